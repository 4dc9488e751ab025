"""The cuda domain's service kernel (plugins/cuda/vkshmem_cuda/service.py) under the launcher,
run with ``VKSHMEM_CUDA_SERVICE=on`` (and a short ``VKSHMEM_CUDA_SERVICE_IDLE_US``): small puts
and gets of every alignment between host and GPU memory and between GPUs, AMOs of both widths
under contention, a relaunch after the kernel went idle, small service operations mixed with
large stream copies on the same bytes, and a device-wide synchronize that returns while the
service is in use. With ``VKSHMEM_CUDA_CPU_MAP=on`` the small copies are the CPU's through
the heaps' mappings and the service's requests sit in GPU memory; ``off``: neither."""

from __future__ import annotations

import os
import time

import numpy as np
from _common import check

from vkshmem import shmem

me, n = shmem.my_pe(), shmem.n_pes()
right, left = (me + 1) % n, (me - 1) % n
rt = shmem._state.rt

buf = shmem.zeros(1 << 16, np.uint8, domain="cuda")
dom = buf.domain
svc = dom.service
check(svc is not None, "VKSHMEM_CUDA_SERVICE=on gives the domain a service kernel")
assert svc is not None
shmem.barrier_all()

rng = np.random.default_rng(7)
pattern = rng.integers(0, 256, 1 << 16, dtype=np.uint8)
sizes = [1, 3, 8, 13, 64, 128, 129, 1000, 4096]  # 4096: the largest inline request
offsets = [int(sum(sizes[:k])) + 3 * k + (k % 2) for k in range(len(sizes))]  # odd, even
for k, size in enumerate(sizes):
    off = offsets[k]
    src = (pattern[:size].astype(np.int64) + me) % 256
    shmem.put(buf[off:off + size], src.astype(np.uint8), right)  # host -> peer GPU
shmem.barrier_all()
got = buf.to_numpy()
for k, size in enumerate(sizes):
    off = offsets[k]
    want = ((pattern[:size].astype(np.int64) + left) % 256).astype(np.uint8)
    check(np.array_equal(got[off:off + size], want), f"host->cuda put of {size} B at {off}")
shmem.barrier_all()
# 8-byte aligned host data up to the 128 bytes the kernel reads with the request's header
for size in (8, 16, 120, 128, 136):
    src = ((pattern[:size].astype(np.int64) + me + size) % 256).astype(np.uint8)
    shmem.put(buf[40000:40000 + size], src, right)
    shmem.barrier_all()
    want = ((pattern[:size].astype(np.int64) + left + size) % 256).astype(np.uint8)
    check(np.array_equal(buf.to_numpy()[40000:40000 + size], want), f"aligned put {size} B")
    shmem.barrier_all()

# GPU -> GPU both ways and GPU -> host, at the byte offsets above
stage = shmem.zeros(8192, np.uint8, domain="cuda")
stage.copy_from(np.arange(8192).astype(np.uint8) ^ me)
for size in sizes:
    shmem.put(buf[20000:20000 + size], stage[5:5 + size], right)
    shmem.barrier_all()
    want = (np.arange(8192).astype(np.uint8) ^ left)[5:5 + size]
    check(np.array_equal(buf.to_numpy()[20000:20000 + size], want), f"cuda->cuda put {size} B")
    h = np.zeros(size, np.uint8)
    shmem.get(h, buf[20000:20000 + size], right)
    check(np.array_equal(h, (np.arange(8192).astype(np.uint8) ^ me)[5:5 + size]),
          f"cuda->host get {size} B")
    g = shmem.zeros(size, np.uint8, domain="cuda")
    shmem.get(g, buf[20000:20000 + size], right)
    check(np.array_equal(g.to_numpy(), h), f"cuda->cuda get {size} B")
    shmem.free(g)
    shmem.barrier_all()

# AMOs on PE 0's words, 8 and 4 bytes, from every PE at once
c64 = shmem.zeros(1, np.int64, domain="cuda")
c32 = shmem.zeros(1, np.int32, domain="cuda")
olds = [shmem.atomic_fetch_add(c64, 3, 0) for _ in range(50)]
olds32 = [shmem.atomic_fetch_inc(c32, 0) for _ in range(50)]
check(len(set(olds)) == 50 and len(set(olds32)) == 50, "fetching AMOs return distinct values")
shmem.barrier_all()
if me == 0:
    check(int(c64.to_numpy()[0]) == 150 * n and int(c32.to_numpy()[0]) == 50 * n,
          f"counters {c64.to_numpy()[0]}, {c32.to_numpy()[0]}")
shmem.barrier_all()
won = shmem.atomic_compare_swap(c64, 150 * n, -7, 0)
shmem.barrier_all()
check(shmem.atomic_fetch(c64, 0) == -7 and won in (150 * n, -7), "one compare_swap won")
check(shmem.atomic_swap(c32, 9, right) in range(0, 50 * n + 1), "swap on a peer")

# the kernel ends when idle and comes back for the next request
idle_s = float(os.environ.get("VKSHMEM_CUDA_SERVICE_IDLE_US", "1000")) / 1e6
word = shmem.zeros(1, np.int64, domain="cuda")
shmem.barrier_all()
before = svc.launches
time.sleep(idle_s * 5 + 0.01)
shmem.atomic_add(word, 200 + me, me)  # an AMO: the service even where copies are the CPU's
seen = int(word.to_numpy()[0])
check(svc.launches > before and seen == 200 + me,
      f"relaunched after the idle exit ({before} -> {svc.launches} launches, {seen})")
shmem.free(word)
shmem.barrier_all()

# small service operations and large stream copies on the same bytes, in program order
big = np.full(1 << 16, me + 1, np.uint8)
shmem.put(buf, big, right)                       # > 4096 B: the stream path
shmem.put(buf[100:108], np.full(8, 99, np.uint8), right)  # then the service
shmem.put(buf[1 << 15:(1 << 15) + 8], stage[:8], right)
shmem.barrier_all()
got = buf.to_numpy()
check(np.all(got[100:108] == 99) and got[99] == left + 1 and got[108] == left + 1
      and np.array_equal(got[1 << 15:(1 << 15) + 8], np.arange(8).astype(np.uint8) ^ left),
      "service and stream copies land in order")

try:
    import cupy as cp
except Exception:
    cp = None
if cp is not None:  # the application's device-wide synchronize is not held up for long
    shmem.atomic_add(c64, 1, right)
    t0 = time.perf_counter()
    with cp.cuda.Device(dom.device.ordinal):
        cp.cuda.Device().synchronize()
    waited = time.perf_counter() - t0
    check(waited < 1.0, f"cudaDeviceSynchronize returned after {waited:.3f} s")
shmem.barrier_all()
for x in (buf, stage, c64, c32):
    shmem.free(x)
# VKSHMEM_CUDA_CPU_MAP: on maps every heap (small copies by the CPU, requests in GPU memory)
cpu_map = os.environ.get("VKSHMEM_CUDA_CPU_MAP", "auto")
if cpu_map != "auto":
    on = cpu_map == "on"
    check((dom.mapped_calls > 0) == on and svc.requests_on_gpu == on,
          f"{cpu_map}: {dom.mapped_calls} CPU copies, requests on the GPU: {svc.requests_on_gpu}")
print(f"PE {me}: service kernel launched {svc.launches} times, {dom.mapped_calls} CPU copies")
print(f"routes: {sorted({r.name for r in rt.routing.routes})}")
print("cuda_service ok", flush=True)
