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
spending 19-36 us on numpy's slow ``dtype.name``, since keyed by the dtype itself, and then
11-19 us of the API's Python before the round, since skipped on a repeat: ``reduce_again``).
Also timed: the second phase by the copy engine instead (each of 1-16 chunks folded into the
local target only, then pushed by a copy on a second stream): 2 x H200, 2026-11-27, 770-833 us
for push + second phase against 735-742 for push + fold, so the fold's stores across NVLink
stay. ``pair_phase_probe.py sweep`` times the fold alone in 54 shapes of the kernel (UNROLL 1,
2, 4; 1, 2, 4 blocks per SM; 256-1024 threads; plain or streaming stores): 382-400 us on
2 x H200, the shape used (2, plain, 2, 512) 388, within 1.5 % of the best: the fold is bound by
NVLink's rate for SM stores (~350 GB/s against the copy engine's ~385), not by its shape.
``PROBE_SHIFT=64`` (or 256) starts the arrays that many bytes further into the heap, as the
benchmark's are (after an 8-byte word): on 2 x H200 the API call moved by -16 ... +18 us
between processes at any shift (the fold alone 385-397 us from one process to the next), so
alignment is not what varies. The last row times the API call back to back, as the benchmark
does."""

from __future__ import annotations

import ctypes
import itertools
import os
import statistics
import sys
import threading
import time
import timeit
from typing import Any

import numpy as np
from pair_common import ok, pair_heaps
from probe_timing import best_per_call
from vkshmem_cuda.kernels import REDUCE_NAME, compile_kernel, reduce_source
from vkshmem_cuda.vulkan_accel.fold import _Pointers

from vkshmem import shmem

N = 64 << 20  # float32 elements: 256 MiB
HALF = N // 2
ISZ = 4
me, peer = shmem.my_pe(), 1 - shmem.my_pe()
# PROBE_SHIFT=64: the arrays start 64 bytes past a 2 MiB boundary (as the benchmark's, after
# an 8-byte word)
_shift = shmem.zeros(int(os.environ.get("PROBE_SHIFT", "0")) or 1, np.uint8, domain="gpu") \
    if os.environ.get("PROBE_SHIFT") else None
src = shmem.zeros(N, np.float32, domain="gpu")
dst = shmem.zeros(N, np.float32, domain="gpu")
src.copy_from(np.full(N, me + 1, np.float32))
heap, dom, name, link, cu, ctx, device, local, remote, fn, grid, block, sms = \
    pair_heaps(src, peer, HALF)


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


PLAIN = "((struct pack *)dst.p[d])[i + u * stride] = a[u];"
STREAM = "__stcs((uint4 *)dst.p[d] + i + u * stride, *(const uint4 *)&a[u]);"


def sweep() -> None:
    """``pair_phase_probe.py sweep``: the fold's GPU time (both PEs at once, after a barrier)
    for each shape of the reduce kernel: 16-byte packs in flight per thread per source
    (UNROLL), blocks per SM, threads per block, plain or streaming (``__stcs``) stores."""
    rows = []
    for unroll, streaming in itertools.product((1, 2, 4), (False, True)):
        source = reduce_source("sum", np.dtype(np.float32), unroll)
        assert source is not None and PLAIN in source
        if streaming:
            source = source.replace(PLAIN, STREAM)
        kfn = compile_kernel(cu, lambda res, what: ok(res), device, source, REDUCE_NAME,
                             RuntimeError)
        for per_sm, threads in itertools.product((1, 2, 4), (256, 512, 1024)):
            kgrid = max(1, min(sms * per_sm, -(-HALF * ISZ // (16 * threads))))
            times = []
            for r in range(11):
                shmem.barrier_all()
                ok(cu.cuEventRecord(ev[0], stream))
                ok(cu.cuLaunchKernel(kfn, kgrid, 1, 1, threads, 1, 1, 0, stream,
                                     ctypes.addressof(params), 0))
                ok(cu.cuEventRecord(ev[1], stream))
                ok(cu.cuStreamSynchronize(stream))
                if r >= 2:
                    times.append(ok(cu.cuEventElapsedTime(ev[0], ev[1])) * 1e3)
            rows.append((statistics.median(times), unroll, streaming, per_sm, threads))
    rows.sort()
    print(f"PE {me} {name} fold of 64 M floats, GPU us (unroll, stores, blocks/SM, threads): "
          + "; ".join(f"{t:.1f} ({u}, {'cs' if st else 'plain'}, {p}, {b})"
                      for t, u, st, p, b in rows), flush=True)


if sys.argv[1:] == ["sweep"]:
    sweep()
    shmem.barrier_all()
    raise SystemExit(0)

s2 = ok(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING))
CHUNKS = (1, 2, 4, 8, 16)
cev = [ok(cu.cuEventCreate(0)) for _ in range(max(CHUNKS) + 2)]


def _fold_params(k: int, part: int) -> Any:
    """The kernel's arguments for chunk ``k`` of ``part`` elements of this PE's share,
    folded into the local target only."""
    d, s = _Pointers(), _Pointers()
    at = k * part * ISZ
    d.p[0] = dsts.p[0] + at
    s.p[0], s.p[1] = srcs.p[0] + at, srcs.p[1] + at
    a = (d, ctypes.c_int(1), s, ctypes.c_int(2), ctypes.c_uint64(part))
    return a, (ctypes.c_void_p * len(a))(*[ctypes.addressof(x) for x in a])


_CE_PARAMS = {c: [_fold_params(k, HALF // c) for k in range(c)] for c in CHUNKS}


def ce_phases(chunks: int) -> tuple[float, float]:
    """(push, second phase) GPU microseconds of the round with its second phase in
    ``chunks``: each chunk folded into the local target only (the kernel on the probe's
    stream), then pushed into the peer's target by the copy engine (a second stream, after
    the chunk's event), the next chunk's fold meanwhile."""
    part = HALF // chunks
    kgrid = max(1, min(grid, -(-part * ISZ // (16 * block))))
    shmem.barrier_all()
    ok(cu.cuEventRecord(ev[0], stream))
    ok(cu.cuMemcpyDtoDAsync(remote + dst.offset + plo * ISZ, local + src.offset + plo * ISZ,
                            HALF * ISZ, stream))
    ok(cu.cuEventRecord(ev[1], stream))
    for k in range(chunks):
        ok(cu.cuLaunchKernel(fn, kgrid, 1, 1, block, 1, 1, 0, stream,
                             ctypes.addressof(_CE_PARAMS[chunks][k][1]), 0))
        ok(cu.cuEventRecord(cev[k], stream))
        ok(cu.cuStreamWaitEvent(s2, cev[k], 0))
        at = k * part * ISZ
        ok(cu.cuMemcpyDtoDAsync(dsts.p[1] + at, dsts.p[0] + at, part * ISZ, s2))
    ok(cu.cuEventRecord(ev[2], s2))
    ok(cu.cuEventSynchronize(ev[2]))
    ok(cu.cuStreamSynchronize(stream))
    return (ok(cu.cuEventElapsedTime(ev[0], ev[1])) * 1e3,
            ok(cu.cuEventElapsedTime(ev[1], ev[2])) * 1e3)


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


dc = sys.modules["vkshmem.core.collectives.device"]
ct = shmem._state.rt.world
ct.sync = _stamped(ct.sync, "sync")  # before the first call: the kept path holds this one
api_call()  # makes the domain's round (the cuda domain's PairReduce), then time inside it
for fname in ("reduce_again", "reduce"):  # a repeat is kept: reduce_again runs its call
    setattr(dc, fname, _stamped(getattr(dc, fname), fname[:9]))
if link is not None:
    link.pair_reduce = _stamped(link.pair_reduce, "round")
else:
    dom._pair.round = _stamped(dom._pair.round, "round")
for _ in range(3):
    phases()
    domain_round()
    api_call()
runs = [phases() for _ in range(30)]
ce_rows = []
for c in CHUNKS:
    ce_phases(c)
    got = [ce_phases(c) for _ in range(15)]
    ce_rows.append((c, statistics.median(g[0] for g in got), statistics.median(g[1] for g in got)))
rounds, apis = [], []
for _ in range(30):  # interleaved: nothing that drifts in time favours one
    rounds.append(domain_round())
    apis.append(api_call())
shmem.barrier_all()
ok(cu.cuCtxSetCurrent(ctx))
ok(cu.cuStreamDestroy(stream))
ok(cu.cuStreamDestroy(s2))
push, fold, host = (statistics.median(r[i] for r in runs) for i in range(3))
barriers = best_per_call(lambda: (shmem.barrier_all(), shmem.barrier_all()), 200)
rows = [("two barriers", barriers), ("push 128 MiB (GPU)", push), ("fold 64 M floats (GPU)", fold),
        ("push + fold (host)", host), ("domain round (host)", statistics.median(rounds)),
        ("domain round best", min(rounds))]
rows.append(("API call", statistics.median(r[0] for r in apis)))
rows.append(("API back to back (bench)", best_per_call(lambda: shmem.sum_reduce(dst, src), 50)))
rows += [(k, statistics.median(r[1][i][1] for r in apis)) for i, (k, _) in
         enumerate(apis[0][1])]
print(f"PE {me} {name} grid {grid} x {block} ({sms} SMs): " +
      ", ".join(f"{k} {v:.1f}" for k, v in rows) + " us; threads: " +
      ", ".join(t.name for t in threading.enumerate()), flush=True)
print(f"PE {me} {name} second phase by the copy engine (push; fold + CE push, GPU us): " +
      ", ".join(f"{c} chunks {p:.1f}; {q:.1f} (sum {p + q:.1f})" for c, p, q in ce_rows),
      flush=True)
if link is not None and me == 0:  # the Python the ring's entry runs before its barrier
    f32 = np.dtype(np.float32)
    dr = sys.modules["vkshmem.core.collectives.device_ring"]
    for what, fn in (("link.pairs", lambda: link.pairs((0, 1), "sum", f32)),
                     ("hub.fold_kernel", lambda: link.hub.fold_kernel("sum", f32)),
                     ("folds.known", lambda: link.hub._folds.known("sum", f32)),
                     ("_shares", lambda: dr._shares(N, 2)),
                     ("config", lambda: shmem._state.rt.config.gpu_ring_reduce)):
        print(f"{what:16s} {min(timeit.repeat(fn, number=2000, repeat=5)) / 2000 * 1e6:.2f} us",
              flush=True)
