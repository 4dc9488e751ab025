"""What the latency benchmarks share (``latency.py``, ``collectives_more.py`` and their mpi4py
twins ``mpi_rma.py``, ``mpi_collectives_more.py``): the command-line knobs and the timing loop,
so both sides of a comparison measure the same way."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable

__all__ = ["knobs", "make_timer", "pin"]


def knobs() -> tuple[int, float]:
    """``(reps, scale)`` from ``--reps`` (default 5) and ``--iters-scale`` (default 1.0)."""
    argv = sys.argv
    reps = int(argv[argv.index("--reps") + 1]) if "--reps" in argv else 5
    scale = float(argv[argv.index("--iters-scale") + 1]) if "--iters-scale" in argv else 1.0
    return reps, scale


def pin(me: int, n: int) -> None:
    """Pin rank ``me`` to its own core when there are ``n`` (as MPI launchers bind), unless
    ``--no-pin`` is given (which suits a machine shared with other work)."""
    if "--no-pin" not in sys.argv and len(os.sched_getaffinity(0)) >= n:
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[me]})


def make_timer(me: int, reps: int, scale: float, barrier: Callable[[], object],
               slowest: Callable[[float], float]) -> Callable[..., float]:
    """``timed(fn, iters, everyone=False)``: the median over ``reps`` loops of the mean time per
    call of ``fn`` on rank 0, or with ``everyone`` (collectives: every rank calls it) on the
    slowest rank (``slowest``: the maximum over ranks, collective); ``barrier`` separates the
    loops."""

    def timed(fn: Callable[[], object], iters: int, everyone: bool = False) -> float:
        iters = max(10, int(iters * scale))
        active = everyone or me == 0
        for _ in range(min(100, iters)):
            if active:
                fn()
        times = []
        for _ in range(reps):
            barrier()
            t0 = time.perf_counter()
            if active:
                for _ in range(iters):
                    fn()
            times.append((time.perf_counter() - t0) / iters)
        barrier()
        mine = sorted(times)[reps // 2]
        return slowest(mine) if everyone else mine

    return timed
