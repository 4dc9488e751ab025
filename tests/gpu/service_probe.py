"""Where the cuda domain's service kernel spends a small operation (run by hand on an NVIDIA
machine: ``VKSHMEM_CUDA_SERVICE=on vkshmem run -n 1 tests/gpu/service_probe.py``). Times, per
call, the service's C entry points without the API above them, then the API calls, and the
same operations on the stream paths; prints the kernel's launch count (1 unless it went
idle)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from probe_timing import best_per_call

from vkshmem import shmem

a = shmem.zeros(1 << 12, np.uint8, domain="cuda")
b = shmem.zeros(1 << 12, np.uint8, domain="cuda")
w = shmem.zeros(1, np.int64, domain="cuda")
dom = a.domain
svc = dom.service
dev = dom.device
va = dom.local.va
host = np.zeros(8, np.uint8)
haddr = host.ctypes.data
me = shmem.my_pe()


def per_call(fn: Callable[[], object]) -> float:
    return best_per_call(fn, 3000)


rows = []
if svc is not None:
    rows += [
        ("service copy 8 B (C)", per_call(lambda: svc.copy(va + a.offset, va + b.offset, 8))),
        ("service write 8 B (C)", per_call(lambda: svc.write(va + a.offset, haddr, 8))),
        ("service read 8 B (C)", per_call(lambda: svc.read(haddr, va + a.offset, 8))),
        ("service amo (C)", per_call(lambda: svc.amo(va + w.offset, 4, 8, 1, 0))),
    ]
a8, b8 = a[:8], b[:8]
rows += [
    ("stream dtod 8 B (C)", per_call(lambda: dev.dtod(va + a.offset, va + b.offset, 8))),
    ("kernel amo (C)", per_call(lambda: dev.amo(va + w.offset, 4, 8, 1, 0))),
    ("shmem.put gpu->gpu 8 B", per_call(lambda: shmem.put(a8, b8, me))),
    ("shmem.put cpu->gpu 8 B", per_call(lambda: shmem.put(a8, host, me))),
    ("shmem.get gpu->cpu 8 B", per_call(lambda: shmem.get(host, a8, me))),
    ("shmem.atomic_fetch_add", per_call(lambda: shmem.atomic_fetch_add(w, 1, me))),
]
for name, us in rows:
    print(f"{name:<28} {us:8.2f} us")
print(f"service: {'off' if svc is None else f'{svc.launches} launches'}")
