"""Probe (run by hand on a two-GPU NVIDIA machine: ``VKSHMEM_GPU_PROVIDER=vulkan python -m
vkshmem run -n 2 tests/gpu/pair_phase_probe.py``, and the same with ``cuda``): the GPU time of
each phase of the two-GPU all-reduce's pair round on the domain ``gpu``'s heaps, by CUDA events
on a stream of the probe's own in the domain's context, so both domains run the same calls:
the push of half of 256 MiB into the peer's target (both PEs at once, after a host barrier),
the fold of this PE's share into both targets (local reads, half of its writes across the
link), one after the other; then, timed on the host, two barriers, the domain's own round (the
C call) and the API's call, split at the functions it passes (its Python, the barriers, the
round), and, on the Vulkan domain, the Python of the ring's entry. Where the domains differ,
this says whether the GPUs' work differs or the time around it (it found the ring's entry
spending 19-36 us on numpy's slow ``dtype.name``, since keyed by the dtype itself)."""

from __future__ import annotations

import ctypes
import itertools
import statistics
import sys
import threading
import time
import timeit
from typing import Any

import numpy as np
from probe_timing import best_per_call

from vkshmem import shmem
from vkshmem.gpu.cudafold import _Pointers

N = 64 << 20  # float32 elements: 256 MiB
HALF = N // 2
ISZ = 4
me, peer = shmem.my_pe(), 1 - shmem.my_pe()
src = shmem.zeros(N, np.float32, domain="gpu")
dst = shmem.zeros(N, np.float32, domain="gpu")
src.copy_from(np.full(N, me + 1, np.float32))
heap = shmem._state.rt.heaps[src.domain.spec.name]
dom = heap.domain
name = dom.spec.name

link = heap.links[peer] if heap.links else None
if link is not None:  # the Vulkan domain's CUDA link
    hub = link.hub
    cu, ctx, local, remote = hub.cu, hub.view.context, hub.view.pointer, link._ptr
    fn, grid, block = hub.fold_launch("sum", np.dtype(np.float32), HALF)
    sms = hub._kernels().sms
else:  # the cuda domain: the peer's heap mapped (route direct)
    dev = dom.device
    cu, ctx, local, remote = dev.cu, dev.ctx, dom.local.va, heap.direct[peer].va
    fn = cu.CUfunction(dom.reducer.fn("sum", np.dtype(np.float32), 2))
    grid, block, sms = dom.reducer.grid(HALF, np.float32, 512, 2), 512, dev.sms


def ok(res: Any) -> Any:
    err, *rest = res if isinstance(res, tuple) else (res,)
    assert int(err) == 0, err
    return rest[0] if len(rest) == 1 else rest


ok(cu.cuCtxSetCurrent(ctx))
stream = ok(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING))
ev = [ok(cu.cuEventCreate(0)) for _ in range(3)]
lo, plo = me * HALF, peer * HALF
dsts, srcs = _Pointers(), _Pointers()
dsts.p[0], dsts.p[1] = local + dst.offset + lo * ISZ, remote + dst.offset + lo * ISZ
mine, pushed = local + src.offset + lo * ISZ, local + dst.offset + lo * ISZ
srcs.p[0], srcs.p[1] = (mine, pushed) if me == 0 else (pushed, mine)
args = (dsts, ctypes.c_int(2), srcs, ctypes.c_int(2), ctypes.c_uint64(HALF))
params = (ctypes.c_void_p * len(args))(*[ctypes.addressof(a) for a in args])


def phases() -> tuple[float, float, float]:
    """(push, fold, host) of one push-then-fold on the probe's stream, after a barrier:
    GPU milliseconds by events, the host's from the barrier's end to the stream's end."""
    shmem.barrier_all()
    t0 = time.perf_counter()
    ok(cu.cuEventRecord(ev[0], stream))
    ok(cu.cuMemcpyDtoDAsync(remote + dst.offset + plo * ISZ, local + src.offset + plo * ISZ,
                            HALF * ISZ, stream))
    ok(cu.cuEventRecord(ev[1], stream))
    ok(cu.cuLaunchKernel(fn, grid, 1, 1, block, 1, 1, 0, stream, ctypes.addressof(params), 0))
    ok(cu.cuEventRecord(ev[2], stream))
    ok(cu.cuStreamSynchronize(stream))
    host = time.perf_counter() - t0
    return (ok(cu.cuEventElapsedTime(ev[0], ev[1])) * 1e3,
            ok(cu.cuEventElapsedTime(ev[1], ev[2])) * 1e3, host * 1e6)


