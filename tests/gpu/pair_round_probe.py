"""Probe (run by hand on a two-GPU NVIDIA machine: ``VKSHMEM_GPU_PROVIDER=vulkan python -m
vkshmem run -n 2 tests/gpu/pair_round_probe.py``, and the same with ``cuda``): where a 256 MiB
float32 sum all-reduce of the domain ``gpu`` spends its time. Times, per call on both PEs (best
of 5 rounds of 20 after warm-ups): the API call, the domain's pair round between two host
barriers as the API runs it (the Vulkan domain's link, the cuda domain's ``reduce_from``), the
two host barriers alone. Run it under several settings (``VKSHMEM_CUDA_CPU_MAP``,
``VKSHMEM_GPU_LINK_MAP``, the service variables) to see what the other contexts on a GPU cost
the round."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from vkshmem import shmem

N = 64 << 20  # float32 elements: 256 MiB
me, peer = shmem.my_pe(), 1 - shmem.my_pe()
src = shmem.zeros(N, np.float32, domain="gpu")
dst = shmem.zeros(N, np.float32, domain="gpu")
src.copy_from(np.full(N, me + 1, np.float32))
heap = shmem._state.rt.heaps[src.domain.spec.name]
dom = heap.domain
pes = (0, 1)


def best(fn: Callable[[], object], n: int = 20) -> float:
    for _ in range(3):
        fn()
    out = float("inf")
    for _ in range(5):
        shmem.barrier_all()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        out = min(out, (time.perf_counter() - t0) / n)
    shmem.barrier_all()
    return out * 1e6


rows: list[tuple[str, float]] = [("API sum_reduce", best(lambda: shmem.sum_reduce(dst, src)))]
got = dst.to_numpy()[:4]
assert np.all(got == 3.0), got
link = heap.links[peer] if heap.links else None
if link is not None and link.pairs(pes, "sum", np.dtype(np.float32)):
    share = N // 2
    shares = [(0, share), (share, N - share)]

    def linked() -> None:
        shmem.barrier_all()
        link.pair_reduce(me, pes, shares, dst.offset, src.offset, "sum", np.dtype(np.float32))
        shmem.barrier_all()

    rows.append(("barrier + link round + barrier", best(linked)))
elif heap.direct[peer] is not None:
    sources = [(dom.local if pe == me else heap.direct[pe], src.offset) for pe in pes]

    def direct() -> None:
        shmem.barrier_all()
        dom.reduce_from(dst.offset, sources, N, "sum", np.dtype(np.float32))
        shmem.barrier_all()

    rows.append(("barrier + reduce_from + barrier", best(direct)))


def barriers() -> None:
    shmem.barrier_all()
    shmem.barrier_all()


rows.append(("two barriers", best(barriers)))
for name, us in rows:
    print(f"{name:34s} {us:9.1f} us", flush=True)
