"""The compiled all-reduce and scan against the Python algorithms they replace, in one process
and taking turns: run with ``vkshmem run -n 2 benchmarks/fast_vs_python.py``.

On a loaded machine two separate runs (the code before and after a change) can differ by
several times from one minute to the next; here each sample of the C path (``sum_reduce``,
``sum_inscan``: the compiled entries) is followed by one of the Python algorithm
(``vkshmem.core.collectives.host.reduce``/``scan`` after the same argument handling), so both meet
the same load. PE 0 prints the median over ``--rounds`` (7) of the mean time per call of each,
float64, at 64 KiB, 1 MiB and 4 MiB (scans: 64 KiB); each PE is pinned to its own core when
there are enough.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable

import numpy as np

from vkshmem import shmem
from vkshmem._api.collargs import prep, team_of
from vkshmem.core.collectives import host as core

me, n = shmem.my_pe(), shmem.n_pes()
rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 7
if len(os.sched_getaffinity(0)) >= n:
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[me]})
KIB, MIB = 1 << 10, 1 << 20
tgt = shmem.zeros(4 * MIB // 8, np.float64)
src = np.random.default_rng(me).integers(0, 100, 4 * MIB // 8).astype(np.float64)
ct = team_of(None)


def py_reduce(t: np.ndarray, s: np.ndarray) -> None:
    _dt, t, s, seg, off = prep(ct, t, s, "reduce")
    core.reduce(ct, t, seg, off, s, np.add)


def py_inscan(t: np.ndarray, s: np.ndarray) -> None:
    _dt, t, s, seg, off = prep(ct, t, s, "sum_inscan")
    core.scan(ct, t, seg, off, s, True)


CASES: list[tuple[str, int, int, Callable[..., None], Callable[..., None]]] = [
    ("sum_reduce", size, iters, shmem.sum_reduce, py_reduce)
    for size, iters in ((64 * KIB, 200), (MIB, 40), (4 * MIB, 10))
] + [("sum_inscan", 64 * KIB, 200, shmem.sum_inscan, py_inscan)]
times: dict[tuple[str, int, str], list[float]] = {}
for _ in range(rounds):
    for name, size, iters, fast, slow in CASES:
        k = size // 8
        for side, fn in (("C", fast), ("Python", slow)):
            shmem.barrier_all()
            t0 = time.perf_counter()
            for _ in range(iters):
                fn(tgt[:k], src[:k])
            times.setdefault((name, size, side), []).append((time.perf_counter() - t0) / iters)
if me == 0:
    print(f"\n{'operation':24s} {'C (us)':>10s} {'Python (us)':>12s}")
    for name, size, _iters, _f, _s in CASES:
        label = f"{name} {size // KIB} KiB" if size < MIB else f"{name} {size // MIB} MiB"
        c, p = (sorted(times[(name, size, s)])[rounds // 2] * 1e6 for s in ("C", "Python"))
        print(f"{label:24s} {c:10.1f} {p:12.1f}")
