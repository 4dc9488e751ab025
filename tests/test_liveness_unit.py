"""The liveness channel in one process (:mod:`vkshmem.core.liveness.channel`,
:mod:`vkshmem.core.liveness.hub`):
a real hub on loopback and real connections; "a PE dies" is its socket closing without a
goodbye, as the kernel does for a killed process."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from vkshmem.core._native import ffi

import vkshmem
from vkshmem.core.errors import BootstrapError, PeerFailedError, TransportError, VkshmemError
from vkshmem.core.liveness.channel import Liveness
from vkshmem.core.liveness.hub import Hub
from vkshmem.core.wait import Waiter

TIMEOUT = 5.0


def _until(cond: Callable[[], bool], limit: float = 5.0) -> bool:
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.005)
    return cond()


class Job:
    """PE 0 (hub) and PEs 1..n-1 connected to it, as Liveness._start sets them up."""

    def __init__(self, n: int) -> None:
        self.key = secrets.token_bytes(32)
        self.pes = [Liveness(r, n) for r in range(n)]
        hub = Hub(n, "127.0.0.1", self.key, self.pes[0].mark, TIMEOUT)
        self.pes[0]._hub = hub
        hub.start()
        self.address = hub.address
        for lv in self.pes[1:]:
            lv._connect(*self.address, self.key, TIMEOUT, TIMEOUT)

    def die(self, rank: int) -> None:
        """PE ``rank``'s process ends: its connection closes without a goodbye."""
        lv = self.pes[rank]
        lv._closing = True  # its own monitor thread is part of the dead process
        if rank == 0:
            assert lv._hub is not None
            lv._hub.close(wait=0.0, clean=False)
        else:
            assert lv._sock is not None
            lv._sock.shutdown(socket.SHUT_RDWR)
            lv._sock.close()

    def close(self) -> None:
        for lv in reversed(self.pes):
            lv.close(clean=False)


@pytest.fixture
def job3() -> Iterator[Job]:
    job = Job(3)
    yield job
    job.close()


def test_peer_failed_error_is_public_and_names_pe_and_reason() -> None:
    assert vkshmem.PeerFailedError is PeerFailedError
    assert issubclass(PeerFailedError, VkshmemError)
    exc = PeerFailedError(3, "raised ValueError: boom", "barrier_all")
    assert (exc.pe, exc.reason) == (3, "raised ValueError: boom")
    assert str(exc).startswith("barrier_all: PE 3 failed: raised ValueError: boom")
    assert "VKSHMEM_FAILURE_TIMEOUT" in str(exc)


def test_a_pe_that_drops_is_reported_to_every_other(job3: Job) -> None:
    job3.die(2)
    for lv in job3.pes[:2]:
        assert _until(lambda lv=lv: lv.any), "no news of PE 2"
        assert lv.first()[0] == 2 and "ended without finalizing" in lv.failures[2]
        assert lv.words[0] == 3 and lv.words[1 + 2] == 1 and lv.words[1 + 1] == 0
        with pytest.raises(PeerFailedError, match="PE 2 failed"):
            lv.check(2)
        lv.check(1)  # a live PE: no error


def test_a_report_carries_its_reason(job3: Job) -> None:
    job3.pes[1].report("raised RuntimeError: planned")
    for lv in (job3.pes[0], job3.pes[2]):
        assert _until(lambda lv=lv: 1 in lv.failures)
        assert lv.failures[1] == "raised RuntimeError: planned"


def test_losing_the_hub_means_pe_0_failed(job3: Job) -> None:
    job3.die(0)
    for lv in job3.pes[1:]:
        assert _until(lambda lv=lv: 0 in lv.failures)
        assert "liveness hub it hosts closed" in lv.failures[0]


def test_a_clean_finalize_reports_nothing() -> None:
    job = Job(3)
    for lv in job.pes[1:]:
        lv.close(clean=True)
    start = time.monotonic()
    job.pes[0].close(clean=True)  # waits for the goodbyes (already said): returns at once
    assert time.monotonic() - start < 1.5
    assert not any(lv.any for lv in job.pes)


def test_pe_0_finalizing_first_is_no_failure() -> None:
    job = Job(2)
    job.pes[0]._hub.close(wait=0.0, clean=True)  # type: ignore[union-attr]
    time.sleep(0.2)
    assert not job.pes[1].any
    job.close()


