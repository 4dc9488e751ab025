"""The GPU domain: DeviceArrays, the four CPU/GPU pairs of put/get for every dtype, AMOs on GPU
words (atomic across PEs and with the host path), signals and waits on GPU memory, and the
collectives on GPU memory. Run under ``vkshmem run`` (see tests/test_gpu_multipe.py)."""

from __future__ import annotations

import dataclasses

import numpy as np
from _common import DTYPES, check, data

from vkshmem import shmem
from vkshmem.core.domains.array import DomainArray
from vkshmem.core.errors import FeatureNotAvailableError, InvalidArgumentError

me, n = shmem.my_pe(), shmem.n_pes()
right, left = (me + 1) % n, (me - 1) % n
N = 129

# -- allocation and the DeviceArray surface ---------------------------------------------------
g = shmem.zeros((4, 8), np.int32, domain="gpu")
# the Vulkan domain's arrays are DeviceArrays; any GPU domain's (e.g. the cuda plugin's, with
# VKSHMEM_GPU_PROVIDER=cuda) DomainArrays
vulkan = g.domain.spec.name == "vulkan"
check(isinstance(g, shmem.DeviceArray if vulkan else DomainArray) and g.shape == (4, 8)
      and g.dtype == np.int32, "type")
check(g.nbytes == 128 and g.size == 32 and len(g) == 4 and g.ndim == 2, "attributes")
check(not g.to_numpy().any(), "zeros")
g.copy_from(np.arange(32, dtype=np.int32).reshape(4, 8))
check(np.array_equal(g[1].to_numpy(), np.arange(8, 16)), "row view")
check(np.array_equal(g[1:3].to_numpy().ravel(), np.arange(8, 24)), "slice view")
check(g[2, 3] == 19 and g[1][2] == 10, "element read")
g[0, 0] = 100
check(g.to_numpy()[0, 0] == 100 and g[0, 1] == 1, "element write")
check(g.reshape(32)[5] == 5 and g.view(np.uint8).shape == (4, 32), "reshape/view")
try:
    g[::2]
    check(False, "a strided DeviceArray slice must be refused")
except InvalidArgumentError:
    pass
f = shmem.full(5, 2.5, np.float32, domain="gpu")
o = shmem.ones(3, np.int64, domain="gpu")
a = shmem.array(np.arange(6, dtype=np.uint16) + me, domain="gpu")
check(np.array_equal(f.to_numpy(), np.full(5, 2.5, np.float32)), "full")
check(np.array_equal(o.to_numpy(), np.ones(3, np.int64)), "ones")
check(np.array_equal(a.to_numpy(), np.arange(6) + me), "array")
auto = shmem.zeros(4, np.float64, domain="auto")
gpu_is_real = not (vulkan and g.domain.device.info.is_cpu)
check(isinstance(auto, DomainArray) == gpu_is_real, "auto picks the GPU only on a GPU")
try:
    view = g.to_numpy(zero_copy=True)
    check(vulkan and g.domain.memory.host_visible and view[0, 0] == 100, "zero-copy view")
    del view
except FeatureNotAvailableError as exc:
    check(g.domain.no_view_reason() in str(exc), "no-view reason")
for x in (f, o, a, auto):
    shmem.free(x)
shmem.free(g)

# -- the four pairs, every dtype -----------------------------------------------------------
for i, dt in enumerate(DTYPES):
    mine = data(dt, N, seed=100 * i + me)
    theirs = data(dt, N, seed=100 * i + left)
    gdst = shmem.zeros(N, dt, domain="gpu")
    hdst = shmem.zeros(N, dt)
    gsrc = shmem.array(mine, domain="gpu")
    name = np.dtype(dt).name
    # CPU -> GPU and GPU -> GPU puts into the right neighbour
    shmem.put(gdst, mine, right)
    shmem.barrier_all()
    check(np.array_equal(gdst.to_numpy(), theirs), f"put cpu->gpu {name}")
    shmem.barrier_all()
    gdst.fill(0)
    shmem.barrier_all()
    shmem.put(gdst[1:], gsrc[2:], right, size=100)
    shmem.barrier_all()
    want = np.zeros(N, dt)
    want[1:101] = theirs[2:102]
    check(np.array_equal(gdst.to_numpy(), want), f"put gpu->gpu {name}")
    # GPU -> CPU put, then gets of each kind from the left neighbour
    shmem.put(hdst, gsrc, right)
    shmem.barrier_all()
    check(np.array_equal(hdst, theirs), f"put gpu->cpu {name}")
    got = np.empty(N, dt)
    shmem.get(got, gsrc, left)  # GPU -> CPU
    check(np.array_equal(got, theirs), f"get gpu->cpu {name}")
    gtmp = shmem.zeros(N, dt, domain="gpu")
    shmem.get(gtmp, hdst, left)  # CPU -> GPU (a local DeviceArray target)
    check(np.array_equal(gtmp.to_numpy(), data(dt, N, seed=100 * i + (left - 1) % n)),
          f"get cpu->gpu {name}")
    shmem.get(gtmp, gsrc, left)  # GPU -> GPU
    check(np.array_equal(gtmp.to_numpy(), theirs), f"get gpu->gpu {name}")
    shmem.barrier_all()
    for x in (gtmp, gsrc, hdst, gdst):
        shmem.free(x)

