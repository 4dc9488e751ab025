"""The multi-PE part of the memory-domain contract, run by ``vkshmem run`` with the domain's
name as the script's argument (``vkshmem run -n 2 domain_job.py <domain>``): the domain gets
a second symmetric heap; puts, gets, strided puts, AMOs, signals, waits and a reduction reach
every peer's arrays in it; the host heap is unaffected; a freed block is reused (checked where
the arrays are numpy arrays). Arrays of the domain are read back through ``shmem.get`` to this
PE, so the domain's memory need not be CPU-visible. Each PE prints its routes to the domain's
peers (``PE <me> <domain> domain: [...]``)."""

from __future__ import annotations

import sys

import numpy as np

from vkshmem import shmem

if len(sys.argv) != 2:
    raise SystemExit(f"usage: vkshmem run -n <pes> {sys.argv[0]} <domain>")
NAME = sys.argv[1]


def check(cond: object, what: str) -> None:
    """Assert with a message that names the PE (the launcher reports it)."""
    if not cond:
        raise AssertionError(f"PE {shmem.my_pe()}: {what}")


def local(arr: object, count: int, dtype: type) -> np.ndarray:
    """This PE's first ``count`` elements of domain array ``arr``, through a get."""
    out = np.empty(count, dtype)
    shmem.get(out, arr[:count], shmem.my_pe())
    return out


me, n = shmem.my_pe(), shmem.n_pes()
right, left = (me + 1) % n, (me - 1) % n
rt = shmem._state.rt

host = shmem.zeros(8, np.int64)
a = shmem.zeros(64, np.int64, domain=NAME)
check(shmem.offset_of(host)[0] == 0, "host arrays stay in segment 0")
check(not local(a, 64, np.int64).any(), "a new domain array is zeroed")
heap = rt.domains.heaps[NAME]
print(f"PE {me} {NAME} domain: {heap.route_names}", flush=True)
print(f"routes: {sorted({r.name for r in rt.routing.routes})}", flush=True)
shmem.barrier_all()

# put / get / iput into the right neighbour's heap of the domain
shmem.put(a[:8], np.arange(8, dtype=np.int64) + 100 * me, right)
shmem.iput(a[16:32], np.full(8, me + 1, np.int64), right, tst=2)
shmem.barrier_all()
mine = local(a, 32, np.int64)
check(np.array_equal(mine[:8], np.arange(8) + 100 * left), f"put from the left: {mine[:8]}")
check(np.array_equal(mine[16:32:2], np.full(8, left + 1)) and not mine[17:32:2].any(), "iput")
got = np.empty(8, np.int64)
shmem.get(got, a[:8], right)
check(np.array_equal(got, np.arange(8) + 100 * me), f"get from the right: {got}")
shmem.put_nbi(a[40:48], np.full(8, 7 + me, np.int64), right)
shmem.quiet()
shmem.barrier_all()
check(np.array_equal(local(a, 48, np.int64)[40:48], np.full(8, 7 + left)), "put_nbi")

# AMOs from every PE on PE 0's counter; a fetch right after a put sees it
ctr = shmem.zeros(1, np.uint64, domain=NAME)
olds = [int(shmem.atomic_fetch_inc(ctr, 0)) for _ in range(50)]
shmem.atomic_add(ctr, 2, 0)
check(len(set(olds)) == 50, "fetch_inc values are distinct")
shmem.barrier_all()
if me == 0:
    total = int(local(ctr, 1, np.uint64)[0])
    check(total == 52 * n, f"counter {total} != {52 * n}")
word = shmem.zeros(1, np.int64, domain=NAME)
for i in range(1, 6):
    shmem.put(word, np.array([i * 1000 + me], np.int64), right)
    seen = int(shmem.atomic_fetch(word, right))
    check(seen == i * 1000 + me, f"fetch after put saw {seen}, not {i * 1000 + me}")
    shmem.barrier_all()

# put_signal (signal in the domain) and a wait
sig = shmem.zeros(1, np.uint64, domain=NAME)
data = shmem.zeros(4, np.float64, domain=NAME)
shmem.put_signal(data, np.full(4, me + 0.5), right, sig, me + 1, shmem.SIGNAL_SET)
seen = shmem.signal_wait_until(sig, shmem.CMP.EQ, left + 1)
check(seen == left + 1 and np.all(local(data, 4, np.float64) == left + 0.5),
      "put_signal delivers data first")
shmem.barrier_all()

# a reduction with source and target in the domain
src = shmem.full(5, me + 1, np.int64, domain=NAME)
dst = shmem.zeros(5, np.int64, domain=NAME)
shmem.sum_reduce(dst, src)
check(np.all(local(dst, 5, np.int64) == n * (n + 1) // 2), "sum_reduce into the domain")
check(not host.any(), "the host heap was not touched")

first = a.ctypes.data if isinstance(a, np.ndarray) else None  # CPU-visible memory
for x in (a, ctr, word, sig, data, src, dst):
    shmem.free(x)
b = shmem.zeros(64, np.int64, domain=NAME)
check(first is None or b.ctypes.data == first, "a freed block is reused")
shmem.free(b)
shmem.barrier_all()
print("domain_job ok", flush=True)
