"""The collectives and calls beyond ``benchmarks/latency.py``: run with
``vkshmem run -n 2 benchmarks/collectives_more.py``.

Every PE takes part in alltoall, alltoalls (target stride 2), collect, sum_inscan/sum_exscan
and large sum_reduce (float64); PE 0 alone measures strided put (``iput`` + ``quiet``) and
get (``iget``) of 8 int64 at stride 2 against PE 1, and an uncontended lock (``set_lock`` +
``clear_lock``, ``test_lock`` + ``clear_lock``). Every row is the median over ``--reps``
loops of the mean time per call (back to back), for collectives on the slowest PE; each PE
is pinned to its own core when there are enough (``--no-pin`` leaves placement to the OS).
Collectives that reuse one target are separated by nothing: every call here writes the same
values, so a peer running ahead is harmless. ``benchmarks/mpi_collectives_more.py`` measures
the same rows with mpi4py. ``--json`` prints one JSON object (row -> microseconds) instead
of the table.
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
BIG = 4 * MIB // 8
tgt = shmem.zeros(n * BIG, np.float64)
src = np.random.default_rng(me).integers(0, 100, n * BIG).astype(np.float64)
small = shmem.zeros(16, np.int64)
local16 = np.arange(16, dtype=np.int64)
lock = shmem.new_lock()
timed = shmem_timer(shmem, reps, scale)


def elems(nbytes: int) -> int:
    return nbytes // 8


def alltoall(nbytes: int) -> Callable[[], None]:
    k = elems(nbytes)
    t, s = tgt[:n * k], src[:n * k]
    return lambda: shmem.alltoall(t, s, k)


def alltoalls(nbytes: int) -> Callable[[], None]:
    k = elems(nbytes)
    t, s = tgt[:2 * n * k], src[:n * k]
    return lambda: shmem.alltoalls(t, s, 2, 1, k)


def collect(nbytes: int) -> Callable[[], None]:
    t, s = tgt[:n * elems(nbytes)], src[:elems(nbytes)]
    return lambda: shmem.collect(t, s)


def scan(nbytes: int, inclusive: bool) -> Callable[[], None]:
    t, s = tgt[:elems(nbytes)], src[:elems(nbytes)]
    fn = shmem.sum_inscan if inclusive else shmem.sum_exscan
    return lambda: fn(t, s)


def reduce(nbytes: int) -> Callable[[], None]:
    t, s = tgt[:elems(nbytes)], src[:elems(nbytes)]
    return lambda: shmem.sum_reduce(t, s)


def iput() -> None:
    shmem.iput(small, local16, peer, 2, 2, 8)
    shmem.quiet()


def iget() -> None:
    shmem.iget(local16, small, peer, 2, 2, 8)


def set_clear() -> None:
    shmem.set_lock(lock)
    shmem.clear_lock(lock)


def test_clear() -> None:
    shmem.test_lock(lock)
    shmem.clear_lock(lock)


rows = {
    "alltoall 8 B": timed(alltoall(8), 10000, True),
    "alltoall 64 KiB": timed(alltoall(64 * KIB), 1000, True),
    "alltoalls 8 B, tst 2": timed(alltoalls(8), 10000, True),
    "alltoalls 64 KiB, tst 2": timed(alltoalls(64 * KIB), 1000, True),
    "collect 8 B": timed(collect(8), 10000, True),
    "collect 64 KiB": timed(collect(64 * KIB), 1000, True),
    "sum_inscan 8 B": timed(scan(8, True), 10000, True),
    "sum_exscan 8 B": timed(scan(8, False), 10000, True),
    "sum_inscan 64 KiB": timed(scan(64 * KIB, True), 1000, True),
    "sum_reduce 64 KiB": timed(reduce(64 * KIB), 1000, True),
    "sum_reduce 1 MiB": timed(reduce(MIB), 200, True),
    "sum_reduce 4 MiB": timed(reduce(4 * MIB), 50, True),
    "iput 8x8 B + quiet": timed(iput, 20000),
    "iget 8x8 B": timed(iget, 20000),
    "set_lock + clear_lock": timed(set_clear, 20000),
    "test_lock + clear_lock": timed(test_clear, 20000),
}
if me == 0:
    routes = sorted({r.name for r in shmem._state.rt.routing.routes})
    report(rows, {"impl": "vkshmem", "routes": routes, "pes": n}, f"vkshmem at {n} PEs")
