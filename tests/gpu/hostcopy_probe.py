"""CPU<->GPU copies between the imported host heap and GPU memory: the copy engine (one
vkCmdCopyBuffer) against copy.comp reading or writing the host memory over PCIe (run by hand
on a GPU machine: ``VKSHMEM_GPU_PROVIDER=vulkan VKSHMEM_SYMMETRIC_SIZE=1G
VKSHMEM_GPU_SYMMETRIC_SIZE=1G vkshmem run -n 1 tests/gpu/hostcopy_probe.py``). GB/s, best of 5."""

from __future__ import annotations

import time

import numpy as np

from vkshmem import shmem

g = shmem.zeros(256 << 20, np.uint8, domain="gpu")
h = shmem.zeros(256 << 20, np.uint8)
dom = g.domain
dev = dom.device
imp = dev.transfer.host_imports[0]
hoff = imp.offset_of(h.ctypes.data, h.nbytes)
assert hoff >= 0 and imp.device_address, (hoff, imp.device_address)
mem = dom.local


def best(fn, n: int) -> float:
    fn()
    t = min(_timed(fn) for _ in range(5))
    return n / t / 1e9


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


print(f"{'bytes':>10} {'h2d engine':>11} {'h2d shader':>11} {'d2h engine':>11} {'d2h shader':>11}")
go = g.offset
for n in (1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20):
    r = [best(lambda n=n: dev.transfer.copy(mem, go, imp, hoff, n, None), n),
         best(lambda n=n: dev.kernels.shader_copy(mem, go, imp, hoff, n), n),
         best(lambda n=n: dev.transfer.copy(imp, hoff, mem, go, n, None), n),
         best(lambda n=n: dev.kernels.shader_copy(imp, hoff, mem, go, n), n)]
    print(f"{n:>10} " + " ".join(f"{x:>11.1f}" for x in r), flush=True)
