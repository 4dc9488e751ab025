"""What every host transport must do: the checks of the transport contract.

Each check takes a :class:`~vkshmem.testing.job.Job` (or a factory of jobs) and asserts one
promise of :class:`~vkshmem.core.transports.contract.Transport`; its keyword arguments are where
transports legitimately differ (how hard it is pushed, what a fetching SET returns). A plugin's
own tests call them from their own test functions (so that the test ids stay theirs); the
collected suite (:class:`vkshmem.testing.transport_suite.TransportContract`) calls them with
defaults derived from the transport's spec. The AMO checks live in :mod:`vkshmem.testing.amo`
and are re-exported here, so ``from vkshmem.testing import transport as contract`` reaches
them all.
"""

from __future__ import annotations

import random
import struct
import threading
from collections.abc import Callable

import pytest

from vkshmem.core.errors import InvalidArgumentError, TransportError
from vkshmem.core.transports.contract import AmoOp, SegmentInfo, Transport

from .amo import (
    amo_fetching,
    amo_non_fetching,
    amo_operands_are_masked_to_the_width,
    amos_are_atomic_across_two_rails,
    compare_swap_success_and_failure,
    concurrent_fetch_add_from_threads,
)
from .job import (
    ALL_OPS,
    NON_FETCHING_OPS,
    SECRET,
    WIDTHS,
    Job,
    amo_model,
    context,
    fd_count,
    registered_host_transport,
    run_threads,
    set_word,
    thread_count,
    word,
)
from .segments import Segment

__all__ = [
    "ALL_OPS",
    "NON_FETCHING_OPS",
    "SECRET",
    "WIDTHS",
    "Job",
    "Segment",
    "amo_fetching",
    "amo_model",
    "amo_non_fetching",
    "amo_operands_are_masked_to_the_width",
    "amos_are_atomic_across_two_rails",
    "close_twice_without_leaks",
    "compare_swap_success_and_failure",
    "concurrent_fetch_add_from_threads",
    "concurrent_transfers_between_three_pes",
    "context",
    "fd_count",
    "get_sees_an_earlier_put_without_quiet",
    "large_transfers",
    "only_host_memory_can_be_registered",
    "put_and_get_typed_memoryviews",
    "put_get_random",
    "quiet_after_many_put_nbi",
    "quiet_and_fence_with_nothing_outstanding",
    "range_errors_are_caught_before_sending",
    "registered_host_transport",
    "run_threads",
    "set_word",
    "thread_count",
    "word",
]


# -- RMA -------------------------------------------------------------------------------------


def get_sees_an_earlier_put_without_quiet(job: Job, rounds: int) -> None:
    """A get (or fetching AMO) after puts to the same PE observes them without a quiet."""
    tr = job.t[0][0]
    for i in range(rounds):
        buf = bytearray(struct.pack("<Q", i) * 512)
        tr.put(1, 0, 4096, memoryview(buf))
        buf[:] = b"\xff" * len(buf)  # the source is reusable on return
        out = bytearray(8)
        tr.get(1, 0, 4096 + 8 * 511, memoryview(out))
        assert struct.unpack("<Q", out)[0] == i
        tr.amo(1, 0, 0, AmoOp.SET, 8, i, 0, False)
        assert tr.amo(1, 0, 0, AmoOp.FETCH, 8, 0, 0, True) == i


def put_get_random(job: Job, rounds: int, nbi_gets: bool) -> None:
    """Random sizes at random offsets of every segment, blocking and non-blocking, between both
    PEs and to the PE itself (gets through ``get_nbi`` half the time where ``nbi_gets``)."""
    rng = random.Random(1234)
    sizes = job.sizes
    for _ in range(rounds):
        src_pe, pe, seg = rng.randrange(2), rng.randrange(2), rng.choice(list(sizes))
        n = rng.choice([0, 1, 7, 8, rng.randrange(1, 5000), rng.randrange(1, 300_000)])
        n = min(n, sizes[seg])
        offset = rng.randrange(0, sizes[seg] - n + 1)
        data = rng.randbytes(n)
        tr = job.t[0][src_pe]
        if rng.random() < 0.5:
            tr.put(pe, seg, offset, memoryview(data))
        else:
            tr.put_nbi(pe, seg, offset, memoryview(data))
        tr.quiet()
        assert job.mem(pe, seg)[offset:offset + n] == data
        out = bytearray(n)
        if not nbi_gets or rng.random() < 0.5:
            tr.get(pe, seg, offset, memoryview(out))
        else:
            tr.get_nbi(pe, seg, offset, memoryview(out))
            tr.quiet()
        assert out == data


def put_and_get_typed_memoryviews(job: Job) -> None:
    tr = job.t[0][0]
    src = memoryview(struct.pack("<4d", 1.0, 2.0, 3.0, 4.0)).cast("d")
    tr.put(1, 0, 64, src)
    dst = memoryview(bytearray(32)).cast("d")
    tr.get(1, 0, 64, dst)
    assert dst.tolist() == [1.0, 2.0, 3.0, 4.0]


def large_transfers(job: Job) -> None:
    """All of segment 0 in one put and one get."""
    tr = job.t[0][0]
    data = random.Random(5).randbytes(job.sizes[0])
    tr.put(1, 0, 0, memoryview(data))
    out = bytearray(len(data))
    tr.get(1, 0, 0, memoryview(out))
    assert out == data


