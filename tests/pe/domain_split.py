"""A transport that carries a memory kind's puts and gets but not its AMOs: the ``file`` domain
(examples/example-domain) with shm off and UCX told to leave AMOs on domain memory to the
owner (rail option ``domain_amo=proxy``, the same rule as UCX on CUDA memory). Puts and gets
to every peer go through UCX (the domain proxy sends no request for them), AMOs through the
proxy (one request each), a fetching AMO after a put to the same PE sees it, and
put_signal, a signal wait and a reduction still work."""

from __future__ import annotations

import numpy as np
from _common import check, check_fetch_sees_put

from vkshmem import shmem

me, n = shmem.my_pe(), shmem.n_pes()
right, left = (me + 1) % n, (me - 1) % n
rt = shmem._state.rt

a = shmem.zeros(2 << 16, np.uint8, domain="file")
b = a[1 << 16:]  # where the non-blocking puts land, while a peer may still check a
heap = rt.domains.heaps["file"]
want = ["direct" if pe == me else "ucx+proxy" for pe in range(n)]
check(heap.route_names == want, f"routes {heap.route_names}, want {want}")
check((heap.proxy is not None) == (n > 1), "the proxy runs where a peer needs it")
print(f"PE {me} file domain: {heap.route_names}", flush=True)


def requests() -> int:
    return heap.proxy.stats["requests"] if heap.proxy is not None else 0


# puts and gets of several sizes, blocking and not: all through UCX
before = requests()
for size in (8, 1000, 1 << 16):
    src = (np.arange(size) * (me + 3)).astype(np.uint8)
    shmem.put(a[:size], src, right)
    shmem.barrier_all()
    check(np.array_equal(a[:size], (np.arange(size) * (left + 3)).astype(np.uint8)),
          f"{size}-byte put from the left")
    got = np.empty(size, np.uint8)
    shmem.get(got, a[:size], right)
    check(np.array_equal(got, (np.arange(size) * (me + 3)).astype(np.uint8)), "get")
    rev = src[::-1].copy()
    shmem.put_nbi(b[:size], rev, right)
    shmem.get_nbi(got, b[:size], right)  # after the put to the same PE: sees it
    shmem.quiet()
    check(np.array_equal(got, rev), f"{size}-byte get_nbi after put_nbi")
    shmem.barrier_all()
check(requests() == before, f"puts and gets sent {requests() - before} proxy requests")

# AMOs: every one through the owner's proxy (none where the owner is this PE)
ctr = shmem.zeros(1, np.uint64, domain="file")
before = requests()
olds = [int(shmem.atomic_fetch_inc(ctr, 0)) for _ in range(20)]
shmem.atomic_add(ctr, 2, 0)
check(len(set(olds)) == 20, "fetch_inc values are distinct")
check(requests() - before == (0 if me == 0 else 21),
      f"{requests() - before} proxy requests for 21 AMOs on PE 0 from PE {me}")
shmem.barrier_all()
if me == 0:
    check(int(ctr[0]) == 22 * n, f"counter {int(ctr[0])} != {22 * n}")

# a fetching AMO right after a put of the same word (UCX, then the proxy) sees the put
check_fetch_sees_put("file", 5)

# put_signal (data through UCX, the signal through the proxy), a wait, a reduction
sig = shmem.zeros(1, np.uint64, domain="file")
data = shmem.zeros(4, np.float64, domain="file")
shmem.put_signal(data, np.full(4, me + 0.5), right, sig, me + 1, shmem.SIGNAL_SET)
seen = shmem.signal_wait_until(sig, shmem.CMP.EQ, left + 1)
check(seen == left + 1 and np.all(data == left + 0.5), "put_signal delivers data first")
src = shmem.full(5, me + 1, np.int64, domain="file")
dst = shmem.zeros(5, np.int64, domain="file")
shmem.sum_reduce(dst, src)
check(np.all(dst == n * (n + 1) // 2), f"sum_reduce into the file heap: {dst}")

for x in (a, ctr, sig, data, src, dst):
    shmem.free(x)
print(f"routes: {sorted({r.name for r in rt.routing.routes})}")
print("domain_split ok", flush=True)
