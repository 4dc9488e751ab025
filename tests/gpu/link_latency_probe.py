"""Probe (run by hand on a two-GPU NVIDIA machine: ``VKSHMEM_GPU_PROVIDER=vulkan python -m
vkshmem run -n 2 tests/gpu/link_latency_probe.py``): where an 8-byte operation of the Vulkan
domain between GPUs spends its time. PE 0 times, layer by layer, a GPU->GPU put, a CPU->GPU
put and a fetch_add into PE 1's heap on the other GPU: through the API, through the CUDA link
(:class:`~vkshmem.gpu.cudalink.CudaLink`) and through the C call under it."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from vkshmem import shmem
from vkshmem.core.transport import AmoOp

me = shmem.my_pe()
s8 = shmem.zeros(8, np.uint8, domain="gpu")
d8 = shmem.zeros(8, np.uint8, domain="gpu")
word = shmem.zeros(1, np.uint64, domain="gpu")
heap = shmem._state.rt.heaps[s8.domain.spec.name]
h8 = np.ones(8, np.uint8)


def med(fn: Callable[[], object], n: int = 3000) -> float:
    for _ in range(200):
        fn()
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return float(np.median(ts)) * 1e6


rows: list[tuple[str, float]] = []
if me == 0:
    link = heap.links[1]
    assert link is not None and link.direct, "PE 1 is not linked directly (two GPUs?)"
    hub = link.hub
    lib = hub._lib
    rows.append(("shmem.put GPU->GPU", med(lambda: shmem.put(d8, s8, 1))))
    rows.append(("link.put_device", med(lambda: link.put_device(d8.offset, s8.offset, 8))))
    dst, src = link._ptr + d8.offset, hub.view.pointer + s8.offset
    rows.append(("vkc_link_host d2d (C)", med(lambda: lib.vkc_link_host(
        0, hub.ctx_ptr, hub.stream_ptr, dst, src, 8, hub.spin_ns))))
    rows.append(("shmem.put CPU->GPU", med(lambda: shmem.put(d8, h8, 1))))
    rows.append(("link.put host", med(lambda: link.put(d8.offset, memoryview(h8)))))
    rows.append(("shmem.atomic_fetch_add", med(lambda: shmem.atomic_fetch_add(word, 1, 1))))
    rows.append(("link.amo", med(lambda: link.amo(word.offset, AmoOp.ADD, 8, 1, 0))))
    copier = link._copier
    addr = link._ptr + word.offset
    rows.append(("copier.amo_at", med(lambda: copier.amo_at(addr, int(AmoOp.ADD), 8, 1, 0))))
shmem.barrier_all()
for name, us in rows:
    print(f"{name:28s} {us:7.2f} us", flush=True)
