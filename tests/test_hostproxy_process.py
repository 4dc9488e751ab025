"""The hostproxy transport with its target PE in another process (real loopback sockets): a
target spinning in pure Python (holding its GIL) is still served, and a target stopped with
SIGSTOP lets a real signal interrupt the C client's wait: Ctrl-C retires the request's
connection, a handler that returns lets the wait go on."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from vkshmem.core.transports.contract import AmoOp, PeerInfo

pytest.importorskip("vkshmem_hostproxy")
from vkshmem_hostproxy import HostProxyTransport

from vkshmem.testing import transport as contract
from vkshmem.testing.transport import context

pytestmark = pytest.mark.timeout(120)


# -- progress without the target -----------------------------------------------------------

BUSY_TARGET = """
import ctypes, json, mmap, os, sys, time
from vkshmem.core._native import lib
from vkshmem.core.transports.contract import SegmentInfo, TransportContext
from vkshmem_hostproxy import HostProxyTransport

fd = os.memfd_create("busy")
os.ftruncate(fd, 4096)
m = mmap.mmap(fd, 4096)
probe = ctypes.c_char.from_buffer(m)
address = ctypes.addressof(probe)
del probe
t = HostProxyTransport(TransportContext(1, 2, 0, {"addr": "127.0.0.1"}, "node0", "127.0.0.1",
                                        lib.vk_amo_address(), secret=SECRET))
key = t.register(SegmentInfo(0, "host", address, 4096, fd, memoryview(m)))
print(json.dumps({"address": t.address().decode(), "key": key.hex()}), flush=True)
stop, deadline, spins = sys.argv[1], time.monotonic() + 60, 0
while not os.path.exists(stop) and time.monotonic() < deadline:
    for _ in range(10000):  # pure Python holding the GIL, never calling the transport
        spins += 1
print(m[:16].hex(), flush=True)
t.close()
"""


@contextlib.contextmanager
def busy_target(tmp_path: Path, timeout: str = "60") -> Iterator[tuple[subprocess.Popen[str],
                                                                       HostProxyTransport]]:
    """PE 1 in a child process spinning in pure Python, and PE 0's transport connected to it.
    On exit the child is stopped and must have exited cleanly."""
    stop = tmp_path / "stop"
    child = subprocess.Popen([sys.executable, "-c", f"SECRET = {contract.SECRET!r}\n"
                              + BUSY_TARGET, str(stop)],
                             stdout=subprocess.PIPE, text=True)
    tr = HostProxyTransport(context(0, 2, options={"addr": "127.0.0.1", "timeout": timeout}))
    try:
        assert child.stdout is not None
        info = json.loads(child.stdout.readline())
        tr.connect({1: PeerInfo(1, "node0", True, info["address"].encode(),
                                {0: bytes.fromhex(info["key"])})})
        yield child, tr
    finally:
        tr.close()
        child.send_signal(signal.SIGCONT)
        stop.touch()
        child.communicate(timeout=60)
    assert child.returncode == 0


def stop(child: subprocess.Popen[str]) -> None:
    """SIGSTOP ``child`` and wait until every thread of it has stopped."""
    child.send_signal(signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        states = [Path(t, "stat").read_text().rsplit(")", 1)[1].split()[0]
                  for t in Path(f"/proc/{child.pid}/task").iterdir()]
        if all(s == "T" for s in states):
            return
        time.sleep(0.005)
    raise AssertionError(f"process {child.pid} did not stop")


def test_serves_a_busy_target_process(tmp_path: Path) -> None:
    """The target PE spins in pure Python (holding its GIL); its server still answers."""
    with busy_target(tmp_path) as (_, tr):
        tr.put(1, 0, 0, memoryview(b"busy PE"))
        start = time.perf_counter()
        for _ in range(200):
            tr.amo(1, 0, 8, AmoOp.ADD, 8, 1, 0, True)
        per_op = (time.perf_counter() - start) / 200
        out = bytearray(16)
        tr.get(1, 0, 0, memoryview(out))
        assert out == b"busy PE\0" + (200).to_bytes(8, "little")
        # Needing the target's GIL would cost about a 5 ms switch interval per operation.
        assert per_op < 0.002, f"{per_op * 1e3:.2f} ms per fetch-add"


def _interrupt_after(seconds: float) -> None:
    def raise_interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt
    signal.signal(signal.SIGALRM, raise_interrupt)
    signal.setitimer(signal.ITIMER_REAL, seconds)


@pytest.mark.parametrize("kind", ["amo", "get", "quiet"])
def test_interrupted_request_retires_its_connection(tmp_path: Path, kind: str) -> None:
    """Ctrl-C (here a real SIGALRM whose handler raises KeyboardInterrupt) while the C client
    waits for a stopped target's reply: the exception propagates, and the reply, once the
    target goes on, is not read by the next request: the connection is retired and replaced."""
    old = signal.getsignal(signal.SIGALRM)
    with busy_target(tmp_path) as (child, tr):
        tr.amo(1, 0, 512, AmoOp.SET, 8, 101, 0, False)
        tr.quiet()
        assert tr.client_stats()["opened"] == 1
        stop(child)
        start = time.monotonic()
        try:
            _interrupt_after(0.2)
            with pytest.raises(KeyboardInterrupt):
                if kind == "amo":  # applied later; its reply is never read
                    tr.amo(1, 0, 512, AmoOp.ADD, 8, 100, 0, True)
                elif kind == "get":
                    tr.get(1, 0, 512, memoryview(bytearray(8)))
                else:
                    tr.amo(1, 0, 512, AmoOp.ADD, 8, 100, 0, False)
                    tr.quiet()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
            child.send_signal(signal.SIGCONT)
        assert time.monotonic() - start < 5
        expect = 101 if kind == "get" else 201
        assert tr.amo(1, 0, 512, AmoOp.FETCH, 8, 0, 0, True) == expect  # not a stale reply
        assert tr.client_stats()["opened"] == 2


def test_a_signal_whose_handler_returns_does_not_disturb_a_wait(tmp_path: Path) -> None:
    """A signal handler that returns (no exception): the interrupted wait goes on."""
    seen: list[int] = []
    old = signal.signal(signal.SIGALRM, lambda signum, frame: seen.append(signum))
    with busy_target(tmp_path) as (child, tr):
        tr.put(1, 0, 64, memoryview(b"survives"))
        stop(child)
        try:
            signal.setitimer(signal.ITIMER_REAL, 0.1)
            threading.Timer(0.4, child.send_signal, (signal.SIGCONT,)).start()
            out = bytearray(8)
            tr.get(1, 0, 64, memoryview(out))
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
        assert out == b"survives" and seen == [signal.SIGALRM]
        assert tr.client_stats()["opened"] == 1
