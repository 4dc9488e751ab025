"""fd passing under attack: a local user who squats the abstract socket names of the PEs; and
two start-up checks of the same issue: every PE's start-up record is checked, and every rank of
the ``env`` bootstrap refuses at once to run beyond loopback without a secret.

The PEs of a node hand each other their memfds over abstract Unix sockets, whose names every
user of the host sees in ``/proc/net/unix``. A name a stranger can predict from what it sees
there, it can bind first, and the PE that wanted it cannot listen. Each PE therefore binds a
fresh random name before anyone learns it, and the names travel only through the authenticated
bootstrap (:mod:`vkshmem.core.fdshare`).

The attack test runs a real 2-PE job and an attacker of another user (nobody) in a network
namespace of its own (abstract sockets belong to the network namespace): needs root, iproute2
and setpriv; skipped otherwise.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from attack import private_netns

from vkshmem.core import auth, fdshare, runtime
from vkshmem.core.bootstrap.base import Bootstrap, guess_host_address
from vkshmem.core.bootstrap.exposure import env_secret
from vkshmem.core.bootstrap.storeboot import EnvBootstrap
from vkshmem.core.config import load as load_config
from vkshmem.core.errors import BootstrapError

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parent.parent
SYSTEM_PYTHON = "/usr/bin/python3"  # the attacker's: nobody may not read this checkout

ATTACK_MISSING = next((why for cond, why in [
    (os.geteuid() != 0, "needs root (ip netns, setpriv)"),
    (shutil.which("ip") is None, "needs iproute2 (ip netns)"),
    (shutil.which("setpriv") is None, "needs setpriv (util-linux)"),
    (not os.access(SYSTEM_PYTHON, os.X_OK), f"needs {SYSTEM_PYTHON} for the attacker"),
] if cond), None)

#: The attacker (user nobody, stdlib only): watches /proc/net/unix for the names of vkshmem's
#: fd-passing sockets and binds every name it can predict from one it sees: the same token with
#: other PE numbers, and with a segment number in front (the old scheme
#: ``vkshmem.<token>.<pe>`` and ``vkshmem.<token>.<seg>.<pe>``). Prints what it saw and took;
#: stops on SIGTERM or after its time.
ATTACKER = r"""
import os, signal, socket, sys, time
stop = []
signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
end = time.monotonic() + float(sys.argv[1])
seen, held = set(), {}

def take(name):
    if name in held or name in seen:
        return
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.bind(b"\0" + name.encode())
        s.listen(1)
    except OSError:
        s.close()
        return
    held[name] = s
    print("took", name, flush=True)

print("ready", os.getuid(), flush=True)
while not stop and time.monotonic() < end:
    with open("/proc/net/unix") as f:
        lines = f.read().splitlines()[1:]
    for line in lines:
        path = line.split()[-1] if len(line.split()) > 7 else ""
        if not path.startswith("@vkshmem.") or path[1:] in held or path[1:] in seen:
            continue
        seen.add(path[1:])
        print("saw", path, flush=True)
        token = path[len("@vkshmem."):].split(".")[0]
        for pe in range(8):
            take(f"vkshmem.{token}.{pe}")
            for seg in range(8):
                take(f"vkshmem.{token}.{seg}.{pe}")
print("done saw", len(seen), "took", len(held), flush=True)
"""

#: A PE of the job: PE 1 starts its fd exchange a moment after PE 0 (as a loaded host may
#: schedule it), then the PEs put to and get from each other through the shm path (their
#: exchanged memfds) and check every word.
PE_SCRIPT = """
import os, time
import numpy as np
from vkshmem.core import runtime
from vkshmem.core.transports import rails  # opens the shm path: the host heaps' exchange

real = rails.exchange_fds
def slow(*args, **kwargs):
    if os.environ.get("VKSHMEM_PE") == "1":
        time.sleep(1.0)
    return real(*args, **kwargs)
rails.exchange_fds = slow

