"""Where the Vulkan domain's AMO across GPUs spends its time (run by hand on two NVIDIA GPUs:
``VKSHMEM_GPU_PROVIDER=vulkan vkshmem run -n 2 tests/gpu/vulkan_amo_probe.py``). PE 0 times a
fetch_add on PE 1's word (the other GPU, through the CUDA link) at each layer: the service
kernel's C call, the service's Python method, the copier, the link, the domain heap and the
API; then the same through a kernel launch per AMO (the service bypassed), and on PE 0's own
word. PE 1 waits in a barrier meanwhile. Prints the best per-call time of each, in µs."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from probe_timing import best_per_call

from vkshmem import shmem
from vkshmem.core.transports.contract import AmoOp

me = shmem.my_pe()
w = shmem.zeros(2, np.int64, domain="gpu")
dom = w.domain
heap = shmem._state.rt.domains.domain_heaps[dom]
shmem.barrier_all()


def per_call(fn: Callable[[], object]) -> float:
    return best_per_call(fn, 2000)


if me == 0:
    link = heap.links[1]
    shmem.atomic_fetch_add(w[0:1], 1, 1)  # makes the copier and the service
    copier = dom.accel._copier
    svc = dom.accel.cuda_service
    addr = link._ptr + w.offset
    rows = []
    if svc is not None:
        res = svc._result
        rows += [
            ("service C call", per_call(lambda: svc._call_c(svc._h, 2, 8, addr, 4, 0, 1, 0, 0,
                                                            0, res, svc.timeout_ns))),
            ("service.amo", per_call(lambda: svc.amo(addr, 4, 8, 1, 0))),
        ]
    w1 = w[0:1]
    rows += [
        ("copier.amo_at", per_call(lambda: copier.amo_at(addr, 4, 8, 1, 0))),
        ("link.amo", per_call(lambda: link.amo(w.offset, AmoOp.ADD, 8, 1, 0))),
        ("heap.amo", per_call(lambda: heap.amo(1, heap.seg_id, w.offset, AmoOp.ADD, 8, 1, 0))),
        ("shmem.atomic_fetch_add", per_call(lambda: shmem.atomic_fetch_add(w1, 1, 1))),
        ("shmem.atomic_fetch_add own", per_call(lambda: shmem.atomic_fetch_add(w1, 1, 0))),
    ]
    busy = copier._vulkan_busy
    copier._vulkan_busy = lambda: True  # the launch path
    rows += [
        ("launch: copier.amo_at", per_call(lambda: copier.amo_at(addr, 4, 8, 1, 0))),
        ("launch: shmem.atomic_fetch_add", per_call(lambda: shmem.atomic_fetch_add(w1, 1, 1))),
        ("launch: fetch_add own", per_call(lambda: shmem.atomic_fetch_add(w1, 1, 0))),
    ]
    copier._vulkan_busy = busy
    for name, us in rows:
        print(f"{name:<32} {us:8.2f} us", flush=True)
    print(f"service: {'off' if svc is None else f'{svc.launches} launches'}", flush=True)
shmem.barrier_all()
