"""A peer whose GPU proxy stopped answering: a put into its GPU heap fails after
VKSHMEM_GPU_TIMEOUT with an error that names the PE and the variable (no hang). Run with
VKSHMEM_SHM=0 at 2 PEs (tests/test_gpu_multipe.py)."""

from __future__ import annotations

import time

import numpy as np
from _common import check

from vkshmem import shmem
from vkshmem.gpu.errors import GpuError

me = shmem.my_pe()
g = shmem.zeros(16, np.int64, domain="gpu")
dom = shmem._state.rt.domains.heaps[g.domain.spec.name]  # the domain's heap: its routes and proxy
check(dom.proxy is not None, "this test needs the GPU proxy (VKSHMEM_SHM=0)")
if me == 1:
    dom.proxy.stop()  # PE 1 no longer serves GPU requests
shmem.barrier_all()
if me == 0:
    t0 = time.monotonic()
    try:
        shmem.put(g, np.arange(16, dtype=np.int64), 1)
        check(False, "a put to a silent GPU proxy must fail")
    except GpuError as exc:
        took = time.monotonic() - t0
        text = str(exc)
        check("PE 1" in text and "VKSHMEM_GPU_TIMEOUT" in text, f"unclear error: {text}")
        check(1.5 < took < 20, f"gave up after {took:.1f} s")
        print(f"gpu timeout ok after {took:.1f} s: {text[:120]}", flush=True)
    t0 = time.monotonic()
    try:  # the pair's slots are in an unknown state: refused at once from now on
        shmem.get(np.zeros(16, np.int64), g, 1)
        check(False, "a get from a proxy that timed out must fail")
    except GpuError as exc:
        check("PE 1" in str(exc) and time.monotonic() - t0 < 1, f"second error: {exc}")
shmem.barrier_all()
print("gpu_timeout done", flush=True)
