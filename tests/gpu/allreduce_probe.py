"""Probe (run by hand on a two-GPU NVIDIA machine with CuPy): ways to sum-all-reduce 256 MiB of
float32 between two GPUs, in one process with peer access, each timed as both GPUs' work:

- ``share``: the cuda domain's kernel (``vkshmem_cuda.kernels``) as it runs now, each GPU
  reducing its half from both sources (its own, the peer's over NVLink) into both targets;
  variants with other grid sizes, more loads in flight (UNROLL) and streaming stores;
- ``push``: each GPU's copy engine first pushes the half the peer reduces into the peer's
  scratch (cudaMemcpyPeerAsync), then each reduces its half from local memory only and writes
  both targets;
- ``pipe``: ``push`` in chunks, the reduce of chunk c waiting on the GPU (a flag the peer's
  stream writes after its push, ``cuStreamWaitValue32``; no host round trip) while chunk c+1
  is pushed; ``+ce`` variants write the peer's target by a copy-engine push of the reduced
  chunk instead of the kernel's NVLink stores (on a second copy stream, or queued behind the
  pushes on the same one: "one copy stream");
- ``gather``: each GPU's copy engine pushes its *whole* source into the peer's target in
  chunks (all of the link traffic by copies queued back to back, no second phase), and each
  GPU folds chunk c into its target from local memory (target = source op target) as soon as
  the peer's flag for c lands; only the last chunk's fold is not hidden behind the copies;
- ``copy``: one 256 MiB peer copy, and two at once, one each way (the least traffic of a
  two-GPU all-reduce).
Prints microseconds per all-reduce (best of 10 after 3 warm-ups) and checks the sums.
``python allreduce_probe.py push`` runs only the copies and ``push`` with other kernel shapes.
Measured on 2 x H100 (2026-11-27): ``gather`` 822-866 us in every chunking tried (4 x 64 MiB
to 16 x 16 MiB, shrinking chunks 128 ... 4 MiB), against 740 for ``push`` and 695 for the two
copies alone: the folds slow the copies down more than they hide."""

from __future__ import annotations

import sys
import time

import cupy as cp
import numpy as np

try:
    from cuda.bindings import driver as cu
except ImportError:  # cuda-python before 12.6
    from cuda import cuda as cu
from vkshmem_cuda.kernels import reduce_source

N = 64 << 20  # float32 elements: 256 MiB
HALF = N // 2
SRC = reduce_source("sum", np.dtype(np.float32))
assert SRC is not None
WRAP = r"""
extern "C" __global__ void probe2(const T *s0, const T *s1, T *d0, T *d1, int nd, u64 count) {
    struct sources s, d;
    s.p[0] = s0; s.p[1] = s1; d.p[0] = d0; d.p[1] = d1;
    body(d, nd, s, 2, count);
}
"""


def variant(unroll: int = 4, streaming: bool = False) -> str:
    text = SRC.replace('extern "C" __global__ void vkshmem_reduce', "__device__ void body")
    text = text.replace("UNROLL = 4", f"UNROLL = {unroll}")
    if streaming:
        text = text.replace("((struct pack *)dst.p[d])[i + u * stride] = a[u];",
                            "__stcs((float4 *)&((struct pack *)dst.p[d])[i + u * stride], "
                            "*(float4 *)&a[u]);")
    return text + WRAP


def kernels(src: str) -> list[cp.RawKernel]:
    out = []
    for dev in (0, 1):
        with cp.cuda.Device(dev):
            k = cp.RawKernel(src, "probe2", options=("-std=c++17",))
            k.compile()
            out.append(k)
    return out


