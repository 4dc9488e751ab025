"""Probe (run by hand on an NVIDIA GPU with cuda-bindings and NVRTC: ``python
tests/gpu/timeslice_probe.py``): does a resident CUDA kernel hold up Vulkan work of the same
process on the same GPU? The question behind the Vulkan domain's AMOs: the ``cuda`` domain
serves small operations from a resident service kernel, which the Vulkan domain could copy only
if its own queue's work still runs while that kernel spins (a CUDA context and a Vulkan device
are separate contexts to the GPU, which time-slices contexts without MPS).

One process: a Vulkan device and CUDA's primary context on the same GPU. Times 8-byte Vulkan
copies through the staging buffer (one queue submission and wait each) with the GPU idle, then
while a one-block CUDA kernel spins on a flag in mapped pinned memory (released after the
measurement, or after 2 s by its own clock), then idle again. Prints the median and the worst
of each, in microseconds. One H100 (driver 580), 2026-11-27: idle 21.5 us per copy, with the
kernel resident 2419 us (the queue waits for the CUDA context's time slice), idle again 21.1:
a resident kernel is not an option for a Vulkan domain's PE on its own GPU.
"""

from __future__ import annotations

import ctypes
import time

import numpy as np
from cuda.bindings import driver as cu
from vkshmem_cuda.kernels import compile_kernel
from vkshmem_cuda.vmm import device_by_uuid

from vkshmem.gpu import VulkanDevice

SPIN = r"""
extern "C" __global__ void spin(volatile unsigned *flag, long long limit) {
    long long start = clock64();
    while (*flag == 0 && clock64() - start < limit) { }
}
"""


def check(res: tuple, what: str = "") -> object:
    err, *rest = res if isinstance(res, tuple) else (res,)
    if int(err) != 0:
        raise RuntimeError(f"{what}: {err}")
    return rest[0] if len(rest) == 1 else rest


def copies(dev: VulkanDevice, mem: object, n: int, budget: float) -> list[float]:
    """Per-copy microseconds of up to ``n`` staged 8-byte writes, stopping after ``budget`` s."""
    data = np.arange(8, dtype=np.uint8)
    out = []
    end = time.perf_counter() + budget
    while len(out) < n and time.perf_counter() < end:
        t = time.perf_counter()
        dev.write(mem, 0, data)
        out.append((time.perf_counter() - t) * 1e6)
    return out


def main() -> None:
    dev = VulkanDevice(0)
    mem = dev.alloc(4096, exportable=False, host_visible=False)
    check(cu.cuInit(0), "cuInit")
    found = device_by_uuid(cu, dev.info.device_uuid, check)
    assert found is not None, "CUDA does not list the Vulkan device"
    ordinal, cudev = found
    ctx = check(cu.cuDevicePrimaryCtxRetain(cudev), "retain")
    check(cu.cuCtxSetCurrent(ctx), "current")
    fn = compile_kernel(cu, check, cudev, SPIN, b"spin", RuntimeError)
    flag = check(cu.cuMemHostAlloc(4, 2), "cuMemHostAlloc")  # DEVICEMAP
    flag_dev = check(cu.cuMemHostGetDevicePointer(flag, 0), "device pointer")
    ctypes.c_uint32.from_address(int(flag)).value = 0
    stream = check(cu.cuStreamCreate(1), "stream")
    rate = check(cu.cuDeviceGetAttribute(
        cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_CLOCK_RATE, cudev), "clock")  # kHz
    rows = [("idle", copies(dev, mem, 2000, 2.0))]
    args = (ctypes.c_uint64(int(flag_dev)), ctypes.c_int64(int(rate) * 1000 * 2))
    params = (ctypes.c_void_p * 2)(*[ctypes.addressof(a) for a in args])
    check(cu.cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, stream, ctypes.addressof(params), 0),
          "launch")
    time.sleep(0.01)
    running = cu.cuStreamQuery(stream)[0]  # CUDA_ERROR_NOT_READY: the kernel spins
    rows.append((f"CUDA kernel resident ({running.name})", copies(dev, mem, 2000, 1.5)))
    ctypes.c_uint32.from_address(int(flag)).value = 1
    check(cu.cuStreamSynchronize(stream), "sync")
    rows.append(("idle again", copies(dev, mem, 2000, 2.0)))
    print(f"GPU {ordinal}: {dev.info.name}, 8-byte staged Vulkan copies")
    for name, ts in rows:
        print(f"{name:44s} n={len(ts):5d} median {np.median(ts):9.1f} us  max {max(ts):9.1f} us")
    mem.free()
    dev.close()


if __name__ == "__main__":
    main()
