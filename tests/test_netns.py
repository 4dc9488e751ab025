"""Two PEs on two test "hosts": network namespaces made here and joined by a veth pair.

The PEs find each other with the ``env`` bootstrap (rank 0 hosts the rendezvous) and, being on
different nodes, can only talk through the hostproxy transport over the veth link. Needs root
and iproute2; skipped otherwise.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hosts import MISSING, make_hosts

PE_DIR = Path(__file__).parent / "pe"
SUBNET = "10.213.77"  # only ever assigned inside the namespaces this test creates

pytestmark = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")


@pytest.fixture
def two_hosts() -> Iterator[tuple[str, str]]:
    try:
        with make_hosts(2, SUBNET) as h:
            yield h.names[0], h.names[1]
    except (subprocess.CalledProcessError, OSError) as exc:
        pytest.skip(f"cannot create network namespaces here: {exc}")


def run_on_two_hosts(hosts: tuple[str, str], script: str, extra_env: dict[str, str],
                     ) -> list[str]:
    """Run ``pe/<script>.py`` as rank 0 in the first namespace and rank 1 in the second (rank 0
    hosting the ``env`` bootstrap), with ``extra_env`` on top of the common settings; both must end
    well, printing "<script> ok". Returns their outputs."""
    env = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": f"{SUBNET}.1",
           "VKSHMEM_BOOTSTRAP": "env", "VKSHMEM_SYMMETRIC_SIZE": "64M",
           "VKSHMEM_WAIT_TIMEOUT": "60", "VKSHMEM_BOOTSTRAP_TIMEOUT": "30",
           # beyond loopback the job needs a secret every PE knows
           "VKSHMEM_JOB_SECRET": secrets.token_hex(32),
           "PYTHONPATH": str(PE_DIR), **extra_env}
    procs = [subprocess.Popen(["ip", "netns", "exec", ns, sys.executable,
                               str(PE_DIR / f"{script}.py")],
                              env={**env, "RANK": str(rank)}, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
             for rank, ns in enumerate(hosts)]
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=120)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"{script} on two hosts over {env['VKSHMEM_TRANSPORTS']} timed out")
    for p, out in zip(procs, outs, strict=True):
        assert p.returncode == 0, out
        assert f"{script} ok" in out, out
    return outs


@pytest.mark.parametrize("script", ["rma", "amo", "sync", "gpu"])
def test_two_hosts_over_hostproxy(two_hosts: tuple[str, str], script: str) -> None:
    outs = run_on_two_hosts(two_hosts, script, {
        "MASTER_PORT": "29411", "VKSHMEM_TRANSPORTS": "hostproxy",
        "VKSHMEM_GPU_SYMMETRIC_SIZE": "64M", "VKSHMEM_GPU_VALIDATION": "1"})
    for out in outs:
        # different nodes: the peer is reached through hostproxy, only the PE itself through shm
        assert "routes: ['hostproxy', 'shm']" in out, out
