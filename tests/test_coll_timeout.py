"""Mismatched collectives end with an error on every PE, not a hang (issue 40):
VKSHMEM_COLLECTIVE_TIMEOUT bounds every wait of a barrier, collective or allocation, on the
compiled (shm) and Python (transport) paths (tests/pe/coll_hang.py: counts 16 vs 300,000 in
broadcast and sum_reduce, a PE that skips a barrier)."""

from __future__ import annotations

import time

import pytest
from test_multipe import MODES, expected_route, launch

from vkshmem.core.config import load

CASES = ["broadcast", "broadcast_root_large", "sum_reduce", "barrier"]
RUNS = [(npes, mode) for mode in ("shm", "hostproxy") for npes in (2, 3, 4)]
TIMEOUT = 2


def test_default_bounds_collectives_like_torch_distributed() -> None:
    cfg = load({})
    assert cfg.collective_timeout == 600 and cfg.wait_timeout == 0
    assert load({"VKSHMEM_COLLECTIVE_TIMEOUT": "0"}).collective_timeout == 0


#: UCX and libfabric at 3 and 4 PEs, each case once (pairwise, not the whole cross product)
MORE = [(3, "ucx-sm", "broadcast"), (4, "ucx-sm", "sum_reduce"),
        (3, "ofi-tcp", "broadcast_root_large"), (4, "ofi-tcp", "barrier")]


@pytest.mark.parametrize(("npes", "mode", "case"),
                         [(npes, mode, case) for npes, mode in
                          [*RUNS, (2, "ucx-sm"), (2, "ofi-tcp")] for case in CASES] + MORE)
def test_mismatch_ends_with_an_error_on_every_pe(case: str, npes: int, mode: str) -> None:
    env = {**MODES[mode], "COLL_HANG_CASE": case, "VKSHMEM_WAIT_TIMEOUT": "0",
           "VKSHMEM_COLLECTIVE_TIMEOUT": str(TIMEOUT)}
    start = time.monotonic()
    r = launch("coll_hang", npes, env, timeout=60)
    took = time.monotonic() - start
    out = r.stdout + r.stderr
    # every PE raised WaitTimeoutError, printed it, then left it uncaught: the job ends (1)
    assert r.returncode == 1, f"exit {r.returncode}\n{out}"
    assert r.stdout.count("coll_hang ok") == npes, out
    for pe in range(npes):
        assert f"coll_hang error on PE {pe}: WaitTimeoutError" in r.stdout, out
    assert "job failed with exit code 1" in out and "VKSHMEM_COLLECTIVE_TIMEOUT" in out, out
    routes = [line for line in r.stdout.splitlines() if "routes:" in line]
    assert routes and all(f"['{expected_route(mode)}']" in line for line in routes), routes
    assert took < 2 * TIMEOUT + 40, took
