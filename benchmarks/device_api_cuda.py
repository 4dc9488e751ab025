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

import sys

import cupy as cp
import numpy as np
import vkshmem_cuda
from _device_api import measure, report, start

from vkshmem import shmem

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


def main() -> None:
    args, src, dst = start(__doc__ or "")
    me = shmem.my_pe()
    sig = shmem.new_signal(domain="gpu")
    if src.domain.spec.name != "cuda":
        sys.exit("the device API for CUDA kernels is the cuda domain's: "
                 "VKSHMEM_GPU_PROVIDER=cuda")
    ordinal = src.domain.device.ordinal
    cp.cuda.Device(ordinal).use()  # this PE's GPU: the heaps are mapped there
    ctx = np.uint64(shmem.device_context())
    kernel = cp.RawKernel(SOURCE, "bench", options=("-I" + vkshmem_cuda.include_dir(),
                                                    "--std=c++17"))
    stream = cp.cuda.Stream(non_blocking=True)
    peer = 1 - me

    def run(mode: int, nbytes: int, blocks: int) -> None:
        kernel((blocks,), (THREADS,), (ctx, np.uint64(src.offset), np.uint64(dst.offset),
                                       np.uint64(sig.offset), np.uint64(nbytes // blocks),
                                       np.int32(peer), np.int32(mode)), stream=stream)
        stream.synchronize()

    rows = measure(args.quick, run,
                   lambda total: shmem.signal_wait_until(sig, shmem.CMP.GE, total), "direct")
    shmem.barrier_all()
    if me == 0:
        name = cp.cuda.runtime.getDeviceProperties(ordinal)["name"].decode()
        report(rows, name, "cuda", args.json,
               "VKSHMEM_GPU_PROVIDER=cuda vkshmem run -n 2 benchmarks/device_api_cuda.py",
               note="one job, 2 PEs sharing the GPU, CUDA kernels through "
                    "vkshmem_device.cuh (blocks of 256 threads); floor and ceiling measured "
                    "in the same rounds on PE 0")


if __name__ == "__main__":
    main()
