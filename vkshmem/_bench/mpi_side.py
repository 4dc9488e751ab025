"""The mpi4py side of ``vkshmem bench --compare``: the same plan with MPI RMA and collectives.

``mpiexec -n N python -m vkshmem._bench.mpi_side PLAN.json``. Passive-target RMA on a window
from ``MPI.Win.Allocate`` (``Lock_all`` for the whole run), each operation followed by
``Flush`` of the target, as an OpenSHMEM operation followed by ``quiet``:

==================  ======================================================================
put_lat, get_lat    ``Put`` / ``Get`` + ``Flush``
put_bw/_rate ...    a window of ``Put`` (``Get``) then one ``Flush``
fetch, swap, ...    ``Fetch_and_op`` (NO_OP, REPLACE, SUM, BAND, BOR, BXOR) + ``Flush``
set, inc, add ...   ``Accumulate`` (REPLACE, SUM, BAND, BOR, BXOR) + ``Flush``
compare_swap        ``Compare_and_swap`` + ``Flush``
put_signal          ``Put`` + ``Flush`` + ``Accumulate(REPLACE)`` of the signal + ``Flush``;
                    the receiver polls its window word with ``Win.Sync``
barrier ...         ``Barrier``, ``Bcast``, ``Allreduce`` (SUM, float64), ``Allgather``,
                    ``Alltoall``
==================  ======================================================================

Sizes, iterations, warm-up and samples come from the plan, who measures what from
:class:`~vkshmem._bench.pattern.Pattern`; rank 0 prints the results as the OpenSHMEM side
does. Never imported by the vkshmem side.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import numpy as np

from .pattern import Op, Pattern
from .spec import MARK, META, Item, Plan


class MpiKernels(Pattern):
    """The measurements of one rank."""

    def __init__(self, MPI: Any, plan: Plan) -> None:
        self.MPI = MPI
        self.plan = plan
        self.comm = comm = MPI.COMM_WORLD
        self.me, self.n = comm.Get_rank(), comm.Get_size()
        room = plan.max_size * max(self.n, 1)
        self.word_at = room  # an int64 AMO word, then the signal word
        self.sig_at = room + 8
        self.win = MPI.Win.Allocate(room + 16, 1, comm=comm)
        mem = np.frombuffer(self.win.tomemory(), np.uint8)
        mem[:] = 0
        self.sigword = mem[self.sig_at:self.sig_at + 8].view(np.int64)
        self.a = np.zeros(room, np.uint8)  # local buffers: collective targets, get targets
        self.b = np.zeros(room, np.uint8)  # put / collective sources
        nf = max(1, plan.max_size // 8)
        self.ft = np.zeros(nf, np.float64)
        self.fs = np.ones(nf, np.float64)
        comm.Barrier()
        self.win.Lock_all()

    def close(self) -> None:
        self.win.Unlock_all()
        self.comm.Barrier()
        self.win.Free()

    def p2p_op(self, item: Item) -> Op:
        MPI, win, p, n = self.MPI, self.win, self.peer, item.size
        src, dst = self.b[:n], self.a[:n]
        flush = win.Flush
        if item.bench == "put_lat":
            put = win.Put

            def put_flush() -> None:
                put(src, p)
                flush(p)
            return put_flush
        if item.bench == "get_lat":
            get = win.Get

            def get_flush() -> None:
                get(dst, p)
                flush(p)
            return get_flush
        if item.bench in ("put_bw", "put_rate", "get_bw", "get_rate"):
            call, buf = (win.Put, src) if item.bench.startswith("put") else (win.Get, dst)
            rng = range(self.plan.window)

            def window() -> None:
                for _ in rng:
                    call(buf, p)
                flush(p)
            return window
        return self._amo(item.bench, MPI)

    def _amo(self, name: str, MPI: Any) -> Op:
        win, p, at = self.win, self.peer, self.word_at
        flush = win.Flush
        res = np.zeros(1, np.int64)
        if name == "compare_swap":
            zero = np.zeros(1, np.int64)
            cas = win.Compare_and_swap

            def cas_flush() -> None:
                cas(zero, zero, res, p, at)
                flush(p)
            return cas_flush
        ops = {"fetch": (MPI.NO_OP, 0), "set": (MPI.REPLACE, 0), "swap": (MPI.REPLACE, 0),
               "inc": (MPI.SUM, 1), "fetch_inc": (MPI.SUM, 1), "add": (MPI.SUM, 1),
               "fetch_add": (MPI.SUM, 1), "and": (MPI.BAND, -1), "fetch_and": (MPI.BAND, -1),
               "or": (MPI.BOR, 0), "fetch_or": (MPI.BOR, 0), "xor": (MPI.BXOR, 1),
               "fetch_xor": (MPI.BXOR, 1)}
        op, value = ops[name]
        origin = np.full(1, value, np.int64)
        if name.startswith(("fetch", "swap")):
            fop = win.Fetch_and_op

            def fetch_flush() -> None:
                fop(origin, res, p, at, op)
                flush(p)
            return fetch_flush
        acc = win.Accumulate

        def acc_flush() -> None:
            acc(origin, p, at, op)
            flush(p)
        return acc_flush

    def coll_op(self, item: Item) -> Op:
        comm, n, size = self.comm, self.n, item.size
        if item.bench == "barrier":
            return comm.Barrier
        if item.bench == "broadcast":
            buf = self.a[:size]
            bcast = comm.Bcast
            return lambda: bcast(buf, 0)
        if item.bench == "reduce":
            c = size // 8
            t, s, op = self.ft[:c], self.fs[:c], self.MPI.SUM
            allreduce = comm.Allreduce
            return lambda: allreduce(s, t, op)
        if item.bench == "fcollect":
            t, s = self.a[:n * size], self.b[:size]
            allgather = comm.Allgather
            return lambda: allgather(s, t)
        t, s = self.a[:n * size], self.b[:n * size]
        alltoall = comm.Alltoall
        return lambda: alltoall(s, t)

    def barrier(self) -> None:
        self.comm.Barrier()

    def mean_over_ranks(self, times: list[float]) -> list[float]:
        total = np.zeros(len(times))
        self.comm.Allreduce(np.array(times), total, self.MPI.SUM)
        return [float(t) / self.n for t in total]

    def signal_ops(self, item: Item, to: int) -> tuple[Op, Op]:
        win, src, word = self.win, self.b[:item.size], self.sigword
        value = np.zeros(1, np.int64)
        put, acc, flush, sync = win.Put, win.Accumulate, win.Flush, win.Sync
        replace, at = self.MPI.REPLACE, self.sig_at

        def send() -> None:
            put(src, to)
            flush(to)
            value[0] = self.seq
            acc(value, to, at, replace)
            flush(to)

        def wait() -> None:
            while word[0] < self.seq:
                sync()
        return send, wait


def main(argv: list[str] | None = None) -> int:
    """Run every item of the plan with mpi4py; rank 0 prints the results."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("plan", help="the plan (JSON) written by 'vkshmem bench'")
    args = ap.parse_args(argv)
    plan = Plan.load(args.plan)
    import mpi4py
    from mpi4py import MPI

    k = MpiKernels(MPI, plan)
    if k.me == 0:
        lib = MPI.Get_library_version().splitlines()[0].split(",")[0].strip()
        print(META + json.dumps({"impl": "mpi4py", "label": f"mpi4py {mpi4py.__version__}",
                                 "library": lib, "npes": k.n, "domain": "host"}), flush=True)
    for item in plan.items:
        out = k.run(item)
        if out is not None:
            print(MARK + json.dumps({"bench": item.bench, "size": item.size,
                                     "iters": item.iters, "samples": out}), flush=True)
    k.close()
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
