"""Where the time of a small GPU operation goes, layer by layer (run on a real GPU):
a prerecorded copy (submit + wait), a recorded copy through the native helper, the device's
copy, the domain heap's put_device, the public put; then copy bandwidth by vkCmdCopyBuffer and
by copy.comp. Usage: vkshmem run -n 1 tests/gpu/layers_probe.py"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from vkshmem import shmem


def per_call(fn: Callable[[], object], iters: int = 2000) -> float:
    fn()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        best = min(best, (time.perf_counter() - t0) / iters)
    return best * 1e6


me = shmem.my_pe()
a = shmem.zeros(64 << 20, np.uint8, domain="gpu")
b = shmem.zeros(64 << 20, np.uint8, domain="gpu")
a8, b8 = a[:8], b[:8]
dom = a.domain
dev = dom.device
heap = shmem._state.rt.domains.heaps[dom.spec.name]
mem = dom.memory
tr = dev.transfer
slot = tr._aux
def measure() -> None:
    print(f"{dev.name}: native={dev.native is not None} spin_wait={dev.spin_wait}")
    rows: list[tuple[str, float]] = []


    def prerecorded() -> None:
        slot.submit()
        slot.wait()


    with dev.lock:
        slot.begin(reusable=True)
        r = slot._regions
        r.srcOffset, r.dstOffset, r.size = 0, 64, 8
        slot._lib.vkCmdCopyBuffer(slot.cmd, mem.buffer, mem.buffer, 1, r)
        slot.end()
    rows.append(("prerecorded submit+wait", per_call(prerecorded)))


    def recorded() -> None:
        with dev.lock:
            slot.copy(mem.buffer, 64, mem.buffer, 0, 8)
        slot.wait()


    rows.append(("record+submit+wait", per_call(recorded)))
    rows.append(("device.copy", per_call(lambda: dev.copy(mem, 64, mem, 0, 8))))
    put_device = heap.transfers.put_device
    rows.append(("heap.transfers.put_device", per_call(lambda: put_device(0, 64, 0, 8))))
    if shmem.n_pes() > 1:  # into PE 1's heap, imported here from its fd
        rows.append(("heap.transfers.put_device to PE 1",
                     per_call(lambda: put_device(1, 64, 0, 8))))
    rows.append(("shmem.put gpu->gpu", per_call(lambda: shmem.put(a8, b8, 0))))
    h8 = np.ones(8, np.uint8)
    rows.append(("shmem.put cpu->gpu", per_call(lambda: shmem.put(a8, h8, 0))))
    rows.append(("fetch_add", per_call(lambda: shmem.atomic_fetch_add(a[:8].view(np.int64), 1, 0))))
    for name, us in rows:
        print(f"{name:<28} {us:8.1f} us")
    k = dev.kernels
    for size in (1 << 20, 16 << 20, 64 << 20):
        t1 = per_call(lambda s=size: tr.copy(mem, a.offset, mem, b.offset, s, None), 20)
        t2 = per_call(lambda s=size: k.shader_copy(mem, a.offset, mem, b.offset, s), 20)
        print(f"copy {size >> 20:3d} MiB: vkCmdCopyBuffer {size / t1 / 1e3:7.1f} GB/s, copy.comp "
              f"{size / t2 / 1e3:7.1f} GB/s")


if me == 0:  # the other PE only keeps its heap open
    measure()
shmem.barrier_all()