from vkshmem import shmem
shmem.init()
me, n = shmem.my_pe(), shmem.n_pes()
other = 1 - me
rt = runtime.current
assert rt.routing.route_transport[other] is rt.routing.shm, "the peer is not reached through shm"
dst = shmem.zeros(4096, np.int64)
src = np.arange(4096, dtype=np.int64) * 7 + me
shmem.put(dst, src, other)
shmem.barrier_all()
assert np.array_equal(dst, np.arange(4096, dtype=np.int64) * 7 + other), "put"
got = np.empty(4096, np.int64)
shmem.get(got, dst, other)
assert np.array_equal(got, np.arange(4096, dtype=np.int64) * 7 + me), "get"
shmem.barrier_all()
print("fdshare job ok", me, flush=True)
shmem.finalize()
"""


@pytest.fixture
def netns() -> Iterator[str]:
    if ATTACK_MISSING is not None:
        pytest.skip(ATTACK_MISSING)
    with private_netns("vkfd") as name:
        yield name


def test_squatting_the_fd_passing_names_does_not_stop_the_job(netns: str,
                                                              tmp_path: Path) -> None:
    script = tmp_path / "fdjob.py"
    script.write_text(textwrap.dedent(PE_SCRIPT))
    attacker = subprocess.Popen(
        ["ip", "netns", "exec", netns, "setpriv", "--reuid=65534", "--regid=65534",
         "--clear-groups", SYSTEM_PYTHON, "-c", ATTACKER, "90"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd="/")
    try:
        assert attacker.stdout is not None
        first = attacker.stdout.readline()
        assert first.startswith("ready 65534"), first + attacker.stdout.read()
        env = {k: v for k, v in os.environ.items() if not k.startswith("VKSHMEM_")}
        env.update(VKSHMEM_SHM="1", VKSHMEM_SYMMETRIC_SIZE="16M",
                   VKSHMEM_BOOTSTRAP_TIMEOUT="30")
        job = subprocess.run(
            ["ip", "netns", "exec", netns, sys.executable, "-m", "vkshmem", "run", "-n", "2",
             "--timeout", "60", str(script)],
            capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    finally:
        attacker.send_signal(signal.SIGTERM)
        try:
            seen = attacker.communicate(timeout=30)[0]
        except subprocess.TimeoutExpired:
            attacker.kill()
            seen = attacker.communicate()[0]
    out = job.stdout + job.stderr
    report = f"job:\n{out}\nattacker:\n{first}{seen}"
    assert job.returncode == 0, report
    for pe in range(2):
        assert f"fdshare job ok {pe}" in out, report
    assert "saw @vkshmem." in seen, report  # it did watch the job's names appear


# -- a taken name: retry with another, then a clear error ------------------------------------------


def squat(name: bytes) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(name)
    s.listen(1)
    return s


def two_pes(names: dict[int, list[bytes]], monkeypatch: pytest.MonkeyPatch
            ) -> dict[int, dict[int, list[int]] | BaseException]:
    """PEs 0 and 1 (threads of this process) exchange one memfd each; ``names[pe]``: the
    names each PE's ``_new_name`` draws, in order (then random ones). Returns each PE's
    result or exception."""
    draws = {pe: list(seq) for pe, seq in names.items()}
    real = fdshare._new_name
    local = threading.local()

    def new_name() -> bytes:
        seq = draws.get(getattr(local, "pe", -1))
        return seq.pop(0) if seq else real()

    monkeypatch.setattr(fdshare, "_new_name", new_name)
    fds = [os.memfd_create(f"pe{pe}") for pe in range(2)]
    for pe, fd in enumerate(fds):
        os.write(fd, b"PE %d" % pe)
    barrier = threading.Barrier(2)
    slots: list[bytes] = [b"", b""]

    def allgather(me: int, blob: bytes) -> list[bytes]:
        slots[me] = blob
        barrier.wait(10)
        out = list(slots)
        barrier.wait(10)
        return out

    out: dict[int, dict[int, list[int]] | BaseException] = {}

    def pe(me: int) -> None:
        local.pe = me
        try:
            out[me] = fdshare.exchange_fds(
                me, {1 - me: os.getpid()}, [fds[me]],
                lambda blob: allgather(me, blob), lambda: barrier.wait(10), 10)
        except BaseException as exc:
            out[me] = exc

    threads = [threading.Thread(target=pe, args=(me,)) for me in range(2)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    finally:
        for fd in fds:
            os.close(fd)
    return out


def test_a_taken_name_is_retried_with_another(monkeypatch: pytest.MonkeyPatch) -> None:
    taken = b"\0vkshmem." + b"ab" * 16
    s = squat(taken)
    try:
        out = two_pes({0: [taken, taken]}, monkeypatch)
    finally:
        s.close()
    for me in range(2):
        got = out[me]
        assert isinstance(got, dict), got
        (fd,) = got[1 - me]
        assert os.pread(fd, 4, 0) == b"PE %d" % (1 - me)
        os.close(fd)


def test_a_name_taken_every_time_raises_bootstrap_error(monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    taken = b"\0vkshmem." + b"cd" * 16
    s = squat(taken)
    try:
        out = two_pes({0: [taken] * 100}, monkeypatch)
    finally:
        s.close()
    err = out[0]
    assert isinstance(err, BootstrapError), err
    assert not isinstance(err, OSError)
    assert "taken by another process" in str(err) and "squat" in str(err), err
    # its peer learns it through the all-gather and fails at once too, naming PE 0
    assert isinstance(out[1], BootstrapError) and "PE 0" in str(out[1]), out[1]


def test_a_malformed_name_from_a_peer_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    out = two_pes({0: [b"\0vkshmem.not-hex"]}, monkeypatch)
    assert isinstance(out[1], BootstrapError) and "PE 0" in str(out[1]), out[1]


def test_names_are_fresh_and_unguessable() -> None:
    names = {fdshare._new_name() for _ in range(100)}
    assert len(names) == 100
    for name in names:
        assert name.startswith(b"\0vkshmem.") and len(name) == len(b"\0vkshmem.") + 32


# -- a PE's malformed start-up record ----------------------------------------------------------

GOOD = {"node": "host:boot:1", "heap": 1 << 20, "pid": 1234, "domains": []}


@pytest.mark.parametrize(("blob", "what"), [
    (b"\xff\xfe not utf-8", "not JSON"),
    (b"{not json", "not JSON"),
    (b"[1, 2]", "not an object"),
    (b"null", "not an object"),
    (json.dumps({k: v for k, v in GOOD.items() if k != "pid"}).encode(), "no 'pid'"),
    (json.dumps({**GOOD, "heap": "1M"}).encode(), "'heap' is a str"),
    (json.dumps({**GOOD, "pid": True}).encode(), "'pid' is a bool"),
    (json.dumps({**GOOD, "pid": -5}).encode(), "'pid' is -5"),
    (json.dumps({**GOOD, "node": 7}).encode(), "'node' is a int"),
    (json.dumps({**GOOD, "domains": "cuda"}).encode(), "'domains' is a str"),
    (json.dumps({**GOOD, "domains": [1]}).encode(), "'domains' is not a list of names"),
])
def test_a_malformed_start_up_record_names_the_pe(blob: bytes, what: str) -> None:
    with pytest.raises(BootstrapError, match=r"PE 3 sent a malformed start-up record") as info:
        runtime._read_info(3, blob)
    assert what in str(info.value)
    assert runtime._read_info(3, json.dumps(GOOD).encode()) == GOOD


class FakeBootstrap(Bootstrap):
    """Rank 0 of 2 whose peer's start-up record is ``peer_blob``."""

    def __init__(self, peer_blob: bytes) -> None:
        self.name, self.rank, self.size = "fake", 0, 2
        self.peer_blob = peer_blob
        self.closed = False

    def allgather(self, blob: bytes) -> list[bytes]:
        return [blob, self.peer_blob]

    def close(self) -> None:
        self.closed = True