def main() -> None:
    for a, b in ((0, 1), (1, 0)):
        with cp.cuda.Device(a):
            cp.cuda.runtime.deviceEnablePeerAccess(b)
    src, dst, scratch, streams = [], [], [], []
    for dev in (0, 1):
        with cp.cuda.Device(dev):
            src.append(cp.full(N, dev + 1, cp.float32))
            dst.append(cp.zeros(N, cp.float32))
            scratch.append(cp.zeros(HALF, cp.float32))
            streams.append(cp.cuda.Stream(non_blocking=True))
    sms = cp.cuda.runtime.getDeviceProperties(0)["multiProcessorCount"]

    def ok(res) -> None:
        err = res[0] if isinstance(res, tuple) else res
        if int(err) != 0:
            raise RuntimeError(f"CUDA driver error {err}")

    go_mem = cp.cuda.alloc_pinned_memory(4)
    go = np.frombuffer(go_mem, np.uint32, 1)
    go[0] = 0
    all_streams: list = []

    def timed(run, reps: int = 10) -> float:
        """Best of ``reps``; the streams wait on a host word while ``run`` issues its work,
        so the time is the GPUs' (from the word's release), not Python's issuing."""
        for _ in range(3):
            run()
        best = 1e9
        for _ in range(reps):
            for dev in (0, 1):
                with cp.cuda.Device(dev):
                    cp.cuda.runtime.deviceSynchronize()
            gate = int(go[0]) + 1
            for dev, stream in all_streams:
                with cp.cuda.Device(dev):
                    ok(cu.cuStreamWaitValue32(stream.ptr, go_mem.ptr, gate, 0))
            run()
            time.sleep(0.002)
            t = time.perf_counter()
            go[0] = gate
            for dev in (0, 1):
                streams[dev].synchronize()
            best = min(best, time.perf_counter() - t)
        return best * 1e6

    def check(name: str) -> None:
        for dev in (0, 1):
            with cp.cuda.Device(dev):
                got = dst[dev]
                if not bool(cp.all(got == 3)):
                    print(f"{name}: GPU {dev} has wrong sums", flush=True)
                dst[dev].fill(0)

    rows = []

    def share(ks, grid: int, block: int):
        def run() -> None:
            for dev in (0, 1):
                lo = dev * HALF
                with cp.cuda.Device(dev), streams[dev]:
                    ks[dev]((grid,), (block,), (src[dev][lo:], src[1 - dev][lo:], dst[dev][lo:],
                                                 dst[1 - dev][lo:], np.int32(2),
                                                 np.uint64(HALF)))
        return run

    def push(ks, grid: int, block: int):
        def run() -> None:
            for dev in (0, 1):  # my half of the peer's work goes to its scratch
                peer = 1 - dev
                lo = peer * HALF
                with cp.cuda.Device(dev):
                    cp.cuda.runtime.memcpyPeerAsync(scratch[peer].data.ptr, peer,
                                                    src[dev][lo:].data.ptr, dev, HALF * 4,
                                                    streams[dev].ptr)
            evs = []
            for dev in (0, 1):
                with cp.cuda.Device(dev):
                    evs.append(cp.cuda.Event(disable_timing=True))
                    evs[-1].record(streams[dev])
            for dev in (0, 1):
                with cp.cuda.Device(dev):
                    streams[dev].wait_event(evs[1 - dev])
            for dev in (0, 1):
                lo = dev * HALF
                with cp.cuda.Device(dev), streams[dev]:
                    ks[dev]((grid,), (block,), (src[dev][lo:], scratch[dev], dst[dev][lo:],
                                                 dst[1 - dev][lo:], np.int32(2),
                                                 np.uint64(HALF)))
        return run

    flags = []
    for dev in (0, 1):
        with cp.cuda.Device(dev):
            flags.append(cp.zeros(2, cp.uint32))
    side = []  # per GPU: the copy engine's stream and, for +ce, the gather stream
    for dev in (0, 1):
        with cp.cuda.Device(dev):
            side.append((cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)))
    for dev in (0, 1):
        all_streams.extend([(dev, streams[dev]), (dev, side[dev][0]), (dev, side[dev][1])])
    epoch = [0]

    def pipe(ks, grid_mul: int, chunks: int, ce_gather: bool, one_ce: bool = False):
        part = HALF // chunks

        def run() -> None:
            base = epoch[0]
            epoch[0] += chunks
            for dev in (0, 1):
                peer = 1 - dev
                ce, _g = side[dev]
                with cp.cuda.Device(dev):
                    for c in range(chunks):
                        lo = peer * HALF + c * part
                        cp.cuda.runtime.memcpyPeerAsync(scratch[peer][c * part:].data.ptr,
                                                        peer, src[dev][lo:].data.ptr, dev,
                                                        part * 4, ce.ptr)
                        ok(cu.cuStreamWriteValue32(ce.ptr, flags[peer].data.ptr,
                                                   (base + c + 1) & 0xFFFFFFFF, 0))
            for dev in (0, 1):
                peer = 1 - dev
                _ce, g = side[dev]
                if one_ce:  # the reduced chunks queue behind the pushes on one copy stream
                    g = _ce
                grid = max(1, min(sms * grid_mul, part * 4 // (16 * 512)))
                with cp.cuda.Device(dev):
                    for c in range(chunks):
                        lo = dev * HALF + c * part
                        ok(cu.cuStreamWaitValue32(streams[dev].ptr, flags[dev].data.ptr,
                                                  (base + c + 1) & 0xFFFFFFFF, 0))
                        with streams[dev]:
                            ks[dev]((grid,), (512,), (src[dev][lo:], scratch[dev][c * part:],
                                                      dst[dev][lo:], dst[peer][lo:],
                                                      np.int32(1 if ce_gather else 2),
                                                      np.uint64(part)))
                        if ce_gather:
                            ev = cp.cuda.Event(disable_timing=True)
                            ev.record(streams[dev])
                            g.wait_event(ev)
                            cp.cuda.runtime.memcpyPeerAsync(dst[peer][lo:].data.ptr, peer,
                                                            dst[dev][lo:].data.ptr, dev,
                                                            part * 4, g.ptr)
                    if ce_gather:
                        ev = cp.cuda.Event(disable_timing=True)
                        ev.record(g)
                        streams[dev].wait_event(ev)
            for dev in (0, 1):  # the peer's pushes into my targets are done too
                with cp.cuda.Device(1 - dev):
                    ev = cp.cuda.Event(disable_timing=True)
                    ev.record(streams[1 - dev])
                with cp.cuda.Device(dev):
                    streams[dev].wait_event(ev)
        return run

    def gather(ks, grid_mul: int, sizes_mib: list[int]):
        """Whole-source pushes in chunks of ``sizes_mib`` (summing to 256), folded locally."""
        parts = [m << 18 for m in sizes_mib]  # float32 elements
        assert sum(parts) == N, sizes_mib
        starts = [sum(parts[:i]) for i in range(len(parts))]

        def run() -> None:
            base = epoch[0]
            epoch[0] += len(parts)
            for dev in (0, 1):
                peer = 1 - dev
                ce, _g = side[dev]
                with cp.cuda.Device(dev):
                    for c, (lo, n) in enumerate(zip(starts, parts, strict=True)):
                        cp.cuda.runtime.memcpyPeerAsync(dst[peer][lo:].data.ptr, peer,
                                                        src[dev][lo:].data.ptr, dev, n * 4,
                                                        ce.ptr)
                        ok(cu.cuStreamWriteValue32(ce.ptr, flags[peer].data.ptr,
                                                   (base + c + 1) & 0xFFFFFFFF, 0))
            for dev in (0, 1):
                with cp.cuda.Device(dev):
                    for c, (lo, n) in enumerate(zip(starts, parts, strict=True)):
                        grid = max(1, min(sms * grid_mul, n * 4 // (16 * 512)))
                        ok(cu.cuStreamWaitValue32(streams[dev].ptr, flags[dev].data.ptr,
                                                  (base + c + 1) & 0xFFFFFFFF, 0))
                        with streams[dev]:
                            ks[dev]((grid,), (512,), (src[dev][lo:], dst[dev][lo:],
                                                      dst[dev][lo:], dst[dev][lo:],
                                                      np.int32(1), np.uint64(n)))
            for dev in (0, 1):  # my pushes are done (the peer's fold waited for them)
                with cp.cuda.Device(dev):
                    ev = cp.cuda.Event(disable_timing=True)
                    ev.record(side[dev][0])
                    streams[dev].wait_event(ev)
        return run

    def copy() -> None:
        with cp.cuda.Device(0):
            cp.cuda.runtime.memcpyPeerAsync(dst[1].data.ptr, 1, src[0].data.ptr, 0, N * 4,
                                            streams[0].ptr)

    def both_ways() -> None:
        copy()
        with cp.cuda.Device(1):
            cp.cuda.runtime.memcpyPeerAsync(dst[0].data.ptr, 0, src[1].data.ptr, 1, N * 4,
                                            streams[1].ptr)

    base = kernels(variant())
    rows.append(("copy 256 MiB GPU0->GPU1 (ceiling)", timed(copy)))
    rows.append(("copies 256 MiB both ways at once", timed(both_ways)))
    dst[1].fill(0)
    if sys.argv[1:] == ["push"]:  # the push kernel's shape: grid, block, loads, stores
        for grid_mul, block in ((2, 512), (1, 512), (1, 1024), (8, 256), (4, 256), (2, 1024)):
            name = f"push unroll4 grid {grid_mul}xSM block {block}"
            rows.append((name, timed(push(base, sms * grid_mul, block))))
            check(name)
        for unroll, streaming in ((8, False), (2, False), (4, True), (2, True)):
            ks = kernels(variant(unroll, streaming))
            for grid_mul in (2, 1):
                name = f"push unroll{unroll}{' stcs' if streaming else ''} grid {grid_mul}xSM"
                rows.append((name, timed(push(ks, sms * grid_mul, 512))))
                check(name)
        report(rows)
        return
    for grid_mul, block in ((4, 512), (2, 512), (8, 256), (1, 1024), (16, 512)):
        name = f"share unroll4 grid {grid_mul}xSM block {block}"
        rows.append((name, timed(share(base, sms * grid_mul, block))))
        check(name)
    for unroll, streaming in ((8, False), (2, False), (4, True), (8, True)):
        ks = kernels(variant(unroll, streaming))
        name = f"share unroll{unroll}{' stcs' if streaming else ''} grid 4xSM block 512"
        rows.append((name, timed(share(ks, sms * 4, 512))))
        check(name)
    for grid_mul in (4, 2):
        name = f"push (CE) + local reduce grid {grid_mul}xSM"
        rows.append((name, timed(push(base, sms * grid_mul, 512))))
        check(name)
    for chunks in (4, 8, 16, 32):
        for ce_gather in (False, True):
            for grid_mul in ((4, 1) if chunks >= 16 else (4,)):
                name = f"pipe {chunks} chunks{' +ce' if ce_gather else ''} grid {grid_mul}xSM"
                try:
                    rows.append((name, timed(pipe(base, grid_mul, chunks, ce_gather))))
                except Exception as exc:
                    print(f"{name}: {exc}", flush=True)
                    continue
                check(name)
    for chunks in (2, 4, 8, 16):
        for grid_mul in (4, 1):
            name = f"pipe {chunks} chunks +ce, one copy stream, grid {grid_mul}xSM"
            try:
                rows.append((name, timed(pipe(base, grid_mul, chunks, True, True))))
            except Exception as exc:
                print(f"{name}: {exc}", flush=True)
                continue
            check(name)
    report(rows)


def report(rows: list[tuple[str, float]]) -> None:
    ceiling = rows[0][1]
    print(f"{'variant':52s} {'us':>9s} {'ceiling/us':>10s}")
    for name, us in rows:
        print(f"{name:52s} {us:9.1f} {ceiling / us:10.3f}")


if __name__ == "__main__":
    main()
