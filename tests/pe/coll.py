"""Collectives against numpy references: broadcast (every root), fcollect, collect (uneven
sizes), alltoall(s), reduce with every op on every dtype it is defined for (and the refusals
where it is not), sum_inscan/sum_exscan; on TEAM_WORLD, a strided split and the 2-D split;
sizes beyond the team scratch (chunking), a long run of back-to-back collectives, argument
errors that fail alike on every PE and write nothing."""

from __future__ import annotations

import functools
import time

import numpy as np
from _common import DTYPES, check, data

from vkshmem import InvalidArgumentError, shmem

me, n = shmem.my_pe(), shmem.n_pes()
W = shmem.TEAM_WORLD
OPS = {"and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor,
       "max": np.maximum, "min": np.minimum, "sum": np.add, "prod": np.multiply}
KINDS = {"and": "iu", "or": "iu", "xor": "iu", "max": "iuf", "min": "iuf", "sum": "iufc",
         "prod": "iufc"}
scratch = W.state.scratch_bytes
case = 0


def seed(pe: int) -> int:
    return 7919 * case + pe


def close(got: np.ndarray, want: np.ndarray, what: str) -> None:
    """Integers exactly; floating point within a tolerance of the dtype (the reference is
    computed in long double, the collective in the dtype, in another order)."""
    dt = got.dtype
    if dt.kind in "iu":
        ok = np.array_equal(got, want)
    else:
        tol = {"float16": 1e-2, "float32": 1e-5, "complex64": 1e-5}.get(dt.name, 1e-12)
        wide = np.clongdouble if dt.kind == "c" else np.longdouble
        err = np.abs(got.astype(wide) - want.astype(wide))
        ok = bool(np.all(err <= tol * np.maximum(1, np.abs(want.astype(wide)))))
    if not ok:
        bad = np.flatnonzero(got != want)[:5]
        check(False, f"{what} ({dt}): first differences at {bad}: got {got[bad]}, "
                     f"want {want[bad]}")


def expect_error(what: str, fn, *args, **kw) -> None:
    try:
        fn(*args, **kw)
    except InvalidArgumentError:
        return
    check(False, f"{what} must raise InvalidArgumentError")


class Pool:
    """A symmetric byte buffer (allocated on the world team) that one team's tests carve
    targets from. ``take`` zeroes the front and syncs the team, so no member writes into it
    before every member has checked the previous result and zeroed."""

    def __init__(self, team: shmem.Team, raw: np.ndarray) -> None:
        self.team, self.raw = team, raw

    def take(self, dt: type, shape: int | tuple[int, ...], fill: int = 0) -> np.ndarray:
        cnt = int(np.prod(shape))
        a = self.raw[:cnt * np.dtype(dt).itemsize].view(dt).reshape(shape)
        a[...] = fill
        self.team.sync()
        return a


