"""The multi-PE part of the transport contract, run by ``vkshmem run`` with the shm path off
and only the transport under test (``VKSHMEM_TRANSPORTS``): every byte, even to this PE, takes
it. Puts and gets of several sizes (blocking and not), strided puts, AMOs from every PE on one
counter, compare-swap, put_signal and a wait, a fence-ordered flag, and collectives."""

from __future__ import annotations

import numpy as np

from vkshmem import shmem


def check(cond: object, what: str) -> None:
    """Assert with a message that names the PE (the launcher reports it)."""
    if not cond:
        raise AssertionError(f"PE {shmem.my_pe()}: {what}")


me, n = shmem.my_pe(), shmem.n_pes()
right, left = (me + 1) % n, (me - 1) % n
routes = sorted({r.name for r in shmem._state.rt.routing.routes})
print(f"routes: {routes}", flush=True)

# puts and gets of several sizes into the right neighbour, blocking and not
a = shmem.zeros(1 << 17, np.uint8)
for size in (1, 8, 1000, 1 << 16):
    src = (np.arange(size) * (me + 3)).astype(np.uint8)
    shmem.put(a[:size], src, right)
    shmem.barrier_all()
    want = (np.arange(size) * (left + 3)).astype(np.uint8)
    check(np.array_equal(a[:size], want), f"{size}-byte put from the left")
    got = np.empty(size, np.uint8)
    shmem.get(got, a[:size], right)
    check(np.array_equal(got, src), f"{size}-byte get from the right")
    rev = src[::-1].copy()
    shmem.put_nbi(a[1 << 16:(1 << 16) + size], rev, right)
    shmem.quiet()
    shmem.get_nbi(got, a[1 << 16:(1 << 16) + size], right)
    shmem.quiet()
    check(np.array_equal(got, rev), f"{size}-byte get_nbi after put_nbi")
    shmem.barrier_all()

# a strided put
s = shmem.zeros(32, np.int64)
shmem.iput(s, np.full(16, me + 1, np.int64), right, tst=2)
shmem.barrier_all()
check(np.all(s[::2] == left + 1) and not s[1::2].any(), f"iput from the left: {s}")

# AMOs from every PE on PE 0's counter; compare-swap on the right neighbour
ctr = shmem.zeros(1, np.int64)
olds = [int(shmem.atomic_fetch_inc(ctr, 0)) for _ in range(50)]
shmem.atomic_add(ctr, 2, 0)
check(len(set(olds)) == 50, "fetch_inc values are distinct")
shmem.barrier_all()
if me == 0:
    check(int(ctr[0]) == 52 * n, f"counter {int(ctr[0])} != {52 * n}")
shmem.barrier_all()
w = shmem.zeros(1, np.uint32)
shmem.atomic_set(w, 7, right)
shmem.barrier_all()
check(int(shmem.atomic_compare_swap(w, 1, 9, right)) == 7, "compare_swap miss")
check(int(shmem.atomic_compare_swap(w, 7, 9, right)) == 7, "compare_swap hit")
shmem.barrier_all()
check(int(w[0]) == 9, f"compare_swap result {int(w[0])}")

# data before the flag: put, fence, flag
data = shmem.zeros(512, np.int64)
flag = shmem.zeros(1, np.int64)
shmem.put(data, np.full(512, 10 + me, np.int64), right)
shmem.fence()
shmem.atomic_set(flag, 1, right)
shmem.wait_until(flag, shmem.CMP.EQ, 1)
check(np.all(data == 10 + left), "the data arrived before the flag")

# put_signal and a wait
sig = shmem.zeros(1, np.uint64)
vals = shmem.zeros(4, np.float64)
shmem.put_signal(vals, np.full(4, me + 0.5), right, sig, me + 1, shmem.SIGNAL_SET)
seen = shmem.signal_wait_until(sig, shmem.CMP.EQ, left + 1)
check(seen == left + 1 and np.all(vals == left + 0.5), "put_signal delivers data first")

# collectives
src = shmem.full(5, me + 1, np.int64)
dst = shmem.zeros(5, np.int64)
shmem.sum_reduce(dst, src)
check(np.all(dst == n * (n + 1) // 2), f"sum_reduce: {dst}")
b = shmem.full(8, me, np.int32)
shmem.broadcast(b, shmem.full(8, 100 + me, np.int32), root=0)
check(np.all(b == 100), f"broadcast: {b}")
shmem.barrier_all()
print("transport_job ok", flush=True)