# -- strided and non-blocking ------------------------------------------------------------------
gs = shmem.zeros(20, np.int64, domain="gpu")
shmem.iput(gs, np.arange(10, dtype=np.int64) + 10 * me, right, tst=2, sst=1, size=10)
shmem.put_nbi(gs[19:], np.array([7 + me], np.int64), right)
shmem.quiet()
shmem.barrier_all()
v = gs.to_numpy()
check(np.array_equal(v[0:19:2], np.arange(10) + 10 * left) and v[19] == 7 + left, "iput/put_nbi")
loc = shmem.zeros(5, np.int64, domain="gpu")
shmem.iget(loc, gs, left, tst=1, sst=2, size=5)
check(np.array_equal(loc.to_numpy(), np.arange(5) + 10 * ((left - 1) % n)), "iget")
shmem.barrier_all()
shmem.free(loc)
shmem.free(gs)

# -- non-blocking puts and gets, batched until quiet (more than one batch of 256 copies) -------
K = 300
gsrc = shmem.array(np.arange(4 * K, dtype=np.int32) + 1000 * me, domain="gpu")
gdst = shmem.zeros(4 * K, np.int32, domain="gpu")
gdst2 = shmem.zeros(4 * K, np.int32, domain="gpu")
gback = shmem.zeros(4 * K, np.int32, domain="gpu")
hsym = shmem.array(np.arange(4 * K, dtype=np.int32) + 7000 * me)  # host heap: imported
hback = shmem.zeros(4 * K, np.int32)
shmem.barrier_all()
for k in range(0, 4 * K, 4):
    shmem.put_nbi(gdst[k:k + 4], gsrc[k:k + 4], right)  # GPU -> GPU
    shmem.put_nbi(gdst2[k:k + 4], hsym[k:k + 4], right)  # CPU (symmetric) -> GPU
    shmem.get_nbi(gback[k:k + 4], gsrc[k:k + 4], left)  # GPU <- GPU
    shmem.get_nbi(hback[k:k + 4], gsrc[k:k + 4], left)  # CPU (symmetric) <- GPU
shmem.quiet()
check(np.array_equal(gback.to_numpy(), np.arange(4 * K) + 1000 * left), "get_nbi GPU<-GPU")
check(np.array_equal(hback, np.arange(4 * K) + 1000 * left), "get_nbi CPU<-GPU")
shmem.barrier_all()
check(np.array_equal(gdst.to_numpy(), np.arange(4 * K) + 1000 * left), "put_nbi GPU->GPU")
check(np.array_equal(gdst2.to_numpy(), np.arange(4 * K) + 7000 * left), "put_nbi CPU->GPU")
shmem.barrier_all()  # everyone has checked before gdst changes again
shmem.put_nbi(gdst[:4], gsrc[:4], right)
shmem.fence()  # orders the batched put before the blocking one
shmem.put(gdst[:4], np.full(4, -1, np.int32), right)
shmem.barrier_all()
check(np.array_equal(gdst[:4].to_numpy(), np.full(4, -1)), "fence after put_nbi")
for x in (gsrc, gdst, gdst2, gback):
    shmem.free(x)
shmem.free(hsym)
shmem.free(hback)

