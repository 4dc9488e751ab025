"""CUDA kernels' put_signal through the device API on the ``cuda`` domain, next to the floor
and the ceiling of the same GPU, in one job (the CUDA twin of ``device_api.py``):

    VKSHMEM_GPU_PROVIDER=cuda vkshmem run -n 2 benchmarks/device_api_cuda.py [--json F] [--quick]

PE 0's CuPy kernel (``vkshmem_device.cuh``) puts ``bytes`` into PE 1's GPU heap with
block-scope ``vks_putmem_signal_block`` calls, each block adding 1 to PE 1's signal; PE 1's
host waits on the signal word (``shmem.signal_wait_until``). Rows, per size (8 B to 32 MiB,
every power of 4, and 64 MiB):

- ``put_signal``: from PE 0's launch call to PE 1's host seeing the last signal (µs; both
  clocks are this host's CLOCK_MONOTONIC), and the bandwidth that makes;
- ``floor``: an empty kernel's launch to completion (stream synchronize) on PE 0;
- ``ceiling``: a kernel copying the same bytes inside PE 0's own heap, launch to completion.

Goals (issue 38): put_signal ≤ floor + 5 µs for small sizes, ≥ 0.8 x the ceiling's bandwidth
from 16 MiB. Needs CuPy and a CUDA GPU; both PEs may share it (the peer's heap is mapped).
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import cupy as cp
import numpy as np
import vkshmem_cuda

from vkshmem import shmem

SIZES = [8 << (2 * k) for k in range(12)] + [64 << 20]  # 8 B ... 32 MiB, 64 MiB
THREADS = 256

SOURCE = r"""
#include "vkshmem_device.cuh"
typedef unsigned long long u64;
/* mode 0: nothing (the floor); 1: put_signal of each block's chunk to `peer`; 2: the same
 * bytes copied inside this PE's heap (the ceiling) */
