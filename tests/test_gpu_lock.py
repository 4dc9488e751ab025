"""Locks whose word lies in GPU memory (tests/pe/gpu_lock.py) on lavapipe with the validation
layer on: the peers' heaps imported at 1, 2 and 4 PEs; through the domain proxy
(VKSHMEM_DOMAIN_IMPORT=0, with and without a CPU mapping of the heap) and over hostproxy
(VKSHMEM_SHM=0) at 2 or 4 PEs."""

from __future__ import annotations

import pytest
from test_gpu_multipe import VULKAN_ENV
from test_multipe import MODES, launch

RUNS = {"imported": {},
        "noimport": {"VKSHMEM_DOMAIN_IMPORT": "0"},
        "noimport-unmapped": {"VKSHMEM_DOMAIN_IMPORT": "0", "VKSHMEM_GPU_MAPPED": "0"},
        "hostproxy": MODES["hostproxy"]}


@pytest.mark.parametrize(("npes", "run"), [(1, "imported"), (2, "imported"), (4, "imported"),
                                           (2, "noimport-unmapped"), (4, "noimport"),
                                           (4, "hostproxy")])
def test_gpu_lock(npes: int, run: str) -> None:
    r = launch("gpu_lock", npes, {**VULKAN_ENV, **RUNS[run]}, timeout=300)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert r.stdout.count("gpu_lock ok") == npes, r.stdout