def test_the_runtime_refuses_a_malformed_record_with_bootstrap_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    boot = FakeBootstrap(json.dumps({"node": "x", "heap": 1}).encode())
    monkeypatch.setattr(runtime, "open_bootstrap", lambda *args: boot)
    with pytest.raises(BootstrapError, match=r"PE 1 sent a malformed start-up record.*'pid'"):
        runtime.Runtime(load_config({"VKSHMEM_SYMMETRIC_SIZE": "1M"}))


# -- env bootstrap: every rank refuses to run beyond loopback without a secret ---------------------


def env_rank(rank: int, addr: str, **extra: str) -> dict[str, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return {"RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": addr,
            "MASTER_PORT": str(port), **extra}


def outward_address() -> str | None:
    addr = guess_host_address()
    return None if addr.startswith("127.") else addr


@pytest.mark.parametrize("rank", [0, 1])
def test_env_every_rank_refuses_a_wildcard_bind_without_a_secret_at_once(rank: int) -> None:
    """Rank 0 would bind the wildcard (VKSHMEM_BOOTSTRAP_BIND): it refuses, and so does rank 1
    at once (not after the 30 s bootstrap timeout, waiting for a rank 0 that never came)."""
    start = time.monotonic()
    with pytest.raises(BootstrapError, match=f"beyond loopback.*{auth.SECRET_VAR}.*"
                                             f"{auth.FILE_VAR}.*{auth.FD_VAR}") as info:
        EnvBootstrap.open(env_rank(rank, "127.0.0.1", VKSHMEM_BOOTSTRAP_BIND="0.0.0.0"), 30)
    assert time.monotonic() - start < 10
    assert "0.0.0.0 (VKSHMEM_BOOTSTRAP_BIND)" in str(info.value)


def test_env_a_rank_reaching_the_store_beyond_loopback_refuses_at_once() -> None:
    addr = outward_address()
    if addr is None:
        pytest.skip("this host has no address beyond loopback")
    start = time.monotonic()
    with pytest.raises(BootstrapError, match=f"{addr}.*beyond loopback.*{auth.SECRET_VAR}"):
        EnvBootstrap.open(env_rank(1, addr), 30)
    assert time.monotonic() - start < 10


def test_env_secret_rule_on_loopback_and_with_a_secret() -> None:
    assert env_secret({}, "127.0.0.1", "the address of MASTER_ADDR", "localhost",
                      "MASTER_ADDR") == b""
    with pytest.raises(BootstrapError, match=r"reaches the store at 10\.1\.2\.3 \(MASTER_ADDR\)"):
        env_secret({}, "127.0.0.1", "VKSHMEM_BOOTSTRAP_BIND", "10.1.2.3", "MASTER_ADDR")
    secret = {auth.SECRET_VAR: "s" * 32}
    assert env_secret(secret, "0.0.0.0", "VKSHMEM_BOOTSTRAP_BIND", "10.1.2.3",
                      "MASTER_ADDR") == b"s" * 32
