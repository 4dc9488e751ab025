"""The domain-link route (``DomainExport.link_group``, ``MemoryDomain.link_peer``) through a
real out-of-tree domain: the ``file`` domain of examples/example-domain with
``VKSHMEM_FILE_DOMAIN_LINK=1``, where every PE exports its own group and a common link group.
Same-node peers are linked, not imported (route ``link+proxy``); puts and gets of host data
and between the domain's own arrays go through the links (the proxy sends no request for
them); AMOs go through the proxy, or with ``VKSHMEM_FILE_DOMAIN_LINK=amo`` through the links
(route ``link``: no proxy request either); a fetching AMO after a put sees it; a reduction
works."""

from __future__ import annotations

import os

import numpy as np
from _common import check, check_fetch_sees_put

from vkshmem import shmem

me, n = shmem.my_pe(), shmem.n_pes()
right, left = (me + 1) % n, (me - 1) % n
rt = shmem._state.rt

a = shmem.zeros(1 << 16, np.int64, domain="file")
heap = rt.domains.heaps["file"]
amo_links = os.environ.get("VKSHMEM_FILE_DOMAIN_LINK") == "amo"
want = ["direct" if pe == me else ("link" if amo_links else "link+proxy") for pe in range(n)]
check(heap.route_names == want, f"routes {heap.route_names}, want {want}")
check(all(heap.direct[pe] is None for pe in range(n) if pe != me), "no peer is imported")
print(f"PE {me} file domain: {heap.route_names}", flush=True)


def requests() -> int:
    return heap.proxy.stats["requests"] if heap.proxy is not None else 0


def link_calls() -> int:
    return sum(link.calls for link in heap.links if link is not None)


before_req, before_calls = requests(), link_calls()
shmem.put(a[:8], np.arange(8, dtype=np.int64) + 100 * me, right)  # host data
b = shmem.zeros(64, np.int64, domain="file")
b[:] = np.arange(64) * (me + 1)
shmem.barrier_all()
check(np.array_equal(a[:8], np.arange(8) + 100 * left), f"put through the link: {a[:8]}")
got = np.empty(8, np.int64)
shmem.get(got, a[:8], right)
check(np.array_equal(got, np.arange(8) + 100 * me), f"get through the link: {got}")
shmem.put_nbi(a[100:108], np.full(8, 7 + me, np.int64), right)
shmem.quiet()
shmem.barrier_all()
check(np.array_equal(a[100:108], np.full(8, 7 + left)), "put_nbi through the link")
if n > 1:
    check(requests() == before_req, f"puts and gets sent {requests() - before_req} requests")
    check(link_calls() >= 3, f"the links carried {link_calls() - before_calls} calls")
shmem.barrier_all()

# AMOs through the proxy (or the links), after puts through the link
c = shmem.zeros(1, np.int64, domain="file")
before_req, before_calls = requests(), link_calls()
for _ in range(5):
    shmem.atomic_add(c, 2, 0)
shmem.barrier_all()
if me == 0:
    check(int(c[0]) == 10 * n, f"counter {c[0]}")
if me != 0:
    by_link = link_calls() - before_calls
    check((by_link == 5) == amo_links, f"the links carried {by_link} of 5 AMOs")
    check(amo_links == (requests() == before_req), "AMOs and the proxy's requests")
if n > 1:  # links that carry AMOs leave the proxy nothing to do: it is not started
    check((heap.proxy is None) == amo_links, f"proxy {heap.proxy} with AMO links {amo_links}")
shmem.barrier_all()
check_fetch_sees_put("file", 5)

src = shmem.zeros(16, np.int64, domain="file")
dst = shmem.zeros(16, np.int64, domain="file")
src[:] = np.arange(16) + me
shmem.barrier_all()
shmem.sum_reduce(dst, src)
check(np.array_equal(dst, n * np.arange(16) + n * (n - 1) // 2), f"sum {dst}")
shmem.barrier_all()
for x in (src, dst, c, b, a):
    shmem.free(x)
print(f"routes: {sorted({r.name for r in rt.routing.routes})}")
print("domain_link ok", flush=True)
