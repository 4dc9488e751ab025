"""Probe (run by hand on a two-GPU NVIDIA machine with cuda-bindings): can the Vulkan domain
reach another GPU's heap over NVLink through a CUDA VMM bounce buffer?

Imported Vulkan memory is not mapped for peers (``vulkan_cuda_peer_probe.py``), but each GPU's
own context reaches its own imported heap, and a VMM allocation maps onto both GPUs. So one
process (the sender) holds a context on each GPU, imports GPU 0's heap on GPU 0 and GPU 1's heap
on GPU 1, and moves a buffer in pieces: GPU 0 copies a piece from its heap into a VMM bounce
slot that lives on GPU 1 (over NVLink), GPU 1 copies it from the slot into its heap (local),
events ordering the two streams and the reuse of the slots. Times that pipeline (GPU time from
events and wall time from Python's issue) against ``cuMemcpyPeerAsync`` between two VMM
allocations (the ceiling) and between the imported heaps (staged through the host), and checks
the bytes through Vulkan.

Measured on 2 x H200 (NVLink NV18, driver 580, 2026-11-27; Python issues every call, GPU time
from events): the bytes arrive; 256 MiB: VMM peer copy 388 GB/s, the imported heaps' peer copy
38.6 (staged through the host), the bounce on GPU 1 with 16 / 8 / 4 / 2 MiB pieces 330 / 306
/ 167 / 88 GB/s (on GPU 0: 315 / 282 / 166 / 84); 16 MiB: 319 against 217 / 219 / 162 / 83
(small pieces are bound by Python's issue, about 25 us per piece). An 8-byte host copy into
GPU 1's imported heap from GPU 1's context: 8.1 us. So the Vulkan domain's links
(vkshmem_cuda/vulkan_accel/bounce.py) issue the pieces in C, four in flight, the bounce on
the peer's GPU."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from cuda.bindings import driver as cu
from vkshmem_cuda.vmm import map_handle
from vulkan_cuda_peer_probe import ok, two_heaps

N = 256 << 20


def vmm(dev: int, size: int, access: tuple[int, ...]) -> int:
    """A VMM allocation of ``size`` bytes on GPU ``dev``, mapped for the GPUs in ``access``."""
    prop = cu.CUmemAllocationProp()
    prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = dev
    handle = ok(cu.cuMemCreate(size, prop, 0))
    return map_handle(cu, handle, size, access, lambda res, _what: ok(res))


def main() -> None:
    mems, ptrs, ctxs, streams = two_heaps(N)
    for a, b in ((0, 1), (1, 0)):
        ok(cu.cuCtxSetCurrent(ctxs[a]))
        print(f"peer access GPU {a} -> {b}: {cu.cuCtxEnablePeerAccess(ctxs[b], 0)[0]}")
    ok(cu.cuCtxSetCurrent(ctxs[0]))
    slots_bytes = 64 << 20
    bounce1 = vmm(1, slots_bytes, (0, 1))  # on GPU 1, written by GPU 0 over NVLink
    bounce0 = vmm(0, slots_bytes, (0, 1))  # on GPU 0, read by GPU 1 over NVLink
    v0, v1 = vmm(0, N, (0, 1)), vmm(1, N, (0, 1))
    pattern = (np.arange(N // 4, dtype=np.uint64) * 2654435761).astype(np.uint32)
    mems[0].write(0, pattern)
    mems[1].write(0, np.zeros(N // 4, np.uint32))

    ev = {}

    def event(ctx_i: int, key: Any) -> Any:
        if key not in ev:
            ok(cu.cuCtxSetCurrent(ctxs[ctx_i]))
            ev[key] = ok(cu.cuEventCreate(0))
        return ev[key]

    def pipeline(n: int, piece: int, nslots: int, where: int) -> None:
        """src (GPU 0 heap) -> bounce slot -> dst (GPU 1 heap). ``where``: the bounce's GPU."""
        bounce = bounce1 if where == 1 else bounce0
        k = 0
        off = 0
        while off < n:
            m = min(piece, n - off)
            slot = bounce + (k % nslots) * piece
            ok(cu.cuCtxSetCurrent(ctxs[0]))
            if k >= nslots:  # slot free once GPU 1 copied it out
                ok(cu.cuStreamWaitEvent(streams[0], event(1, ("out", k % nslots)), 0))
            ok(cu.cuMemcpyDtoDAsync(slot, ptrs[0] + off, m, streams[0]))
            ok(cu.cuEventRecord(event(0, ("in", k % nslots)), streams[0]))
            ok(cu.cuCtxSetCurrent(ctxs[1]))
            ok(cu.cuStreamWaitEvent(streams[1], event(0, ("in", k % nslots)), 0))
            ok(cu.cuMemcpyDtoDAsync(ptrs[1] + off, slot, m, streams[1]))
            ok(cu.cuEventRecord(event(1, ("out", k % nslots)), streams[1]))
            k += 1
            off += m

    def timed(fn: Any, reps: int) -> tuple[float, float]:
        """Best wall and GPU time of ``fn``'s work on both streams (events on GPU 0)."""
        best_wall, best_gpu = 1e9, 1e9
        start, done, end = event(0, "t0"), event(1, "done"), event(0, "t1")
        for _ in range(reps + 1):
            ok(cu.cuCtxSetCurrent(ctxs[0]))
            ok(cu.cuEventRecord(start, streams[0]))
            t = time.perf_counter()
            fn()
            ok(cu.cuCtxSetCurrent(ctxs[1]))
            ok(cu.cuEventRecord(done, streams[1]))
            ok(cu.cuCtxSetCurrent(ctxs[0]))
            ok(cu.cuStreamWaitEvent(streams[0], done, 0))
            ok(cu.cuEventRecord(end, streams[0]))
            ok(cu.cuEventSynchronize(end))
            wall = time.perf_counter() - t
            gpu = ok(cu.cuEventElapsedTime(start, end)) * 1e-3
            best_wall, best_gpu = min(best_wall, wall), min(best_gpu, gpu)
        return best_wall, best_gpu

    def peer(dst: int, src: int, n: int) -> Any:
        def go() -> None:
            ok(cu.cuCtxSetCurrent(ctxs[0]))
            ok(cu.cuMemcpyPeerAsync(dst, ctxs[1], src, ctxs[0], n, streams[0]))
        return go

    rows = []
    for n in (16 << 20, 64 << 20, N):
        reps = 10
        w, g = timed(peer(v1, v0, n), reps)
        rows.append((n, "ceiling VMM peer copy", w, g))
        w, g = timed(peer(ptrs[1], ptrs[0], n), reps)
        rows.append((n, "imported heaps, peer copy", w, g))
        for where in (1, 0):
            for piece, nslots in ((2 << 20, 4), (4 << 20, 4), (8 << 20, 4), (16 << 20, 4)):
                if piece > n:
                    continue
                w, g = timed(lambda p=piece, s=nslots, n=n, wh=where: pipeline(n, p, s, wh),
                             reps)
                rows.append((n, f"bounce on GPU{where} {piece >> 20}M x{nslots}", w, g))
    got = np.empty(N // 4, np.uint32)
    mems[1].read(0, got)
    print("bytes arrived through the bounce:", bool(np.array_equal(got, pattern)))
    # small host -> other GPU's heap (the sender's context on GPU 1)
    host = int(ok(cu.cuMemHostAlloc(4096, 1)))  # portable: every context sees it pinned
    ok(cu.cuCtxSetCurrent(ctxs[1]))
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(200):
            ok(cu.cuMemcpyHtoDAsync(ptrs[1], host, 8, streams[1]))
            ok(cu.cuStreamSynchronize(streams[1]))
        small = (time.perf_counter() - t) / 200
    print(f"8 B host -> GPU 1 heap from GPU 1's context: {small * 1e6:.2f} us (python calls)")
    print(f"{'bytes':>10s} {'path':30s} {'wall us':>9s} {'GB/s':>7s} {'gpu GB/s':>8s}")
    for n, what, w, g in rows:
        print(f"{n:>10d} {what:30s} {w * 1e6:9.1f} {n / w / 1e9:7.1f} {n / g / 1e9:8.1f}")


if __name__ == "__main__":
    main()
