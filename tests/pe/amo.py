"""Every AMO on 32/64-bit integers and fetch/set/swap on floats; contention from all PEs."""

from __future__ import annotations

import numpy as np
from _common import check

from vkshmem import InvalidArgumentError, shmem

me, n = shmem.my_pe(), shmem.n_pes()
right = (me + 1) % n
ROUNDS = 200

for dt in (np.int32, np.int64, np.uint32, np.uint64):
    bits = np.dtype(dt).itemsize * 8
    ctr = shmem.zeros(1, dt)
    # distributed counter on PE 0: every PE adds, the fetched values are all distinct
    seen = [shmem.atomic_fetch_inc(ctr, 0) for _ in range(ROUNDS)]
    for _ in range(ROUNDS):
        shmem.atomic_inc(ctr, 0)
        shmem.atomic_add(ctr, 2, 0)
    seen += [shmem.atomic_fetch_add(ctr, 0, 0)]
    check(len(set(seen[:-1])) == ROUNDS and all(isinstance(v, int) for v in seen), "fetch_inc")
    shmem.barrier_all()
    if me == 0:
        check(int(ctr[0]) == 4 * ROUNDS * n, f"counter {dt}: {ctr[0]} != {4 * ROUNDS * n}")
    shmem.barrier_all()
    # set / fetch / swap / compare_swap on the right neighbour
    shmem.atomic_set(ctr, 5, right)
    shmem.barrier_all()
    v = shmem.atomic_fetch(ctr, me)
    check(v == 5, f"set/fetch {dt}: {v}")
    shmem.barrier_all()
    check(shmem.atomic_swap(ctr, 9, right) == 5, "swap")
    shmem.barrier_all()
    check(shmem.atomic_compare_swap(ctr, 1, 3, right) == 9, "cswap miss")
    check(shmem.atomic_compare_swap(ctr, 9, 3, right) == 9, "cswap hit")
    shmem.barrier_all()
    check(int(ctr[0]) == 3, f"cswap result {ctr[0]}")
    shmem.barrier_all()
    # signed wrap-around and negative values
    if np.dtype(dt).kind == "i":
        shmem.atomic_set(ctr, -7, right)
        shmem.barrier_all()
        check(shmem.atomic_fetch_add(ctr, -1, right) == -7, "negative fetch_add")
        shmem.barrier_all()
        check(int(ctr[0]) == -8, "negative result")
    # bitwise ops: each PE owns one bit of the word on PE 0
    shmem.barrier_all()
    word = shmem.zeros(1, dt)
    mask = 1 << (me % bits)
    old = shmem.atomic_fetch_or(word, mask, 0)
    shmem.atomic_or(word, mask << 1 if me + 1 < bits else 0, 0)
    shmem.barrier_all()
    full = 0
    for pe in range(n):
        full |= (1 << pe) | (1 << (pe + 1))
    if me == 0:
        check(int(word[0]) == full & ((1 << bits) - 1), f"or {dt}: {word[0]:x}")
    shmem.barrier_all()
    shmem.atomic_xor(word, mask, 0)
    shmem.barrier_all()
    shmem.atomic_fetch_and(word, ~(mask << 1) & ((1 << bits) - 1), 0)
    shmem.barrier_all()
    if me == 0:
        expect = full
        for pe in range(n):
            expect ^= 1 << pe
        for pe in range(n):
            expect &= ~(1 << (pe + 1))
        check(int(word[0]) == expect & ((1 << bits) - 1), f"xor/and {dt}: {word[0]:x}")
    shmem.barrier_all()
    check(old & mask in (0, mask), "fetch_or value")
    shmem.atomic_fetch_xor(word, 0, me)
    shmem.atomic_and(word, 0, me)
    check(shmem.atomic_fetch(word, me) == 0, "and 0")
    # atomic_op / atomic_fetch_op by enum and by name
    shmem.atomic_op(word, 4, shmem.AMO.ADD, me)
    shmem.atomic_op(word, None, "inc", me)
    check(shmem.atomic_fetch_op(word, 1, shmem.AMO_SET, me) == 5, "fetch_op set")
    check(shmem.atomic_fetch_op(word, 2, "xor", me) == 1, "fetch_op xor")
    shmem.barrier_all()
    shmem.free(word)
    shmem.free(ctr)

for dt in (np.float32, np.float64):
    f = shmem.zeros(1, dt)
    shmem.atomic_set(f, 1.5 + me, right)
    shmem.barrier_all()
    check(shmem.atomic_fetch(f, me) == 1.5 + (me - 1) % n, "float fetch")
    shmem.barrier_all()
    got = shmem.atomic_swap(f, -2.25, right)
    check(got == 1.5 + me and isinstance(got, float), f"float swap {got}")
    shmem.barrier_all()
    check(float(f[0]) == -2.25, "float swap result")
    try:
        shmem.atomic_add(f, 1.0, right)
    except InvalidArgumentError:
        pass
    else:
        check(False, "float add must be refused")
    shmem.barrier_all()

# atomicity across paths: everyone hammers PE 0's word, PE 0 too (through its own path)
hot = shmem.zeros(1, np.int64)
for _ in range(500):
    shmem.atomic_add(hot, 1, 0)
shmem.barrier_all()
check(shmem.atomic_fetch(hot, 0) == 500 * n, "mixed-path atomicity")
shmem.barrier_all()
print(f"routes: {sorted({r.name for r in shmem._state.rt.routing.routes})}")
print(f"amo ok: {n} PEs")
