"""What every host transport must do, written once for the transport unit tests.

``test_ucx_unit.py`` and ``test_hostproxy_unit.py`` each subclass :class:`Job` (a small job of
hand-opened transports, one per PE and rail, exchanging :class:`PeerInfo` as the core would)
and call the checks below with it from their own test functions, so that the test ids stay
theirs. The keyword arguments of a check are where the transports legitimately differ (how hard
it is pushed, what a fetching SET returns); assertions about one transport's internals stay
in its own file.
"""

from __future__ import annotations

import os
import random
import struct
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

import pytest
from segments import Segment
from vkshmem.core._native import lib as native

from vkshmem.core import transport as core_transport
from vkshmem.core.config import Config
from vkshmem.core.errors import InvalidArgumentError, TransportError
from vkshmem.core.plugins import load_plugins
from vkshmem.core.transport import AmoOp, PeerInfo, SegmentInfo, Transport, TransportContext

if TYPE_CHECKING:
    from vkshmem.core.plugins import Registry
    from vkshmem.core.transport import TransportSpec

T = TypeVar("T", bound=Transport)
J = TypeVar("J", bound="Job")

WIDTHS = pytest.mark.parametrize("width", [4, 8])
ALL_OPS = pytest.mark.parametrize("op", list(AmoOp))
NON_FETCHING_OPS = pytest.mark.parametrize("op", [op for op in AmoOp if not op.fetching_only])


# -- the job ---------------------------------------------------------------------------------


#: The job secret of the hand-made jobs of the unit tests.
SECRET = b"transport-unit-test-job-secret"


def context(pe: int, n: int, rail: int = 0, options: dict[str, str] | None = None,
            secret: bytes = SECRET) -> TransportContext:
    """The context the core would give PE ``pe`` of ``n`` on one node, for rail ``rail``."""
    return TransportContext(
        my_pe=pe, n_pes=n, rail=rail, options=dict(options or {}), node_id="node0",
        host_address="127.0.0.1", amo_function=native.vk_amo_address(), secret=secret,
    )


class Job(Generic[T]):
    """``n`` PEs of one node, each with one transport per rail (``t[rail][pe]``), each PE with
    memfd-backed segments of ``sizes`` (segment id to bytes) registered with all of them."""

    transport: ClassVar[Callable[[TransportContext], Any]]
    default_options: ClassVar[dict[str, str]] = {}
    seg_sizes: ClassVar[dict[int, int]]

    def __init__(self, n: int = 2, rails: int = 1, options: dict[str, str] | None = None,
                 sizes: dict[int, int] | None = None) -> None:
        self.sizes = self.seg_sizes if sizes is None else sizes
        self.segs = [{s: Segment(s, size) for s, size in self.sizes.items()} for _ in range(n)]
        self.t: list[list[T]] = []  # [rail][pe]
        opts = self.default_options if options is None else options
        try:
            for rail in range(rails):
                row: list[T] = []
                self.t.append(row)
                for pe in range(n):
                    row.append(self.transport(context(pe, n, rail, opts)))
                peers = {}
                for pe, tr in enumerate(row):
                    keys = {s: tr.register(seg.info()) for s, seg in self.segs[pe].items()}
                    peers[pe] = PeerInfo(pe, "node0", True, tr.address(), keys)
                for tr in row:
                    tr.connect(peers)
        except BaseException:
            self.close()
            raise

    def __enter__(self: J) -> J:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def mem(self, pe: int, seg: int = 0) -> memoryview:
        return self.segs[pe][seg].view

    def close(self) -> None:
        for row in self.t:
            for tr in row:
                tr.close()
        for segs in self.segs:
            for seg in segs.values():
                seg.close()


# -- helpers ---------------------------------------------------------------------------------


def amo_model(op: AmoOp, width: int, old: int, operand: int, compare: int) -> int:
    """The word an AMO leaves behind (``old`` being the word before it)."""
    mask = (1 << (8 * width)) - 1
    operand &= mask
    if op is AmoOp.FETCH:
        return old
    if op in (AmoOp.SET, AmoOp.SWAP):
        return operand
    if op is AmoOp.CSWAP:
        return operand if old == compare & mask else old
    if op is AmoOp.ADD:
        return (old + operand) & mask
    if op is AmoOp.AND:
        return old & operand
    if op is AmoOp.OR:
        return old | operand
    return old ^ operand


def word(m: memoryview, offset: int, width: int) -> int:
    return int.from_bytes(m[offset:offset + width], "little")


def set_word(m: memoryview, offset: int, width: int, value: int) -> None:
    m[offset:offset + width] = value.to_bytes(width, "little")


def fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def thread_count() -> int:
    return len(os.listdir("/proc/self/task"))


def run_threads(threads: list[threading.Thread]) -> None:
    """Start them all, then wait for them all."""
    for th in threads:
        th.start()
    for th in threads:
        th.join()


def registered_host_transport(name: str, dist: str) -> tuple[Registry, TransportSpec]:
    """The registry and the spec of transport ``name``, which distribution ``dist`` registers
    through its entry point: it reaches PEs on this node and others, on host memory (puts, gets
    and AMOs; other kinds the transport's own tests check), with every AMO of 4 and 8 bytes and
    a fence of its own."""
    reg = load_plugins(Config({}))
    spec = reg.transports[name]
    assert reg.origin[name] == dist
    assert spec.reach == {"intra", "inter"}
    assert "host" in spec.memory_kinds and spec.ops_on("host") == core_transport.ALL_OPS
    assert spec.amo_ops == set(AmoOp)
    assert spec.amo_widths == {4, 8}
    assert spec.native_fence
    return reg, spec


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


