"""The compiled collectives, strided RMA and locks (vkshmem.core._fast) against their Python
functions, at any number of PEs: every call is made twice, once through the entry (C on the
shm path) and once through its ``__wrapped__`` Python function, and the results must be
identical bit for bit (same algorithm, same order of operations). In a third round the PEs
mix the two (PE ``p`` takes C when ``p + round`` is even), which only works if the C and
Python algorithms speak the same protocol (flags, scratch regions, phases). Sizes cover one
phase, several chunks of the scratch and the ring; locks are contended by every PE."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from _common import check, data

from vkshmem import InvalidArgumentError, shmem
from vkshmem._api import collectives, lock, reductions, rma
from vkshmem._api.collargs import team_of

me, n = shmem.my_pe(), shmem.n_pes()
W = shmem.TEAM_WORLD
scratch = W.state.scratch_bytes
BIG = max(3 * scratch // 8, 70_000)  # elements: beyond the scratch, and the ring's minimum
pool = shmem.zeros(n * BIG + 64, np.float64)  # targets are carved from this (as bytes)
case = 0


def target(dtype: Any, count: int) -> np.ndarray:
    """A zeroed symmetric array of ``count`` elements (every PE ready before any writes)."""
    t = pool.view(np.uint8)[:count * np.dtype(dtype).itemsize].view(dtype)
    t[...] = 0
    shmem.barrier_all()
    return t


def python(entry: Any) -> Callable[..., Any]:
    """The entry's Python function with the Python algorithms (on TEAM_WORLD the Python layer
    would otherwise hand the work to the team's NativeTeam, in C)."""
    ct = team_of(None)

    def call(*args: Any, **kw: Any) -> Any:
        native, ct.native = ct.native, None
        try:
            return entry.__wrapped__(*args, **kw)
        finally:
            ct.native = native

    call.__name__ = entry.__name__
    return call


def variants(entry: Any) -> list[Callable[..., Any]]:
    """The entry, its Python function, and this PE's pick for the mixed rounds."""
    py = python(entry)
    return [entry, py, entry if (me + case) % 2 == 0 else py, py if (me + case) % 2 == 0 else entry]


def same(run: Callable[[Callable[..., Any]], np.ndarray], entry: Any, what: str) -> None:
    """``run(fn)`` gives the same bytes with every variant of ``entry``."""
    global case
    case += 1
    results = [run(fn).copy() for fn in variants(entry)]
    for i, r in enumerate(results[1:], 1):
        check(r.tobytes() == results[0].tobytes(), f"{what}: variant {i} differs from C")


def alltoalls() -> None:
    """alltoall, and alltoalls with either stride (a target stride other than 1 goes through
    the scratch: 3000 elements take several chunks of a small one)."""
    for dt, cnt, tst, sst in ((np.int64, 1, 1, 1), (np.float32, 5, 1, 1), (np.uint8, 33, 1, 1),
                              (np.int16, 7, 1, 3), (np.float64, 0, 1, 1), (np.int64, 3, 2, 1),
                              (np.float32, 5, 3, 2), (np.int64, 3000, 2, 1)):
        src = data(dt, max(1, n * cnt * sst), 100 + me)

        def run(fn: Callable[..., Any], dt: Any = dt, cnt: int = cnt, tst: int = tst,
                sst: int = sst, src: np.ndarray = src) -> np.ndarray:
            t = target(dt, n * cnt * tst)
            if fn.__name__ == "alltoalls":
                fn(t, src, tst, sst, cnt)
            else:
                fn(t, src[:n * cnt], cnt)
            shmem.barrier_all()
            return t

        entry = collectives.alltoalls if tst * sst > 1 else collectives.alltoall
        same(run, entry, f"alltoall {np.dtype(dt)} x {cnt} tst {tst} sst {sst}")


def collects() -> None:
    for dt, base in ((np.int32, 3), (np.float64, 0), (np.uint16, 1000)):
        counts = [(base + 2 * p) % 7 + (base if p == n - 1 else 0) for p in range(n)]
        src = data(dt, counts[me], 200 + me)

        def run(fn: Callable[..., Any], dt: Any = dt, src: np.ndarray = src,
                total: int = sum(counts)) -> np.ndarray:
            t = target(dt, total + 3)
            fn(t, src)
            shmem.barrier_all()
            return t

        same(run, collectives.collect, f"collect {np.dtype(dt)} {counts}")

    def in_place(fn: Callable[..., Any]) -> np.ndarray:  # the source is this PE's own block
        t = target(np.int64, 4 * n)
        t[4 * me:4 * me + 4] = np.arange(4) + 10 * me
        shmem.barrier_all()
        fn(t, t[4 * me:4 * me + 4])
        shmem.barrier_all()
        return t

    same(in_place, collectives.collect, "collect in place")
    t = target(np.int64, n)
    for fn in (collectives.collect, python(collectives.collect)):
        try:  # too many elements in all: every PE raises after the counts' exchange
            fn(t, np.ones(1 if me else 2, np.int64))
            check(False, "collect beyond the target must raise")
        except InvalidArgumentError as exc:
            check(n == 1 or ("contribute" in str(exc) and f"{n + 1} elements" in str(exc)),
                  str(exc))
        shmem.barrier_all()


