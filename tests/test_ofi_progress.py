"""The ofi progress thread's polling policy. Over ``shm`` (a provider whose CQ has no wait fd):
a peer's operation landing on a PE (seen by a remote-access counter) makes that PE's progress
thread poll without sleeping for ``busy_us``, so the next requests are served at once instead of
at the next ``poll_us`` nap; ``busy_us=0`` turns the window (and the counter) off. Over
``tcp;ofi_rxm`` (a CQ wait fd, no counter): the thread sleeps in ``poll()`` on the fd, a peer's
traffic waking it opens the same window, and once the traffic stops it sleeps again; while its
own caller waits on the CQ in a loop of operations, it parks instead.

Real libfabric between two transports of this process; timings are medians with wide margins
(a 20 ms nap against a 2 ms bound), so load on the machine does not decide them.
"""

from __future__ import annotations

import resource
import statistics
import time

import pytest

from vkshmem.core.errors import ConfigError
from vkshmem.core.transports.contract import AmoOp

pytest.importorskip("vkshmem_ofi")
from test_ofi_unit import Job, context
from vkshmem_ofi._transport import OfiTransport

pytestmark = pytest.mark.timeout(120)

SLOW = {"provider": "shm", "poll_us": "20000", "idle_poll_us": "20000"}


def _fetch_add_times(job: Job, rounds: int) -> list[float]:
    tr = job.t[0][0]
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        tr.amo(1, 0, 0, AmoOp.ADD, 8, 1, 0, True)
        times.append(time.perf_counter() - start)
    return times


def test_a_served_request_opens_a_busy_window_on_the_target() -> None:
    """With 20 ms naps, fetch_adds to a PE whose thread busy-polls after the first one take
    well under 2 ms each (median), and the target counted the peer's operations."""
    with Job(options={**SLOW, "busy_us": "200000"}) as job:
        times = _fetch_add_times(job, 30)
        stats = job.t[0][1].stats()
    assert stats["remote_ops"] is not None and stats["remote_ops"] >= 30
    assert stats["busy_windows"] >= 1
    assert statistics.median(times[1:]) < 0.002, times


def test_busy_us_zero_keeps_the_naps() -> None:
    """busy_us=0: no counter, no window; each request waits for the target's next nap to end
    (20 ms naps: a median well above 2 ms), which is what the knob trades against CPU."""
    with Job(options={**SLOW, "busy_us": "0"}) as job:
        times = _fetch_add_times(job, 10)
        stats = job.t[0][1].stats()
    assert stats["remote_ops"] is None and stats["busy_windows"] == 0
    assert statistics.median(times) > 0.002, times


def test_tcp_sleeps_on_its_wait_fd_without_a_counter() -> None:
    with Job(options={"provider": "tcp;ofi_rxm"}) as job:
        job.t[0][0].amo(1, 0, 0, AmoOp.ADD, 8, 1, 0, True)
        stats = job.t[0][1].stats()
    assert stats["progress_waits"] and stats["remote_ops"] is None
    assert stats["progress_wait"] == "fd"


def _cpu_share(seconds: float) -> float:
    """This process's CPU time over the next ``seconds``, in cores."""
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    time.sleep(seconds)
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    used = r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime
    return used / (time.monotonic() - t0)


def test_tcp_a_peer_waking_the_target_opens_a_busy_window_that_ends() -> None:
    """The target's thread (woken on its wait fd by PE 0's requests) opens busy windows; the
    initiator's, whose caller reads its own CQ while it waits, opens (almost) none; once the
    requests stop, both threads sleep again (a 20 ms window, then well under a core)."""
    with Job(options={"provider": "tcp;ofi_rxm", "busy_us": "20000"}) as job:
        before = job.t[0][0].stats()["busy_windows"]
        times = _fetch_add_times(job, 200)
        target, initiator = job.t[0][1].stats(), job.t[0][0].stats()
        idle = _cpu_share(0.5)
        assert job.t[0][0].amo(1, 0, 0, AmoOp.FETCH, 8, 0, 0, True) == 200
    assert target["progress_wait"] == "fd" and target["busy_windows"] >= 1, target
    assert initiator["busy_windows"] - before <= 3, initiator
    assert statistics.median(times) < 0.005, times
    assert idle < 0.3, idle


def test_tcp_busy_us_zero_opens_no_window() -> None:
    with Job(options={"provider": "tcp;ofi_rxm", "busy_us": "0"}) as job:
        times = _fetch_add_times(job, 50)
        stats = job.t[0][1].stats()
    assert stats["busy_windows"] == 0 and stats["progress_wait"] == "fd"
    assert statistics.median(times) < 0.05, times


@pytest.mark.parametrize("value", ["-1", "x", "1e9"])
def test_busy_us_is_validated(value: str) -> None:
    with pytest.raises(ConfigError, match=r"VKSHMEM_RAIL0.*busy_us"):
        OfiTransport(context(0, 1, options={"provider": "shm", "busy_us": value}))


def test_tcp_the_thread_parks_while_its_caller_waits_on_the_cq() -> None:
    """A loop of put 8 B + quiet (timed in C, vko_probe): the caller reads the CQ itself while
    it waits, so the initiator's thread parks instead of waking on the wait fd for the replies
    (before: ~900 rounds for 2000 operations, now ~150; under heavy load the loop's gaps grow
    past what counts as a loop and the thread behaves as before, hence up to three tries);
    afterwards, with the caller out of the transport, the same PE still serves the peer's
    fetch_adds at once."""
    from vkshmem_ofi._ofi import ffi, lib

    n = 2000
    with Job(options={"provider": "tcp;ofi_rxm"}) as job:
        initiator, target = job.t[0][0], job.t[0][1]
        out = ffi.new("uint64_t[3]")
        tries = []
        for _ in range(3):
            assert lib.vko_probe(initiator._e, 1, 2, 200, out) == 0  # warm-up: a loop is seen
            parks = initiator.stats()["progress_parks"]
            assert lib.vko_probe(initiator._e, 1, 2, n, out) == 0
            tries.append((int(out[2]), initiator.stats()["progress_parks"] - parks))
            if tries[-1][0] < n // 4 and tries[-1][1] >= 1:
                break
        times = []
        for _ in range(50):  # PE 0's caller is in none of its calls now: its thread serves
            start = time.perf_counter()
            target.amo(0, 0, 0, AmoOp.ADD, 8, 1, 0, True)
            times.append(time.perf_counter() - start)
        assert initiator.amo(0, 0, 0, AmoOp.FETCH, 8, 0, 0, True) == 50
    assert tries[-1][0] < n // 4 and tries[-1][1] >= 1, tries  # (rounds, parks) per try
    assert max(times) < 0.05, times
