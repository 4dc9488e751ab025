"""Probe (run by hand on a GPU, one process): where a compute dispatch's round trip and a large
shader copy spend their time, next to copy-engine copies and (when CuPy is importable) CUDA.

Prints one table: per-call microseconds (median of many submit+wait round trips) of
prerecorded command buffers with and without the barriers every vkshmem command buffer carries,
on the first queue and on the launch queue; GPU time (timestamps) and wall time of shader and
copy-engine copies from 1 MiB to 256 MiB; host->device copies from imported host memory.
"""

from __future__ import annotations

import mmap
import statistics
import struct
import sys
import time
from collections.abc import Callable

from vkshmem.core.transports.contract import AmoOp
from vkshmem.gpu import VulkanDevice
from vkshmem.gpu.vk.submit import Slot

dev = VulkanDevice()
vk = dev._vk
ffi, lib = vk.ffi, vk.lib
rows: list[tuple[str, str, float, str]] = []
BIG = [1 << 20, 4 << 20] if "--quick" in sys.argv else [1 << 20, 4 << 20, 16 << 20, 64 << 20,
                                                        256 << 20]


def per_call(fn: Callable[[], object], n: int) -> float:
    for _ in range(min(n, 20)):
        fn()
    samples = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        samples.append((time.perf_counter() - t0) / n)
    return statistics.median(samples)


def add(name: str, what: str, value: float, unit: str) -> None:
    rows.append((name, what, value, unit))
    print(f"{name:<34} {what:<22} {value:>10.2f} {unit}", flush=True)


src = dev.alloc(256 << 20)
dst = dev.alloc(256 << 20)
word = dev.alloc(4096)
pipe = dev.pipeline("copy_u32")
push1 = struct.pack("<QQII", dst.device_address, src.device_address, 1, 0)


def prerecorded(name: str, launch: bool, barriers: bool, body: str) -> Slot:
    slot = Slot(dev, name, launch=launch)
    with dev.lock:
        if barriers:
            slot.begin(reusable=True)
        else:
            lib.vkBeginCommandBuffer(slot.cmd, dev._begin_info_reuse)
        if body == "dispatch":
            pipe.record(slot, 1, push1)
        elif body == "copy":
            r = ffi.new("VkBufferCopy*", {"srcOffset": 0, "dstOffset": 0, "size": 8})
            lib.vkCmdCopyBuffer(slot.cmd, src.buffer, dst.buffer, 1, r)
        if barriers:
            slot.end()
        else:
            lib.vkEndCommandBuffer(slot.cmd)
    return slot


def round_trip(slot: Slot) -> Callable[[], None]:
    def run() -> None:
        with dev.lock:
            slot.submit()
        slot.wait()
    return run


print(f"device {dev.name} ({dev.driver}); queues {dev.queue_count}; native "
      f"{dev.native is not None}", flush=True)
for launch in (False, True):
    q = "launch queue" if launch else "first queue"
    for body in ("empty", "copy", "dispatch"):
        for barriers in (True, False):
            s = prerecorded(f"{body}", launch, barriers, body)
            add(f"{body} {'+barriers' if barriers else 'bare'}", q,
                per_call(round_trip(s), 500) * 1e6, "us")
            s.close()
add("transfer.copy 8 B", "first queue",
    per_call(lambda: dev.transfer.copy(dst, 0, src, 0, 8, None), 500) * 1e6, "us")
add("kernels.amo fetch_add", "first queue",
    per_call(lambda: dev.kernels.amo(word, 0, AmoOp.ADD, 8, 1), 500) * 1e6, "us")
add("pipe.dispatch (Python record)", "first queue",
    per_call(lambda: pipe.dispatch(1, push1), 500) * 1e6, "us")

# GPU time of one shader copy and one copy-engine copy, by timestamps.
props = ffi.new("VkPhysicalDeviceProperties*")
lib.vkGetPhysicalDeviceProperties(dev.physical, props)
period = float(props.limits.timestampPeriod)
qinfo = ffi.new("VkQueryPoolCreateInfo*", {"sType": vk.VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO,
                                           "queryType": vk.VK_QUERY_TYPE_TIMESTAMP,
                                           "queryCount": 2})
qp = ffi.new("VkQueryPool*")
lib.vkCreateQueryPool(dev.handle, qinfo, ffi.NULL, qp)
pool = qp[0]
u128 = dev.pipeline("copy_u128")


