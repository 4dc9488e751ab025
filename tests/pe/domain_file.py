"""The out-of-tree ``file`` memory domain (examples/example-domain) under the launcher: its
arrays are numpy arrays in a second symmetric heap; puts, gets, strided puts, AMOs, signals,
waits, ptr and a reduction reach every peer; the host heap is unaffected; free releases."""

from __future__ import annotations

import numpy as np
from _common import check

from vkshmem import shmem

me, n = shmem.my_pe(), shmem.n_pes()
right, left = (me + 1) % n, (me - 1) % n
rt = shmem._state.rt

host = shmem.zeros(8, np.int64)
a = shmem.zeros(64, np.int64, domain="file")
check(type(a) is np.ndarray and a.sum() == 0, "a file-domain array is a zeroed numpy array")
heap = rt.domains.heaps["file"]
check(shmem.offset_of(host)[0] == 0, "host arrays stay in segment 0")
print(f"PE {me} file domain: {heap.route_names}", flush=True)
shmem.barrier_all()

# put / get / iput into the right neighbour's file heap
shmem.put(a[:8], np.arange(8, dtype=np.int64) + 100 * me, right)
shmem.iput(a[16:32], np.full(8, me + 1, np.int64), right, tst=2)
shmem.barrier_all()
check(np.array_equal(a[:8], np.arange(8) + 100 * left), f"put from the left: {a[:8]}")
check(np.array_equal(a[16:32:2], np.full(8, left + 1)) and not a[17:32:2].any(), "iput")
got = np.empty(8, np.int64)
shmem.get(got, a[:8], right)
check(np.array_equal(got, np.arange(8) + 100 * me), f"get from the right: {got}")

# AMOs from every PE on PE 0's counter, then a signal and a wait
ctr = shmem.zeros(1, np.uint64, domain="file")
olds = [shmem.atomic_fetch_inc(ctr, 0) for _ in range(50)]
shmem.atomic_add(ctr, 2, 0)
check(len(set(olds)) == 50, "fetch_inc values are distinct")
shmem.barrier_all()
if me == 0:
    check(int(ctr[0]) == 52 * n, f"counter {int(ctr[0])} != {52 * n}")
sig = shmem.zeros(1, np.uint64, domain="file")
data = shmem.zeros(4, np.float64, domain="file")
shmem.put_signal(data, np.full(4, me + 0.5), right, sig, me + 1, shmem.SIGNAL_SET)
seen = shmem.signal_wait_until(sig, shmem.CMP.EQ, left + 1)
check(seen == left + 1 and np.all(data == left + 0.5), "put_signal delivers data first")
shmem.barrier_all()

# ptr: a view of a peer's file heap where the shm path maps it
view = shmem.ptr(a, right)
if view is not None:
    check(view.ctypes.data != a.ctypes.data or right == me, "ptr maps the peer's memory")
    check(np.array_equal(view[:8], np.arange(8) + 100 * me), "ptr sees the peer's data")
    del view

# a reduction with the target in the file domain
src = shmem.full(5, me + 1, np.int64, domain="file")
dst = shmem.zeros(5, np.int64, domain="file")
shmem.sum_reduce(dst, src)
check(np.all(dst == n * (n + 1) // 2), f"sum_reduce into the file heap: {dst}")
check(not host.any(), "the host heap was not touched")

for x in (a, ctr, sig, data, src, dst):
    shmem.free(x)
b = shmem.zeros(64, np.int64, domain="file")
check(b.ctypes.data == a.ctypes.data, "a freed block is reused")
shmem.free(b)
print(f"routes: {sorted({r.name for r in rt.routing.routes})}")
print("domain_file ok", flush=True)
