"""User kernels and the host side of GPU-initiated communication, on one PE: loading and
dispatching SPIR-V with the vkshmem push header (vkshmem.gpu.initiated.launch), draining a kernel's
requests on a thread (vkshmem.gpu.initiated.ringservice), and the device-side API of vkshmem.glsl
(tests/gpu/shaders/*.comp) end to end against a handler that performs every request on this
PE's own memory."""

from __future__ import annotations

import re
import shutil
import struct
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from gpu.helpers import device_fixture

from vkshmem.core.errors import InvalidArgumentError
from vkshmem.core.transports.contract import AmoOp
from vkshmem.gpu import (
    Descriptor,
    GpuError,
    GpuMemory,
    GpuTimeoutError,
    Ring,
    RingError,
    RingOp,
    RingService,
    SignalOp,
    UserKernel,
    VulkanDevice,
    pack_push,
    shaders,
)
from vkshmem.gpu.initiated import ring as ringmod
from vkshmem.gpu.initiated.push import PUSH_HEADER, USER_PUSH_SIZE, entry_points

pytestmark = pytest.mark.timeout(60)

KERNELS = Path(__file__).parent / "gpu" / "shaders"
PUT_SIGNAL = KERNELS / "put_signal.spv"
API_SELFTEST = KERNELS / "api_selftest.spv"
HEAP = 1 << 16

needs_glslc = pytest.mark.skipif(shutil.which("glslc") is None,
                                 reason="glslc is not installed (apt-get install glslc)")


@pytest.fixture(scope="module")
def dev() -> Iterator[VulkanDevice]:
    yield from device_fixture(staging_size=256 << 10)


class Loopback:
    """A ring handler for a one-PE job: performs the requests of PE ``me`` on its own memory,
    segment 1 (the GPU heap) through a mapping, segment 0 (the host heap) in a bytearray. The
    reference of the handler contract (vkshmem.gpu.initiated.ringservice) on a single PE."""

    def __init__(self, gpu: memoryview, host: bytearray, me: int = 0) -> None:
        self.segs = {1: gpu, 0: memoryview(host)}
        self.me = me
        self.ops: list[RingOp | int] = []

    def _seg(self, seg: int) -> memoryview:
        if seg not in self.segs:
            raise InvalidArgumentError(f"no segment {seg}")
        return self.segs[seg]

    def _signal(self, d: Descriptor) -> None:
        mem, off = self._seg(d.dst_seg), d.signal_offset
        old = struct.unpack_from("<Q", mem, off)[0]
        new = old + d.value if d.signal_op == SignalOp.ADD else d.value
        struct.pack_into("<Q", mem, off, new & (2**64 - 1))

    def _amo(self, d: Descriptor) -> int:
        mem, w = self._seg(d.dst_seg), d.width
        fmt = {4: "<I", 8: "<Q"}[w]
        mask = (1 << (8 * w)) - 1
        old = struct.unpack_from(fmt, mem, d.dst)[0]
        op, x = d.amo_op, d.value & mask
        new = {AmoOp.FETCH: old, AmoOp.SET: x, AmoOp.SWAP: x,
               AmoOp.CSWAP: x if old == d.compare & mask else old, AmoOp.ADD: old + x,
               AmoOp.AND: old & x, AmoOp.OR: old | x, AmoOp.XOR: old ^ x}[op]
        struct.pack_into(fmt, mem, d.dst, new & mask)
        return old

    def __call__(self, d: Descriptor) -> int | None:
        self.ops.append(d.op)
        if d.op in (RingOp.NOP, RingOp.FENCE, RingOp.QUIET):
            return None
        if d.pe != self.me:
            raise InvalidArgumentError(f"PE {d.pe} is not reachable from this one-PE job")
        if d.op in (RingOp.PUT, RingOp.GET, RingOp.PUT_SIGNAL):
            dst, src = self._seg(d.dst_seg), self._seg(d.src_seg)
            dst[d.dst:d.dst + d.nbytes] = bytes(src[d.src:d.src + d.nbytes])
        if d.op in (RingOp.SIGNAL, RingOp.PUT_SIGNAL):
            self._signal(d)
        if d.op == RingOp.AMO:
            return self._amo(d)
        return None


