"""The ofi transport across processes: progress while the target PE is busy in Python,
``wait_until`` on words written by libfabric puts, libfabric as one rail among several
(next to hostproxy, and two libfabric providers on two rails), and two PEs on two test "hosts"
(network namespaces) reaching each other over tcp;ofi_rxm.

Every test runs real libfabric between real processes (the project's launcher, or a child
process), with outer timeouts.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_multipe import MODES, launch
from test_netns import run_on_two_hosts, two_hosts  # noqa: F401 - a fixture, used by name
from test_ucx import WAIT_SCRIPT, _run_file
from vkshmem.core._native import lib as native

from vkshmem.core.transport import AmoOp, PeerInfo, TransportContext

pytest.importorskip("vkshmem_ofi")
from vkshmem_ofi._transport import OfiTransport

pytestmark = pytest.mark.timeout(300)

PROVIDERS = {"tcp": "tcp;ofi_rxm", "shm": "shm"}

BUSY_TARGET = """
import json, mmap, os, sys, time
from vkshmem.core._native import lib, ffi
from vkshmem.core.transport import SegmentInfo, TransportContext
from vkshmem_ofi._transport import OfiTransport

fd = os.memfd_create("busy")
os.ftruncate(fd, 1 << 20)
m = mmap.mmap(fd, 1 << 20)
address = int(ffi.cast("uintptr_t", ffi.from_buffer(m)))
t = OfiTransport(TransportContext(1, 2, 0, {"provider": sys.argv[1]}, "node0", "127.0.0.1",
                                  lib.vk_amo_address()))
key = t.register(SegmentInfo(0, "host", address, 1 << 20, fd, memoryview(m)))
print(json.dumps({"address": t.address().hex(), "key": key.hex()}), flush=True)
sys.stdin.readline()  # the initiator is connected: be busy now
start = time.monotonic()
spins = 0
while time.monotonic() - start < float(sys.argv[2]):
    for _ in range(10000):  # pure Python holding the GIL, never calling the transport
        spins += 1
print(json.dumps({"busy_from": start, "busy_until": time.monotonic(),
                  "head": m[:16].hex()}), flush=True)
t.close()
"""


@pytest.mark.parametrize("prov", list(PROVIDERS))
def test_a_target_busy_in_python_still_serves_puts_gets_and_amos(prov: str) -> None:
    """The target spins in pure Python for 2 s, never entering libfabric; the initiator's puts,
    gets and AMOs (which every provider here needs the target to progress) complete promptly:
    each well under the ~1 s stall a target without a progress thread causes."""
    busy = 2.0
    child = subprocess.Popen([sys.executable, "-c", BUSY_TARGET, PROVIDERS[prov], str(busy)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    tr = OfiTransport(TransportContext(0, 2, 0, {"provider": PROVIDERS[prov]}, "node0",
                                       "127.0.0.1", native.vk_amo_address()))
    worst: dict[str, float] = {}
    try:
        assert child.stdin is not None and child.stdout is not None
        info = json.loads(child.stdout.readline())
        tr.connect({1: PeerInfo(1, "node0", True, bytes.fromhex(info["address"]),
                                {0: bytes.fromhex(info["key"])})})
        tr.put(1, 0, 0, memoryview(b"busy PE\0"))  # connected before the busy phase
        tr.quiet()
        child.stdin.write("go\n")
        child.stdin.flush()
        time.sleep(0.2)
        first = time.monotonic()

        def timed(name: str, fn: object, *args: object) -> object:
            t0 = time.monotonic()
            out = fn(*args)  # type: ignore[operator]
            worst[name] = max(worst.get(name, 0.0), time.monotonic() - t0)
            return out

        out = bytearray(4096)
        for i in range(60):
            timed("put+quiet", lambda i=i: (tr.put(1, 0, 4096, memoryview(bytes([i]) * 4096)),
                                            tr.quiet()))
            timed("get", tr.get, 1, 0, 4096, memoryview(out))
            assert out == bytes([i]) * 4096
            assert timed("fetch_add", tr.amo, 1, 0, 8, AmoOp.ADD, 8, 1, 0, True) == i
            timed("add+quiet", lambda: (tr.amo(1, 0, 16, AmoOp.ADD, 8, 1, 0, False),
                                        tr.quiet()))
        last = time.monotonic()
    finally:
        tr.close()
        final = child.communicate(timeout=60)[0].splitlines()
    assert child.returncode == 0
    done = json.loads(final[-1])
    assert done["busy_from"] <= first and last <= done["busy_until"], \
        "the operations did not all run while the target was busy"
    assert bytes.fromhex(done["head"]) == b"busy PE\0" + (60).to_bytes(8, "little")
    assert all(t < 0.2 for t in worst.values()), {k: f"{v * 1e3:.1f} ms"
                                                  for k, v in worst.items()}


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
