"""Non-blocking fetching AMOs (checked after quiet) on int32/int64/uint32/uint64 and fetch/swap
on float32/float64, with random operands; and the other OpenSHMEM 1.6 additions: ibput/ibget
against numpy references, pe_quiet, query_initialized."""

from __future__ import annotations

import numpy as np
from _common import check, data

from vkshmem import InvalidArgumentError, shmem

me, n = shmem.my_pe(), shmem.n_pes()
right, left = (me + 1) % n, (me - 1) % n
W = 10  # words per dtype


def one(x: object, dt: type) -> np.ndarray:
    return np.array([x], dt)


# -- every fetching *_nbi form on the right neighbour's words -----------------------------------
for i, dt in enumerate((np.int32, np.int64, np.uint32, np.uint64)):
    words = shmem.zeros(W, dt)
    words[:] = data(dt, W, seed=100 * i + me)
    shmem.barrier_all()
    theirs = data(dt, W, seed=100 * i + right)  # right's words before the ops
    vals = data(dt, W, seed=100 * i + 50 + me)
    f = [np.zeros(1, dt) for _ in range(W)]
    shmem.atomic_fetch_nbi(f[0], words[0:1], right)
    shmem.atomic_swap_nbi(f[1], words[1:2], vals[1], right)
    shmem.atomic_compare_swap_nbi(f[2], words[2:3], theirs[2], vals[2], right)  # hit
    shmem.atomic_compare_swap_nbi(f[3], words[3:4], theirs[3] ^ dt(1), vals[3], right)  # miss
    shmem.atomic_fetch_inc_nbi(f[4], words[4:5], right)
    shmem.atomic_fetch_add_nbi(f[5], words[5:6], vals[5], right)
    shmem.atomic_fetch_and_nbi(f[6], words[6:7], vals[6], right)
    shmem.atomic_fetch_or_nbi(f[7], words[7:8], vals[7], right)
    shmem.atomic_fetch_xor_nbi(f[8], words[8:9], vals[8], right)
    shmem.atomic_fetch_op_nbi(f[9], words[9:10], vals[9], shmem.AMO.ADD, right)
    shmem.quiet()
    for j in range(W):
        check(f[j][0] == theirs[j], f"{np.dtype(dt)} fetch {j}: {f[j][0]} != {theirs[j]}")
    shmem.barrier_all()
    # what my left neighbour's operations left in my words
    orig = data(dt, W, seed=100 * i + me)
    lv = data(dt, W, seed=100 * i + 50 + left)
    expect = orig.copy()
    expect[1] = lv[1]
    expect[2] = lv[2]
    expect[4] = (one(orig[4], dt) + one(1, dt))[0]
    expect[5] = (one(orig[5], dt) + one(lv[5], dt))[0]
    expect[6] = orig[6] & lv[6]
    expect[7] = orig[7] | lv[7]
    expect[8] = orig[8] ^ lv[8]
    expect[9] = (one(orig[9], dt) + one(lv[9], dt))[0]
    check(np.array_equal(words, expect), f"{np.dtype(dt)} results {words} != {expect}")
    # fetch_op by name, and SET behaving as swap
    g = np.zeros(1, dt)
    shmem.atomic_fetch_op_nbi(g, words[0:1], 7, "set", me)
    shmem.quiet()
    check(g[0] == orig[0] and words[0] == 7, "fetch_op_nbi set")
    shmem.atomic_fetch_op_nbi(g, words[0:1], None, shmem.AMO.INC, me)
    shmem.quiet()
    check(g[0] == 7 and words[0] == 8, "fetch_op_nbi inc")
    shmem.barrier_all()
    # contention: every PE fetch-incs PE 0's counter; fetched tickets are distinct
    ctr = shmem.zeros(1, dt)
    got = np.zeros(20, dt)
    for k in range(20):
        shmem.atomic_fetch_inc_nbi(got[k:k + 1], ctr, 0)
    shmem.quiet()
    check(len(set(got.tolist())) == 20, f"{np.dtype(dt)} tickets not distinct: {got}")
    shmem.barrier_all()
    if me == 0:
        check(int(ctr[0]) == 20 * n, f"{np.dtype(dt)} counter {ctr[0]}")
    # the fetch buffer is checked before anything happens at the target
    for bad, what in [(np.zeros(1, np.float32 if dt != np.float32 else np.int8), "dtype"),
                      (np.zeros(2, dt), "size"),
                      (np.broadcast_to(np.zeros(1, dt), (1,)), "read-only"),
                      ([0], "list")]:
        try:
            shmem.atomic_fetch_add_nbi(bad, ctr, 1, 0)
        except InvalidArgumentError:
            pass
        else:
            check(False, f"a bad fetch buffer ({what}) must be refused")
    shmem.barrier_all()
    if me == 0:
        check(int(ctr[0]) == 20 * n, "a refused nbi AMO changed the target")
    shmem.barrier_all()
    shmem.free(ctr)
    shmem.free(words)

