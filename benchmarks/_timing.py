"""What the latency benchmarks share (``latency.py``, ``collectives_more.py`` and their mpi4py
twins ``mpi_rma.py``, ``mpi_collectives_more.py``): the command-line knobs and the timing loop,
so both sides of a comparison measure the same way."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["knobs", "make_timer", "pin", "report", "shmem_timer"]


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


def shmem_timer(shmem: Any, reps: int, scale: float) -> Callable[..., float]:
    """Collective (it allocates a symmetric word): :func:`make_timer` for vkshmem PEs."""
    slowest = shmem.zeros(1, np.float64)

    def max_over_pes(x: float) -> float:
        shmem.max_reduce(slowest, np.array([x]))
        shmem.barrier_all()
        return float(slowest[0])

    return make_timer(shmem.my_pe(), reps, scale, shmem.barrier_all, max_over_pes)


def report(rows: dict[str, float], meta: dict[str, Any], title: str,
           sizes: dict[str, int] | None = None) -> None:
    """Print ``rows`` (seconds per call) in microseconds: one JSON object (``meta`` + ``us``)
    with ``--json``, else a table under ``title`` (with GB/s for the rows in ``sizes``)."""
    us = {k: v * 1e6 for k, v in rows.items()}
    if "--json" in sys.argv:
        print(json.dumps({**meta, "us": us}))
        return
    width = max(20, *(len(k) + 1 for k in us))
    print(f"\n{title}")
    print(f"{'operation':{width}s} {'latency (us)':>14s}")
    for name, t in us.items():
        gbs = f"   {sizes[name] / (t * 1e-6) / 1e9:.2f} GB/s" if sizes and name in sizes else ""
        print(f"{name:{width}s} {t:14.2f}{gbs}")
