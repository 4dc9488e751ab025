"""Probe (run by hand on a two-GPU NVIDIA machine: ``VKSHMEM_GPU_PROVIDER=vulkan python -m
vkshmem run -n 2 tests/gpu/pair_pipe_probe.py [MODE]``, and the same with ``cuda``; both need
``VKSHMEM_GPU_SYMMETRIC_SIZE=2G VKSHMEM_CUDA_SYMMETRIC_SIZE=2G``): schedules of the two-GPU
all-reduce's pair round (csrc/cudapair.c) for 256 MiB of float32, each PE on its own streams
in the domain's context, host microseconds from a barrier's end and GPU microseconds (events),
medians of interleaved runs, every schedule's result checked. Found with it (2026-11-27):

- (no MODE) the unsplit round against the same cut into K chunks on two streams (A pushes
  chunk k and writes k into the peer's word, B waits for its own word and folds chunk k into
  both targets): 2 x H200, 741-750 us for 1 or 2 chunks, 750-942 for 4-32; one stream, 8
  pushes: 844-847.
- ``mix``: the push shared between the copy engine and the kernel's stores across NVLink:
  the link tops out at ~380 GB/s either way (copy engine alone 371-381, kernel alone 338-347,
  any mix in between): the SMs add no bandwidth.
- ``chunks``: the push in 1-32 copies back to back, with and without a flag after each:
  ~3.5 us per extra copy, ~3 us more per flag (2 x H200).
- ``ce``: both phases by the copy engine (B folds each chunk into the local target only,
  A copies it into the peer's after B's event), 2-4 chunks, folds on 2 ... 1/8 blocks per SM:
  2 chunks 711-716 us on 2 x H200 against 740 unsplit (any fold width down to 1/4 per SM);
  2 x H100 719 against 744 at 1/2-1/4 per SM, 745-761 at 1-2 (the fold takes the HBM
  bandwidth the copy engine needs). The library's split round is this (csrc/cudapair.c).
- ``sizes``: the unsplit round, the split one and the library's call from 2 to 256 MiB:
  on 2 x H100 the split round is even at 32 MiB and ahead from 64 (VKC_PAIR_SPLIT).
"""

from __future__ import annotations

import ctypes
import statistics
import sys
import time
from typing import Any

import numpy as np
from pair_common import ok, pair_heaps
from vkshmem_cuda.vulkan_accel.fold import _Pointers

from vkshmem import shmem

N = 64 << 20  # float32 elements: 256 MiB
HALF = N // 2
ISZ = 4
me, peer = shmem.my_pe(), 1 - shmem.my_pe()
src = shmem.zeros(N, np.float32, domain="gpu")
dst = shmem.zeros(N, np.float32, domain="gpu")
flags = shmem.zeros(64, np.uint32, domain="gpu")
src.copy_from(np.full(N, me + 1, np.float32))
heap, dom, name, link, cu, ctx, device, local, remote, fn, grid, block, sms = \
    pair_heaps(src, peer, HALF)


ok(cu.cuCtxSetCurrent(ctx))
sa = ok(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING))
sb = ok(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING))
ev = [ok(cu.cuEventCreate(0)) for _ in range(2)]
lo, plo = me * HALF, peer * HALF
mine_word = local + flags.offset
their_word = remote + flags.offset
GEQ = cu.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ


def _params(at: int, part: int) -> Any:
    d, s = _Pointers(), _Pointers()
    d.p[0] = local + dst.offset + (lo + at) * ISZ
    d.p[1] = remote + dst.offset + (lo + at) * ISZ
    mine, pushed = local + src.offset + (lo + at) * ISZ, local + dst.offset + (lo + at) * ISZ
    s.p[0], s.p[1] = (mine, pushed) if me == 0 else (pushed, mine)
    a = (d, ctypes.c_int(2), s, ctypes.c_int(2), ctypes.c_uint64(part))
    return a, (ctypes.c_void_p * len(a))(*[ctypes.addressof(x) for x in a])