def domain_round() -> float:
    """Host microseconds of the domain's own pair round between two barriers (no API)."""
    shmem.barrier_all()
    t0 = time.perf_counter()
    if link is not None:
        link.pair_reduce(me, (0, 1), [(0, HALF), (HALF, N - HALF)], dst.offset, src.offset,
                         "sum", np.dtype(np.float32))
    else:
        sources = [(dom.local if pe == me else heap.direct[pe], src.offset) for pe in (0, 1)]
        dom.reduce_from(dst.offset, sources, N, "sum", np.dtype(np.float32))
    return (time.perf_counter() - t0) * 1e6


stamps: list[tuple[str, float]] = []


def _stamped(fn: Any, label: str) -> Any:
    def call(*args: Any) -> Any:
        stamps.append((label + ">", time.perf_counter()))
        try:
            return fn(*args)
        finally:
            stamps.append((label + "<", time.perf_counter()))
    return call


def api_call() -> tuple[float, list[tuple[str, float]]]:
    """Host microseconds of the API's all-reduce (after a barrier), and the steps between the
    stamps of the functions it passes (its Python, the barriers, the round)."""
    shmem.barrier_all()
    stamps.clear()
    stamps.append(("api", time.perf_counter()))
    shmem.sum_reduce(dst, src)
    stamps.append(("end", time.perf_counter()))
    steps = [(f"{a}-{b}", (tb - ta) * 1e6) for (a, ta), (b, tb) in
             itertools.pairwise(stamps)]
    return (stamps[-1][1] - stamps[0][1]) * 1e6, steps


api_call()  # makes the domain's round (the cuda domain's PairReduce), then time inside it
dc = sys.modules["vkshmem._api.device_collectives"]
for fname in ("reduce", "_reduce_in_place", "ring_reduce"):
    setattr(dc, fname, _stamped(getattr(dc, fname), fname.strip("_")[:9]))
ct = shmem._state.rt.world
ct.sync = _stamped(ct.sync, "sync")
if link is not None:
    link.pair_reduce = _stamped(link.pair_reduce, "round")
else:
    dom._pair.round = _stamped(dom._pair.round, "round")
for _ in range(3):
    phases()
    domain_round()
    api_call()
runs = [phases() for _ in range(30)]
rounds, apis = [], []
for _ in range(30):  # interleaved: nothing that drifts in time favours one
    rounds.append(domain_round())
    apis.append(api_call())
shmem.barrier_all()
ok(cu.cuCtxSetCurrent(ctx))
ok(cu.cuStreamDestroy(stream))
push, fold, host = (statistics.median(r[i] for r in runs) for i in range(3))
barriers = best_per_call(lambda: (shmem.barrier_all(), shmem.barrier_all()), 200)
rows = [("two barriers", barriers), ("push 128 MiB (GPU)", push), ("fold 64 M floats (GPU)", fold),
        ("push + fold (host)", host), ("domain round (host)", statistics.median(rounds)),
        ("domain round best", min(rounds))]
rows.append(("API call", statistics.median(r[0] for r in apis)))
rows += [(k, statistics.median(r[1][i][1] for r in apis)) for i, (k, _) in
         enumerate(apis[0][1])]
print(f"PE {me} {name} grid {grid} x {block} ({sms} SMs): " +
      ", ".join(f"{k} {v:.1f}" for k, v in rows) + " us; threads: " +
      ", ".join(t.name for t in threading.enumerate()), flush=True)
if link is not None and me == 0:  # the Python the ring's entry runs before its barrier
    f32 = np.dtype(np.float32)
    dr = sys.modules["vkshmem._api.device_ring"]
    for what, fn in (("link.pairs", lambda: link.pairs((0, 1), "sum", f32)),
                     ("hub.fold_kernel", lambda: link.hub.fold_kernel("sum", f32)),
                     ("folds.known", lambda: link.hub._folds.known("sum", f32)),
                     ("_shares", lambda: dr._shares(N, 2)),
                     ("config", lambda: shmem._state.rt.config.gpu_ring_reduce)):
        print(f"{what:16s} {min(timeit.repeat(fn, number=2000, repeat=5)) / 2000 * 1e6:.2f} us",
              flush=True)