for i, dt in enumerate((np.float32, np.float64)):
    fw = shmem.zeros(2, dt)
    fw[:] = data(dt, 2, seed=300 + 10 * i + me)
    shmem.barrier_all()
    theirs = data(dt, 2, seed=300 + 10 * i + right)
    mine = data(dt, 2, seed=400 + 10 * i + me)
    a, b = np.zeros(1, dt), np.zeros(1, dt)
    shmem.atomic_fetch_nbi(a, fw[0:1], right)
    shmem.atomic_swap_nbi(b, fw[1:2], mine[1], right)
    shmem.quiet()
    check(a[0] == theirs[0] and b[0] == theirs[1], f"{np.dtype(dt)} fetch/swap nbi")
    shmem.barrier_all()
    check(fw[1] == data(dt, 2, seed=400 + 10 * i + left)[1], f"{np.dtype(dt)} swap result")
    try:
        shmem.atomic_fetch_add_nbi(a, fw[0:1], 1.0, right)
    except InvalidArgumentError:
        pass
    else:
        check(False, "float fetch_add_nbi must be refused")
    shmem.barrier_all()
    shmem.free(fw)

# -- ibput / ibget against numpy references ----------------------------------------------------
L = 64
CASES = [(5, 3, 2, 4), (8, 8, 8, 8), (1, 2, 7, 3), (10, 4, 4, 1), (3, 2, 3, 0), (7, 6, 1, 9),
         (16, 9, 9, 4), (4, 4, 0, 5)]


def blocked(dst: np.ndarray, src: np.ndarray, tst: int, sst: int, bsize: int,
            nblocks: int) -> np.ndarray:
    out = dst.copy()
    for b in range(nblocks):  # in order: with overlapping target blocks the later one wins
        out[b * tst:b * tst + bsize] = src[b * sst:b * sst + bsize]
    return out


for i, dt in enumerate((np.int16, np.float64, np.complex128, np.uint8)):
    sym = shmem.zeros(L, dt)
    for c, (tst, sst, bsize, nblocks) in enumerate(CASES):
        seed = 1000 * i + 10 * c
        src = data(dt, L, seed=seed + me)
        sym[:] = 0
        shmem.barrier_all()
        shmem.ibput(sym, src, right, tst, sst, bsize, nblocks)
        shmem.barrier_all()
        want = blocked(np.zeros(L, dt), data(dt, L, seed=seed + left), tst, sst, bsize, nblocks)
        check(np.array_equal(sym, want), f"ibput {np.dtype(dt)} case {c}")
        shmem.barrier_all()
        sym[:] = data(dt, L, seed=seed + 5 + me)
        shmem.barrier_all()
        out = np.zeros(L, dt)
        shmem.ibget(out, sym, right, tst, sst, bsize, nblocks)
        rsrc = data(dt, L, seed=seed + 5 + right)
        check(np.array_equal(out, blocked(np.zeros(L, dt), rsrc, tst, sst, bsize, nblocks)),
              f"ibget {np.dtype(dt)} case {c}")
        wide = np.zeros((L, 2), dt)  # a non-contiguous local target
        shmem.ibget(wide[:, 1], sym, right, tst, sst, bsize, nblocks)
        check(np.array_equal(wide[:, 1], out) and not wide[:, 0].any(),
              f"ibget into a strided target {np.dtype(dt)} case {c}")
        shmem.barrier_all()
    # a non-contiguous local source, and slices of the symmetric target
    sym[:] = 0
    shmem.barrier_all()
    src = data(dt, 2 * L, seed=2000 + me)[::2]
    shmem.ibput(sym[3:], src, right, 6, 5, 4, 10)
    shmem.barrier_all()
    lsrc = data(dt, 2 * L, seed=2000 + left)[::2]
    want = np.zeros(L, dt)
    want[3:] = blocked(np.zeros(L - 3, dt), lsrc, 6, 5, 4, 10)
    check(np.array_equal(sym, want), f"ibput slice {np.dtype(dt)}")
    other = np.zeros(L, np.int32 if dt != np.int32 else np.int8)
    for fn, args in [(shmem.ibput, (sym, src, right, 8, 1, 8, 9)),  # past the target's end
                     (shmem.ibget, (np.zeros(4, dt), sym, right, 2, 2, 2, 3)),  # local too short
                     (shmem.ibput, (sym, src, right, 0, 1, 1, 2)),  # zero stride
                     (shmem.ibput, (sym, other, right, 1, 1, 1, 1))]:  # dtype mismatch
        try:
            fn(*args)
        except InvalidArgumentError:
            pass
        else:
            check(False, "a bad ibput/ibget must raise InvalidArgumentError")
    shmem.barrier_all()
    shmem.free(sym)

# -- pe_quiet and query_initialized ---------------------------------------------------------------
box = shmem.zeros(1000, np.int64)
payload = data(np.int64, 1000, seed=3000 + me)
shmem.put_nbi(box, payload, right)
shmem.pe_quiet([right])
shmem.pe_quiet(np.array([right, me]))
shmem.pe_quiet(right)
shmem.barrier_all()
check(np.array_equal(box, data(np.int64, 1000, seed=3000 + left)), "pe_quiet put_nbi")
for bad in ([n], [-1], "x", 1.5):
    try:
        shmem.pe_quiet(bad)  # type: ignore[arg-type]
    except InvalidArgumentError:
        pass
    else:
        check(False, f"pe_quiet({bad!r}) must raise InvalidArgumentError")
check(shmem.query_initialized() is True, "query_initialized")
shmem.barrier_all()

print(f"routes: {sorted({r.name for r in shmem._state.rt.routing.routes})}")
print(f"amo_nbi ok: {n} PEs")