def run_team(name: str, team: shmem.Team, pool: Pool, big: bool) -> None:
    """Every collective on ``team`` (called by its members only)."""
    global case
    case = 1_000_000 * ["world", "odd", "row", "col"].index(name)  # alike on the members
    tn, tme = team.n_pes(), team.my_pe()
    wpes = [team.translate_pe(i, W) for i in range(tn)]

    def every(dt: type, cnt: int) -> list[np.ndarray]:
        return [data(dt, cnt, seed(pe)) for pe in wpes]

    for dt in DTYPES:
        dtn = np.dtype(dt).name
        kind = np.dtype(dt).kind
        wide = (np.clongdouble if kind == "c" else np.longdouble) if kind in "fc" else dt
        # broadcast from every root, 37 of 41 elements (the root's target too)
        for root in range(tn):
            case += 1
            tgt = pool.take(dt, 41)
            shmem.broadcast(tgt, data(dt, 37, seed(wpes[tme])), root, 37, team)
            check(np.array_equal(tgt[:37], data(dt, 37, seed(wpes[root]))) and
                  not tgt[37:].any(), f"{name} broadcast {dtn} root {root}")
        # fcollect: 13 each
        case += 1
        tgt = pool.take(dt, 13 * tn + 3)
        shmem.fcollect(tgt, data(dt, 13, seed(wpes[tme])), team=team)
        check(np.array_equal(tgt[:13 * tn], np.concatenate(every(dt, 13))) and
              not tgt[13 * tn:].any(), f"{name} fcollect {dtn}")
        # collect: uneven counts, some zero
        case += 1
        counts = [(3 * i + tn) % 5 for i in range(tn)]
        tgt = pool.take(dt, sum(counts) + 4)
        shmem.collect(tgt, data(dt, counts[tme], seed(wpes[tme])), team=team)
        want = np.concatenate([data(dt, c, seed(pe)) for c, pe in zip(counts, wpes, strict=True)])
        check(np.array_equal(tgt[:want.size], want) and not tgt[want.size:].any(),
              f"{name} collect {dtn} {counts}")
        # alltoall: 5 per PE
        case += 1
        tgt = pool.take(dt, 5 * tn)
        shmem.alltoall(tgt, data(dt, 5 * tn, seed(wpes[tme])), team=team)
        want = np.concatenate([s[5 * tme:5 * tme + 5] for s in every(dt, 5 * tn)])
        check(np.array_equal(tgt, want), f"{name} alltoall {dtn}")
        # alltoalls: 4 per PE, source stride 3, target stride 2 and 1
        for tst in (2, 1):
            case += 1
            tgt = pool.take(dt, 4 * tn * tst)
            shmem.alltoalls(tgt, data(dt, 12 * tn, seed(wpes[tme])), tst, 3, 4, team)
            want = np.zeros(4 * tn * tst, dt)
            for j, s in enumerate(every(dt, 12 * tn)):
                want[4 * j * tst:4 * (j + 1) * tst:tst] = s[12 * tme:12 * tme + 12:3]
            check(np.array_equal(tgt, want), f"{name} alltoalls {dtn} tst={tst}")
        # reductions: every op defined on the dtype; the others are refused on every PE
        for op, uf in OPS.items():
            case += 1
            tgt = pool.take(dt, 29, fill=1)
            if kind not in KINDS[op]:
                expect_error(f"{op} on {dtn}", shmem.reduce, tgt, tgt, op, team=team)
                check((tgt == 1).all(), "a refused reduce wrote its target")
                continue
            srcs = every(dt, 29)
            if op == "prod" and kind == "f":
                srcs = [(1 + s / 8).astype(dt) for s in srcs]  # float16 products in range
            shmem.reduce(tgt, srcs[tme], shmem.OP(op) if case % 2 else op, team=team)
            close(tgt, functools.reduce(uf, [s.astype(wide) for s in srcs]),
                  f"{name} reduce {op}")
        # the per-op helpers: in place (source is target), and with a size
        if kind in "iu":
            case += 1
            tgt = pool.take(dt, 29)
            tgt[...] = data(dt, 29, seed(wpes[tme]))
            shmem.xor_reduce(tgt, tgt, team=team)
            check(np.array_equal(tgt, functools.reduce(np.bitwise_xor, every(dt, 29))),
                  f"{name} in-place xor_reduce {dtn}")
        if kind in "iuf":
            case += 1
            tgt = pool.take(dt, 29)
            shmem.max_reduce(tgt, data(dt, 29, seed(wpes[tme])), 20, team)
            check(np.array_equal(tgt[:20], functools.reduce(np.maximum, every(dt, 20))) and
                  not tgt[20:].any(), f"{name} max_reduce {dtn}")
        # scans
        for inclusive in (True, False):
            case += 1
            tgt = pool.take(dt, 19)
            fn = shmem.sum_inscan if inclusive else shmem.sum_exscan
            fn(tgt, data(dt, 19, seed(wpes[tme])), team=team)
            want = np.zeros(19, wide)
            for s in every(dt, 19)[:tme + 1 if inclusive else tme]:
                want = np.add(want, s.astype(wide))
            close(tgt, want, f"{name} {'inscan' if inclusive else 'exscan'}")

    # beyond the team scratch (chunks): float64, a 16-byte dtype, a 4-byte one
    if big:
        for dt, cnt in ((np.float64, scratch // 8 + 1001), (np.complex128, 3001),
                        (np.int32, 20011)):
            case += 1
            srcs = every(dt, cnt)
            tgt = pool.take(dt, cnt)
            shmem.sum_reduce(tgt, srcs[tme], team=team)
            close(tgt, functools.reduce(np.add, srcs), f"{name} big sum_reduce {cnt}")
            if np.dtype(dt).kind != "c":
                tgt = pool.take(dt, cnt)
                shmem.max_reduce(tgt, srcs[tme], team=team)
                check(np.array_equal(tgt, functools.reduce(np.maximum, srcs)),
                      f"{name} big max_reduce")
            tgt = pool.take(dt, cnt)
            tgt[...] = srcs[tme]
            shmem.sum_reduce(tgt, tgt, team=team)
            close(tgt, functools.reduce(np.add, srcs), f"{name} big in-place sum_reduce")
            tgt = pool.take(dt, cnt)
            shmem.sum_inscan(tgt, srcs[tme], team=team)
            close(tgt, functools.reduce(np.add, srcs[:tme + 1]), f"{name} big inscan")
            tgt = pool.take(dt, cnt)
            shmem.sum_exscan(tgt, srcs[tme], team=team)
            close(tgt, functools.reduce(np.add, [0 * srcs[0], *srcs[:tme]]),
                  f"{name} big exscan")
            tgt = pool.take(dt, cnt)
            shmem.broadcast(tgt, srcs[tme], tn - 1, team=team)
            check(np.array_equal(tgt, srcs[-1]), f"{name} big broadcast")
            per = cnt // 3
            tgt = pool.take(dt, per * tn)
            shmem.fcollect(tgt, srcs[tme][:per], team=team)
            check(np.array_equal(tgt, np.concatenate([s[:per] for s in srcs])),
                  f"{name} big fcollect")
            tgt = pool.take(dt, per * tn)
            shmem.alltoall(tgt, data(dt, per * tn, seed(wpes[tme])), team=team)
            want = np.concatenate([data(dt, per * tn, seed(pe))[per * tme:per * (tme + 1)]
                                   for pe in wpes])
            check(np.array_equal(tgt, want), f"{name} big alltoall")
            blk = scratch // (2 * tn * np.dtype(dt).itemsize) + 7  # > one chunk per PE
            tgt = pool.take(dt, 2 * blk * tn)
            shmem.alltoalls(tgt, data(dt, blk * tn, seed(wpes[tme])), 2, 1, blk, team)
            want = np.zeros(2 * blk * tn, dt)
            for j, pe in enumerate(wpes):
                want[2 * blk * j:2 * blk * (j + 1):2] = \
                    data(dt, blk * tn, seed(pe))[blk * tme:blk * (tme + 1)]
            check(np.array_equal(tgt, want), f"{name} big alltoalls")

    # back to back, no sync in between: every call has its own row of the target
    case += 1
    rounds, width = 60, 8 * tn
    out = pool.take(np.int64, (rounds, width))
    mine = data(np.int64, width, seed(wpes[tme])) % 1000
    for k in range(rounds):
        row = out[k]
        op = k % 6
        if (k + tme) % 4 == 0:
            time.sleep(0.0003)  # let members drift apart
        if op == 0:
            shmem.broadcast(row, mine, k % tn, team=team)
        elif op == 1:
            shmem.sum_reduce(row, mine + k, team=team)
        elif op == 2:
            shmem.fcollect(row, mine[:8] * k, team=team)
        elif op == 3:
            shmem.alltoall(row, mine - k, team=team)
        elif op == 4:
            shmem.collect(row, mine[:tme % 3 + 1], team=team)
        else:
            shmem.sum_inscan(row, mine * k, team=team)
    team.sync()
    alls = [data(np.int64, width, seed(pe)) % 1000 for pe in wpes]
    for k in range(rounds):
        op = k % 6
        if op == 0:
            want = alls[k % tn]
        elif op == 1:
            want = sum(a + k for a in alls)
        elif op == 2:
            want = np.concatenate([a[:8] * k for a in alls])
        elif op == 3:
            want = np.concatenate([(a - k)[8 * tme:8 * tme + 8] for a in alls])
        elif op == 4:
            parts = np.concatenate([a[:i % 3 + 1] for i, a in enumerate(alls)])
            want = np.zeros(width, np.int64)
            want[:parts.size] = parts
        else:
            want = sum(a * k for a in alls[:tme + 1])
        check(np.array_equal(out[k], want), f"{name} back-to-back #{k} (op {op})")


def aliasing(name: str, team: shmem.Team, pool: Pool) -> None:
    """Sources inside the target: in place (own block, or the whole target) and overlapping
    elsewhere (detached before peers write there), small and beyond the scratch."""
    tn, tme = team.n_pes(), team.my_pe()
    vals = [np.arange(40, dtype=np.int64) * (i + 1) for i in range(tn)]
    # fcollect / collect with the source in place (this PE's own block)
    tgt = pool.take(np.int64, 40 * tn)
    tgt[40 * tme:40 * (tme + 1)] = vals[tme]
    shmem.fcollect(tgt, tgt[40 * tme:40 * (tme + 1)], team=team)
    check(np.array_equal(tgt, np.concatenate(vals)), f"{name} in-place fcollect")
    counts = [i % 3 + 1 for i in range(tn)]
    tgt = pool.take(np.int64, 40 * tn)
    start = sum(counts[:tme])
    tgt[start:start + counts[tme]] = vals[tme][:counts[tme]]
    shmem.collect(tgt, tgt[start:start + counts[tme]], team=team)
    want = np.concatenate([v[:c] for v, c in zip(vals, counts, strict=True)])
    check(np.array_equal(tgt[:want.size], want), f"{name} in-place collect")
    # a source anywhere else in the target is refused (peers may write there first)
    tgt = pool.take(np.int64, 40 * tn + 1, fill=5)
    expect_error("overlapping fcollect", shmem.fcollect, tgt, tgt[1:41], team=team)
    if tn > 1:  # each PE's one element sits in its right neighbour's place
        other = (tme + 1) % tn
        expect_error("overlapping collect", shmem.collect, tgt, tgt[other:other + 1],
                     team=team)
    check((tgt == 5).all(), "a refused fcollect/collect wrote its target")
    # reductions, scans and broadcasts detach a source that overlaps the target
    for size in (40, 70000):
        mine = np.arange(size, dtype=np.int64) * (tme + 1)
        tgt = pool.take(np.int64, size + 1)
        tgt[1:] = mine
        shmem.sum_reduce(tgt, tgt[1:], size, team)  # shifted by one element
        check(np.array_equal(tgt[:size], sum(np.arange(size, dtype=np.int64) * (i + 1)
                                            for i in range(tn))),
              f"{name} overlapping sum_reduce {size}")
        tgt = pool.take(np.int64, size + 1)
        tgt[1:] = mine
        shmem.sum_inscan(tgt, tgt[1:], size, team)
        check(np.array_equal(tgt[:size], sum(np.arange(size, dtype=np.int64) * (i + 1)
                                            for i in range(tme + 1))),
              f"{name} overlapping sum_inscan {size}")
        # broadcast: the root's source is its target, or overlaps it
        for shift in (0, 1):
            tgt = pool.take(np.int64, size + 1)
            tgt[shift:shift + size] = mine
            team.sync()  # the root writes into the others' targets
            shmem.broadcast(tgt, tgt[shift:shift + size], tn - 1, size, team)
            check(np.array_equal(tgt[:size], np.arange(size, dtype=np.int64) * tn),
                  f"{name} broadcast from the target itself, shift {shift}, {size}")


def errors(team: shmem.Team, pool: Pool) -> None:
    """Bad arguments: InvalidArgumentError on every member, nothing written, no hang."""
    tn = team.n_pes()
    tgt = pool.take(np.int32, 8, fill=7)
    other = pool.raw[64:].view(np.complex64)[:2]
    src = np.arange(8, dtype=np.int32)
    expect_error("dtype mismatch", shmem.broadcast, tgt, src.astype(np.int64), 0, team=team)
    expect_error("root out of range", shmem.broadcast, tgt, src, tn, team=team)
    expect_error("size too big", shmem.broadcast, tgt, src, 0, 9, team)
    expect_error("size too big", shmem.sum_reduce, tgt, src, 9, team)
    expect_error("negative size", shmem.sum_reduce, tgt, src, -1, team)
    expect_error("fcollect too big", shmem.fcollect, tgt, src, 8 // tn + 1, team)
    if tn > 1:
        odd_len = pool.raw[256:256 + 4 * (tn + 1)].view(np.int32)  # tn + 1 elements
        expect_error("alltoall remainder", shmem.alltoall, odd_len,
                     np.zeros(tn + 1, np.int32), None, team)
    expect_error("alltoall overlap", shmem.alltoall, tgt, tgt, 8 // tn, team)
    expect_error("bad op", shmem.reduce, tgt, src, "avg", team=team)
    expect_error("float and", shmem.and_reduce, tgt.view(np.float32), src.view(np.float32),
                 team=team)
    expect_error("complex max", shmem.max_reduce, other, np.zeros(2, np.complex64), team=team)
    expect_error("scan of bool", shmem.sum_inscan, tgt.view(np.bool_), np.zeros(32, np.bool_),
                 team=team)
    expect_error("not symmetric", shmem.fcollect, np.zeros(8 * tn, np.int32), src[:1],
                 team=team)
    ro = tgt.view()
    ro.flags.writeable = False
    expect_error("read-only target", shmem.sum_reduce, ro, src, team=team)
    expect_error("strided target", shmem.broadcast, pool.raw.view(np.int32)[8:40:2], src, 0,
                 team=team)
    expect_error("zero stride", shmem.alltoalls, tgt, src, 0, 1, team=team)
    expect_error("bad team", shmem.sum_reduce, tgt, src, team=object())
    if tn > 1:
        # each count fits alone, the total does not: every member refuses alike
        expect_error("collect total", shmem.collect, tgt, src[:8 // tn + 1], team=team)
    check((tgt == 7).all(), f"an erroneous call wrote its target: {tgt}")
    team.sync()
    shmem.broadcast(tgt, src, tn - 1, team=team)  # the team still works afterwards
    check(np.array_equal(tgt, src), "broadcast after errors")


# 2-D and Fortran-order arrays, default arguments (team=None, size=None)
a = shmem.zeros((3, 4), np.float64)
shmem.broadcast(a, np.arange(12.0).reshape(3, 4) + me, n - 1)
check(np.array_equal(a, np.arange(12.0).reshape(3, 4) + n - 1), "2-D broadcast")
f = shmem.zeros((4, 3), np.float64).T
shmem.sum_reduce(f, np.ones((3, 4)))
check((f == n).all(), "Fortran-order reduce")
shmem.barrier_all()

small = 1 << 16
big_bytes = 12 * scratch + (1 << 20)
pools = {name: shmem.zeros(size, np.uint8)
         for name, size in (("world", big_bytes), ("odd", big_bytes), ("row", small),
                            ("col", small))}
errors(W, Pool(W, pools["world"]))
expect_error("TEAM_INVALID", shmem.sum_reduce, a, a, team=shmem.TEAM_INVALID)
run_team("world", W, Pool(W, pools["world"]), big=True)
aliasing("world", W, Pool(W, pools["world"]))
if n >= 3:
    odd = W.split_strided(1, 2)
    if odd:
        run_team("odd", odd, Pool(odd, pools["odd"]), big=n == 4)
        aliasing("odd", odd, Pool(odd, pools["odd"]))
        errors(odd, Pool(odd, pools["odd"]))
        odd.destroy()
    else:
        expect_error("not a member", shmem.sum_reduce, a, a, team=odd)
x, y = W.split_2d(2)
run_team("row", x, Pool(x, pools["row"]), big=False)
run_team("col", y, Pool(y, pools["col"]), big=False)
x.destroy()
y.destroy()
shmem.barrier_all()

# the offload hook, end to end: when every member routes through one transport object and
# its collective() offers an implementation, the core calls it instead of its own algorithm
# (not on PEs spread over hosts, where a PE reaches its own host by shm, others otherwise)
if len({id(t) for t in W.state.routes}) == 1:
    transport_cls = type(W.state.routes[0])
    calls = []

    def offered(self: object, name: str, team_pes: tuple[int, ...]) -> object:
        if name != "fcollect":
            return None
        calls.append((name, team_pes))
        return lambda args: calls.append(args)

    transport_cls.collective = offered
    try:
        fresh = W.split_strided(0, 1)  # a new team: nothing cached yet
        tgt = pools["world"][:64 * n].view(np.int64)
        tgt[...] = -1
        fresh.sync()
        shmem.fcollect(tgt, np.full(2, me, np.int64), team=fresh)
        shmem.fcollect(tgt, np.full(2, me, np.int64), 1, fresh)
        check((tgt == -1).all(), f"an offloaded fcollect ran the core algorithm too: {tgt}")
        check(calls[0] == ("fcollect", tuple(range(n))) and len(calls) == 3,
              f"offload asked once per team and name, then used: {calls}")
        got = calls[1]
        check(got.name == "fcollect" and got.me == me and got.team_pes == tuple(range(n)) and
              got.nelems == 2 and got.dtype == np.dtype(np.int64).str and
              got.target[1] == shmem.offset_of(tgt)[1] and got.target_nbytes == 16 * n and
              bytes(got.source) == np.full(2, me, np.int64).tobytes() and calls[2].nelems == 1,
              f"offload arguments: {got}")
        fresh.sync()  # the fake implementation synchronises nothing
        shmem.broadcast(tgt, np.arange(8 * n, dtype=np.int64), 0, team=fresh)  # not offered
        check(np.array_equal(tgt, np.arange(8 * n)), "a collective the transport declines")
        fresh.destroy()
    finally:
        del transport_cls.collective
shmem.barrier_all()
print(f"routes: {sorted({r.name for r in shmem._state.rt.routing.routes})}")
print(f"coll ok: {n} PEs")