def test_a_wrong_key_is_refused_and_a_stranger_does_not_disturb(job3: Job) -> None:
    with socket.create_connection(job3.address) as stranger:  # garbage, then silence
        stranger.sendall(b"\xff" * 64)
        with pytest.raises(BootstrapError, match="did not accept"):
            Liveness(1, 3)._connect(*job3.address, b"x" * 32, TIMEOUT, TIMEOUT)
        job3.pes[1].report("raised ValueError: still served")
        assert _until(lambda: 1 in job3.pes[2].failures)
    assert not job3.pes[0].failures.get(2)


def test_a_hub_gone_before_a_pe_joins_means_pe_0_failed() -> None:
    """PE 0 ended between the all-gather of the hub's address and a PE's handshake: that PE
    names PE 0 (the launcher then reports PE 0's own error), not its own refusal."""
    key = secrets.token_bytes(32)
    hub = Hub(2, "127.0.0.1", key, Liveness(0, 2).mark, TIMEOUT)
    hub.start()
    address = hub.address
    hub.close(wait=0.0, clean=False)
    with pytest.raises(PeerFailedError, match="PE 0 failed: its liveness hub") as info:
        Liveness(1, 2)._connect(*address, key, TIMEOUT, TIMEOUT)
    assert info.value.pe == 0


def test_confirm_asks_the_hub(job3: Job) -> None:
    assert not job3.pes[1].confirm(2, 1.0)  # alive
    job3.die(2)
    assert job3.pes[1].confirm(2, 2.0)
    assert "ended without finalizing" in job3.pes[1].failures[2]


def test_translate_turns_a_transport_error_into_peer_failed(job3: Job) -> None:
    lv = job3.pes[1]
    exc = TransportError("hostproxy", "connection to PE 2 closed")
    assert lv.translate(exc, 2) is exc  # PE 2 is alive: the error stays
    job3.die(2)
    got = lv.translate(exc, 2)
    assert isinstance(got, PeerFailedError) and got.pe == 2 and got.__cause__ is exc
    other = ValueError("not a transport's")
    assert lv.translate(other, 2) is other


def test_a_wait_raises_once_a_pe_failed(job3: Job) -> None:
    lv = job3.pes[1]
    word = ffi.new("uint64_t[1]")
    waiter = Waiter(0, (), lv)
    assert waiter.failed_address == lv.address
    threading.Timer(0.1, lambda: job3.die(2)).start()
    start = time.monotonic()
    with pytest.raises(PeerFailedError, match="test wait: PE 2 failed"):
        waiter.wait(lambda: word[0] == 1, int(ffi.cast("uintptr_t", word)), 8, "test wait")
    assert time.monotonic() - start < 2.0


def test_an_inert_channel_never_reports() -> None:
    lv = Liveness(0, 1)
    lv.report("raised X: y")
    assert not lv.any and lv.words[0] == 0
    lv.close(clean=True)


def test_a_child_of_a_pe_does_not_hide_its_death() -> None:
    """PE 1 (a forked process) forks a child of its own and exits: the child must not keep
    PE 1's liveness connection open (the fork hook closes its copy), so the hub sees the end."""
    key = secrets.token_bytes(32)
    lv0 = Liveness(0, 2)
    hub = Hub(2, "127.0.0.1", key, lv0.mark, TIMEOUT)
    lv0._hub = hub
    hub.start()
    r, w = os.pipe()
    pe1 = os.fork()
    if pe1 == 0:  # PE 1
        try:
            os.close(r)
            lv1 = Liveness(1, 2)
            lv1._connect(*hub.address, key, TIMEOUT, TIMEOUT)
            child = os.fork()
            if child == 0:
                time.sleep(10)
                os._exit(0)
            os.write(w, b"%d" % child)
        finally:
            os._exit(0)
    os.close(w)
    child = int(os.read(r, 64) or b"0")
    os.close(r)
    try:
        os.waitpid(pe1, 0)
        assert child > 0
        assert _until(lambda: 1 in lv0.failures, 3.0), "PE 1's end went unnoticed"
        assert "ended without finalizing" in lv0.failures[1]
    finally:
        if child > 0:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
        lv0.close(clean=False)
