"""Set-wide tests and waits against the single-word ``test``: µs per call, one process per
PE, taking turns so every row meets the same load. Run with
``vkshmem run -n 1 benchmarks/sync_set.py`` (or ``-n 2``; PE 0 prints the table).

Each row is the median over ``--rounds`` (7) of the mean time per call of ``--iters`` (20000)
calls on a symmetric int64 array of ``--n`` (8) elements, CMP.EQ against a plain int, status
None (and a list of ints where marked); the ``_vector`` forms take a list of ints (or an int64
array where marked). ``wait_until_*`` wait on a set that already holds,
so they measure the call, not a wait. ``--python`` also times the Python functions the
compiled entries fall back to (``__wrapped__``).
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable

import numpy as np

from vkshmem import shmem


def arg(name: str, default: int) -> int:
    return int(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else default


me = shmem.my_pe()
rounds, iters, n = arg("--rounds", 7), arg("--iters", 20000), arg("--n", 8)
EQ = shmem.CMP.EQ
word = shmem.zeros(1, np.int64)
ivars = shmem.zeros(n, np.int64)
ivars[n // 2] = 1  # any/some: one index holds
ones = shmem.ones(n, np.int64)
status = [0] * n
values = [1] * n
values_np = np.ones(n, np.int64)
CASES: list[tuple[str, Callable[[], object]]] = [
    ("test", lambda: shmem.test(word, EQ, 0)),
    ("test_any", lambda: shmem.test_any(ivars, EQ, 1)),
    ("test_some", lambda: shmem.test_some(ivars, EQ, 1)),
    ("test_all", lambda: shmem.test_all(ones, EQ, 1)),
    ("test_any status=list", lambda: shmem.test_any(ivars, EQ, 1, status)),
    ("test_any_vector", lambda: shmem.test_any_vector(ivars, EQ, values)),
    ("test_some_vector", lambda: shmem.test_some_vector(ivars, EQ, values)),
    ("test_all_vector", lambda: shmem.test_all_vector(ones, EQ, values)),
    ("test_any_vector (array)", lambda: shmem.test_any_vector(ivars, EQ, values_np)),
    ("test_all_vector (array)", lambda: shmem.test_all_vector(ones, EQ, values_np)),
    ("wait_until (holds)", lambda: shmem.wait_until(word, EQ, 0)),
    ("wait_until_any", lambda: shmem.wait_until_any(ivars, EQ, 1)),
    ("wait_until_some", lambda: shmem.wait_until_some(ivars, EQ, 1)),
    ("wait_until_all", lambda: shmem.wait_until_all(ones, EQ, 1)),
    ("wait_until_any_vector", lambda: shmem.wait_until_any_vector(ivars, EQ, values)),
    ("wait_until_some_vector", lambda: shmem.wait_until_some_vector(ivars, EQ, values)),
    ("wait_until_all_vector", lambda: shmem.wait_until_all_vector(ones, EQ, values)),
]
if "--python" in sys.argv:
    py = {name: getattr(getattr(shmem, name), "__wrapped__", getattr(shmem, name)) for name in (
        "test", "test_any", "test_some", "test_all")}
    CASES += [
        ("test [Python]", lambda: py["test"](word, EQ, 0)),
        ("test_any [Python]", lambda: py["test_any"](ivars, EQ, 1)),
        ("test_some [Python]", lambda: py["test_some"](ivars, EQ, 1)),
        ("test_all [Python]", lambda: py["test_all"](ones, EQ, 1)),
    ]
times: dict[str, list[float]] = {}
for _ in range(rounds):
    for name, fn in CASES:
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        times.setdefault(name, []).append((time.perf_counter() - t0) / iters * 1e6)
# the loop's own cost (a lambda call), to subtract
t0 = time.perf_counter()
nop = lambda: None  # noqa: E731
for _ in range(iters):
    nop()
loop = (time.perf_counter() - t0) / iters * 1e6
shmem.barrier_all()
if me == 0:
    base = statistics.median(times["test"])
    print(f"{shmem.n_pes()} PE(s), int64[{n}], median of {rounds} x {iters} calls "
          f"(a lambda call, {loop:.3f} us, included)")
    print(f"{'call':<28}{'us/call':>9}{'x test':>8}")
    for name, _fn in CASES:
        t = statistics.median(times[name])
        print(f"{name:<28}{t:>9.3f}{t / base:>8.2f}")
