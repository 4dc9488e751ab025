"""The ``cuda`` memory domain carried by UCX (plugins/cuda + plugins/ucx, on a machine with an
NVIDIA GPU and a UCX built with CUDA, e.g. the libucx-cu12 wheel), run with ``VKSHMEM_SHM=0``
and ``VKSHMEM_TRANSPORTS=ucx`` so that no peer imports another's heap: every peer's segment is
registered with UCX as CUDA memory (route ``ucx+proxy``). Puts and gets of 8 B .. 16 MiB, GPU ->
peer GPU, host -> peer GPU, peer GPU -> GPU and peer GPU -> host, go through UCX (the domain
proxy sends no request for them); AMOs go through the owner's domain proxy (one request each)
and stay atomic; put_signal (data by UCX, the signal by the proxy) delivers the data first.
Each PE prints the route it took to each peer, and PE 0 the time of each size."""

from __future__ import annotations

import time

import numpy as np
from _common import check, check_fetch_sees_put

from vkshmem import shmem

me, n = shmem.my_pe(), shmem.n_pes()
right, left = (me + 1) % n, (me - 1) % n
rt = shmem._state.rt
SIZES = (8, 4096, 1 << 16, 1 << 20, 16 << 20)
MAX = SIZES[-1]

a = shmem.zeros(MAX, np.uint8, domain="cuda")  # GPU -> peer GPU puts land here
b = shmem.zeros(MAX, np.uint8, domain="cuda")  # host -> peer GPU puts land here
src = shmem.zeros(MAX, np.uint8, domain="cuda")  # this PE's GPU source
c = shmem.zeros(MAX, np.uint8, domain="cuda")  # this PE's GPU destination of gets
heap = rt.domains.heaps["cuda"]
check(type(a).__name__ == "CudaArray", "a CudaArray")
want = ["direct" if pe == me else "ucx+proxy" for pe in range(n)]
for pe in range(n):
    other = "domain" if heap.direct[pe] is not None else "proxy"  # else: the domain proxy
    t, t_amo = heap.carrier[pe], heap.amo_carrier[pe]
    print(f"PE {me} -> PE {pe}: cuda route {heap.route_names[pe]} (puts/gets: "
          f"{t.spec.name if t else other}, AMOs: {t_amo.spec.name if t_amo else other})",
          flush=True)
check(heap.route_names == want, f"routes {heap.route_names}, want {want}: is VKSHMEM_SHM=0 "
      "and does this UCX register CUDA memory (UCX_TLS with cuda_copy)?")
check(heap.info is not None and heap.info.kind == "cuda_va", "the segment is cuda_va")


def requests() -> int:
    return heap.proxy.stats["requests"] if heap.proxy is not None else 0


def pattern(pe: int, size: int, salt: int) -> np.ndarray:
    x = np.arange(size, dtype=np.uint32)
    return ((x * 2654435761) >> 13).astype(np.uint8) + np.uint8((pe * 31 + salt) % 251)


before = requests()
for i, size in enumerate(SIZES):
    mine, theirs = pattern(me, size, i), pattern(left, size, i)
    hmine, htheirs = pattern(me, size, i + 100), pattern(left, size, i + 100)
    src[:size].copy_from(mine)
    shmem.barrier_all()
    t0 = time.perf_counter()
    shmem.put(a[:size], src[:size], right)  # GPU -> peer GPU
    shmem.quiet()
    t1 = time.perf_counter()
    shmem.put(b[:size], hmine, right)  # host -> peer GPU
    shmem.quiet()
    t2 = time.perf_counter()
    shmem.barrier_all()
    check(np.array_equal(a[:size].to_numpy(), theirs), f"{size} B GPU->peer GPU put")
    check(np.array_equal(b[:size].to_numpy(), htheirs), f"{size} B host->peer GPU put")
    t3 = time.perf_counter()
    shmem.get(c[:size], a[:size], right)  # peer GPU -> GPU: what this PE put there
    t4 = time.perf_counter()
    check(np.array_equal(c[:size].to_numpy(), mine), f"{size} B peer GPU->GPU get")
    host = np.empty(size, np.uint8)
    shmem.get(host, b[:size], right)  # peer GPU -> host
    check(np.array_equal(host, hmine), f"{size} B peer GPU->host get")
    if me == 0 and n > 1:
        print(f"PE 0 {size:>9d} B: put GPU->GPU {(t1 - t0) * 1e6:9.1f} us, host->GPU "
              f"{(t2 - t1) * 1e6:9.1f} us, get GPU<-GPU {(t4 - t3) * 1e6:9.1f} us", flush=True)
    shmem.barrier_all()  # every PE checked before the next size overwrites
check(requests() == before, f"puts and gets sent {requests() - before} domain-proxy requests")

# AMOs on PE 0's word: through its domain proxy (a device atomic there), none by UCX
ctr = shmem.zeros(1, np.int64, domain="cuda")
before = requests()
olds = [int(shmem.atomic_fetch_inc(ctr, 0)) for _ in range(20)]
shmem.atomic_add(ctr, 5, 0)
check(len(set(olds)) == 20, f"fetch_inc values are distinct: {olds}")
check(requests() - before == (0 if me == 0 else 21),
      f"{requests() - before} domain-proxy requests for 21 AMOs on PE 0 from PE {me}")
shmem.barrier_all()
if me == 0:
    check(int(ctr.to_numpy()[0]) == 25 * n, f"counter {ctr.to_numpy()[0]} != {25 * n}")
shmem.barrier_all()
check(shmem.atomic_compare_swap(ctr, 25 * n, -1, 0) in (25 * n, -1), "compare_swap")
shmem.barrier_all()
check(shmem.atomic_fetch(ctr, 0) == -1, "exactly one compare_swap won")

# a fetching AMO right after a put of the same word (UCX, then the proxy) sees the put
check_fetch_sees_put("cuda", 3)

# put_signal: the data by UCX, then the signal by the proxy
sig = shmem.new_signal(domain="cuda")
data = shmem.zeros(4, np.float64, domain="cuda")
shmem.put_signal(data, np.full(4, me + 0.5), right, sig, me + 1, shmem.SIGNAL_SET)
seen = shmem.signal_wait_until(sig, shmem.CMP.EQ, left + 1)
check(seen == left + 1 and np.all(data.to_numpy() == left + 0.5), "put_signal over ucx+proxy")
shmem.barrier_all()

for x in (a, b, src, c, ctr, data):
    shmem.free(x)
shmem.del_signal(sig)
print(f"routes: {sorted({r.name for r in rt.routing.routes})}")
print("cuda_ucx ok", flush=True)