# -- AMOs on GPU words: every op, both widths, and contention from every PE ------------------
for dt in (np.int32, np.int64, np.uint32, np.uint64):
    w = shmem.zeros(1, dt, domain="gpu")
    shmem.barrier_all()
    if me == 0:
        check(shmem.atomic_fetch(w, right) == 0, f"fetch {dt}")
        shmem.atomic_set(w, 12, right)
        check(shmem.atomic_swap(w, 10, right) == 12, f"swap {dt}")
        check(shmem.atomic_compare_swap(w, 10, 6, right) == 10, f"cswap hit {dt}")
        check(shmem.atomic_compare_swap(w, 10, 99, right) == 6, f"cswap miss {dt}")
        check(shmem.atomic_fetch_and(w, 3, right) == 6, f"and {dt}")
        check(shmem.atomic_fetch_or(w, 8, right) == 2, f"or {dt}")
        check(shmem.atomic_fetch_xor(w, 1, right) == 10, f"xor {dt}")
        check(shmem.atomic_fetch_inc(w, right) == 11, f"inc {dt}")
        shmem.atomic_add(w, 3, right)
        check(shmem.atomic_fetch(w, right) == 15, f"add {dt}")
        fetched = np.zeros(1, dt)
        shmem.atomic_fetch_add_nbi(fetched, w, 1, right)
        shmem.quiet()
        check(fetched[0] == 15, f"fetch_add_nbi {dt}")
    shmem.barrier_all()
    w.fill(0)
    shmem.barrier_all()
    K = 25
    for _ in range(K):  # every PE hammers PE 0's word
        shmem.atomic_fetch_add(w, 1, 0)
    shmem.barrier_all()
    if me == 0:
        check(int(w[0]) == n * K, f"contended fetch_add {dt}: {int(w[0])} != {n * K}")
    shmem.barrier_all()
    shmem.free(w)
fw = shmem.zeros(1, np.float64, domain="gpu")
shmem.atomic_set(fw, 1.5 + me, right)
shmem.barrier_all()
check(shmem.atomic_fetch(fw, me) == 1.5 + left, "float64 set/fetch")
shmem.barrier_all()
shmem.free(fw)

# -- signals and waits on GPU memory -----------------------------------------------------------
sig = shmem.new_signal(domain="gpu")
box = shmem.zeros(64, np.float32, domain="gpu")
hsig = shmem.new_signal()
payload = np.arange(64, dtype=np.float32) * (me + 1)
shmem.put_signal(box, payload, right, sig, 1, shmem.SIGNAL_ADD)
check(shmem.signal_wait_until(sig, shmem.CMP.GE, 1) == 1, "gpu signal wait")
check(np.array_equal(box.to_numpy(), np.arange(64, dtype=np.float32) * (left + 1)), "gpu data")
shmem.barrier_all()
# GPU data, host signal
shmem.put_signal(box, np.full(64, me, np.float32), right, hsig, 5, shmem.SIGNAL_SET)
shmem.signal_wait_until(hsig, shmem.CMP.EQ, 5)
check(np.array_equal(box.to_numpy(), np.full(64, left, np.float32)), "gpu data, host signal")
shmem.barrier_all()
shmem.signal_set(sig, 41, right)
shmem.signal_add(sig, 1, right)
check(shmem.signal_wait_until(sig, shmem.CMP.EQ, 42) == 42 and shmem.signal_fetch(sig) == 42,
      "signal_set/add on a GPU word")
flags = shmem.zeros(n, np.int64, domain="gpu")
shmem.barrier_all()
shmem.atomic_set(flags[me:me + 1], me + 1, right)
shmem.wait_until(flags[left:left + 1], shmem.CMP.EQ, left + 1)
check(shmem.test(flags[left:left + 1], shmem.CMP.EQ, left + 1), "test on a GPU word")
shmem.barrier_all()
for x in (flags, hsig, box):
    shmem.free(x)
shmem.del_signal(sig)

