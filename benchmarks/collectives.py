"""Collective latency benchmark: run with ``vkshmem run -n N benchmarks/collectives.py``.

PE 0 prints one table: team sync, broadcast (8 B and 1 MiB), sum_reduce of float64 (8 B and
1 MiB) and fcollect (8 B per PE), each the mean time per call over a loop of back-to-back
calls on TEAM_WORLD (median of 5 loops). Each PE is pinned to its own core when there are
enough (as MPI launchers bind by default). Set VKSHMEM_SHM=0 VKSHMEM_TRANSPORTS=hostproxy
to measure the hostproxy transport instead of the shm path. ``--iters-scale F`` scales every loop.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable

import numpy as np

from vkshmem import shmem

scale = float(sys.argv[sys.argv.index("--iters-scale") + 1]) if "--iters-scale" in sys.argv \
    else 1.0
me, n = shmem.my_pe(), shmem.n_pes()
if len(os.sched_getaffinity(0)) >= n:  # one core per PE, as MPI launchers bind by default
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[me]})
MIB = 1 << 20
t8 = shmem.zeros(1, np.float64)
s8 = np.ones(1, np.float64)
tbig = shmem.zeros(MIB // 8, np.float64)
sbig = np.random.default_rng(me).standard_normal(MIB // 8)
tcol = shmem.zeros(n, np.float64)


def timed(fn: Callable[[], None], iters: int, reps: int = 5) -> float:
    """Median over ``reps`` loops of the mean time per call (loops start together)."""
    iters = max(10, int(iters * scale))
    for _ in range(min(50, iters)):
        fn()
    times = []
    for _ in range(reps):
        shmem.barrier_all()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        times.append((time.perf_counter() - t0) / iters)
    shmem.barrier_all()
    return sorted(times)[reps // 2]


rows = [
    ("sync", timed(shmem.sync, 10000), 0),
    ("broadcast 8 B", timed(lambda: shmem.broadcast(t8, s8, 0), 10000), 8),
    ("broadcast 1 MiB", timed(lambda: shmem.broadcast(tbig, sbig, 0), 200), MIB),
    ("sum_reduce 8 B", timed(lambda: shmem.sum_reduce(t8, s8), 10000), 8),
    ("sum_reduce 1 MiB", timed(lambda: shmem.sum_reduce(tbig, sbig), 200), MIB),
    ("fcollect 8 B", timed(lambda: shmem.fcollect(tcol, s8), 10000), 8),
]
if me == 0:
    routes = sorted({r.name for r in shmem._state.rt.routing.routes})
    print(f"\nvkshmem collectives at {n} PEs over {', '.join(routes)}")
    print(f"{'operation':20s} {'time (us)':>12s} {'GB/s':>8s}")
    for name, t, nbytes in rows:
        bw = f"{nbytes / t / 1e9:8.2f}" if nbytes >= MIB else ""
        print(f"{name:20s} {t * 1e6:12.2f} {bw}")
