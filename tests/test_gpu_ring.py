"""The GPU-initiated request ring: its host view (vkshmem.gpu.initiated.ring) against descriptors a
shader enqueued through shaders/vkshmem.glsl (ring_selftest.comp), completions the shader
waits on, and the layout shared by the GLSL and the Python side."""

from __future__ import annotations

import re
import struct
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from gpu.helpers import device_fixture

from vkshmem.core.errors import InvalidArgumentError
from vkshmem.core.transports.contract import AmoOp
from vkshmem.gpu import Descriptor, GpuMemory, Ring, RingOp, SignalOp, VulkanDevice
from vkshmem.gpu.initiated import ring as ringmod

pytestmark = pytest.mark.timeout(60)

NO_TICKET = (1 << 64) - 1
GLSL = Path(__file__).resolve().parents[1] / "shaders" / "vkshmem.glsl"


@pytest.fixture(scope="module")
def dev() -> Iterator[VulkanDevice]:
    yield from device_fixture(staging_size=256 << 10)


class Run:
    """A ring plus the selftest's output array: out[0:n] tickets (or fetched values),
    out[n:2n] results the host writes, out[2n:3n] per-invocation success flags."""

    def __init__(self, dev: VulkanDevice, n: int, capacity: int) -> None:
        self.dev = dev
        self.n = n
        self.ring = Ring.create(dev, capacity)
        self.out: GpuMemory = dev.alloc_mapped(8 * 3 * n)
        view = self.out.map()
        assert view is not None
        view[:] = bytes(len(view))

    def dispatch(self, mode: int) -> None:
        push = struct.pack("<QQII", self.ring.device_address, self.out.device_address, self.n,
                           mode)
        self.dev.pipeline("ring_selftest").dispatch(-(-self.n // 64), push, timeout=30)

    def values(self) -> np.ndarray:
        view = self.out.map()
        assert view is not None
        return np.frombuffer(view, np.uint64).copy()

    def close(self) -> None:
        self.ring.close()
        self.out.free()


@pytest.fixture
def run(dev: VulkanDevice) -> Iterator[Run]:
    r = Run(dev, 30, 64)
    yield r
    r.close()


def _expected(i: int, n: int, out_addr: int) -> dict[str, object]:
    kind = i % 6
    pe = i % 4
    if kind == 0:
        return dict(op=RingOp.PUT, pe=pe, dst=64 * i, src=8 * i, nbytes=8 + i)
    if kind == 1:
        return dict(op=RingOp.GET, pe=pe, dst=64 * i, src=8 * i, nbytes=16)
    if kind == 2:
        return dict(op=RingOp.AMO, pe=pe, dst=8 * i, value=i + 1, amo_op=AmoOp.ADD, width=8,
                    result=out_addr + 8 * (n + i))
    if kind == 3:
        return dict(op=RingOp.SIGNAL, pe=pe, dst=8 * i, value=i, signal_op=SignalOp.ADD)
    if kind == 4:
        return dict(op=RingOp.PUT_SIGNAL, pe=pe, dst=64 * i, src=8 * i, nbytes=32, value=i,
                    signal_offset=4096 + 8 * i, signal_op=SignalOp.SET)
    return dict(op=RingOp.FENCE)


def test_shader_enqueues_descriptors(run: Run) -> None:
    run.dispatch(0)
    tickets = run.values()[:run.n]
    assert sorted(tickets.tolist()) == list(range(run.n))
    ring = run.ring
    assert ring.head == run.n and ring.tail == 0 and ring.done == 0
    descs = ring.poll()
    assert [d.ticket for d in descs] == list(range(run.n))
    assert ring.tail == run.n and ring.poll() == []
    by_ticket = {int(t): i for i, t in enumerate(tickets)}
    for d in descs:
        i = by_ticket[d.ticket]
        for name, want in _expected(i, run.n, run.out.device_address).items():
            assert getattr(d, name) == want, (i, name, d)
        if d.op != RingOp.FENCE:
            assert d.dst_seg == 1 and d.src_seg == 1


def test_completions_and_results_reach_the_shader(dev: VulkanDevice, run: Run) -> None:
    run.dispatch(0)
    descs = run.ring.poll()
    # Complete the first half only: exactly those waits succeed.
    half = run.n // 2
    for d in descs[:half]:
        if d.op == RingOp.AMO:
            run.ring.write_result(d, 1000 + d.ticket, dev)
        run.ring.complete()
    run.dispatch(1)
    v = run.values()
    tickets = v[:run.n]
    assert v[2 * run.n:].tolist() == [int(t < half) for t in tickets]
    # Then the rest, through drain(): results land where each AMO asked.
    handled = run.ring.drain(lambda d: 1000 + d.ticket if d.op == RingOp.AMO else None, dev)
    assert handled == 0  # drain() consumes only what poll() has not: nothing new is published

    for d in descs[half:]:
        if d.op == RingOp.AMO:
            run.ring.write_result(d, 1000 + d.ticket, dev)
    run.ring.complete(run.n - half)
    run.dispatch(1)
    v = run.values()
    assert v[2 * run.n:].tolist() == [1] * run.n
    for i, t in enumerate(v[:run.n]):
        want = 1000 + int(t) if i % 6 == 2 else 0
        assert int(v[run.n + i]) == want
    with pytest.raises(InvalidArgumentError, match="cannot complete"):
        run.ring.complete()


def test_full_ring_refuses_instead_of_hanging(dev: VulkanDevice) -> None:
    r = Run(dev, 20, 8)
    try:
        r.dispatch(0)
        tickets = r.values()[:r.n]
        got = sorted(int(t) for t in tickets if t != NO_TICKET)
        assert got == list(range(8))  # a claimed ticket is always published
        assert len(r.ring.poll()) == 8 and r.ring.head == 8
    finally:
        r.close()


def _round_trip(dev: VulkanDevice) -> tuple[list[int], list[int]] | None:
    """Run mode 2 with a host thread draining the ring; the fetched values and the final
    words, or None when a shader's wait gave up."""
    r = Run(dev, 30, 64)
    words = [0, 0, 0, 0]
    stop = threading.Event()

    def handle(d: Descriptor) -> int | None:
        if d.op == RingOp.AMO:
            old = words[d.dst // 8]
            words[d.dst // 8] = old + d.value
            return old
        return None

    def drain() -> None:
        while not stop.is_set():
            r.ring.drain(handle, dev)

    thread = threading.Thread(target=drain, daemon=True)
    thread.start()
    try:
        r.dispatch(2)
    finally:
        stop.set()
        thread.join(10)
    v = r.values()
    r.close()
    if v[2 * r.n:].tolist() != [1] * r.n:
        return None
    return [int(x) for x in v[:r.n]], words


def test_round_trip_within_one_dispatch(dev: VulkanDevice) -> None:
    """Shaders block on fetch-adds that a host thread performs while the dispatch runs.

    lavapipe bounds a shader's waiting (its loop budget), so a slow host can make a wait give
    up; the test retries a few times and checks the values whenever the shader saw its
    completions."""
    for _attempt in range(3):
        got = _round_trip(dev)
        if got is None:
            continue
        fetched, words = got
        for w in range(4):  # per word: the fetches are the prefix sums of the adds
            acc = 0
            for old, add in sorted((fetched[i], i + 1) for i in range(w, 30, 4)):
                assert old == acc
                acc += add
            assert words[w] == acc
        return
    pytest.fail("no attempt saw its completions within lavapipe's loop budget")


def test_ring_view_without_a_gpu() -> None:
    buf = memoryview(bytearray(Ring.nbytes_for(4)))
    with pytest.raises(InvalidArgumentError, match="not an initialised"):
        Ring(buf)
    with pytest.raises(InvalidArgumentError, match="power of two"):
        Ring.initialize(buf, 3)
    Ring.initialize(buf, 4)
    ring = Ring(buf)
    desc = struct.Struct("<IIQQQQQQII")

    def produce(t: int, publish: bool = True) -> int:
        struct.pack_into("<Q", buf, ringmod.OFF_HEAD, t + 1)
        off = ringmod.HEADER_SIZE + (t % 4) * ringmod.DESC_SIZE
        desc.pack_into(buf, off, RingOp.AMO, 3, 8 * t, 0, 8, t, 99, 0,
                       ringmod.flags(1, 1, AmoOp.CSWAP, 8), 0)
        if publish:
            struct.pack_into("<I", buf, off + 60, t + 1)
        return off

    for t in range(4):
        produce(t)
    assert [d.ticket for d in ring.poll()] == [0, 1, 2, 3]
    assert ring.complete(4) == 4
    off = produce(4, publish=False)
    assert ring.poll() == []  # written but not published: invisible
    struct.pack_into("<I", buf, off + 60, 5)
    produce(5)
    got = ring.poll(limit=1) + ring.poll()
    assert [d.ticket for d in got] == [4, 5]
    d = got[0]
    assert d.op == RingOp.AMO and d.pe == 3 and d.dst == 32 and d.value == 4
    assert d.amo_op == AmoOp.CSWAP and d.compare == 99 and d.width == 8 and d.dst_seg == 1
    assert ring.head == 6 and ring.tail == 6 and ring.done == 4 and ring.complete(2) == 6


def test_layout_matches_the_glsl() -> None:
    text = "".join(p.read_text() for p in sorted(GLSL.parent.glob("vkshmem*.glsl")))

    def define(name: str) -> int:
        m = re.search(rf"#define {name} (0x[0-9A-Fa-f]+|\d+)u?l?", text)
        assert m, name
        return int(m.group(1), 0)

    assert define("VKS_RING_MAGIC") == ringmod.RING_MAGIC
    assert define("VKS_RING_VERSION") == ringmod.RING_VERSION
    assert define("VKS_RING_HEADER") == ringmod.HEADER_SIZE
    assert define("VKS_DESC_SIZE") == ringmod.DESC_SIZE
    for op in RingOp:
        assert define(f"VKS_OP_{op.name}") == op.value
    for amo in AmoOp:
        assert define(f"VKS_AMO_{amo.name}") == amo.value
    for sig in SignalOp:
        assert define(f"VKS_SIGNAL_{sig.name}") == sig.value
    assert define("VKS_DIRECT_ALL") == ringmod.DIRECT_ALL
    assert define("VKS_DIRECT_SHARED") == ringmod.DIRECT_SHARED
    assert {define("VKS_KERR_SHARED_BARRIER"), define("VKS_KERR_SHARED_WAIT")} == \
        set(ringmod.KERNEL_ERRORS)
    for name, off in [("peers", ringmod.OFF_PEERS), ("sync_off", ringmod.OFF_SYNC),
                      ("direct_flags", ringmod.OFF_DIRECT_FLAGS),
                      ("spin_limit", ringmod.OFF_SPIN_LIMIT),
                      ("kernel_error", ringmod.OFF_KERNEL_ERROR)]:
        assert re.search(rf"(uint64_t|uint) {name};\s+// offset {off}:", text), name
    for name, off in [("head", ringmod.OFF_HEAD), ("tail", ringmod.OFF_TAIL),
                      ("done", ringmod.OFF_DONE)]:
        assert re.search(rf"uint64_t {name};\s+// offset {off}:", text), name


def test_kernel_errors_are_taken_once_and_said() -> None:
    buf = memoryview(bytearray(Ring.nbytes_for(4)))
    Ring.initialize(buf, 4)
    ring = Ring(buf)
    assert ring.take_kernel_error() is None
    ring.set_direct(0x1000, 512, True, 7, shared=True)
    assert struct.unpack_from("<QQII", buf, ringmod.OFF_PEERS) == \
        (0x1000, 512, ringmod.DIRECT_ALL | ringmod.DIRECT_SHARED, 7)
    struct.pack_into("<I", buf, ringmod.OFF_KERNEL_ERROR, 3)
    text = ring.take_kernel_error()
    assert text is not None and "vks_barrier_all" in text and "one PE per GPU" in text
    assert ring.take_kernel_error() is None  # cleared
