"""Timing for the probes in this folder (run as scripts, which find this module beside them)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def per_call(fn: Callable[[], object], n: int = 50, warm: int = 20) -> float:
    """Microseconds per call of ``fn``: the median of 5 rounds of ``n`` calls, after ``warm``
    calls."""
    for _ in range(warm):
        fn()
    rounds = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        rounds.append((time.perf_counter() - t0) / n)
    return statistics.median(rounds) * 1e6


def best_per_call(fn: Callable[[], object], n: int, rounds: int = 3, warm: int = 1) -> float:
    """Microseconds per call of ``fn``: the best of ``rounds`` rounds of ``n`` calls, each
    after ``warm`` calls."""
    best = float("inf")
    for _ in range(rounds):
        for _ in range(warm):
            fn()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n)
    return best * 1e6


def median_call(fn: Callable[[], object], n: int = 3000, warm: int = 200) -> float:
    """Microseconds of one call of ``fn``: the median of ``n`` calls timed one by one, after
    ``warm`` calls."""
    for _ in range(warm):
        fn()
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e6
