"""Probe (run by hand on a two-GPU NVIDIA machine with cuda-bindings and CuPy): do Vulkan
heaps on two GPUs, each imported into CUDA on its own GPU (``cuImportExternalMemory``), reach
each other over NVLink once peer access is on between the two contexts? Times
``cuMemcpyPeerAsync`` and ``cuMemcpyDtoDAsync`` between them (8 B to 256 MiB), checks the bytes
through Vulkan, then lets a kernel on GPU 0 store into GPU 1's imported heap.

Measured on 2 x H100 (driver 580, 2026-11-27): both copies 37.7 GB/s at 256 MiB, 18 us for 8 B
(staged through the host, as the domain proxy), bytes correct; the kernel's stores faulted
(CUDA_ERROR_ILLEGAL_ADDRESS, which poisons the context: run it last). Imported Vulkan memory
is not mapped for peers, so only a CUDA VMM allocation (imported into Vulkan) would put the
Vulkan domain on NVLink."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from cuda.bindings import driver as cu

from vkshmem.gpu.vk.device import VulkanDevice

N = 256 << 20


def ok(res: Any) -> Any:
    """The value of a cuda-bindings call's result, or a RuntimeError naming its error."""
    err = res[0] if isinstance(res, tuple) else res
    if int(err) != 0:
        raise RuntimeError(f"CUDA error {err}")
    return res[1] if isinstance(res, tuple) and len(res) == 2 else res


def two_heaps(n: int) -> tuple[list[Any], list[int], list[Any], list[Any]]:
    """A Vulkan heap of ``n`` bytes on each of GPUs 0 and 1, imported into CUDA on its own
    GPU: (the memories, their CUDA addresses, the contexts, a stream per context)."""
    ok(cu.cuInit(0))
    vk = [VulkanDevice(i) for i in (0, 1)]
    mems = [d.alloc_exportable(n) for d in vk]
    ordinal = {}
    for i in range(ok(cu.cuDeviceGetCount())):
        ordinal[bytes(ok(cu.cuDeviceGetUuid(ok(cu.cuDeviceGet(i)))).bytes)] = i
    ctxs, ptrs, streams = [], [], []
    for dev, mem in zip(vk, mems, strict=True):
        ctx = ok(cu.cuDevicePrimaryCtxRetain(ok(cu.cuDeviceGet(ordinal[dev.info.device_uuid]))))
        ok(cu.cuCtxSetCurrent(ctx))
        info = mem.export_info()
        desc = cu.CUDA_EXTERNAL_MEMORY_HANDLE_DESC()
        desc.type = cu.CUexternalMemoryHandleType.CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD
        desc.handle.fd = mem.export_fd()  # CUDA owns it once imported
        desc.size = info.allocation_size
        desc.flags = 1 if info.dedicated else 0  # CUDA_EXTERNAL_MEMORY_DEDICATED
        ext = ok(cu.cuImportExternalMemory(desc))
        buf = cu.CUDA_EXTERNAL_MEMORY_BUFFER_DESC()
        buf.offset, buf.size = 0, n
        ptrs.append(int(ok(cu.cuExternalMemoryGetMappedBuffer(ext, buf))))
        ctxs.append(ctx)
        streams.append(ok(cu.cuStreamCreate(1)))
    return mems, ptrs, ctxs, streams


def main() -> None:
    mems, ptrs, ctxs, streams = two_heaps(N)
    for a, b in ((0, 1), (1, 0)):
        ok(cu.cuCtxSetCurrent(ctxs[a]))
        print(f"peer access GPU {a} -> {b}: {cu.cuCtxEnablePeerAccess(ctxs[b], 0)[0]}")
    pattern = (np.arange(N // 4, dtype=np.uint64) * 2654435761).astype(np.uint32)
    mems[0].write(0, pattern)
    ok(cu.cuCtxSetCurrent(ctxs[0]))

    def copy(n: int, how: str) -> None:
        if how == "peer":
            ok(cu.cuMemcpyPeerAsync(ptrs[1], ctxs[1], ptrs[0], ctxs[0], n, streams[0]))
        else:
            ok(cu.cuMemcpyDtoDAsync(ptrs[1], ptrs[0], n, streams[0]))
        ok(cu.cuStreamSynchronize(streams[0]))

    for how in ("peer", "dtod"):
        for n in (8, 1 << 20, 16 << 20, N):
            copy(n, how)
            reps = 20 if n >= 16 << 20 else 200
            best = 1e9
            for _ in range(3):
                t = time.perf_counter()
                for _ in range(reps):
                    copy(n, how)
                best = min(best, (time.perf_counter() - t) / reps)
            print(f"{how:5s} {n:>10d} B: {best * 1e6:9.2f} us {n / best / 1e9:7.1f} GB/s")
    got = np.empty(N // 4, np.uint32)
    mems[1].read(0, got)
    print("bytes arrived:", bool(np.array_equal(got, pattern)))
    import cupy as cp

    with cp.cuda.Device(0):
        kernel = cp.RawKernel(r"""extern "C" __global__ void st(unsigned int *p, unsigned v) {
            p[threadIdx.x] = v + threadIdx.x; }""", "st")
        try:
            kernel((1,), (32,), (cp.uint64(ptrs[1]), cp.uint32(7)))
            cp.cuda.runtime.deviceSynchronize()
            small = np.empty(32, np.uint32)
            mems[1].read(0, small)
            print("GPU 0's kernel stored into GPU 1's imported heap:",
                  bool(np.all(small == 7 + np.arange(32))))
        except Exception as exc:  # the fault this probe looks for
            print("GPU 0's kernel storing into GPU 1's imported heap failed:", exc)


if __name__ == "__main__":
    main()
