"""mpi4py reference for ``benchmarks/collectives_more.py``: the same rows, measured with MPI.

Run with the Open MPI that the ``[mpi]`` extra installs, on the same machine and in the same
session as the vkshmem numbers it is compared with::

    .venv/bin/mpiexec -n 2 --mca osc sm .venv/bin/python benchmarks/mpi_collectives_more.py

The collectives are ``Alltoall``, ``Allgatherv``, ``Scan``/``Exscan`` and ``Allreduce`` on
``COMM_WORLD``; strided RMA is a ``Put``/``Get`` with a vector datatype (8 elements at stride 2
on both sides) on a window from ``MPI.Win.Allocate`` in a ``Lock_all`` epoch, followed by
``Flush``; the lock row is ``Win.Lock`` (exclusive) + ``Unlock`` on PE 1 of a second window
(MPI has no ``test_lock``). Every row is the median over ``--reps`` loops of the mean time per
call, for collectives on the slowest rank. ``--json`` prints one JSON object instead.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from _timing import knobs, make_timer, pin, report
from mpi4py import MPI

comm = MPI.COMM_WORLD
me, n = comm.Get_rank(), comm.Get_size()
peer = (me + 1) % n
reps, scale = knobs()
timed = make_timer(me, reps, scale, comm.Barrier,
                   lambda x: comm.allreduce(x, op=MPI.MAX))
KIB, MIB = 1 << 10, 1 << 20
BIG = 4 * MIB // 8
tgt = np.zeros(n * BIG, np.float64)
src = np.random.default_rng(me).integers(0, 100, n * BIG).astype(np.float64)
win = MPI.Win.Allocate(16 * 8, 8, comm=comm)
win.Lock_all()
lwin = MPI.Win.Allocate(8, 8, comm=comm)
local16 = np.arange(16, dtype=np.int64)
vec = MPI.INT64_T.Create_vector(8, 1, 2).Commit()


def alltoall(nbytes: int) -> Callable[[], None]:
    k = nbytes // 8
    t, s = tgt[:n * k], src[:n * k]
    return lambda: comm.Alltoall(s, t)


def collect(nbytes: int) -> Callable[[], None]:
    k = nbytes // 8
    t, s = tgt[:n * k], src[:k]
    counts = [k] * n
    return lambda: comm.Allgatherv(s, [t, counts])


def scan(nbytes: int, inclusive: bool) -> Callable[[], None]:
    t, s = tgt[:nbytes // 8], src[:nbytes // 8]
    fn = comm.Scan if inclusive else comm.Exscan
    return lambda: fn(s, t, MPI.SUM)


def reduce(nbytes: int) -> Callable[[], None]:
    t, s = tgt[:nbytes // 8], src[:nbytes // 8]
    return lambda: comm.Allreduce(s, t, MPI.SUM)


def iput() -> None:
    win.Put([local16, 1, vec], peer, [0, 1, vec])
    win.Flush(peer)


def iget() -> None:
    win.Get([local16, 1, vec], peer, [0, 1, vec])
    win.Flush(peer)


def lock_unlock() -> None:
    lwin.Lock(1, MPI.LOCK_EXCLUSIVE)
    lwin.Unlock(1)


pin(me, n)
rows = {
    "alltoall 8 B": timed(alltoall(8), 10000, True),
    "alltoall 64 KiB": timed(alltoall(64 * KIB), 1000, True),
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
    "set_lock + clear_lock": timed(lock_unlock, 20000),
}
win.Unlock_all()
vec.Free()
win.Free()
lwin.Free()
if me == 0:
    report(rows, {"impl": "mpi4py", "version": MPI.Get_library_version().split(",")[0], "pes": n},
           f"mpi4py at {n} ranks ({MPI.Get_library_version().splitlines()[0]})")
