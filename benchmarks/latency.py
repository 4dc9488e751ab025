"""Latency/bandwidth benchmark: run with ``vkshmem run -n 2 benchmarks/latency.py``.

PE 0 measures, against PE 1: 8-byte put+quiet, get, fetch_add and compare_swap; every PE
takes part in barrier_all, broadcast (8 B, 1 MiB, root 0) and sum_reduce (8 B); then put
bandwidth (64 KiB, 1 MiB, 4 MiB, each + quiet) next to the same copy done by numpy locally,
and an 8-byte numpy store. Every row is the median over ``--reps`` loops of the mean time per
call (back to back), for collectives on the slowest PE; each PE is pinned to its own core
when there are enough (as MPI launchers bind; ``--no-pin`` leaves placement to the OS, as
``mpiexec --bind-to none`` does, which suits a machine shared with other work).
``benchmarks/mpi_rma.py`` measures the same rows with mpi4py. ``--json`` prints one JSON
object instead of the table. Set VKSHMEM_SHM=0 VKSHMEM_TRANSPORTS=hostproxy (or ucx) to
measure a transport instead of the shm path.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from _timing import knobs, pin, report, shmem_timer

from vkshmem import shmem

me, n = shmem.my_pe(), shmem.n_pes()
peer = (me + 1) % n
reps, scale = knobs()
pin(me, n)
KIB, MIB = 1 << 10, 1 << 20
small = shmem.zeros(1, np.int64)
src8 = np.ones(1, np.int64)
dst8 = np.empty(1, np.int64)
f8 = shmem.zeros(1, np.float64)
s8 = np.ones(1, np.float64)
big = shmem.zeros(4 * MIB // 8, np.float64)
src_big = np.random.default_rng(0).standard_normal(4 * MIB // 8)
local_big = np.empty_like(src_big)
timed = shmem_timer(shmem, reps, scale)


def put_quiet(nbytes: int) -> Callable[[], None]:
    tgt, src = big[:nbytes // 8], src_big[:nbytes // 8]

    def fn() -> None:
        shmem.put(tgt, src, peer)
        shmem.quiet()

    return fn


def np_copy(nbytes: int) -> Callable[[], None]:
    dst, src = local_big[:nbytes // 8], src_big[:nbytes // 8]
    return lambda: np.copyto(dst, src)


def store8() -> None:
    dst8[0] = 5


rows = {
    "put 8 B + quiet": timed(put_quiet(8), 20000),
    "get 8 B": timed(lambda: shmem.get(dst8, small, peer), 20000),
    "fetch_add 8 B": timed(lambda: shmem.atomic_fetch_add(small, 1, peer), 20000),
    "compare_swap 8 B": timed(lambda: shmem.atomic_compare_swap(small, 0, 1, peer), 20000),
    "barrier_all": timed(shmem.barrier_all, 5000, True),
    "broadcast 8 B": timed(lambda: shmem.broadcast(f8, s8, 0), 10000, True),
    "sum_reduce 8 B": timed(lambda: shmem.sum_reduce(f8, s8), 10000, True),
    "broadcast 1 MiB": timed(lambda: shmem.broadcast(big[:MIB // 8], src_big[:MIB // 8], 0),
                             300, True),
    "numpy store 8 B": timed(store8, 20000),
}
sizes = {}  # bandwidth rows: bytes per call
for size, iters in ((64 * KIB, 5000), (MIB, 500), (4 * MIB, 100)):
    label = f"{size // KIB} KiB" if size < MIB else f"{size // MIB} MiB"
    for name, fn in ((f"put {label} + quiet", put_quiet), (f"numpy copy {label}", np_copy)):
        rows[name] = timed(fn(size), iters)
        sizes[name] = size
if me == 0:
    routes = sorted({r.name for r in shmem._state.rt.routing.routes})
    report(rows, {"impl": "vkshmem", "routes": routes, "pes": n},
           f"vkshmem latency at {n} PEs over {', '.join(routes)}", sizes)
