"""The ``cuda`` memory domain (plugins/cuda) under the launcher, on a machine with NVIDIA GPUs:
CudaArrays take puts, gets and AMOs from every kind of source, waits, signals and reductions
work on them, and CuPy and torch (when importable) view them without a copy (CUDA array
interface and DLPack)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from _common import check

from vkshmem import shmem
from vkshmem.core.errors import WaitTimeoutError

me, n = shmem.my_pe(), shmem.n_pes()
right, left = (me + 1) % n, (me - 1) % n
rt = shmem._state.rt

a = shmem.zeros(1024, np.int64, domain="cuda")
heap = rt.domains.heaps["cuda"]
check(type(a).__name__ == "CudaArray" and not a.to_numpy().any(), "a zeroed CudaArray")
print(f"PE {me} cuda domain on {a.domain.device.name} (GPU {a.domain.device.ordinal}): "
      f"{heap.route_names}", flush=True)
shmem.barrier_all()

# host -> cuda, cuda -> cuda, cuda -> host
shmem.put(a[:8], np.arange(8, dtype=np.int64) + 100 * me, right)
b = shmem.full(8, me + 1, np.int64, domain="cuda")
shmem.put(a[8:16], b, right)
shmem.barrier_all()
got = a.to_numpy()
check(np.array_equal(got[:8], np.arange(8) + 100 * left), f"host->cuda put: {got[:8]}")
check(np.array_equal(got[8:16], np.full(8, left + 1)), f"cuda->cuda put: {got[8:16]}")
h = np.empty(8, np.int64)
shmem.get(h, a[:8], right)
check(np.array_equal(h, np.arange(8) + 100 * me), f"cuda->host get: {h}")
c = shmem.zeros(8, np.int64, domain="cuda")
shmem.get(c, a[8:16], right)
check(np.array_equal(c.to_numpy(), np.full(8, me + 1)), "cuda->cuda get")

# contended AMOs on PE 0's word (a kernel on the owner's GPU or a peer's)
ctr = shmem.zeros(1, np.int64, domain="cuda")
olds = [shmem.atomic_fetch_inc(ctr, 0) for _ in range(20)]
shmem.atomic_add(ctr, 5, 0)
check(len(set(olds)) == 20, f"fetch_inc values are distinct: {olds}")
shmem.barrier_all()
if me == 0:
    check(int(ctr.to_numpy()[0]) == 25 * n, f"counter {ctr.to_numpy()[0]} != {25 * n}")
shmem.barrier_all()  # PE 0 has read the counter
check(shmem.atomic_compare_swap(ctr, 25 * n, -1, 0) in (25 * n, -1), "compare_swap")
shmem.barrier_all()
check(shmem.atomic_fetch(ctr, 0) == -1, "exactly one compare_swap won")

# signal + wait on CUDA memory
sig = shmem.new_signal(domain="cuda")
data = shmem.zeros(4, np.float64, domain="cuda")
shmem.put_signal(data, np.full(4, me + 0.5), right, sig, me + 1, shmem.SIGNAL_SET)
seen = shmem.signal_wait_until(sig, shmem.CMP.EQ, left + 1)
check(seen == left + 1 and np.all(data.to_numpy() == left + 0.5), "put_signal on CUDA memory")

# reductions into CUDA memory: from mapped peers by one kernel (routes direct), through the
# gather otherwise; in place (target is source) and a dtype the kernel lacks take the gather
src = shmem.full(5, me + 1, np.int64, domain="cuda")
dst = shmem.zeros(5, np.int64, domain="cuda")
shmem.sum_reduce(dst, src)
check(np.all(dst.to_numpy() == n * (n + 1) // 2), f"sum_reduce: {dst.to_numpy()}")
big = 300_000  # more than the gather's scratch per team, and not a multiple of a block
fsrc = shmem.zeros(big, np.float32, domain="cuda")
fsrc.copy_from(np.arange(big, dtype=np.float32) % 7 + me)
fdst = shmem.zeros(big, np.float32, domain="cuda")
for op, fn, ref in (("sum", shmem.sum_reduce, np.add), ("max", shmem.max_reduce, np.maximum),
                    ("min", shmem.min_reduce, np.minimum), ("prod", shmem.prod_reduce,
                                                            np.multiply)):
    fn(fdst, fsrc)
    want = np.arange(big, dtype=np.float32) % 7
    want = ref.reduce([want + p for p in range(n)], axis=0).astype(np.float32)
    check(np.array_equal(fdst.to_numpy(), want), f"{op}_reduce of {big} float32")
# the same call again, on new data (two GPUs: the round's plan kept from the first sum)
fsrc.copy_from(np.arange(big, dtype=np.float32) % 5 + 2 * me)
shmem.sum_reduce(fdst, fsrc)
want = sum(np.arange(big, dtype=np.float32) % 5 + 2 * p for p in range(n)).astype(np.float32)
check(np.array_equal(fdst.to_numpy(), want), "a repeated sum_reduce on new data")
fsrc.copy_from(np.arange(big, dtype=np.float32) % 7 + me)
# two PEs on two GPUs: those five (1.2 MB each) took the push-then-reduce path (pairreduce)
two_gpus = n == 2 and any(m is not None and m.remote_gpu for m in heap.direct)
pair = fdst.domain._pair
check((pair is not None and pair.rounds == 5) if two_gpus else pair is None,
      f"pair all-reduce rounds: {pair and pair.rounds} (two GPUs: {two_gpus})")
if two_gpus:  # 64 MiB and more: the round in two halves on two streams, an odd count
    large = (64 << 20) // 4 + 4001
    lsrc = shmem.zeros(large, np.float32, domain="cuda")
    ldst = shmem.full(large + 3, 42, np.float32, domain="cuda")
    for k, (fn, ref) in enumerate(((shmem.sum_reduce, np.add), (shmem.max_reduce, np.maximum),
                                   (shmem.sum_reduce, np.add))):
        lsrc.copy_from(np.arange(large, dtype=np.float32) % (7 + k) + (k + 1) * me)
        fn(ldst, lsrc, large)
        want = ref.reduce([np.arange(large, dtype=np.float32) % (7 + k) + (k + 1) * p
                           for p in range(n)], axis=0).astype(np.float32)
        got = ldst.to_numpy()
        check(np.array_equal(got[:large], want) and np.all(got[large:] == 42),
              f"all-reduce {k} of {large} float32 (the split round)")
    check(pair.rounds == 8, f"pair all-reduce rounds: {pair.rounds}, not 8")
# four PEs, two per GPU: PE 0 pairs with PE 1, then with PE 3 (both on the other GPU), in
# teams of two: each partner writes its own word and counts its own rounds, so the rounds of
# one pair do not hold up the other
other_gpu = [p for p in range(n) if p != me and heap.direct[p] is not None
             and heap.direct[p].remote_gpu]
W = shmem.TEAM_WORLD


def agree_all(flag: int) -> bool:
    """Whether ``flag`` holds on every PE (collective)."""
    v = shmem.full(1, flag, np.int64)
    shmem.min_reduce(v, v)
    out = bool(v[0])
    shmem.free(v)
    return out


if n == 4 and agree_all(int(other_gpu == ([1, 3] if me in (0, 2) else [0, 2]))):
    rounds0 = fdst.domain._pair.rounds if fdst.domain._pair else 0
    want = np.arange(big, dtype=np.float32) % 7 * 2
    for team, pes in ((W.split_strided(0, 1, 2), (0, 1)), (W.split_strided(0, 3, 2), (0, 3)),
                      (W.split_strided(0, 1, 2), (0, 1))):
        if me in pes:
            shmem.sum_reduce(fdst, fsrc, team=team)
            check(np.array_equal(fdst.to_numpy(), want + sum(pes)),
                  f"pair all-reduce in the team {pes}")
            team.destroy()
    mine = sum(me in pes for pes in ((0, 1), (0, 3), (0, 1)))
    rounds = fdst.domain._pair.rounds if fdst.domain._pair else 0
    check(rounds == rounds0 + mine, f"pair rounds in teams of two: {rounds}, not "
          f"{rounds0 + mine}")
shmem.barrier_all()


def lone_round(dst: Any, src: Any, count: int, what: str) -> None:
    """PE 0's pair all-reduce without its peer: the wait ends in WaitTimeoutError."""
    t0 = time.monotonic()
    try:
        dst.domain._pair_reduce(0, dst.offset, [(heap.local, src.offset),
                                                (heap.direct[1], src.offset)],
                                count, "sum", np.dtype(np.float32))
        check(False, f"a lone {what} returned")
    except WaitTimeoutError as exc:
        check("VKSHMEM_GPU_TIMEOUT" in str(exc) and time.monotonic() - t0 < 5,
              f"lone {what}: {exc}")