# -- AMOs ------------------------------------------------------------------------------------


def amo_fetching(job: Job, op: AmoOp, width: int, rounds: int, set_fetches: bool = True,
                 ) -> None:
    """Fetching AMOs at random words of PE 1, from PE 0 and from PE 1 itself; a fetching SET
    returns the old word only where ``set_fetches``."""
    rng = random.Random(op * 10 + width)
    mask = (1 << (8 * width)) - 1
    mem = job.mem(1)
    for pe_from in (0, 1):  # remote, and to itself
        tr = job.t[0][pe_from]
        for _ in range(rounds):
            offset = width * rng.randrange(0, 1000)
            old = rng.getrandbits(8 * width)
            operand = rng.getrandbits(8 * width)
            compare = rng.choice([old, rng.getrandbits(8 * width)])
            set_word(mem, offset, width, old)
            got = tr.amo(1, 0, offset, op, width, operand, compare, True)
            if set_fetches or op is not AmoOp.SET:
                assert got == old
            assert word(mem, offset, width) == amo_model(op, width, old, operand, compare) & mask


def amo_non_fetching(job: Job, op: AmoOp, width: int, cases: int,
                     from_pes: tuple[int, ...]) -> None:
    """``cases`` non-fetching AMOs to consecutive words of PE 1 from each of ``from_pes``:
    each returns 0 and all are applied after a quiet."""
    rng = random.Random(op * 100 + width)
    mem = job.mem(1)
    for pe_from in from_pes:
        tr = job.t[0][pe_from]
        done = []
        for i in range(cases):
            old, operand = rng.getrandbits(8 * width), rng.getrandbits(8 * width)
            set_word(mem, width * i, width, old)
            done.append((old, operand))
        for i, (_, operand) in enumerate(done):
            assert tr.amo(1, 0, width * i, op, width, operand, 0, False) == 0
        tr.quiet()
        for i, (old, operand) in enumerate(done):
            assert word(mem, width * i, width) == amo_model(op, width, old, operand, 0)


def compare_swap_success_and_failure(job: Job, width: int) -> None:
    tr, mem = job.t[0][0], job.mem(1)
    set_word(mem, 256, width, 41)
    assert tr.amo(1, 0, 256, AmoOp.CSWAP, width, 99, 40, True) == 41  # fails
    assert word(mem, 256, width) == 41
    assert tr.amo(1, 0, 256, AmoOp.CSWAP, width, 99, 41, True) == 41  # succeeds
    assert word(mem, 256, width) == 99


def amo_operands_are_masked_to_the_width(job: Job) -> None:
    tr, mem = job.t[0][0], job.mem(1)
    set_word(mem, 0, 8, 0)
    tr.amo(1, 0, 0, AmoOp.ADD, 4, (1 << 40) + 5, 0, True)
    assert word(mem, 0, 8) == 5  # the upper word is untouched


def concurrent_fetch_add_from_threads(job: Job, threads: int, per_thread: int) -> None:
    """``threads`` threads of PE 0 race to reach PE 1 first, then fetch-add the same word: each
    value is fetched exactly once."""
    tr, mem = job.t[0][0], job.mem(1)
    set_word(mem, 512, 8, 0)
    barrier = threading.Barrier(threads)
    seen: list[int] = []

    def work() -> None:
        barrier.wait()  # all race to open the first endpoint (connection) to PE 1
        seen.extend(tr.amo(1, 0, 512, AmoOp.ADD, 8, 1, 0, True) for _ in range(per_thread))

    run_threads([threading.Thread(target=work) for _ in range(threads)])
    total = threads * per_thread
    assert word(mem, 512, 8) == total
    assert sorted(seen) == list(range(total))


def amos_are_atomic_across_two_rails(j: Job, per_thread: int, cpu_adds: int = 0) -> None:
    """Both PEs add to one word of PE 1 through both rails of a two-rail job at once (rail 1
    fetching, rail 0 not), while the core's own CPU atomics add ``cpu_adds`` more."""
    mem = j.mem(1)
    set_word(mem, 64, 8, 0)
    addr = j.segs[1][0].address + 64

    def work(rail: int, pe: int) -> None:
        for _ in range(per_thread):
            j.t[rail][pe].amo(1, 0, 64, AmoOp.ADD, 8, 1, 0, bool(rail))
        j.t[rail][pe].quiet()

    threads = [threading.Thread(target=work, args=(r, p)) for r in (0, 1) for p in (0, 1)]
    for th in threads:
        th.start()
    for _ in range(cpu_adds):  # the core's own CPU atomics on the same word, meanwhile
        native.vk_amo(addr, AmoOp.ADD, 8, 1, 0)
    for th in threads:
        th.join()
    assert word(mem, 64, 8) == 4 * per_thread + cpu_adds


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
                              quiet_after_close_raises: bool) -> None:
    """A three-PE job that moved data between every pair closes twice, after which its
    transports refuse work, and leaves no file descriptor or thread behind. Each transport
    runs one progress thread (exactly one where ``exact_threads``)."""
    fds, threads = fd_count(), thread_count()
    j = make_job(n=3)
    for src in range(3):
        for dst in range(3):
            j.t[0][src].put(dst, 0, 0, memoryview(b"abc"))
            j.t[0][src].get(dst, 0, 0, memoryview(bytearray(3)))
            j.t[0][src].amo(dst, 0, 8, AmoOp.ADD, 8, 1, 0, True)
        j.t[0][src].quiet()
    if exact_threads:
        assert thread_count() == threads + 3
    else:  # and the library's own
        assert thread_count() >= threads + 3
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
