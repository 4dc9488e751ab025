"""Multi-PE tests: each script under tests/pe runs under ``vkshmem run`` at 1, 2, 3 and 4 PEs,
once over the shm path and once with it off and every byte (even to this PE) crossing the
hostproxy transport, or UCX (over its shared memory and over tcp), or libfabric (tcp;ofi_rxm and
shm), or raw ibverbs (only where ``tests/rdma.py`` finds or creates an RDMA device; skipped
elsewhere with its reason). ``--timeout`` and the subprocess timeout bound every run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from rdma import rdma_device

PE_DIR = Path(__file__).parent / "pe"
MODES = {
    "shm": {"VKSHMEM_SHM": "1"},
    "hostproxy": {"VKSHMEM_SHM": "0", "VKSHMEM_TRANSPORTS": "hostproxy"},
    # UCX carries everything: once over its shared memory (posix + cma), once over tcp.
    "ucx-sm": {"VKSHMEM_SHM": "0", "VKSHMEM_TRANSPORTS": "ucx", "UCX_TLS": "posix,cma,self"},
    "ucx-tcp": {"VKSHMEM_SHM": "0", "VKSHMEM_TRANSPORTS": "ucx", "UCX_TLS": "tcp,self",
                "VKSHMEM_UCX_TRUSTED_NETWORK": "1"},
    # libfabric carries everything: over tcp;ofi_rxm on loopback, and over its shm provider.
    "ofi-tcp": {"VKSHMEM_SHM": "0", "VKSHMEM_TRANSPORTS": "ofi",
                "VKSHMEM_OFI_PROVIDER": "tcp;ofi_rxm"},
    "ofi-shm": {"VKSHMEM_SHM": "0", "VKSHMEM_TRANSPORTS": "ofi", "VKSHMEM_OFI_PROVIDER": "shm"},
    # raw ibverbs carries everything (this PE's own AMOs through the NIC too)
    "verbs": {"VKSHMEM_SHM": "0", "VKSHMEM_TRANSPORTS": "verbs"},
}
#: modes that need something this machine may lack: mode -> why not here ("" where it can run)
UNAVAILABLE = {"verbs": rdma_device()[1]}
#: every mode, for ``parametrize("mode", MODE_PARAMS)``: those this machine lacks are skipped
#: with the reason
MODE_PARAMS = [pytest.param(m, marks=pytest.mark.skipif(bool(UNAVAILABLE.get(m)),
                                                        reason=UNAVAILABLE.get(m, "")))
               for m in MODES]


def expected_route(mode: str) -> str:
    """The one route every PE of a run in ``mode`` takes (what its scripts print)."""
    return "shm" if mode == "shm" else MODES[mode]["VKSHMEM_TRANSPORTS"]


SCRIPTS = ["rma", "amo", "sync", "alloc", "errors", "teams"]


def launch(script: str, npes: int, env: dict[str, str],
           timeout: int = 120) -> subprocess.CompletedProcess[str]:
    """Run ``tests/pe/<script>.py`` on ``npes`` PEs with the project's launcher."""
    full_env = {**os.environ, "VKSHMEM_SYMMETRIC_SIZE": "64M", "VKSHMEM_WAIT_TIMEOUT": "60",
                **env}
    cmd = [sys.executable, "-m", "vkshmem", "run", "-n", str(npes), "--timeout", str(timeout),
           str(PE_DIR / f"{script}.py")]
    return subprocess.run(cmd, env=full_env, capture_output=True, text=True,
                          timeout=timeout + 30)


def check_run(r: subprocess.CompletedProcess[str], script: str, npes: int, mode: str) -> None:
    """The run succeeded, every PE printed ``<script> ok``, and every PE's routes are the
    one route of ``mode``."""
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert r.stdout.count(f"{script} ok") == npes, r.stdout
    routes = [line for line in r.stdout.splitlines() if "routes:" in line]
    assert len(routes) == npes, r.stdout
    want = expected_route(mode)
    assert all(f"routes: ['{want}']" in line for line in routes), routes


@pytest.mark.parametrize("mode", MODE_PARAMS)
@pytest.mark.parametrize("npes", [1, 2, 3, 4])
@pytest.mark.parametrize("script", SCRIPTS)
def test_script(script: str, npes: int, mode: str) -> None:
    check_run(launch(script, npes, MODES[mode]), script, npes, mode)


def test_allocation_mismatch_is_reported() -> None:
    r = launch("mismatch", 2, {}, timeout=60)
    assert r.returncode != 0
    assert "symmetric allocation mismatch" in r.stdout + r.stderr
    assert "mismatch not detected" not in r.stdout


@pytest.mark.parametrize("npes", [2, 3, 4])
def test_two_rails_stripe(npes: int) -> None:
    """Two hostproxy rails: transfers above VKSHMEM_STRIPE_THRESHOLD use both."""
    env = {"VKSHMEM_SHM": "0", "VKSHMEM_RAIL0": "hostproxy", "VKSHMEM_RAIL1": "hostproxy",
           "VKSHMEM_STRIPE_THRESHOLD": "64K"}
    r = launch("stripe", npes, env)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert r.stdout.count("stripe ok") == npes, r.stdout