def gpu_time(nbytes: int, shader: bool, groups: int = 4096) -> tuple[float, float]:
    """(GPU us between timestamps, wall us of submit+wait) of one prerecorded copy."""
    slot = Slot(dev, "timed")
    with dev.lock:
        slot.begin(reusable=True)
        lib.vkCmdResetQueryPool(slot.cmd, pool, 0, 2)
        lib.vkCmdWriteTimestamp(slot.cmd, vk.VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, pool, 0)
        if shader:
            count = nbytes // 16
            u128.record(slot, min(-(-count // 256), groups),
                        struct.pack("<QQII", dst.device_address, src.device_address, count, 0))
        else:
            r = ffi.new("VkBufferCopy*", {"srcOffset": 0, "dstOffset": 0, "size": nbytes})
            lib.vkCmdCopyBuffer(slot.cmd, src.buffer, dst.buffer, 1, r)
        lib.vkCmdWriteTimestamp(slot.cmd, vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, pool, 1)
        slot.end()
    out = ffi.new("uint64_t[2]")
    gpu = []

    def run() -> None:
        with dev.lock:
            slot.submit()
        slot.wait()
        lib.vkGetQueryPoolResults(dev.handle, pool, 0, 2, 16, out, 8,
                                  vk.VK_QUERY_RESULT_64_BIT | vk.VK_QUERY_RESULT_WAIT_BIT)
        gpu.append((out[1] - out[0]) * period / 1e3)
    wall = per_call(run, 20)
    slot.close()
    return statistics.median(gpu), wall * 1e6


for size in BIG:
    for shader, label in ((False, "copy engine"), (True, "shader 4096 groups")):
        g, w = gpu_time(size, shader)
        add(f"{label} {size >> 20} MiB", "GPU time / wall", g, f"us / {w:.1f} us "
            f"({size / w / 1e3:.0f} GB/s wall, {size / g / 1e3:.0f} GPU)")
    for groups in (1024, 16384, 65535):
        g, w = gpu_time(size, True, groups)
        add(f"shader {groups} groups {size >> 20} MiB", "GPU time / wall", g,
            f"us / {w:.1f} us ({size / w / 1e3:.0f} GB/s wall)")
for size in (1 << 20, 16 << 20, 64 << 20):
    add(f"kernels.shader_copy {size >> 20} MiB", "wall",
        per_call(lambda s=size: dev.kernels.shader_copy(dst, 0, src, 0, s), 20) * 1e6, "us")

# Host -> device from imported host memory (the symmetric host heap's path).
host = mmap.mmap(-1, 64 << 20)
hbuf = ffi.from_buffer(host)
imp = dev.register_host(int(ffi.cast("uintptr_t", hbuf)), 64 << 20)
for size in (1 << 20, 16 << 20, 64 << 20):
    t = per_call(lambda s=size: dev.transfer.copy(dst, 0, imp, 0, s, None), 10)  # type: ignore[arg-type]
    add(f"H2D imported {size >> 20} MiB", "first queue", size / t / 1e9, "GB/s")
    t = per_call(lambda s=size: dev.transfer.copy(imp, 0, dst, 0, s, None), 10)  # type: ignore[arg-type]
    add(f"D2H imported {size >> 20} MiB", "first queue", size / t / 1e9, "GB/s")

qa, qb = Slot(dev, "split a"), Slot(dev, "split b", launch=True)


def split(n: int, to_gpu: bool, parts: int) -> None:
    """One copy of n bytes as `parts` pieces alternating between the two queues."""
    piece = n // parts
    for k in range(parts):
        s = qa if k % 2 == 0 else qb
        s.wait()
        with dev.lock:
            if to_gpu:
                s.copy(dst.buffer, k * piece, imp.buffer, k * piece, piece)
            else:
                s.copy(imp.buffer, k * piece, dst.buffer, k * piece, piece)
    qa.wait()
    qb.wait()


for size in (16 << 20, 64 << 20):
    for parts in (2, 4, 8):
        t = per_call(lambda s=size, p=parts: split(s, True, p), 10)
        add(f"H2D imported {size >> 20} MiB, {parts} pieces", "two queues", size / t / 1e9,
            "GB/s")
        t = per_call(lambda s=size, p=parts: split(s, False, p), 10)
        add(f"D2H imported {size >> 20} MiB, {parts} pieces", "two queues", size / t / 1e9,
            "GB/s")
qa.close()
qb.close()

try:
    import cupy as cp
    import numpy as np

    s = cp.cuda.Stream(non_blocking=True)
    k = cp.RawKernel(r'extern "C" __global__ void k(int *p) { if (p) p[0] += 1; }', "k")
    a = cp.zeros(1, cp.int32)

    def launch() -> None:
        k((1,), (1,), (a,), stream=s)
        s.synchronize()
    add("CUDA empty kernel launch+sync", "CuPy", per_call(launch, 500) * 1e6, "us")
    d_a = cp.zeros(256 << 20, cp.uint8)
    d_b = cp.zeros(256 << 20, cp.uint8)
    pinned = cp.cuda.alloc_pinned_memory(64 << 20)
    h = np.frombuffer(pinned, np.uint8, 64 << 20)
    for size in (1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20):
        def d2d(n: int = size) -> None:
            cp.cuda.runtime.memcpyAsync(d_a.data.ptr, d_b.data.ptr, n, 3, s.ptr)
            s.synchronize()
        t = per_call(d2d, 20)
        add(f"CUDA d2d {size >> 20} MiB", "wall", t * 1e6, f"us ({size / t / 1e9:.0f} GB/s)")
    for size in (1 << 20, 16 << 20, 64 << 20):
        def h2d(n: int = size) -> None:
            cp.cuda.runtime.memcpyAsync(d_a.data.ptr, h.ctypes.data, n, 1, s.ptr)
            s.synchronize()
        t = per_call(h2d, 10)
        add(f"CUDA pinned H2D {size >> 20} MiB", "wall", size / t / 1e9, "GB/s")
except ImportError as exc:
    print(f"no CUDA reference: {exc}")

lib.vkDestroyQueryPool(dev.handle, pool, ffi.NULL)
for m in (src, dst, word):
    m.free()
dev.close()
