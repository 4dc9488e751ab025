"""Signals: put_signal/put_signal_nbi ordering (data before signal), signal_fetch,
signal_wait_until, signal_add/signal_set, uint64 wrap-around, contexts, and argument errors.

(Named ``signals.py``, not ``signal.py``: the script's folder is first on ``sys.path``, so a
``signal.py`` here would shadow the standard library's ``signal`` module for every script.)
"""

from __future__ import annotations

import numpy as np
from _common import check, data

from vkshmem import InvalidArgumentError, shmem

me, n = shmem.my_pe(), shmem.n_pes()
right, left = (me + 1) % n, (me - 1) % n
U64 = (1 << 64) - 1
N = 1 << 16  # 512 KiB of int64: a signal overtaking its data would leave stale elements
SIZES = [N, 1, 4099, N, 17, N // 2 + 3]
ROUNDS = 24

sig = shmem.new_signal()
ack = shmem.new_signal()
check(sig.dtype == np.uint64 and sig.size == 1 and shmem.signal_fetch(sig) == 0, "new_signal")
buf = shmem.zeros(N, np.int64)
mine = data(np.int64, N, seed=10 + me) >> 8  # room to add the round number
theirs = data(np.int64, N, seed=10 + left) >> 8

# -- ordering: the receiver reads the data right after the signal, many rounds, both ops -----
for variant, (sigop, nbi) in enumerate([(shmem.SIGNAL.SET, False), (shmem.SIGNAL.ADD, False),
                                        (shmem.SIGNAL_SET, True), (shmem.SIGNAL_ADD, True)]):
    for r in range(ROUNDS):
        k = r + 1
        size = SIZES[(r + variant) % len(SIZES)]
        if r:
            shmem.signal_wait_until(ack, shmem.CMP.GE, r)  # right has read my round r-1
        payload = mine[:size] + 1000 * variant + r
        value = k if sigop == shmem.SIGNAL.SET else 1
        if nbi:
            shmem.put_signal_nbi(buf, payload, right, sig, value, sigop, size=size)
            shmem.quiet()
        else:
            shmem.put_signal(buf, payload, right, sig, value, sigop, size=size)
        got = shmem.signal_wait_until(sig, ">=", k)
        check(got == k, f"variant {variant} round {r}: signal {got} != {k}")
        seen = buf[:size].copy()  # one read: the check and the report agree
        bad = np.flatnonzero(seen != theirs[:size] + 1000 * variant + r)
        check(bad.size == 0, f"variant {variant} round {r}: {bad.size} of {size} elements "
              f"stale after the signal (first at {bad[:1]})")
        shmem.signal_set(ack, k, left)
    shmem.signal_wait_until(ack, shmem.CMP.EQ, ROUNDS)
    shmem.barrier_all()
    sig[0] = 0
    ack[0] = 0
    shmem.barrier_all()

# -- signal_add from every PE, signal_wait_until returns the value that satisfied it ----------
total = shmem.new_signal()
shmem.signal_add(total, me + 1, 0)
if me == 0:
    want = n * (n + 1) // 2
    got = shmem.signal_wait_until(total, shmem.CMP_EQ, want)
    check(got == want and isinstance(got, int), f"signal_add total {got} != {want}")
    check(shmem.signal_wait_until(total, shmem.CMP.GT, want - 1) == want, "wait GT")
    check(shmem.signal_fetch(total) == want, "signal_fetch after adds")
shmem.barrier_all()

# -- uint64: values modulo 2**64, unsigned comparisons ------------------------------------------
shmem.signal_set(total, -1, right)
shmem.barrier_all()
check(shmem.signal_fetch(total) == U64, f"set -1 reads {shmem.signal_fetch(total)}")
check(shmem.signal_wait_until(total, shmem.CMP.GT, 1 << 63) == U64, "unsigned compare")
shmem.barrier_all()
shmem.signal_add(total, 3, right)
shmem.barrier_all()
check(shmem.signal_fetch(total) == 2, "add wraps modulo 2**64")
shmem.barrier_all()
shmem.put_signal(buf, mine[:8], right, total, (1 << 64) + 5, shmem.SIGNAL.SET)
shmem.signal_wait_until(total, shmem.CMP.EQ, 5)
check(np.array_equal(buf[:8], theirs[:8]), "put_signal with a value over 2**64")
shmem.barrier_all()

# -- a created context carries put_signal too ---------------------------------------------------
ctx = shmem.Ctx.create()
payload = data(np.float64, 1000, seed=77 + me)
fbuf = shmem.zeros(1000, np.float64)
shmem.put_signal_nbi(fbuf, payload, right, sig, 42, shmem.SIGNAL.SET, ctx=ctx)
ctx.quiet()
check(shmem.signal_wait_until(sig, shmem.CMP.EQ, 42) == 42, "ctx signal")
check(np.array_equal(fbuf, data(np.float64, 1000, seed=77 + left)), "ctx put_signal data")
ctx.destroy()
shmem.barrier_all()

# -- argument errors: nothing is written --------------------------------------------------------
fsig = shmem.zeros(1, np.float64)
sig[0] = 0
buf[:4] = 0
shmem.barrier_all()
for bad_call, what in [
    (lambda: shmem.put_signal(buf, mine[:4], right, sig, 1, 7), "unknown sigop"),
    (lambda: shmem.put_signal(buf, mine[:4], right, sig, 1.5, shmem.SIGNAL.SET), "float value"),
    (lambda: shmem.put_signal(buf, mine[:4], right, np.zeros(1, np.uint64), 1,
                              shmem.SIGNAL.SET), "local signal"),
    (lambda: shmem.put_signal(buf, mine[:4], right, buf[:2], 1, shmem.SIGNAL.SET),
     "two-element signal"),
    (lambda: shmem.put_signal(buf, mine[:4], n, sig, 1, shmem.SIGNAL.SET), "bad PE"),
    (lambda: shmem.signal_fetch(fsig), "float signal"),
    (lambda: shmem.signal_add(sig, 1, -1), "signal_add bad PE"),
]:
    try:
        bad_call()
    except InvalidArgumentError:
        pass
    else:
        check(False, f"{what} must raise InvalidArgumentError")
shmem.barrier_all()
check(not buf[:4].any() and shmem.signal_fetch(sig) == 0, "a refused put_signal wrote")
shmem.barrier_all()

shmem.del_signal(total)
shmem.del_signal(ack)
shmem.del_signal(sig)
print(f"routes: {sorted({r.name for r in shmem._state.rt.routing.routes})}")
print(f"signals ok: {n} PEs")
