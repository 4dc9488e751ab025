"""mpi4py reference for ``benchmarks/latency.py``: the same rows, measured with MPI.

Run with the Open MPI that the ``[mpi]`` extra installs, on the same machine and in the same
session as the vkshmem numbers it is compared with::

    .venv/bin/mpiexec -n 2 --oversubscribe .venv/bin/python benchmarks/mpi_rma.py

(add ``--allow-run-as-root`` as root; ``--mca osc sm`` skips Open MPI's attempt at its UCX
one-sided component; ``--no-pin`` with ``--bind-to none`` leaves placement to the OS). RMA is
passive-target on a window from ``MPI.Win.Allocate`` (one ``Lock_all`` epoch), every
operation followed by ``Flush``, as an OpenSHMEM put + quiet; collectives are on
``COMM_WORLD`` (root 0). Rank 0 measures against rank 1; every row is the median over
``--reps`` loops of the mean time per call (back to back), for collectives on the slowest
rank. ``--json`` prints one JSON object (row -> microseconds) instead of the table.
"""

from __future__ import annotations

import numpy as np
from _timing import knobs, make_timer, pin, report
from mpi4py import MPI

comm = MPI.COMM_WORLD
me, n = comm.Get_rank(), comm.Get_size()
peer = (me + 1) % n
reps, scale = knobs()
timed = make_timer(me, reps, scale, comm.Barrier,
                   lambda x: comm.allreduce(x, op=MPI.MAX))
MIB = 1 << 20

win = MPI.Win.Allocate(2 * MIB, 8, comm=comm)
win.Lock_all()
src8 = np.ones(1, np.int64)
dst8 = np.empty(1, np.int64)
res8 = np.empty(1, np.int64)
cmp8 = np.zeros(1, np.int64)
src_big = np.random.default_rng(0).standard_normal(MIB // 8)
b8 = np.zeros(1, np.float64)
bbig = np.zeros(MIB // 8, np.float64)
r8 = np.zeros(1, np.float64)
s8 = np.ones(1, np.float64)


def put8() -> None:
    win.Put(src8, peer, 0)
    win.Flush(peer)


def get8() -> None:
    win.Get(dst8, peer, 0)
    win.Flush(peer)


def fetch_add() -> None:
    win.Fetch_and_op(src8, res8, peer, 0, MPI.SUM)
    win.Flush(peer)


def compare_swap() -> None:
    win.Compare_and_swap(src8, cmp8, res8, peer, 0)
    win.Flush(peer)


def store8() -> None:
    dst8[0] = 5


def put_big() -> None:
    win.Put(src_big, peer, 0)
    win.Flush(peer)


pin(me, n)
rows = {
    "put 8 B + quiet": timed(put8, 20000),
    "get 8 B": timed(get8, 20000),
    "fetch_add 8 B": timed(fetch_add, 20000),
    "compare_swap 8 B": timed(compare_swap, 20000),
    "barrier_all": timed(comm.Barrier, 5000, True),
    "broadcast 8 B": timed(lambda: comm.Bcast(b8, 0), 10000, True),
    "sum_reduce 8 B": timed(lambda: comm.Allreduce(s8, r8, MPI.SUM), 10000, True),
    "broadcast 1 MiB": timed(lambda: comm.Bcast(bbig, 0), 300, True),
    "put 1 MiB + quiet": timed(put_big, 500),
    "numpy store 8 B": timed(store8, 20000),
}
win.Unlock_all()
win.Free()
if me == 0:
    report(rows, {"impl": "mpi4py", "version": MPI.Get_library_version().split(",")[0], "pes": n},
           f"mpi4py RMA at {n} ranks ({MPI.Get_library_version().splitlines()[0]})")