def concurrent_transfers_between_three_pes(j: Job) -> None:
    """Every PE of a three-PE job puts to and gets from every PE at once, from its own thread,
    each (src, dst) pair owning a ninth of dst's segment 0."""
    chunk = j.sizes[0] // 9
    failures: list[BaseException] = []

    def work(src: int) -> None:
        try:
            rng = random.Random(src)
            for _ in range(2):
                for dst in range(3):
                    data = rng.randbytes(chunk)
                    off = chunk * (3 * src + dst)
                    j.t[0][src].put(dst, 0, off, memoryview(data))
                    out = bytearray(chunk)
                    j.t[0][src].get(dst, 0, off, memoryview(out))
                    assert out == data
        except BaseException as exc:  # reported below
            failures.append(exc)

    run_threads([threading.Thread(target=work, args=(pe,)) for pe in range(3)])
    assert not failures, failures


def quiet_after_many_put_nbi(job: Job, n: int,
                             before_quiet: Callable[[Transport], object] | None = None) -> None:
    """``n`` small put_nbi to PE 1 (then ``before_quiet``, if any): complete after one quiet."""
    tr = job.t[0][0]
    for i in range(n):
        tr.put_nbi(1, 0, 8 * i, memoryview(struct.pack("<Q", i + 1)))
    if before_quiet is not None:
        before_quiet(tr)
    tr.quiet()  # no get in between: nothing but the flush proves completion
    mem = job.mem(1)
    assert all(struct.unpack_from("<Q", mem, 8 * i)[0] == i + 1 for i in range(n))


def quiet_and_fence_with_nothing_outstanding(job: Job) -> None:
    job.t[0][0].quiet()
    job.t[0][0].fence()
    job.t[0][0].quiet()


# -- bad requests ----------------------------------------------------------------------------


def range_errors_are_caught_before_sending(
    job: Job, more: Callable[[Transport], None] | None = None,
) -> None:
    """Out-of-range, unknown-segment, misaligned and wrong-width requests (and ``more``) raise
    on the initiator, touch nothing, and leave the transport usable."""
    tr, mem = job.t[0][0], job.mem(1)
    size = job.sizes[0]
    mem[size - 16:] = b"\x5a" * 16
    with pytest.raises(InvalidArgumentError,
                       match=rf"outside segment 0 of PE 1\b.*\({size} bytes\)"):
        tr.put(1, 0, size - 4, memoryview(b"12345678"))
    with pytest.raises(InvalidArgumentError):
        tr.get(1, 0, size, memoryview(bytearray(1)))
    with pytest.raises(InvalidArgumentError):
        tr.put(1, 0, -1, memoryview(b"x"))
    with pytest.raises(InvalidArgumentError, match="no segment 7"):
        tr.put(1, 7, 0, memoryview(b"x"))
    with pytest.raises(InvalidArgumentError):
        tr.amo(1, 0, size, AmoOp.ADD, 8, 1, 0, True)
    with pytest.raises(InvalidArgumentError, match="aligned"):
        tr.amo(1, 0, 6, AmoOp.ADD, 8, 1, 0, True)
    with pytest.raises(InvalidArgumentError, match="width"):
        tr.amo(1, 0, 0, AmoOp.ADD, 2, 1, 0, True)
    if more is not None:
        more(tr)
    tr.quiet()
    assert mem[size - 16:] == b"\x5a" * 16
    tr.put(1, 0, 0, memoryview(b"still ok"))  # the transport is still usable
    tr.quiet()
    assert mem[:8] == b"still ok"


def only_host_memory_can_be_registered(
    tr: Transport, max_segs: int, check_key: Callable[[Segment, bytes], None] | None = None,
) -> None:
    """``tr`` (closed here) refuses GPU memory and segment ids from ``max_segs`` on, and takes
    the same host segment twice (its first key checked by ``check_key``)."""
    seg = Segment(0, 4096)
    try:
        gpu = SegmentInfo(0, "opaque_fd", seg.address, 4096, seg.fd, seg.view)
        with pytest.raises(TransportError, match="host memory only"):
            tr.register(gpu)
        with pytest.raises(TransportError, match="out of range"):
            tr.register(SegmentInfo(max_segs, "host", seg.address, 4096, seg.fd, seg.view))
        key = tr.register(seg.info())
        if check_key is not None:
            check_key(seg, key)
        tr.register(seg.info())  # the same memory again is fine
    finally:
        tr.close()
        seg.close()


# -- lifetime --------------------------------------------------------------------------------


def close_twice_without_leaks(make_job: Callable[..., Job], *, exact_threads: bool,
                              quiet_after_close_raises: bool, progress_threads: int = 1,
                              ) -> None:
    """A three-PE job that moved data between every pair closes twice, after which its
    transports refuse work, and leaves no file descriptor or thread behind. Each transport
    runs ``progress_threads`` progress threads (exactly that many where ``exact_threads``, at
    least that many where not: the library's own come on top)."""
    fds, threads = fd_count(), thread_count()
    j = make_job(n=3)
    for src in range(3):
        for dst in range(3):
            j.t[0][src].put(dst, 0, 0, memoryview(b"abc"))
            j.t[0][src].get(dst, 0, 0, memoryview(bytearray(3)))
            j.t[0][src].amo(dst, 0, 8, AmoOp.ADD, 8, 1, 0, True)
        j.t[0][src].quiet()
    if exact_threads:
        assert thread_count() == threads + 3 * progress_threads
    else:  # and the library's own
        assert thread_count() >= threads + 3 * progress_threads
    j.close()
    for tr in j.t[0]:
        tr.close()  # second close is a no-op
        with pytest.raises(TransportError, match="closed"):
            tr.put(1, 0, 0, memoryview(b"x"))
        if quiet_after_close_raises:
            with pytest.raises(TransportError, match="closed"):
                tr.quiet()
    assert fd_count() == fds
    assert thread_count() == threads
