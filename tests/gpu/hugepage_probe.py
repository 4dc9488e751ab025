"""Does the host memory's page size set the PCIe copy rate? (run by hand on an NVIDIA machine
with CuPy: ``python tests/gpu/hugepage_probe.py``). Copies 256 MiB host->device with CUDA from
pinned memory (cudaMallocHost), from a registered memfd mapping (what vkshmem's host heap is)
and from the same with MADV_HUGEPAGE, and says which huge pages the kernel gave."""

from __future__ import annotations

import mmap
import os
import time

import cupy as cp
import numpy as np

N = 256 << 20
MADV_HUGEPAGE = 14


def rate(src_ptr: int, dst: cp.ndarray) -> float:
    s = cp.cuda.Stream(non_blocking=True)
    best = 0.0
    for _ in range(6):
        t0 = time.perf_counter()
        cp.cuda.runtime.memcpyAsync(dst.data.ptr, src_ptr, N, 1, s.ptr)
        s.synchronize()
        best = max(best, N / (time.perf_counter() - t0) / 1e9)
    return best


def memfd_buffer(huge: bool) -> tuple[mmap.mmap, int]:
    fd = os.memfd_create("probe", 0)
    os.ftruncate(fd, N)
    m = mmap.mmap(fd, N)
    os.close(fd)
    addr = np.frombuffer(m, np.uint8).ctypes.data
    if huge:
        import ctypes

        libc = ctypes.CDLL(None)
        print("madvise:", libc.madvise(ctypes.c_void_p(addr), ctypes.c_size_t(N), MADV_HUGEPAGE))
    np.frombuffer(m, np.uint8)[:] = 1
    return m, addr


def main() -> None:
    for f in ("/sys/kernel/mm/transparent_hugepage/shmem_enabled",
              "/sys/kernel/mm/transparent_hugepage/enabled", "/proc/sys/vm/nr_hugepages"):
        try:
            print(f, open(f).read().strip())
        except OSError as exc:
            print(f, exc)
    dst = cp.zeros(N, cp.uint8)
    pinned = cp.cuda.alloc_pinned_memory(N)
    print(f"pinned (cudaMallocHost): {rate(pinned.ptr, dst):.1f} GB/s")
    for huge in (False, True):
        m, addr = memfd_buffer(huge)
        meminfo = {line.split(":")[0]: line.split(":")[1].strip()
                   for line in open("/proc/meminfo") if "Huge" in line}
        cp.cuda.runtime.hostRegister(addr, N, 0)
        print(f"memfd{' + MADV_HUGEPAGE' if huge else ''} registered: "
              f"{rate(addr, dst):.1f} GB/s; ShmemHugePages {meminfo.get('ShmemHugePages')}")
        cp.cuda.runtime.hostUnregister(addr)
        del m


if __name__ == "__main__":
    main()
