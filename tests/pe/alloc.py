"""Collective allocation: same offsets everywhere, alignment, fill, free, realloc, exhaustion."""

from __future__ import annotations

import numpy as np
from _common import check

from vkshmem import HeapExhaustedError, shmem

me, n = shmem.my_pe(), shmem.n_pes()
right = (me + 1) % n
rt = shmem._state.rt


def offset(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0] - rt.host.segment.address


# the same sequence gives the same offsets on every PE: compare through the heap itself
arrays = [shmem.zeros(k * 13 + 1, np.float32) for k in range(10)]
arrays += [shmem.empty(100, np.int8, align=4096), shmem.ones(7, np.complex64),
           shmem.full((3, 5), 2.5), shmem.array(np.arange(10) * (me + 1))]
offs = shmem.array([offset(a) for a in arrays], dtype=np.int64)
peer = np.empty_like(offs)
shmem.get(peer, offs, right)
check(np.array_equal(peer, offs), "symmetric offsets")
check(all(offset(a) % 64 == 0 for a in arrays), "64-byte alignment")
check(offset(arrays[10]) % 4096 == 0, "align=4096")
check((arrays[11] == 1).all() and (arrays[12] == 2.5).all(), "ones/full")
check(np.array_equal(arrays[13], np.arange(10) * (me + 1)), "array() keeps local data")
# initial values are in place before the closing barrier: read the neighbour's right away
got = np.empty(10, arrays[13].dtype)
shmem.get(got, arrays[13], right)
check(np.array_equal(got, np.arange(10) * (right + 1)), "array() filled before barrier")

# alloc/fromalloc/free of raw memory
mem = shmem.alloc(100, 8)
a = shmem.fromalloc(mem, (10, 10), np.float64)
check(a.shape == (10, 10) and not a.any(), "alloc clear + fromalloc")
shmem.free(mem)
for arr in arrays[:5]:
    shmem.del_array(arr)
again = shmem.zeros(13 * 0 + 1, np.float32)
check(offset(again) == offset(arrays[0]), "freed space is reused deterministically")

# realloc keeps contents
r = shmem.array(np.arange(50, dtype=np.int64) + me)
r2 = shmem.realloc(r, 5000)
check(r2.size == 5000 and np.array_equal(r2[:50], np.arange(50) + me), "realloc grow")
shmem.put(r2[4990:], np.full(10, me, np.int64), right)
shmem.barrier_all()
check((r2[4990:] == (me - 1) % n).all(), "realloc'd array is symmetric")
r3 = shmem.realloc(r2, 10)
check(np.array_equal(r3, np.arange(10) + me), "realloc shrink")

# exhaustion: a clear error on every PE (all PEs fail the same way, so no one hangs)
try:
    shmem.zeros(rt.host.segment.size, np.uint8)
except HeapExhaustedError as exc:
    check("VKSHMEM_SYMMETRIC_SIZE" in str(exc) and str(rt.host.segment.size) in str(exc), str(exc))
else:
    check(False, "over-sized allocation must fail")
# the heap still works afterwards
z = shmem.zeros(16, np.int64)
shmem.put(z, np.full(16, me, np.int64), right)
shmem.barrier_all()
check((z == (me - 1) % n).all(), "heap usable after exhaustion")
print(f"routes: {sorted({r.name for r in shmem._state.rt.routing.routes})}")
print(f"alloc ok: {n} PEs")