class Plan:
    def __init__(self, chunks: int) -> None:
        self.chunks = chunks
        part = HALF // chunks
        self.parts = [(k * part, part if k < chunks - 1 else HALF - k * part)
                      for k in range(chunks)]
        self.params = [_params(at, n) for at, n in self.parts]
        self.grids = [max(1, min(grid, -(-n * ISZ // (16 * block)))) for _, n in self.parts]


PLANS = {k: Plan(k) for k in (1, 2, 4, 8, 16, 32)}
seq = [0]


def round_(plan: Plan, two: bool) -> tuple[float, float]:
    """One round after a barrier: (host us, GPU us). ``two``: the pipelined two-stream form;
    else the whole round on stream A (push, write, wait, fold: today's C call)."""
    shmem.barrier_all()
    t0 = time.perf_counter()
    ok(cu.cuEventRecord(ev[0], sa))
    sbx = sb if two else sa
    if two:
        ok(cu.cuStreamWaitEvent(sb, ev[0], 0))
    for k, (at, n) in enumerate(plan.parts):
        seq[0] = (seq[0] + 1) & 0xFFFFFFFF
        ok(cu.cuMemcpyDtoDAsync(remote + dst.offset + (plo + at) * ISZ,
                                local + src.offset + (plo + at) * ISZ, n * ISZ, sa))
        ok(cu.cuStreamWriteValue32(sa, their_word, seq[0], 0))
        if two or k == plan.chunks - 1:
            ks = range(k, k + 1) if two else range(plan.chunks)
            ok(cu.cuStreamWaitValue32(sbx, mine_word, seq[0], GEQ))
            for j in ks:
                ok(cu.cuLaunchKernel(fn, plan.grids[j], 1, 1, block, 1, 1, 0, sbx,
                                     ctypes.addressof(plan.params[j][1]), 0))
    ok(cu.cuEventRecord(ev[1], sbx))
    ok(cu.cuEventSynchronize(ev[1]))
    ok(cu.cuStreamSynchronize(sa))
    host = (time.perf_counter() - t0) * 1e6
    return host, ok(cu.cuEventElapsedTime(ev[0], ev[1])) * 1e3


def _copy_params(at: int, part: int) -> Any:
    """The kernel as a copy: this PE's source part of the peer's share into the peer's
    target (one source, one destination)."""
    d, s = _Pointers(), _Pointers()
    d.p[0] = remote + dst.offset + (plo + at) * ISZ
    s.p[0] = local + src.offset + (plo + at) * ISZ
    a = (d, ctypes.c_int(1), s, ctypes.c_int(1), ctypes.c_uint64(part))
    return a, (ctypes.c_void_p * len(a))(*[ctypes.addressof(x) for x in a])


def mix(sm_part: int, per_sm: int) -> tuple[float, float]:
    """The push of the peer's share (both PEs at once, after a barrier) with its last
    ``sm_part`` elements stored by the kernel on stream B while the copy engine moves the rest
    on stream A: (host us, GPU us)."""
    ce_part = HALF - sm_part
    shmem.barrier_all()
    t0 = time.perf_counter()
    ok(cu.cuEventRecord(ev[0], sa))
    ok(cu.cuStreamWaitEvent(sb, ev[0], 0))
    if ce_part:
        ok(cu.cuMemcpyDtoDAsync(remote + dst.offset + plo * ISZ, local + src.offset + plo * ISZ,
                                ce_part * ISZ, sa))
    if sm_part:
        p = MIX[sm_part]
        g = max(1, min(sms * per_sm, -(-sm_part * ISZ // (16 * block))))
        ok(cu.cuLaunchKernel(fn, g, 1, 1, block, 1, 1, 0, sb, ctypes.addressof(p[1]), 0))
    ok(cu.cuEventRecord(ev[1], sb))
    ok(cu.cuStreamWaitEvent(sa, ev[1], 0))
    ok(cu.cuEventRecord(ev[1], sa))
    ok(cu.cuEventSynchronize(ev[1]))
    host = (time.perf_counter() - t0) * 1e6
    return host, ok(cu.cuEventElapsedTime(ev[0], ev[1])) * 1e3


def chunked(chunks: int, flag: int) -> float:
    """GPU us of the push in ``chunks`` copies back to back on stream A (both PEs at once,
    after a barrier); ``flag`` -1: nothing between them, else a cuStreamWriteValue32 into
    the peer's word with these flags after each."""
    part = HALF // chunks
    shmem.barrier_all()
    ok(cu.cuEventRecord(ev[0], sa))
    for k in range(chunks):
        at = k * part
        ok(cu.cuMemcpyDtoDAsync(remote + dst.offset + (plo + at) * ISZ,
                                local + src.offset + (plo + at) * ISZ, part * ISZ, sa))
        if flag >= 0:
            ok(cu.cuStreamWriteValue32(sa, their_word + 64, k, flag))
    ok(cu.cuEventRecord(ev[1], sa))
    ok(cu.cuEventSynchronize(ev[1]))
    return ok(cu.cuEventElapsedTime(ev[0], ev[1])) * 1e3


def _local_params(at: int, part: int) -> Any:
    """The fold of chunk ``at`` of this PE's share into the local target only."""
    a, _ = _params(at, part)
    a[0].p[1] = 0
    a = (a[0], ctypes.c_int(1), *a[2:])
    return a, (ctypes.c_void_p * len(a))(*[ctypes.addressof(x) for x in a])


class CePlan:
    def __init__(self, chunks: int, per_sm: float) -> None:
        part = HALF // chunks
        self.parts = [(k * part, part if k < chunks - 1 else HALF - k * part)
                      for k in range(chunks)]
        self.params = [_local_params(at, n) for at, n in self.parts]
        cap = max(1, int(grid // 2 * per_sm))
        self.grids = [max(1, min(cap, -(-n * ISZ // (16 * block)))) for _, n in self.parts]
        self.events = [ok(cu.cuEventCreate(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING))
                       for _ in self.parts]


def ce_round(plan: CePlan) -> tuple[float, float]:
    """Both phases by the copy engine, pipelined: stream A pushes the chunks of the peer's
    share (a flag into the peer's word after each), stream B waits for each of the peer's
    chunks and folds it into the local target only, then stream A copies each folded chunk
    into the peer's target. (host us, GPU us)."""
    shmem.barrier_all()
    t0 = time.perf_counter()
    ok(cu.cuEventRecord(ev[0], sa))
    ok(cu.cuStreamWaitEvent(sb, ev[0], 0))
    base = seq[0]
    for k, (at, n) in enumerate(plan.parts):
        ok(cu.cuMemcpyDtoDAsync(remote + dst.offset + (plo + at) * ISZ,
                                local + src.offset + (plo + at) * ISZ, n * ISZ, sa))
        ok(cu.cuStreamWriteValue32(sa, their_word, (base + k + 1) & 0xFFFFFFFF, 0))
        ok(cu.cuStreamWaitValue32(sb, mine_word, (base + k + 1) & 0xFFFFFFFF, GEQ))
        ok(cu.cuLaunchKernel(fn, plan.grids[k], 1, 1, block, 1, 1, 0, sb,
                             ctypes.addressof(plan.params[k][1]), 0))
        ok(cu.cuEventRecord(plan.events[k], sb))
    seq[0] = (base + len(plan.parts)) & 0xFFFFFFFF
    for k, (at, n) in enumerate(plan.parts):
        ok(cu.cuStreamWaitEvent(sa, plan.events[k], 0))
        ok(cu.cuMemcpyDtoDAsync(remote + dst.offset + (lo + at) * ISZ,
                                local + dst.offset + (lo + at) * ISZ, n * ISZ, sa))
    ok(cu.cuEventRecord(ev[1], sa))
    ok(cu.cuEventSynchronize(ev[1]))
    host = (time.perf_counter() - t0) * 1e6
    return host, ok(cu.cuEventElapsedTime(ev[0], ev[1])) * 1e3


if sys.argv[1:] == ["ce"]:
    cases: list[tuple[str, Any]] = [("today", None)]
    cases += [(f"CE {k} chunks, {q} blocks/SM", CePlan(k, q))
              for k in (2, 3, 4) for q in (2, 1, 0.5, 0.25, 0.125)]
    out: dict[str, list[tuple[float, float]]] = {c: [] for c, _ in cases}
    wrong: dict[str, int] = {}
    for label, cp in cases:
        dst.copy_from(np.zeros(N, np.float32))
        ce_round(cp) if cp else round_(PLANS[1], False)
        shmem.barrier_all()
        wrong[label] = int(np.count_nonzero(dst.to_numpy() != 3.0))
    for _ in range(15):
        for label, cp in cases:
            out[label].append(ce_round(cp) if cp else round_(PLANS[1], False))
    shmem.barrier_all()
    print(f"PE {me} {name} (host us, GPU us): " + "; ".join(
        f"{c} ({wrong[c]} wrong): {statistics.median(h for h, _ in r[2:]):.1f}, "
        f"{statistics.median(g for _, g in r[2:]):.1f}" for c, r in out.items()), flush=True)
    raise SystemExit(0)

def api_round(count: int) -> tuple[float, float]:
    """The library's all-reduce of ``count`` elements after a barrier: (host us, 0)."""
    shmem.barrier_all()
    t0 = time.perf_counter()
    shmem.sum_reduce(dst, src, count)
    return (time.perf_counter() - t0) * 1e6, 0.0


if sys.argv[1:] == ["sizes"]:  # where the split round starts to pay, and the library's call
    table = []
    for mib in (2, 4, 8, 16, 32, 64, 256):
        count = mib << 18
        HALF, lo, plo = count // 2, me * (count // 2), peer * (count // 2)
        cases = [("unsplit", lambda p=Plan(1): round_(p, False)),
                 ("split", lambda c=CePlan(2, 0.5): ce_round(c)),
                 ("library", lambda n=count: api_round(n))]
        dst.copy_from(np.zeros(N, np.float32))
        api_round(count)
        wrong = int(np.count_nonzero(dst.to_numpy()[:count] != 3.0))
        res = {k: [] for k, _ in cases}
        for _ in range(14):
            for k, f in cases:
                res[k].append(f())
        table.append(f"{mib} MiB ({wrong} wrong): " + ", ".join(
            f"{k} {statistics.median(h for h, _ in v[3:]):.1f}"
            + (f" (GPU {statistics.median(g for _, g in v[3:]):.1f})" if k != "library" else "")
            for k, v in res.items()))
    shmem.barrier_all()
    print(f"PE {me} {name} host us: " + "; ".join(table), flush=True)
    raise SystemExit(0)

if sys.argv[1:] == ["chunks"]:
    cases = [(c, f) for c in (1, 2, 4, 8, 16, 32) for f in (-1, 0)]
    times: dict[tuple[int, int], list[float]] = {c: [] for c in cases}
    for _ in range(13):
        for c in cases:
            times[c].append(chunked(*c))
    shmem.barrier_all()
    print(f"PE {me} {name} push 128 MiB in chunks (GPU us; no flags / flags): "
          + "; ".join(f"{c}: " + " / ".join(f"{statistics.median(times[c, f][2:]):.1f}"
                                            for f in (-1, 0))
                      for c in (1, 2, 4, 8, 16, 32)), flush=True)
    raise SystemExit(0)

if sys.argv[1:] == ["mix"]:
    shares = [HALF * k // 16 for k in (0, 1, 2, 3, 4, 6, 8, 16)]
    MIX = {n: _copy_params(HALF - n, n) for n in shares if n}
    cases = [(n, p) for n in shares for p in ((1, 2) if n else (1,))]
    res: dict[tuple[int, int], list[tuple[float, float]]] = {c: [] for c in cases}
    for _ in range(13):
        for c in cases:
            res[c].append(mix(*c))
    shmem.barrier_all()
    print(f"PE {me} {name} push 128 MiB, kernel's share (blocks/SM): host us, GPU us, GB/s: "
          + "; ".join(f"{n / HALF:.3f} ({p}): {statistics.median(h for h, _ in r[2:]):.1f}, "
                      f"{statistics.median(g for _, g in r[2:]):.1f}, "
                      f"{HALF * ISZ / statistics.median(g for _, g in r[2:]) / 1e3:.0f}"
                      for (n, p), r in res.items()), flush=True)
    raise SystemExit(0)

variants = [("one stream, 1 chunk (today)", PLANS[1], False),
            ("one stream, 8 pushes", PLANS[8], False)]
variants += [(f"two streams, {k} chunks", PLANS[k], True) for k in (2, 4, 8, 16, 32)]
zero = np.zeros(N, np.float32)
bad: dict[str, int] = {}
for label, plan, two in variants:  # each variant's result checked from a zeroed target
    dst.copy_from(zero)
    round_(plan, two)
    shmem.barrier_all()
    bad[label] = int(np.count_nonzero(dst.to_numpy() != 3.0))
    for _ in range(2):
        round_(plan, two)
got: dict[str, list[tuple[float, float]]] = {v[0]: [] for v in variants}
for _ in range(15):
    for label, plan, two in variants:
        got[label].append(round_(plan, two))
shmem.barrier_all()
ok(cu.cuCtxSetCurrent(ctx))
ok(cu.cuStreamDestroy(sa))
ok(cu.cuStreamDestroy(sb))
print(f"PE {me} {name} grid {grid} x {block}: " + "; ".join(
    f"{label} ({bad[label]} wrong): host {statistics.median(h for h, _ in r):.1f} "
    f"(best {min(h for h, _ in r):.1f})"
    f" GPU {statistics.median(g for _, g in r):.1f}" for label, r in got.items()), flush=True)
