"""The core's compiled hot path over hostproxy's C client (Transport.native_ops): blocking and
nbi put/get of 8 B to 1 MiB (above and below the size where the core releases the GIL), every
AMO at 4 and 8 bytes, fence and quiet, contended adds from every PE, and a barrier; then the
client's counters must show that these went through C (``native``), not through the Python
methods, and the barrier's remote adds go through C too. Expects VKSHMEM_SHM=0 and
VKSHMEM_TRANSPORTS=hostproxy."""

from __future__ import annotations

import numpy as np
from _common import check, data

from vkshmem import shmem

ROUNDS = 200

shmem.init()
me, n = shmem.my_pe(), shmem.n_pes()
right, left = (me + 1) % n, (me - 1) % n
(hp,) = shmem._state.rt.routing.transports
check(hp.spec.name == "hostproxy", f"transport {hp.spec.name}")
before = hp.client_stats()

for size in (1, 1000, 8192, 1 << 17):  # int64 elements: 8 B ... 1 MiB
    dst = shmem.zeros(size, np.int64)
    src = data(np.int64, size, seed=size + me)
    shmem.put(dst, src, right)
    shmem.barrier_all()
    check(np.array_equal(dst, data(np.int64, size, seed=size + left)), f"put of {size}")
    got = np.empty(size, np.int64)
    shmem.get(got, dst, right)
    check(np.array_equal(got, data(np.int64, size, seed=size + me)), f"get of {size}")
    shmem.barrier_all()
    shmem.put_nbi(dst, src[::-1].copy(), right)
    shmem.quiet()
    shmem.get_nbi(got, dst, right)
    shmem.quiet()
    check(np.array_equal(got, src[::-1]), f"nbi put/get of {size}")
    shmem.barrier_all()
    shmem.free(dst)

for dt in (np.int32, np.int64, np.uint32, np.uint64):
    word = shmem.zeros(1, dt)
    shmem.barrier_all()
    for _ in range(ROUNDS):  # contended: every PE adds to its right neighbour's word
        shmem.atomic_add(word, 1, right)
    shmem.barrier_all()
    check(int(word[0]) == ROUNDS, f"{np.dtype(dt)} word {word[0]} after {ROUNDS} adds")
    shmem.barrier_all()
    if me == 0:
        t = right
        check(int(shmem.atomic_fetch(word, t)) == ROUNDS, "fetch")
        check(int(shmem.atomic_fetch_inc(word, t)) == ROUNDS, "fetch_inc")
        check(int(shmem.atomic_swap(word, 7, t)) == ROUNDS + 1, "swap")
        check(int(shmem.atomic_compare_swap(word, 6, 9, t)) == 7, "failed compare_swap")
        check(int(shmem.atomic_compare_swap(word, 7, 12, t)) == 7, "compare_swap")
        check(int(shmem.atomic_fetch_and(word, 10, t)) == 12, "fetch_and")
        check(int(shmem.atomic_fetch_or(word, 5, t)) == 8, "fetch_or")
        check(int(shmem.atomic_fetch_xor(word, 3, t)) == 13, "fetch_xor")
        shmem.atomic_set(word, 40, t)
        shmem.atomic_inc(word, t)
        shmem.atomic_and(word, 0x3F, t)
        shmem.atomic_or(word, 0x80, t)
        shmem.atomic_xor(word, 1, t)
        shmem.fence()
        check(int(shmem.atomic_fetch_add(word, 0, t)) == (41 | 0x80) ^ 1, "non-fetching ops")
        shmem.quiet()
    shmem.barrier_all()
    shmem.free(word)

after = hp.client_stats()
native = after["native"] - before["native"]
check(native >= (100 if n > 1 else 1), f"only {native} requests through the native ops")

# Every request of this PE goes through C, the barrier's too (its adds and its quiet): the
# Python methods' count stays the same.
word, buf = shmem.zeros(1, np.int64), shmem.zeros(64, np.int64)
shmem.barrier_all()
before = hp.client_stats()
for i in range(ROUNDS):
    shmem.put(buf, np.full(64, i, np.int64), right)
    shmem.get(buf, buf, right)
    shmem.atomic_fetch_add(word, 1, right)
    shmem.atomic_add(word, 1, right)
shmem.quiet()
after = hp.client_stats()
calls = after["native"] - before["native"]
for _ in range(20):
    shmem.barrier_all()
rounds = (n - 1).bit_length()  # the dissemination barrier's rounds: one add each
check(hp.client_stats()["python"] == before["python"], "the barrier went through Python")
barrier_calls = hp.client_stats()["native"] - after["native"]
check(barrier_calls >= 20 * rounds, f"{barrier_calls} native calls in 20 barriers")
check(after["python"] == before["python"], "requests went through the Python methods")
# (this PE's own words take the CPU atomic, not the transport)
want = 4 * ROUNDS + 1 if n > 1 else 2 * ROUNDS + 1
check(calls == want, f"{calls} native calls, not {want}")
shmem.barrier_all()
check(int(word[0]) == 2 * ROUNDS, f"word {word[0]} after {2 * ROUNDS} adds")
print(f"native requests: {native}")
print(f"routes: {sorted({r.name for r in shmem._state.rt.routing.routes})}")
print("hostproxy_native ok")
