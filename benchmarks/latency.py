"""Small latency/bandwidth benchmark: run with ``vkshmem run -n 2 benchmarks/latency.py``.

PE 0 measures, against PE 1: 8-byte put+quiet, 8-byte get, fetch_add, barrier_all, and put
bandwidth at 1 MiB. Prints one table (PE 0); set VKSHMEM_SHM=0 VKSHMEM_TRANSPORTS=hostproxy to
measure the hostproxy transport instead of the shm path.
"""

from __future__ import annotations

import time

import numpy as np

from vkshmem import shmem

me, n = shmem.my_pe(), shmem.n_pes()
peer = (me + 1) % n
small = shmem.zeros(1, np.int64)
src8 = np.ones(1, np.int64)
big = shmem.zeros(1 << 17, np.float64)  # 1 MiB
src_big = np.random.default_rng(0).standard_normal(1 << 17)
dst8 = np.empty(1, np.int64)


def timed(fn, iters: int) -> float:
    for _ in range(min(100, iters)):
        fn()
    shmem.barrier_all()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    dt = time.perf_counter() - t0
    shmem.barrier_all()
    return dt / iters


def put_quiet() -> None:
    shmem.put(small, src8, peer)
    shmem.quiet()


results = {
    "put 8 B + quiet": timed(put_quiet if me == 0 else lambda: None, 20000),
    "get 8 B": timed((lambda: shmem.get(dst8, small, peer)) if me == 0 else lambda: None,
                     20000),
    "fetch_add 8 B": timed((lambda: shmem.atomic_fetch_add(small, 1, peer)) if me == 0
                           else lambda: None, 20000),
    "barrier_all": timed(shmem.barrier_all, 5000),
}


def put_big() -> None:
    shmem.put(big, src_big, peer)
    shmem.quiet()


bw = timed(put_big if me == 0 else lambda: None, 500)
if me == 0:
    routes = sorted({r.name for r in shmem._state.rt.routes})
    print(f"\nvkshmem latency at {n} PEs over {', '.join(routes)}")
    print(f"{'operation':20s} {'latency (us)':>14s}")
    for name, t in results.items():
        print(f"{name:20s} {t * 1e6:14.2f}")
    print(f"{'put 1 MiB + quiet':20s} {bw * 1e6:14.1f}   {(1 << 20) / bw / 1e9:.2f} GB/s")
