"""Probe (run by hand on an NVIDIA GPU with plugins/cuda installed): where the cuda domain's
per-copy time goes. One process, GPU 0: copies of 8 B, 1 MiB and 16 MiB, each complete on
return, (a) through the domain's C helper (Device.dtod) between two VMM allocations, (b) the
same VMM memory through cuda-bindings (cuMemcpyDtoDAsync + cuStreamSynchronize), (c) two
cuMemAlloc buffers through cuda-bindings, (d) CuPy memcpyAsync + synchronize. Prints µs."""

from __future__ import annotations

from collections.abc import Callable

from cuda.bindings import driver as cu
from probe_timing import per_call
from vkshmem_cuda.driver import Device, check

dev = Device(0)
size = dev.round_up(32 << 20)
a, fd_a = dev.create(size)
b, fd_b = dev.create(size)
dev.current()
m1 = int(check(cu.cuMemAlloc(size), "alloc"))
m2 = int(check(cu.cuMemAlloc(size), "alloc"))
stream = dev.stream


def raw(dst: int, src: int, n: int) -> Callable[[], None]:
    def run() -> None:
        cu.cuMemcpyDtoDAsync(dst, src, n, stream)
        cu.cuStreamSynchronize(stream)
    return run


import cupy as cp  # noqa: E402

s = cp.cuda.Stream(non_blocking=True)
x, y = cp.zeros(32 << 20, cp.uint8), cp.zeros(32 << 20, cp.uint8)
print(f"{'bytes':>9} {'C helper VMM':>13} {'bindings VMM':>13} {'bindings malloc':>16} "
      f"{'CuPy':>8}", flush=True)
for n in (8, 1 << 20, 16 << 20):
    helper = per_call(lambda n=n: dev.dtod(b.va, a.va, n), 300)
    vmm = per_call(raw(b.va, a.va, n), 300)
    mal = per_call(raw(m2, m1, n), 300)

    def cupy_copy(n: int = n) -> None:
        cp.cuda.runtime.memcpyAsync(y.data.ptr, x.data.ptr, n, 3, s.ptr)
        s.synchronize()
    cpy = per_call(cupy_copy, 300)
    print(f"{n:>9} {helper:>13.2f} {vmm:>13.2f} {mal:>16.2f} {cpy:>8.2f}", flush=True)