# -- collectives on GPU memory ------------------------------------------------------------------
M = 37
gpu_dev = shmem._state.rt.domains.domain("gpu").domain.device
for dt in DTYPES:  # on the GPU where reduce.comp has the dtype (not longdouble: numpy)
    tol = {"rtol": 1e-2, "atol": 1e-3} if dt == np.float16 else {"rtol": 1e-5}
    src = shmem.array(data(dt, M, seed=7 * me + 1), domain="gpu")
    dst = shmem.zeros(M, dt, domain="gpu")
    every = [data(dt, M, seed=7 * p + 1) for p in range(n)]
    ops = ["sum", "prod", "min", "max", "and", "or", "xor"]
    for op in ops:
        kind = np.dtype(dt).kind
        if (op in ("and", "or", "xor") and kind not in "iu") or (
                op in ("min", "max") and kind == "c"):
            continue
        shmem.reduce(dst, src, op)
        ufunc = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum,
                 "and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor}[op]
        want = every[0].copy()
        for p in range(1, n):
            want = ufunc(want, every[p])
        got = dst.to_numpy()
        ok = np.allclose(got, want, **tol) if kind in "fc" else np.array_equal(got, want)
        check(ok, f"reduce {op} {np.dtype(dt).name}")
    if dt == np.int16 and vulkan:  # a device without shaderInt16: the reduction on the host
        real = gpu_dev.info
        gpu_dev.info = dataclasses.replace(
            real, shader_features=real.shader_features - {"shaderInt16"})
        try:
            shmem.reduce(dst, src, "xor")
        finally:
            gpu_dev.info = real
        want = every[0].copy()
        for p in range(1, n):
            want = want ^ every[p]
        check(np.array_equal(dst.to_numpy(), want), "reduce xor int16 on the host")
    hdst = np.zeros(M, dt)
    hsym = shmem.zeros(M, dt)
    shmem.sum_reduce(hsym, src)  # GPU source, host target
    hdst[:] = hsym
    want = sum(every[1:], every[0])
    check(np.allclose(hdst, want, **tol), f"sum gpu->host {np.dtype(dt).name}")
    shmem.sum_inscan(dst, src)
    check(np.allclose(dst.to_numpy(), sum(every[1:me + 1], every[0]), **tol),
          f"inscan {np.dtype(dt).name}")
    shmem.sum_exscan(dst, src)
    ex = sum(every[1:me], every[0]) if me else np.zeros(M, dt)
    check(np.allclose(dst.to_numpy(), ex, **tol), f"exscan {np.dtype(dt).name}")
    shmem.barrier_all()
    for x in (hsym, dst, src):
        shmem.free(x)

root = n - 1
bsrc = shmem.array(np.arange(10, dtype=np.int64) * (me + 1), domain="gpu")
bdst = shmem.zeros(10, np.int64, domain="gpu")
shmem.broadcast(bdst, bsrc, root)
check(np.array_equal(bdst.to_numpy(), np.arange(10) * (root + 1)), "broadcast")
fc = shmem.zeros(3 * n, np.int64, domain="gpu")
shmem.fcollect(fc, np.full(3, me, np.int64))  # host source, GPU target
check(np.array_equal(fc.to_numpy(), np.repeat(np.arange(n), 3)), "fcollect")
co = shmem.zeros(n * (n + 1) // 2 + 1, np.int64, domain="gpu")
shmem.collect(co, bsrc[:me + 1])
want = np.concatenate([np.arange(p + 1) * (p + 1) for p in range(n)])
check(np.array_equal(co.to_numpy()[:want.size], want), "collect")
a2s = shmem.array(np.arange(2 * n, dtype=np.int64) + 100 * me, domain="gpu")
a2d = shmem.zeros(2 * n, np.int64, domain="gpu")
shmem.alltoall(a2d, a2s)
want = np.concatenate([np.arange(2 * me, 2 * me + 2) + 100 * p for p in range(n)])
check(np.array_equal(a2d.to_numpy(), want), "alltoall")
hdst = shmem.zeros(10, np.int64)
shmem.broadcast(hdst, bsrc, 0)  # GPU source, host target
check(np.array_equal(hdst, np.arange(10)), "broadcast gpu->host")
shmem.barrier_all()
for x in (hdst, a2d, a2s, co, fc, bdst, bsrc):
    shmem.free(x)

# -- errors ------------------------------------------------------------------------------------
e = shmem.zeros(4, np.int32, domain="gpu")
for bad, what in ((lambda: shmem.put(e, np.zeros(4, np.int64), right), "dtype"),
                  (lambda: shmem.zeros(4, domain="tpu"), "domain"),
                  (lambda: shmem.atomic_add(e, 1, right), "AMO on 4 elements")):
    try:
        bad()
        check(False, f"{what} must raise")
    except InvalidArgumentError:
        pass
shmem.free(e)

last = shmem.zeros(1, np.int8, domain="gpu")
dom = shmem._state.rt.domains.heaps[last.domain.spec.name]  # the domain's heap: its routes
shmem.free(last)
print(f"routes: {sorted({r.name for r in shmem._state.rt.routing.routes})}")
linked = [pe for pe in range(n) if dom.links[pe] is not None]  # peers on other GPUs
amo_links = " (AMOs too)" if linked and all(dom.links[pe].amos for pe in linked) else ""
print(f"gpu: imported {sorted(dom.peers)}, proxy {'on' if dom.proxy else 'off'}, "
      f"linked {linked}{amo_links}, "
      f"domain {last.domain.spec.name} device {last.domain.device.name} uuid "
      f"{last.domain.device.info.uuid if vulkan else last.domain.device.uuid.hex()}")
print(f"gpu ok: {len(DTYPES)} dtypes, {n} PEs")
