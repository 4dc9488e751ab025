"""The ucx transport opens only UCX transports that enforce access to a PE's memory (tcp and
sysv only on a network declared trusted), and its tcp then listens only where the job is."""

from __future__ import annotations

import os
import re

import pytest

pytest.importorskip("vkshmem_ucx")
from vkshmem_ucx._access import TRUST_VAR, job_devices, restrict
from vkshmem_ucx._transport import UNREACHABLE_HINT, UcxTransport

from vkshmem.core.errors import ConfigError
from vkshmem.testing import transport as contract

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def _no_ucx_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("UCX_TLS", "UCX_NET_DEVICES", TRUST_VAR):
        monkeypatch.delenv(name, raising=False)


def restricted(tls: str | None, trusted: bool = False) -> dict[str, str]:
    ucx = {} if tls is None else {"TLS": tls}
    restrict(ucx, trusted, "VKSHMEM_RAIL0", "127.0.0.1")
    return ucx


@pytest.mark.parametrize(("given", "opened"), [
    (None, "^tcp,sysv"), ("all", "^tcp,sysv"),
    ("^rc", "^rc,tcp,sysv"), ("^tcp", "^tcp,sysv"),
    ("posix,cma,self", "posix,cma,self"), ("rc,ud,self", "rc,ud,self"),
    ("sm,self", "posix,cma,self"), ("shm", "posix,cma"), ("mm,cma,self", "posix,cma,self"),
])
def test_unchecked_transports_are_left_out_by_default(given: str | None, opened: str) -> None:
    assert restricted(given)["TLS"] == opened


def test_the_environment_list_is_restricted_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UCX_TLS", "^ud")
    assert restricted(None)["TLS"] == "^ud,tcp,sysv"
    monkeypatch.setenv("UCX_TLS", "tcp,self")
    with pytest.raises(ConfigError, match=r"UCX_TLS.*'tcp,self' names tcp"):
        restricted(None)


@pytest.mark.parametrize("given", ["tcp,self", "sysv,self", "posix,tcp", "all,self"])
def test_naming_an_unchecked_transport_is_refused_with_the_alternatives(given: str) -> None:
    with pytest.raises(ConfigError) as err:
        restricted(given)
    text = str(err.value)
    assert "VKSHMEM_RAIL0" in text and TRUST_VAR in text and "hostproxy" in text
    if "tcp" in given:
        assert "without checking a remote key" in text
    if "sysv" in given:
        assert "0660" in text


def test_a_trusted_network_keeps_the_list_and_listens_on_the_jobs_interface() -> None:
    assert restricted("tcp,self", trusted=True) == {"TLS": "tcp,self", "NET_DEVICES": "lo"}
    assert restricted(None, trusted=True) == {"NET_DEVICES": "lo"}
    assert restricted("posix,self", trusted=True) == {"TLS": "posix,self"}  # no tcp
    assert restricted("^tcp", trusted=True) == {"TLS": "^tcp"}
    devices = {"TLS": "tcp", "NET_DEVICES": "eth9"}
    restrict(devices, True, "VKSHMEM_RAIL0", "127.0.0.1")  # the user's choice stands
    assert devices["NET_DEVICES"] == "eth9"
    assert job_devices("127.0.0.1")[0] == "lo"
    assert job_devices("192.0.2.77") == []  # no interface holds it: UCX's choice stands


def test_the_variable_and_the_rail_option(monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = contract.context(0, 1, 0, {"tls": "tcp,self"})
    with pytest.raises(ConfigError, match=TRUST_VAR):
        UcxTransport(ctx)
    monkeypatch.setenv(TRUST_VAR, "maybe")
    with pytest.raises(ConfigError, match=rf"{TRUST_VAR}.*'maybe'"):
        UcxTransport(ctx)
    monkeypatch.setenv(TRUST_VAR, "1")
    tr = UcxTransport(ctx)
    try:
        assert tr.stats()["settings"]["UCX_TLS"] == "tcp,self"
    finally:
        tr.close()
    with pytest.raises(ConfigError, match="VKSHMEM_RAIL0"):  # the rail option overrides it
        UcxTransport(contract.context(0, 1, 0, {"tls": "tcp,self", "trusted": "off"}))


def _my_tcp_listeners() -> set[str]:
    """``address:port`` of this process's listening TCP sockets (IPv4)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            m = re.match(r"socket:\[(\d+)\]", os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            continue
        if m:
            inodes.add(m.group(1))
    found = set()
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            cols = line.split()
            if cols[3] == "0A" and cols[9] in inodes:  # LISTEN
                addr, port = cols[1].split(":")
                ip = ".".join(str(int(addr[i:i + 2], 16)) for i in (6, 4, 2, 0))
                found.add(f"{ip}:{int(port, 16)}")
    return found


def test_by_default_ucx_listens_on_no_tcp_port() -> None:
    before = _my_tcp_listeners()
    tr = UcxTransport(contract.context(0, 1, 0, {}))
    try:
        assert _my_tcp_listeners() == before
        assert tr.stats()["settings"]["UCX_TLS"] == "^tcp,sysv"
    finally:
        tr.close()


def test_trusted_tcp_listens_only_on_the_jobs_address() -> None:
    before = _my_tcp_listeners()
    tr = UcxTransport(contract.context(0, 1, 0, {"tls": "tcp,self", "trusted": "on"}))
    try:
        new = _my_tcp_listeners() - before
        assert new, "UCX's tcp opened no listener"
        assert all(a.startswith("127.0.0.1:") for a in new), new
    finally:
        tr.close()


def test_the_unreachable_error_says_why_tcp_is_off() -> None:
    assert "VKSHMEM_UCX_TRUSTED_NETWORK=1" in UNREACHABLE_HINT
    assert "hostproxy" in UNREACHABLE_HINT
