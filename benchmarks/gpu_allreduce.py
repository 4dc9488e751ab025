"""A float32 sum all-reduce of GPU arrays (``shmem.sum_reduce`` on ``domain='gpu'``), per size:

    VKSHMEM_DOMAIN_IMPORT=0 vkshmem run -n 2 benchmarks/gpu_allreduce.py [--sizes 64M,1M] [--reps 3]

Every PE calls it; the figure is PE 0's best of ``--reps`` calls (after one warm-up), each
between barriers, and the result is checked. Which path runs depends on the routes and
variables: PEs that map each other's GPU heaps reduce straight from the sources; others take
the ring reduce-scatter + all-gather from ``VKSHMEM_GPU_RING_REDUCE`` bytes (set it to 0 for
the scratch gather, to compare). The GPU heap must hold two arrays of the largest size
(``VKSHMEM_GPU_SYMMETRIC_SIZE``).
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from vkshmem import shmem
from vkshmem.core.config import parse_size

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--sizes", default="64M", help="comma-separated byte counts (K, M, G)")
ap.add_argument("--reps", type=int, default=3, help="timed calls per size")
args = ap.parse_args()

me, n = shmem.my_pe(), shmem.n_pes()
ring = os.environ.get("VKSHMEM_GPU_RING_REDUCE", "(default)")
for nbytes in (parse_size(s) for s in args.sizes.split(",")):
    cnt = nbytes // 4
    src = shmem.full(cnt, me + 1, np.float32, domain="gpu")
    dst = shmem.zeros(cnt, np.float32, domain="gpu")
    shmem.sum_reduce(dst, src)  # warm-up
    best = float("inf")
    for _ in range(args.reps):
        shmem.barrier_all()
        t = time.perf_counter()
        shmem.sum_reduce(dst, src)
        best = min(best, time.perf_counter() - t)
    if not (dst.to_numpy() == n * (n + 1) / 2).all():
        raise SystemExit(f"PE {me}: the all-reduce of {nbytes} bytes gave a wrong result")
    if me == 0:
        print(f"{n} PEs, {nbytes} B float32 sum_reduce: {best * 1e3:.2f} ms "
              f"({nbytes / best / 1e9:.2f} GB/s), VKSHMEM_GPU_RING_REDUCE={ring}", flush=True)
    shmem.free(dst)
    shmem.free(src)