extern "C" __global__ void bench(const vks_ctx *c, u64 src, u64 dst, u64 sig, u64 chunk,
                                 int peer, int mode) {
    u64 off = (u64)blockIdx.x * chunk;
    if (mode == 1) {
        vks_putmem_signal_block(c, peer, dst + off, src + off, chunk, sig, 1, VKS_SIGNAL_ADD);
    } else if (mode == 2) {
        vks_copy_(vks_local(c, dst + off), vks_local(c, src + off), chunk, threadIdx.x,
                  blockDim.x);
    }
}
"""


def blocks_for(nbytes: int) -> int:
    """Blocks of a transfer: 64 KiB each past 64 KiB (at most 1024), else one."""
    return max(1, min(1024, nbytes // (64 << 10)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", type=Path, help="write the rows to this file (PE 0)")
    ap.add_argument("--quick", action="store_true", help="fewer rounds (a smoke test)")
    args = ap.parse_args()
    me, n = shmem.my_pe(), shmem.n_pes()
    if n != 2:
        sys.exit("run it with vkshmem run -n 2")
    biggest = max(SIZES)
    src = shmem.zeros(biggest // 4, np.uint32, domain="gpu")
    dst = shmem.zeros(biggest // 4, np.uint32, domain="gpu")
    sig = shmem.new_signal(domain="gpu")
    if src.domain.spec.name != "cuda":
        sys.exit("the device API for CUDA kernels is the cuda domain's: "
                 "VKSHMEM_GPU_PROVIDER=cuda")
    stamps = shmem.zeros(4, np.float64)  # PE 0's launch times, put into PE 1
    mine = shmem.zeros(3, np.float64)  # this PE's medians
    both = shmem.zeros(6, np.float64)  # every PE's (fcollect)
    ordinal = src.domain.device.ordinal
    cp.cuda.Device(ordinal).use()  # this PE's GPU: the heaps are mapped there
    ctx = np.uint64(shmem.device_context())
    kernel = cp.RawKernel(SOURCE, "bench", options=("-I" + vkshmem_cuda.include_dir(),
                                                    "--std=c++17"))
    stream = cp.cuda.Stream(non_blocking=True)
    signalled = 0
    peer = 1 - me

    def launch(mode: int, nbytes: int, blocks: int) -> None:
        kernel((blocks,), (THREADS,), (ctx, np.uint64(src.offset), np.uint64(dst.offset),
                                       np.uint64(sig.offset), np.uint64(nbytes // blocks),
                                       np.int32(peer), np.int32(mode)), stream=stream)

    rows = []
    for nbytes in SIZES:
        blocks = blocks_for(nbytes)
        rounds = 3 if args.quick else (30 if nbytes <= 1 << 20 else 8)
        lat, floor, ceil = [], [], []
        for r in range(rounds + 2):  # two warm-ups
            shmem.barrier_all()
            if me == 0:
                t0 = time.perf_counter()
                launch(1, nbytes, blocks)
                stream.synchronize()
                shmem.put(stamps[:1], np.array([t0]), 1)
            else:
                signalled += blocks
                shmem.signal_wait_until(sig, shmem.CMP.GE, signalled)
                t1 = time.perf_counter()
            shmem.barrier_all()
            if me == 1 and r >= 2:
                lat.append((t1 - float(stamps[0])) * 1e6)
            if me == 0:  # floor and ceiling, PE 0 alone
                for mode, out in ((0, floor), (2, ceil)):
                    t0 = time.perf_counter()
                    launch(mode, nbytes, blocks)
                    stream.synchronize()
                    if r >= 2:
                        out.append((time.perf_counter() - t0) * 1e6)
        mine[:] = [statistics.median(x) if x else 0.0 for x in (lat, floor, ceil)]
        shmem.fcollect(both, mine)  # collective: [PE 0's 3, PE 1's 3]
        if me == 0:
            put_us, floor_us, ceil_us = both[3], both[1], both[2]
            rows.append({"op": "kernel put_signal", "bytes": nbytes, "groups": blocks,
                         "put_signal_us": round(put_us, 2), "floor_us": round(floor_us, 2),
                         "ceiling_us": round(ceil_us, 2),
                         "put_signal_GBps": round(nbytes / put_us / 1e3, 3),
                         "ceiling_GBps": round(nbytes / ceil_us / 1e3, 3),
                         "route": "direct"})
    shmem.barrier_all()
    if me != 0:
        return
    print(f"{'bytes':>10} {'blocks':>6} {'put_signal us':>14} {'floor us':>9} {'+floor':>8} "
          f"{'ceiling us':>11} {'put GB/s':>9} {'ceil GB/s':>10} {'ratio':>6}")
    for row in rows:
        ratio = row["ceiling_us"] / row["put_signal_us"]  # bandwidth ratio
        print(f"{row['bytes']:>10} {row['groups']:>6} {row['put_signal_us']:>14.2f} "
              f"{row['floor_us']:>9.2f} {row['put_signal_us'] - row['floor_us']:>8.2f} "
              f"{row['ceiling_us']:>11.2f} {row['put_signal_GBps']:>9.3f} "
              f"{row['ceiling_GBps']:>10.3f} {ratio:>6.2f}")
    name = cp.cuda.runtime.getDeviceProperties(ordinal)["name"].decode()
    print(f"device {name}, cuda domain, blocks of {THREADS} threads")
    if args.json:
        try:
            driver = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version",
                                     "--format=csv,noheader"], capture_output=True, text=True,
                                    timeout=30).stdout.strip()
        except OSError:
            driver = "unknown"
        args.json.write_text(json.dumps({
            "date": datetime.date.today().isoformat(), "device": name, "driver": driver,
            "domain": "cuda", "note": "one job, 2 PEs sharing the GPU, CUDA kernels through "
            "vkshmem_device.cuh; floor and ceiling measured in the same rounds on PE 0",
            "command": "VKSHMEM_GPU_PROVIDER=cuda vkshmem run -n 2 "
                       "benchmarks/device_api_cuda.py " + " ".join(sys.argv[1:]),
            "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