def scans_and_reductions() -> None:
    sizes = (1, 17, 4096, BIG)
    for dt in (np.int64, np.float64, np.int32, np.uint8, np.float32):
        for cnt in sizes:
            src = data(dt, cnt, 300 + me)
            if np.dtype(dt).kind == "f":
                src = np.round(src * 8).astype(dt)  # exact sums: any order agrees

            for entry in (reductions.sum_inscan, reductions.sum_exscan, reductions.sum_reduce,
                          reductions.max_reduce):
                def run(fn: Callable[..., Any], dt: Any = dt, cnt: int = cnt,
                        src: np.ndarray = src) -> np.ndarray:
                    t = target(dt, cnt)
                    fn(t, src)
                    shmem.barrier_all()
                    return t

                same(run, entry, f"{entry.__name__} {np.dtype(dt)} x {cnt}")

    def overlapping(fn: Callable[..., Any]) -> np.ndarray:  # source = target shifted by 1
        t = target(np.int64, BIG + 1)
        t[1:] = np.arange(BIG) + me
        shmem.barrier_all()
        fn(t[:BIG], t[1:])
        shmem.barrier_all()
        return t

    for entry in (reductions.sum_reduce, reductions.sum_inscan):
        same(overlapping, entry, f"{entry.__name__} overlapping")


def strided() -> None:
    peer = (me + 1) % n
    for dt, tst, sst, cnt in ((np.int64, 2, 3, 5), (np.uint8, 1, 4, 9), (np.float32, 3, 1, 4),
                              (np.int16, 1, 1, 6)):
        src = data(dt, sst * cnt + 2, 400 + me)

        def put(fn: Callable[..., Any], dt: Any = dt, tst: int = tst, sst: int = sst,
                cnt: int = cnt, src: np.ndarray = src) -> np.ndarray:
            t = target(dt, tst * cnt + 1)
            fn(t, src, peer, tst, sst, cnt)
            shmem.barrier_all()
            return t

        def get(fn: Callable[..., Any], dt: Any = dt, tst: int = tst, sst: int = sst,
                cnt: int = cnt, src: np.ndarray = src) -> np.ndarray:
            t = target(dt, sst * cnt + 2)
            t[...] = src
            shmem.barrier_all()
            out = np.zeros(tst * cnt + 1, dt)
            fn(out, t, peer, tst, sst)
            shmem.barrier_all()
            return out

        same(put, rma.iput, f"iput {np.dtype(dt)} tst {tst} sst {sst}")
        same(get, rma.iget, f"iget {np.dtype(dt)} tst {tst} sst {sst}")


def locks() -> None:
    """Every PE adds 1 to a counter on PE 0 under the lock, 200 times, taking and releasing
    it alternately in C and in Python; test_lock while held by this PE says held."""
    word = shmem.new_lock()
    count = shmem.zeros(1, np.int64)
    one = np.ones(1, np.int64)
    got = np.zeros(1, np.int64)
    pairs = [(lock.set_lock, lock.clear_lock), (lock.set_lock.__wrapped__, lock.clear_lock),
             (lock.set_lock, lock.clear_lock.__wrapped__)]
    for i in range(200):
        take, give = pairs[(i + me) % 3]
        take(word)
        shmem.get(got, count, 0)
        shmem.put(count, got + one, 0)
        shmem.quiet()
        give(word)
    shmem.barrier_all()
    shmem.get(got, count, 0)
    check(got[0] == 200 * n, f"lock: counter {got[0]}, want {200 * n}")
    for test in (lock.test_lock, lock.test_lock.__wrapped__):
        if me == 0:
            check(test(word) is False, "test_lock of a free lock takes it")
            check(test(word) is True and lock.test_lock(word) is True, "held: test says so")
            lock.clear_lock(word)
        shmem.barrier_all()
    shmem.del_lock(word)


def teams() -> None:
    """On a team of every PE in order (a NativeTeam: its calls go through the Python layer,
    then C), each collective gives the bytes the compiled TEAM_WORLD entry gives; the Python
    algorithms are not called."""
    from vkshmem.core.collectives import host as core

    team = W.split_strided(0, 1, n)
    check(team.state.native is not None, "a team of shm peers has a NativeTeam")
    src = data(np.int64, 4 * n, 500 + me)
    calls: list[tuple[Callable[..., Any], tuple[Any, ...], int]] = [
        (collectives.alltoall, (src[:2 * n], 2), 2 * n),
        (collectives.alltoalls, (src, 1, 2, 2), 2 * n),
        (collectives.alltoalls, (src, 3, 1, 2), 6 * n),
        (collectives.collect, (src[:me + 1],), n * (n + 1) // 2),
        (reductions.sum_inscan, (src,), 4 * n), (reductions.sum_exscan, (src,), 4 * n),
        (reductions.sum_reduce, (data(np.int64, BIG, me),), BIG),
    ]
    saved = {k: getattr(core, k) for k in ("alltoall", "alltoalls", "collect", "scan", "reduce")}

    def python_called(*args: Any, **kw: Any) -> None:
        raise AssertionError(f"PE {me}: the Python algorithm ran on a NativeTeam")

    for fn, args, count in calls:
        world = target(np.int64, count)
        fn(world, *args)
        world = world.copy()
        t = target(np.int64, count)
        try:
            for k in saved:
                setattr(core, k, python_called)
            fn(t, *args, team=team)
        finally:
            for k, v in saved.items():
                setattr(core, k, v)
        shmem.barrier_all()
        check(t.tobytes() == world.tobytes(), f"{fn.__name__} on a team differs from world")
    team.destroy()


alltoalls()
teams()
collects()
scans_and_reductions()
strided()
locks()
shmem.barrier_all()
print(f"PE {me}: routes: {sorted({r.name for r in shmem._state.rt.routing.routes})}")
print("fast_mixed ok", flush=True)
