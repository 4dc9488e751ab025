"""The ofi transport across processes: progress while the target PE is busy in Python,
``wait_until`` on words written by libfabric puts, libfabric as one rail among several
(next to hostproxy, and two libfabric providers on two rails), and two PEs on two test "hosts"
(network namespaces) reaching each other over tcp;ofi_rxm.

Every test runs real libfabric between real processes (the project's launcher, or a child
process), with outer timeouts.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from busy_target import check_busy_target
from test_multipe import MODES, launch
from test_netns import run_on_two_hosts, two_hosts  # noqa: F401 - a fixture, used by name
from test_ucx import WAIT_SCRIPT, _run_file

pytest.importorskip("vkshmem_ofi")
from vkshmem_ofi._transport import OfiTransport

pytestmark = pytest.mark.timeout(300)

PROVIDERS = {"tcp": "tcp;ofi_rxm", "shm": "shm"}



@pytest.mark.parametrize("prov", list(PROVIDERS))
def test_a_target_busy_in_python_still_serves_puts_gets_and_amos(prov: str) -> None:
    """The target spins in pure Python for 2 s, never entering libfabric; the initiator's puts,
    gets and AMOs (which every provider here needs the target to progress) complete promptly:
    each well under the ~1 s stall a target without a progress thread causes."""
    check_busy_target(OfiTransport, "provider", PROVIDERS[prov], rounds=60)


@pytest.mark.parametrize("mode", ["ofi-tcp", "ofi-shm"])
def test_wait_until_returns_on_a_word_written_by_an_ofi_put(mode: str, tmp_path: Path) -> None:
    script = tmp_path / "wait_put.py"
    script.write_text(WAIT_SCRIPT)
    r = _run_file(script, 2, MODES[mode])
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert r.stdout.count("wait ok") == 2, r.stdout
    assert r.stdout.count("routes: ['ofi']") == 2, r.stdout


RAILS = {
    "ofi+hostproxy": {"VKSHMEM_SHM": "0", "VKSHMEM_RAIL0": "ofi", "VKSHMEM_RAIL1": "hostproxy"},
    "ofi-tcp+ofi-shm": {"VKSHMEM_SHM": "0", "VKSHMEM_RAIL0": "ofi:provider=tcp;ofi_rxm",
                        "VKSHMEM_RAIL1": "ofi:provider=shm"},
}


@pytest.mark.parametrize("npes", [2, 4])
@pytest.mark.parametrize("script", ["rma", "amo"])
def test_two_rails_ofi_and_hostproxy(script: str, npes: int) -> None:
    """tests/pe/rma.py and amo.py with rail 0 = ofi and rail 1 = hostproxy."""
    env = {**RAILS["ofi+hostproxy"], "VKSHMEM_STRIPE_THRESHOLD": "64K"}
    r = launch(script, npes, env)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert r.stdout.count(f"{script} ok") == npes, r.stdout
    routes = [line for line in r.stdout.splitlines() if "routes:" in line]
    assert len(routes) == npes and all("routes: ['hostproxy', 'ofi']" in x for x in routes), \
        routes


@pytest.mark.parametrize("rails,npes", [("ofi+hostproxy", 2), ("ofi+hostproxy", 4),
                                        ("ofi-tcp+ofi-shm", 2)])
def test_large_transfers_stripe_across_an_ofi_rail(rails: str, npes: int) -> None:
    env = {**RAILS[rails], "VKSHMEM_STRIPE_THRESHOLD": "64K"}
    r = launch("stripe", npes, env)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert r.stdout.count("stripe ok") == npes, r.stdout


@pytest.mark.parametrize("script", ["rma", "amo"])
def test_two_hosts_over_ofi_tcp(two_hosts: tuple[str, str], script: str) -> None:  # noqa: F811
    """PEs in two network namespaces joined by a veth pair: the peer is reached through
    tcp;ofi_rxm over the veth link, the PE itself through shm."""
    outs = run_on_two_hosts(two_hosts, script, {
        "MASTER_PORT": "29414", "VKSHMEM_TRANSPORTS": "ofi",
        "VKSHMEM_OFI_PROVIDER": "tcp;ofi_rxm"})
    for out in outs:
        assert "routes: ['ofi', 'shm']" in out, out


@pytest.mark.parametrize("npes", [2, 4])
@pytest.mark.parametrize("script", ["amo", "amo_nbi", "lock"])
def test_emulated_atomics_fallback_across_processes(script: str, npes: int) -> None:
    """Every AMO run as a compare-and-swap loop (the fallback for an op a provider lacks,
    forced with emulate=all) still passes the AMO, non-blocking AMO and lock scripts."""
    env = {"VKSHMEM_SHM": "0", "VKSHMEM_RAIL0": "ofi:provider=tcp;ofi_rxm:emulate=all"}
    r = launch(script, npes, env)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert r.stdout.count(f"{script} ok") == npes, r.stdout


@pytest.mark.parametrize("script", ["rma", "amo", "sync"])
def test_the_sockets_provider_across_processes(script: str) -> None:
    """A third Debian 12 provider (correct, ~10 ms per operation) carries the rma, amo and sync
    scripts at 2 PEs."""
    env = {"VKSHMEM_SHM": "0", "VKSHMEM_TRANSPORTS": "ofi", "VKSHMEM_OFI_PROVIDER": "sockets"}
    r = launch(script, 2, env)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert r.stdout.count(f"{script} ok") == 2, r.stdout