if two_gpus and me == 0:  # a peer that never pushes: the wait ends, it does not hang
    pair.timeout = 0.5
    lone_round(fdst, fsrc, big, "pair all-reduce")
    # the split round's release: its own word frees both of stream B's waits
    lone_round(ldst, lsrc, large, "split pair all-reduce")
shmem.barrier_all()  # no pair all-reduce after this one (the pair's rounds now differ)
fn_in_place = shmem.zeros(5, np.uint32, domain="cuda")
fn_in_place.copy_from(np.full(5, 1 << me, np.uint32))
shmem.or_reduce(fn_in_place, fn_in_place)
check(np.all(fn_in_place.to_numpy() == (1 << n) - 1), "or_reduce in place")
half = shmem.full(3, me + 1, np.float16, domain="cuda")
hdst = shmem.zeros(3, np.float16, domain="cuda")
shmem.sum_reduce(hdst, half)
check(np.all(hdst.to_numpy() == n * (n + 1) // 2), "float16 sum_reduce (gathered)")

try:
    import cupy as cp
except Exception:  # no CuPy: the interface is still checked
    cp = None
iface = a.__cuda_array_interface__
check(iface["data"][0] == a.device_pointer and iface["shape"] == (1024,), "CUDA array interface")
if cp is not None:
    view = cp.asarray(a)
    check(int(view[:8].sum()) == int((np.arange(8) + 100 * left).sum()), "CuPy sees the data")
    with cp.cuda.Device(a.domain.device.ordinal):
        view[16] = 42
        cp.cuda.get_current_stream().synchronize()  # CUDA work ends before vkshmem reads
    check(int(a.to_numpy()[16]) == 42, "CuPy writes land in the symmetric heap")
    with cp.cuda.Device(a.domain.device.ordinal):
        dl = cp.from_dlpack(a)  # DLPack: the same memory again
        check(dl.data.ptr == a.device_pointer and int(dl[16]) == 42, "cupy.from_dlpack")
        back = shmem.from_dlpack(dl[8:16])  # through CuPy's own __dlpack__
        check(back.offset == a.offset + 64 and back.shape == (8,), "from_dlpack of CuPy")
        del dl
try:
    import torch
except Exception:  # no torch: DLPack is still checked through CuPy
    torch = None
if torch is not None:
    t = torch.from_dlpack(a)
    check(t.data_ptr() == a.device_pointer and t.device.index == a.domain.device.ordinal
          and int(t[:8].sum()) == int((np.arange(8) + 100 * left).sum()), "torch.from_dlpack")
    back = shmem.from_dlpack(t[900:904])  # a torch slice back to a symmetric array
    check(type(back) is type(a) and back.offset == a.offset + 900 * 8 and back.shape == (4,),
          "shmem.from_dlpack of a torch slice")
    shmem.put(back, np.full(4, 1000 + me, np.int64), me)
    check(np.all(a.to_numpy()[900:904] == 1000 + me), "a put into the from_dlpack array")
    del t
pv = shmem.ptr(a, right)  # the right neighbour's array as mapped on this GPU
if heap.route_names[right] == "direct":
    check(pv is not None and pv.__cuda_array_interface__["shape"] == (1024,),
          "ptr gives a device view of a mapped peer")
    if cp is not None:
        check(int(cp.asarray(pv)[:8].sum()) == int((np.arange(8) + 100 * me).sum()),
              "the ptr view reads the peer's memory")
        with cp.cuda.Device(a.domain.device.ordinal):
            check(int(cp.from_dlpack(pv)[:8].sum()) == int((np.arange(8) + 100 * me).sum()),
                  "the ptr view through DLPack")
else:
    check(pv is None, "no view of a peer reached through the proxy")
shmem.barrier_all()
for x in (a, b, c, ctr, data, src, dst, fsrc, fdst, fn_in_place, half, hdst):
    shmem.free(x)
shmem.del_signal(sig)
print(f"routes: {sorted({r.name for r in rt.routing.routes})}")
print("cuda_domain ok", flush=True)
