"""Cost of communication contexts over a transport: ``--count`` (32) ``Ctx.create()`` calls
(``ctx_create``), then each context's first AMO (an atomic_fetch_add to the next PE), then a
second AMO on each, per PE; PE 0 prints the median and maximum over the PEs' per-call times
(ms). Run with e.g. ``VKSHMEM_TRANSPORTS=ofi VKSHMEM_SHM=0 vkshmem run -n 2
benchmarks/ofi_ctx.py`` (the ofi provider as configured:
``VKSHMEM_OFI_PROVIDER='tcp;ofi_rxm'``)."""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np

from vkshmem import shmem

count = int(sys.argv[sys.argv.index("--count") + 1]) if "--count" in sys.argv else 32
me, n = shmem.my_pe(), shmem.n_pes()
word = shmem.zeros(1, np.int64)
peer = (me + 1) % n
shmem.barrier_all()
t0 = time.perf_counter()
ctxs = [shmem.Ctx.create() for _ in range(count)]
t_create = time.perf_counter() - t0
first, second = [], []
for c in ctxs:
    t = time.perf_counter()
    shmem.atomic_fetch_add(word, 1, peer, ctx=c)
    first.append(time.perf_counter() - t)
for c in ctxs:
    t = time.perf_counter()
    shmem.atomic_fetch_add(word, 1, peer, ctx=c)
    second.append(time.perf_counter() - t)
t_total = time.perf_counter() - t0
shmem.barrier_all()
row = np.array([t_create / count, statistics.median(first), max(first),
                statistics.median(second), t_total], np.float64) * 1e3
rows = shmem.zeros((n, 5), np.float64)
shmem.fcollect(rows.reshape(-1), row)
for c in ctxs:
    c.destroy()
if me == 0:
    print(f"{n} PEs, {count} contexts (ms; per PE: median / max over PEs)")
    names = ["ctx_create each", "first AMO (median)", "first AMO (max)", "second AMO (median)",
             f"all {count} + AMOs"]
    for j, name in enumerate(names):
        col = rows[:, j]
        print(f"{name:<22}{float(np.median(col)):>10.3f}{float(col.max()):>10.3f}")
    assert int(word[0]) >= 0
shmem.barrier_all()