class Job:
    """One PE's GPU heap (mapped), host heap and request ring."""

    def __init__(self, dev: VulkanDevice, capacity: int = 64) -> None:
        self.dev = dev
        self.heap: GpuMemory = dev.alloc_mapped(HEAP)
        view = self.heap.map()
        assert view is not None
        view[:] = bytes(HEAP)
        self.gpu = view
        self.host = bytearray(4096)
        self.ring = Ring.create(dev, capacity)

    def kernel(self, spv: Path, **kw: object) -> UserKernel:
        return UserKernel(self.dev, spv, heap=self.heap, ring=self.ring, **kw)  # type: ignore[arg-type]

    def u32(self, off: int, n: int) -> np.ndarray:
        return np.frombuffer(self.gpu, np.uint32, n, off).copy()

    def u64(self, off: int, n: int = 1) -> np.ndarray:
        return np.frombuffer(self.gpu, np.uint64, n, off).copy()

    def close(self) -> None:
        self.ring.close()
        del self.gpu
        try:
            self.heap.free()
        except BufferError:  # a failed assertion's traceback still holds a view: leave it
            pass


@pytest.fixture
def job(dev: VulkanDevice) -> Iterator[Job]:
    j = Job(dev)
    yield j
    j.close()


def _service_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("vkshmem-ring")]


# -- put_signal.comp: the multi-PE test kernel, on one PE -------------------------------------

SRC, DST, SIG, STATUS = 0, 8192, 16384, 16640


def put_signal_push(count: int, salt: int = 7, sig_op: int = SignalOp.ADD,
                    sig_value: int = 1) -> bytes:
    return pack_push(np.uint64(SRC), np.uint64(DST), np.uint64(SIG), np.uint64(STATUS),
                     np.uint32(count), np.uint32(salt), np.uint32(sig_op), np.uint32(sig_value))


def expected(me: int, count: int, salt: int = 7) -> np.ndarray:
    """f(my_pe, i) of put_signal.comp."""
    return (salt + 65536 * me + np.arange(count, dtype=np.uint64)).astype(np.uint32)


def test_put_signal_kernel_through_the_ring_service(job: Job) -> None:
    count = 300  # 5 workgroups of 64: 5 put_signals, 5 quiets
    handler = Loopback(job.gpu, job.host)
    with job.kernel(PUT_SIGNAL) as k, RingService(job.ring, handler) as svc:
        assert k.local_size == (64, 1, 1) and k.groups_for(count) == 5
        assert k.header["n_pes"] == 1 and k.header["ring"] == job.ring.device_address
        launch = k.dispatch(k.groups_for(count), push=put_signal_push(count))
        launch.wait()
        assert launch.done() and k.in_flight == 0
        assert job.u32(STATUS, 6).tolist() == [1] * 5 + [0]  # every quiet returned
        np.testing.assert_array_equal(job.u32(DST, count), expected(0, count))
        assert job.u32(DST + 4 * count, 1)[0] == 0  # nothing past the block
        assert int(job.u64(SIG)[0]) == 5  # ADD 1 per workgroup
        assert sorted(handler.ops) == [RingOp.PUT_SIGNAL] * 5 + [RingOp.QUIET] * 5
        # Again with SET, another salt: the data are replaced, the signal set.
        k.run(5, push=put_signal_push(count, salt=1000, sig_op=SignalOp.SET, sig_value=42))
        np.testing.assert_array_equal(job.u32(DST, count), expected(0, count, 1000))
        assert int(job.u64(SIG)[0]) == 42
        assert svc.handled == 20 and svc.error is None
        assert job.ring.done == job.ring.tail == job.ring.head == 20
    assert not svc.running and _service_threads() == []


def test_device_api_end_to_end(dev: VulkanDevice) -> None:
    """api_selftest.comp: every call on the header's ring, with my_pe 2 of 3 in the header."""
    job = Job(dev, capacity=256)
    try:
        _api_selftest(job)
    finally:
        job.close()


def _api_selftest(job: Job) -> None:
    n, area, host = 13 * 8, 4096, 256  # each kind on 8 lanes in a row
    for i in range(n):
        struct.pack_into("<Q", job.gpu, area + 64 * i, 1000 * i + 1)
    handler = Loopback(job.gpu, job.host, me=2)
    with job.kernel(API_SELFTEST, my_pe=2, n_pes=3, scratch_bytes=32 * n) as k, \
            RingService(job.ring, handler):
        k.run(k.groups_for(n), push=pack_push(np.uint64(area), np.uint64(host), np.uint32(n)))
        view = k.scratch_view()
        s = np.frombuffer(view, np.uint64).reshape(n, 4).copy()
        del view
    assert s[:, 2].tolist() == [2 << 32 | 3] * n  # vks_my_pe(), vks_n_pes()
    assert s[:, 3].tolist() == [3] * n, s[:, 3]  # each request completed, each quiet returned
    mask64 = 2**64 - 1
    for i in range(n):
        kind, x = (i // 8) % 13, 1000 * i + 1
        a = area + 64 * i
        word, next_word, sig = (int(v) for v in job.u64(a, 3))
        got = int(s[i, 1])
        want_word = {2: x + i + 1, 3: 7 * i, 4: 5 * i + 1, 6: x + i, 7: 3 * i, 8: x + i,
                     10: x ^ 0xFF}.get(kind, x)
        assert word == want_word & mask64, (i, kind)
        if kind in (2, 3, 4, 5):
            assert got == x and int(s[i, 0]) == x, (i, kind)  # result slot and copy
        if kind == 10:
            assert got == x & 0xFFFFFFFF and int(s[i, 0]) == x & 0xFFFFFFFF  # 4 bytes written
        if kind in (0, 1, 9):
            assert next_word == x, (i, kind)
        if kind == 9:
            assert sig == i + 100
        if kind == 11:
            assert struct.unpack_from("<Q", job.host, host + 16 * i)[0] == x
        if kind == 12:
            assert struct.unpack_from("<Q", job.host, host + 16 * i + 8)[0] == i
    assert handler.ops.count(RingOp.FENCE) == 8 and handler.ops.count(RingOp.QUIET) == n
    assert len(handler.ops) == job.ring.done == 2 * n + 8


# -- failures: timeouts, handler errors, a poisoned ring --------------------------------------

def test_launch_wait_times_out_instead_of_hanging(job: Job) -> None:
    """Without a service, each workgroup's quiet spins until its budget runs out: the launch
    is in flight for a while, wait(timeout) raises, and the kernel reports the failed quiet."""
    count = 64 * 8
    with job.kernel(PUT_SIGNAL) as k:
        first = k.dispatch(8, push=put_signal_push(count))
        second = k.dispatch(1, push=put_signal_push(64))  # overlaps: its own command buffer
        assert k.in_flight == 2
        with pytest.raises(GpuTimeoutError, match="still in flight"):
            first.wait(timeout=0)
        assert "in flight" in repr(first)
        first.wait()
        second.wait()
        assert first.done() and second.done() and k.in_flight == 0
        assert set(job.u32(STATUS, 8).tolist()) == {3}  # the quiets gave up
    assert job.ring.head == 2 * 9 and job.ring.tail == 0  # requests stay queued
    assert job.u64(SIG)[0] == 0


def test_handler_error_poisons_the_ring(job: Job) -> None:
    def handler(d: Descriptor) -> None:
        if d.op == RingOp.PUT_SIGNAL:
            raise ValueError("transport down")

    with job.kernel(PUT_SIGNAL) as k:
        svc = RingService(job.ring, handler)
        t0 = time.perf_counter()
        k.run(4, push=put_signal_push(256))
        elapsed = time.perf_counter() - t0
        assert set(job.u32(STATUS, 4).tolist()) == {3}  # every quiet failed
        assert elapsed < 5
        assert job.ring.failed
        with pytest.raises(RingError, match=r"PUT_SIGNAL to PE 0.*ValueError: transport down"):
            svc.check()
        err = svc.error
        assert isinstance(err, RingError) and isinstance(err.__cause__, ValueError)
        assert err.descriptor is not None and err.descriptor.op == RingOp.PUT_SIGNAL
        with pytest.raises(RingError, match="poisoned"):
            svc.stop()
        assert svc.handled == 0 and svc.discarded == job.ring.head == 8  # #0 failed
        assert not svc.running and _service_threads() == []
        with pytest.raises(GpuError, match="poisoned"):
            job.ring.complete()
        # A poisoned, full ring: producers give up at once (status 2: no ticket).
        job.ring.reset()
        assert not job.ring.failed and job.ring.head == 0
    small = Ring.create(job.dev, 2)
    try:
        small.fail()
        with UserKernel(job.dev, PUT_SIGNAL, heap=job.heap, ring=small) as k:
            k.run(4, push=put_signal_push(256))
        status = job.u32(STATUS, 4).tolist()
        assert set(status) <= {2, 3} and 2 in status, status  # 2 tickets fit, no more
        assert small.head == 2
    finally:
        small.close()


# -- the service without a GPU (a ring in a bytearray) ----------------------------------------

def _host_ring(capacity: int = 8) -> Ring:
    buf = memoryview(bytearray(Ring.nbytes_for(capacity)))
    Ring.initialize(buf, capacity)
    return Ring(buf)


def _produce(ring: Ring, op: int, pe: int = 0, value: int = 0) -> int:
    """Enqueue one descriptor as a shader does (claim, fill, publish)."""
    t = ring.head
    struct.pack_into("<Q", ring.buf, ringmod.OFF_HEAD, t + 1)
    off = ringmod.HEADER_SIZE + (t % ring.capacity) * ringmod.DESC_SIZE
    struct.pack_into("<IIQQQQQQII", ring.buf, off, op, pe, 0, 0, 8, value, 0, 0,
                     ringmod.flags(1, 1), (t + 1) & 0xFFFFFFFF)
    return t


def _until(cond: object, timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not cond():  # type: ignore[operator]
        assert time.monotonic() < end, "timed out"
        time.sleep(1e-3)


def test_service_order_flush_and_stop() -> None:
    ring = _host_ring()
    events: list[str] = []

    def handler(d: Descriptor) -> None:
        events.append(f"{d.op.name}{d.value}")

    svc = RingService(ring, handler, flush=lambda: events.append(f"flush@{ring.done}"),
                      name="vkshmem-ring-test")
    for v in range(5):
        _produce(ring, RingOp.PUT, value=v)
    _until(lambda: ring.done == 5)
    assert [e for e in events if not e.startswith("flush")] == [f"PUT{v}" for v in range(5)]
    assert "flush@0" in events  # flushed before the batch was completed
    time.sleep(0.01)  # idle: sleeping with backoff
    _produce(ring, RingOp.QUIET)
    _until(lambda: ring.done == 6)
    assert svc.running and svc.handled == 6
    svc.stop()
    assert not svc.running and _service_threads() == []
    svc.stop()  # idempotent
    with pytest.raises(InvalidArgumentError, match="already started"):
        svc.start()


def test_service_stop_while_the_handler_is_busy() -> None:
    ring = _host_ring()
    release = threading.Event()
    svc = RingService(ring, lambda d: release.wait(10) and None, name="vkshmem-ring-busy")
    _produce(ring, RingOp.SIGNAL, pe=3)
    _until(lambda: ring.tail == 1)
    with pytest.raises(GpuTimeoutError, match=r"still busy on request #0 \(SIGNAL to PE 3"):
        svc.stop(timeout=0.05)
    release.set()
    svc.stop()
    assert ring.done == 1 and _service_threads() == []


def test_service_rejects_unknown_ops_and_bad_arguments() -> None:
    ring = _host_ring()
    svc = RingService(ring, lambda d: None, name="vkshmem-ring-bad")
    _produce(ring, 99)
    _until(lambda: ring.failed)
    with pytest.raises(RingError, match="unknown request op 99"):
        svc.stop()
    with pytest.raises(InvalidArgumentError, match="batch"):
        RingService(ring, lambda d: None, batch=0)
    # A fetched value with nowhere to go: the request fails (no device to write it with).
    ring2 = _host_ring()
    svc2 = RingService(ring2, lambda d: 5, name="vkshmem-ring-nodev")
    t = ring2.head
    struct.pack_into("<Q", ring2.buf, ringmod.OFF_HEAD, t + 1)
    off = ringmod.HEADER_SIZE
    struct.pack_into("<IIQQQQQQII", ring2.buf, off, RingOp.AMO, 0, 0, 0, 8, 1, 0, 0x1000,
                     ringmod.flags(1, 1, AmoOp.FETCH, 8), 1)
    _until(lambda: ring2.failed)
    with pytest.raises(RingError, match="no device"):
        svc2.stop()
    assert _service_threads() == []


# -- loading and dispatching: argument errors --------------------------------------------------

def test_loading_errors(dev: VulkanDevice, tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="not a SPIR-V module"):
        UserKernel(dev, b"\x00" * 64)
    with pytest.raises(InvalidArgumentError, match="no SPIR-V file"):
        UserKernel(dev, tmp_path / "missing.spv")
    with pytest.raises(InvalidArgumentError, match="is GLSL: compile it"):
        UserKernel(dev, KERNELS / "put_signal.comp")
    with pytest.raises(InvalidArgumentError, match=r"no compute entry point 'nope' \(compute "
                                                   r"entry points: main\)"):
        UserKernel(dev, PUT_SIGNAL, entry="nope")
    with pytest.raises(InvalidArgumentError, match="no shipped shader named"):
        UserKernel(dev, "no_such_module")
    with pytest.raises(InvalidArgumentError, match="my_pe must be in"):
        UserKernel(dev, PUT_SIGNAL, my_pe=1, n_pes=1)
    with pytest.raises(InvalidArgumentError, match="heap must be a device address"):
        UserKernel(dev, PUT_SIGNAL, heap="x")
    data = PUT_SIGNAL.read_bytes()
    assert entry_points(data) == {"main": (64, 1, 1)}
    with UserKernel(dev, data, name="from bytes") as k, UserKernel(dev, "ring_selftest") as k2:
        assert k.name == "from bytes" and k2.local_size == (64, 1, 1)
        assert k.header == {"heap": 0, "ring": 0, "scratch": 0, "my_pe": 0, "n_pes": 1}
        k.set_header(my_pe=3, n_pes=4, heap=0x1000)
        assert PUSH_HEADER.unpack(k._header) == (0x1000, 0, 0, 3, 4)
        with pytest.raises(InvalidArgumentError, match="no scratch"):
            k.scratch_view()


def test_dispatch_argument_errors(dev: VulkanDevice) -> None:
    limit = dev.info.max_workgroup_count
    with UserKernel(dev, PUT_SIGNAL) as k:
        for groups, match in [((0,), "at least 1"), ((limit[0] + 1,), "exceed the device limit"),
                              ((1, 0), "count y must be at least 1"),
                              ((1.0,), "must be an int"), ((True,), "must be an int")]:
            with pytest.raises(InvalidArgumentError, match=match):
                k.dispatch(*groups)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError, match=f"{USER_PUSH_SIZE} bytes follow"):
            k.dispatch(1, push=bytes(USER_PUSH_SIZE + 1))
        with pytest.raises(InvalidArgumentError, match="numpy scalar"):
            k.dispatch(1, push=[np.uint32(1), 5])
        with pytest.raises(InvalidArgumentError, match="push must be bytes"):
            k.dispatch(1, push="abc")  # type: ignore[arg-type]
        assert k.in_flight == 0
    with pytest.raises(GpuError, match="closed"):
        k.dispatch(1)


def test_pack_push_lays_out_like_glsl() -> None:
    assert pack_push(np.uint32(1), np.uint64(2), np.float32(0.5), np.int32(-1)) == \
        struct.pack("<I4xQfi", 1, 2, 0.5, -1)
    assert pack_push(b"\x01", np.uint16(7), b"ab") == b"\x01\x00\x07\x00ab"
    assert pack_push() == b""


# -- the test kernels' SPIR-V matches their sources; the header matches the GLSL ---------------

def test_push_header_and_poison_bit_match_the_glsl() -> None:
    text = "".join(p.read_text() for p in sorted(shaders.source_dir().glob("vkshmem*.glsl")))
    assert re.search(r"#define VKS_DONE_FAILED 0x8000000000000000ul", text)
    assert ringmod.DONE_FAILED == 1 << 63
    assert re.search(rf"#define VKS_PUSH_HEADER_SIZE {PUSH_HEADER.size}u", text)
    macro = text[text.index("#define VKS_PUSH_HEADER \\"):].split("\n\n")[0]
    fields = re.findall(r"(uint64_t|uint) (vks_\w+);", macro)
    assert [t for t, _ in fields] == ["uint64_t"] * 3 + ["uint"] * 2  # "<QQQII"
    assert [n for _, n in fields] == ["vks_heap_base_", "vks_ring_addr_", "vks_scratch_base_",
                                      "vks_my_pe_", "vks_n_pes_"]


def test_test_kernels_match_their_sources() -> None:
    report = shaders.check_tests(recompile=False)
    assert sorted(report.modules) == sorted(shaders.TEST_VARIANTS)


@needs_glslc
def test_test_kernels_are_what_glslc_makes_of_them() -> None:
    report = shaders.check_tests()
    assert sorted(report.modules) == sorted(shaders.TEST_VARIANTS) and report.compiler


@needs_glslc
def test_compile_glsl_finds_vkshmem_glsl(tmp_path: Path) -> None:
    spv = shaders.compile_glsl(KERNELS / "put_signal.comp", tmp_path / "k.spv")
    assert (tmp_path / "k.spv").read_bytes() == spv
    assert shaders.normalize(spv) == shaders.normalize(PUT_SIGNAL.read_bytes())
