"""Unit tests of the ucx transport, in one process over real UCX.

Two (or three) transports are opened by hand as the PEs of a small job, each registering
memfd-backed segments, and exchange their worker addresses and rkey blobs through
:class:`PeerInfo` as the core would. No mocks: every operation goes through UCP, once over
UCX's shared memory (posix + cma, software atomics served by the target's progress thread) and
once over tcp on loopback, chosen per transport with the rail option ``tls=``.
"""

from __future__ import annotations

import random
import struct
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from vkshmem.core.errors import ConfigError, InvalidArgumentError, TransportError
from vkshmem.core.transports.contract import (
    AMO,
    RMA,
    AmoOp,
    PeerInfo,
    SegmentInfo,
    Transport,
    TransportContext,
)

vkshmem_ucx = pytest.importorskip("vkshmem_ucx")
from vkshmem_ucx._transport import UcxTransport, ucx_version  # noqa: E402
from vkshmem_ucx._ucx import lib as vku  # noqa: E402

from vkshmem.testing import Segment  # noqa: E402
from vkshmem.testing import transport as contract  # noqa: E402
from vkshmem.testing.transport import amo_model, run_threads, set_word, thread_count, word  # noqa: E402

pytestmark = pytest.mark.timeout(120)

SEG_SIZES = {0: 1 << 20, 2: 64 * 1024}
TLS = {"sm": "posix,cma,self", "tcp": "tcp,self"}


def tls_options(name: str) -> dict[str, str]:
    """The rail options of UCX path ``name``: tcp is opened only on a trusted network."""
    return {"tls": TLS[name], **({"trusted": "on"} if name == "tcp" else {})}


def context(pe: int, n: int, rail: int = 0, options: dict[str, str] | None = None,
            ) -> TransportContext:
    return contract.context(pe, n, rail, options or {"tls": TLS["sm"]})


class Job(contract.Job[UcxTransport]):
    """``n`` PEs of one node, each with one ucx transport per rail."""

    transport = UcxTransport
    default_options = {"tls": TLS["sm"]}
    seg_sizes = SEG_SIZES


@pytest.fixture
def sm_job() -> Iterator[Job]:
    with Job() as j:
        yield j


@pytest.fixture(params=[*TLS, "sm-heap"])
def job(request: pytest.FixtureRequest) -> Iterator[Job]:
    """tcp, shared memory, and shared memory on segments UCX allocated (heap=ucx), reached
    through UCX's mapping (direct=on)."""
    options = {"tls": TLS["sm"], "heap": "ucx"} if request.param == "sm-heap" else \
        tls_options(request.param)
    with Job(options=options) as j:
        yield j


# -- discovery -----------------------------------------------------------------------------


def test_spec_is_registered_through_the_entry_point() -> None:
    reg, spec = contract.registered_host_transport("ucx", "vkshmem-ucx")
    assert spec is vkshmem_ucx.SPEC and UcxTransport.spec is spec
    assert spec.priority == 50 > reg.transports["hostproxy"].priority
    # CUDA device memory: puts and gets, no AMOs (the core sends those through the proxy)
    assert spec.memory_kinds == {"host", "cuda_va"}
    assert spec.ops_on("cuda_va") == {RMA} and spec.ops_on("opaque_fd") == set()


def test_the_factory_opens_a_transport_and_reports_its_ucx() -> None:
    tr = vkshmem_ucx.SPEC.factory(context(0, 1))
    try:
        assert isinstance(tr, UcxTransport)
        stats = tr.stats()
        assert stats["ucx_version"] == ".".join(map(str, ucx_version()))
        assert "loaded" in stats["built_with"] and "libucp" in stats["built_with"]
        assert stats["settings"] == {"UCX_TLS": TLS["sm"], "UCX_ATOMIC_MODE": "cpu",
                                     "UCX_ALLOC_PRIO": "md:posix"}  # heap=auto may allocate
    finally:
        tr.close()


def test_a_ucx_that_cannot_load_names_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(vkshmem_ucx, "_ucx")
    monkeypatch.setitem(sys.modules, "vkshmem_ucx._ucx", None)  # import fails as without UCX
    monkeypatch.setitem(sys.modules, "libucx", None)
    with pytest.raises(TransportError, match=r"cannot load UCX.*pip install libucx-cu12"):
        vkshmem_ucx.SPEC.factory(context(0, 1))


# -- RMA -----------------------------------------------------------------------------------


def test_put_get_random(job: Job) -> None:
    contract.put_get_random(job, rounds=200, nbi_gets=True)


def test_get_sees_an_earlier_put_without_quiet(job: Job) -> None:
    """A get (or fetching AMO) after puts to the same PE observes them: the endpoint is
    flushed first when it has un-flushed writes."""
    contract.get_sees_an_earlier_put_without_quiet(job, rounds=50)


def test_put_and_get_typed_memoryviews(sm_job: Job) -> None:
    contract.put_and_get_typed_memoryviews(sm_job)


def test_large_transfers(job: Job) -> None:
    contract.large_transfers(job)


@pytest.mark.parametrize("tls", list(TLS))
def test_concurrent_large_transfers_between_three_pes(tls: str) -> None:
    """Every PE puts to and gets from every PE at once, from its own thread."""
    with Job(n=3, sizes={0: 24 << 20}, options=tls_options(tls)) as j:
        contract.concurrent_transfers_between_three_pes(j)


def test_quiet_after_many_nbi(job: Job) -> None:
    n = 10_000
    contract.quiet_after_many_put_nbi(  # an AMO among the puts, completed by the quiet too
        job, n, before_quiet=lambda tr: tr.amo(1, 0, 8 * n, AmoOp.SET, 8, 77, 0, False))
    tr, mem = job.t[0][0], job.mem(1)
    assert word(mem, 8 * n, 8) == 77
    outs = [bytearray(8) for _ in range(2000)]
    for i, out in enumerate(outs):
        tr.get_nbi(1, 0, 8 * i, memoryview(out))
    tr.quiet()
    assert all(struct.unpack("<Q", out)[0] == i + 1 for i, out in enumerate(outs))


def test_put_nbi_keeps_its_source_alive_until_quiet(sm_job: Job) -> None:
    tr = sm_job.t[0][0]
    for i in range(100):
        tr.put_nbi(1, 0, 1024 * i, memoryview(bytes([i % 256]) * 1024))  # no other reference
    tr.quiet()
    mem = sm_job.mem(1)
    assert all(mem[1024 * i:1024 * (i + 1)] == bytes([i % 256]) * 1024 for i in range(100))


def test_quiet_and_fence_with_nothing_outstanding(job: Job) -> None:
    contract.quiet_and_fence_with_nothing_outstanding(job)


def test_fence_orders_data_before_a_flag(job: Job) -> None:
    tr, mem = job.t[0][0], job.mem(1)
    for i in range(1, 30):
        tr.put(1, 0, 8192, memoryview(bytes([i]) * 65536))
        tr.fence()
        tr.amo(1, 0, 0, AmoOp.SET, 8, i, 0, False)
        deadline = time.monotonic() + 10
        while word(mem, 0, 8) != i:
            assert time.monotonic() < deadline, "the flag never arrived"
        assert mem[8192:8192 + 65536] == bytes([i]) * 65536
    tr.quiet()


# -- AMOs ----------------------------------------------------------------------------------


@contract.WIDTHS
@contract.ALL_OPS
def test_amo_fetching(job: Job, op: AmoOp, width: int) -> None:
    contract.amo_fetching(job, op, width, rounds=10)  # to itself: UCX's self transport


@contract.WIDTHS
@contract.NON_FETCHING_OPS
def test_amo_non_fetching(job: Job, op: AmoOp, width: int) -> None:
    contract.amo_non_fetching(job, op, width, cases=30, from_pes=(0, 1))


@contract.WIDTHS
def test_compare_swap_success_and_failure(job: Job, width: int) -> None:
    contract.compare_swap_success_and_failure(job, width)


def test_amo_operands_are_masked_to_the_width(sm_job: Job) -> None:
    contract.amo_operands_are_masked_to_the_width(sm_job)
    tr, mem = sm_job.t[0][0], sm_job.mem(1)
    assert tr.amo(1, 0, 0, AmoOp.SWAP, 8, -1, 0, True) == 5  # bit patterns, any sign
    assert word(mem, 0, 8) == (1 << 64) - 1


@contract.WIDTHS
def test_emulated_bitwise_atomics_by_compare_and_swap(sm_job: Job, width: int) -> None:
    """The work-around for UCX releases with broken AND/OR/XOR (see the self-test), forced on
    here: every bitwise op, fetching or not, through the compare-and-swap loop."""
    tr, mem = sm_job.t[0][0], sm_job.mem(1)
    ctx = tr._shared.ctx
    mask = sum(1 << (op + shift) for op in (AmoOp.AND, AmoOp.OR, AmoOp.XOR)
               for shift in (0, vku.VKU_EMU_NONFETCH))
    vku.vku_set_emulation(ctx, mask)
    try:
        rng = random.Random(width)
        for op in (AmoOp.AND, AmoOp.OR, AmoOp.XOR):
            for fetch in (True, False):
                old, operand = rng.getrandbits(8 * width), rng.getrandbits(8 * width)
                set_word(mem, 128, width, old)
                got = tr.amo(1, 0, 128, op, width, operand, 0, fetch)
                assert not fetch or got == old
                assert word(mem, 128, width) == amo_model(op, width, old, operand, 0)
        # still atomic under contention: 4 threads x 200 fetch_xor of distinct bits
        set_word(mem, 192, 8, 0)
        run_threads([threading.Thread(target=lambda b=b: [
            tr.amo(1, 0, 192, AmoOp.XOR, 8, 1 << b, 0, True) for _ in range(201)])
            for b in range(4)])
        assert word(mem, 192, 8) == 0b1111  # 201 toggles each: every bit ends set
    finally:
        vku.vku_set_emulation(ctx, 0)


def test_self_test_passes_on_this_ucx() -> None:
    """selftest=on runs the AND/OR/XOR check of start-up (normally only for UCX < 1.14)."""
    tr = UcxTransport(context(0, 1, options={"tls": TLS["sm"], "selftest": "on"}))
    try:
        if ucx_version() >= (1, 14, 0):
            assert tr.emulated_atomics == ()
        else:  # Debian's 1.13.1: fetching AND/OR/XOR through UCX's self transport are wrong
            assert set(tr.emulated_atomics) >= {"fetch_and", "fetch_or", "fetch_xor"}
    finally:
        tr.close()


def test_concurrent_fetch_add_from_threads_and_lazy_connect(job: Job) -> None:
    contract.concurrent_fetch_add_from_threads(job, threads=4, per_thread=250)


def test_two_rails_coexist_and_amos_are_atomic_across_them_and_the_cpu() -> None:
    with Job(n=2, rails=2) as j:
        contract.amos_are_atomic_across_two_rails(j, per_thread=300, cpu_adds=300)
        assert j.t[0][1].address() != j.t[1][1].address()


# -- contexts ------------------------------------------------------------------------------


def test_contexts_have_their_own_worker_and_complete_their_own_operations(job: Job) -> None:
    tr, mem = job.t[0][0], job.mem(1)
    a, b = tr.create_context(), tr.create_context()
    assert len({id(x._w) for x in (tr, a, b)}) == 3  # three UCP workers
    a.put_nbi(1, 0, 0, memoryview(b"A" * 4096))
    b.put_nbi(1, 0, 4096, memoryview(b"B" * 4096))
    a.quiet()
    assert mem[:4096] == b"A" * 4096
    b.quiet()
    assert mem[4096:8192] == b"B" * 4096
    assert a.amo(1, 0, 0, AmoOp.FETCH, 4, 0, 0, True) == int.from_bytes(b"AAAA", "little")
    failures: list[BaseException] = []

    def work(ctx: UcxTransport, base: int) -> None:  # each thread on its own context
        try:
            for i in range(200):
                ctx.put_nbi(1, 0, base + 8 * i, memoryview(struct.pack("<Q", base + i)))
                if i % 50 == 49:
                    ctx.quiet()
            ctx.quiet()
        except BaseException as exc:  # reported below
            failures.append(exc)

    run_threads([threading.Thread(target=work, args=(c, 16384 * (k + 1)))
                 for k, c in enumerate((a, b, tr))])
    assert not failures, failures
    for k in range(3):
        base = 16384 * (k + 1)
        assert all(struct.unpack_from("<Q", mem, base + 8 * i)[0] == base + i
                   for i in range(200))
    a.close()
    a.close()  # twice is fine
    with pytest.raises(TransportError, match="closed"):
        a.put(1, 0, 0, memoryview(b"x"))
    b.put(1, 0, 0, memoryview(b"still"))  # the others are untouched
    tr.put(1, 0, 8, memoryview(b"fine"))
    tr.quiet()
    b.quiet()
    assert mem[:5] == b"still" and mem[8:12] == b"fine"


def test_closing_the_transport_closes_its_contexts() -> None:
    threads = thread_count()
    j = Job()
    ctx = j.t[0][0].create_context()
    ctx.put(1, 0, 0, memoryview(b"x"))
    j.close()
    with pytest.raises(TransportError, match="closed"):
        ctx.put(1, 0, 0, memoryview(b"x"))
    ctx.close()
    assert thread_count() == threads


# -- bad requests --------------------------------------------------------------------------


def test_range_and_argument_errors_are_caught_before_ucx(sm_job: Job) -> None:
    def more(tr: Transport) -> None:
        with pytest.raises(InvalidArgumentError):
            tr.put_nbi(1, 0, 2**63, memoryview(b"x"))
        with pytest.raises(InvalidArgumentError, match="no segment 1"):
            tr.get_nbi(1, 1, 0, memoryview(bytearray(1)))
        with pytest.raises(TransportError, match="PE 5 is not reachable"):
            tr.put(5, 0, 0, memoryview(b"x"))
        with pytest.raises(TransportError, match="PE -1 is not reachable"):
            tr.get(-1, 0, 0, memoryview(bytearray(1)))

    contract.range_errors_are_caught_before_sending(sm_job, more)


def test_a_peer_without_an_address_is_not_reached(sm_job: Job) -> None:
    tr = sm_job.t[0][0]
    assert not tr.reaches(PeerInfo(1, "node0", True, None, {}))
    assert tr.reaches(PeerInfo(1, "node0", True, b"x", {}))


def test_unreadable_keys_are_refused() -> None:
    tr = UcxTransport(context(0, 2))
    try:
        with pytest.raises(TransportError, match="unreadable key"):
            tr.connect({1: PeerInfo(1, "n", True, b"addr", {0: b"\0" * 4})})
        with pytest.raises(TransportError, match="names segment 3"):
            tr.connect({1: PeerInfo(1, "n", True, b"addr",
                                    {0: struct.pack("<IIQQ", 3, 0, 0, 8) + b"k"})})
    finally:
        tr.close()


def test_only_host_memory_can_be_registered() -> None:
    def check_key(seg: Segment, key: bytes) -> None:
        assert key[:24] == struct.pack("<IIQQ", 0, 0, seg.address, 4096)  # flags 0: host

    contract.only_host_memory_can_be_registered(UcxTransport(context(0, 1)), vku.VKU_MAX_SEGS,
                                                check_key)


def test_cuda_memory_carries_rma_only() -> None:
    """CUDA device memory: UCX carries puts and gets, no AMOs (the rail option domain_amo=proxy
    takes AMOs on host-kind domain memory away too); a peer's segment keyed as device memory
    is refused an AMO by name instead of UCX applying it with CPU atomics."""
    tr = UcxTransport(context(0, 2))
    try:
        assert tr.carries("host") == {RMA, AMO} and tr.carries("cuda_va") == {RMA}
        assert tr.carries("opaque_fd") == set()
        tr.connect({1: PeerInfo(1, "n", True, tr.address(),
                                {5: struct.pack("<IIQQ", 5, 1, 1 << 40, 4096) + b"k"})})
        with pytest.raises(InvalidArgumentError, match="segment 5 is CUDA device memory"):
            tr.amo(1, 5, 0, AmoOp.ADD, 8, 1, 0, True)
    finally:
        tr.close()
    tr = UcxTransport(context(0, 1, options={"domain_amo": "proxy"}))
    try:
        assert tr.carries("host") == {RMA} and tr.carries("cuda_va") == {RMA}
    finally:
        tr.close()
    with pytest.raises(ConfigError, match="domain_amo='nic'"):
        UcxTransport(context(0, 1, options={"domain_amo": "nic"}))


def test_cuda_memory_without_cuda_is_a_clear_error() -> None:
    """Without a CUDA device (this machine, CI), UCX cannot map a CUDA VA: the error says
    which segment and what is needed."""
    tr = UcxTransport(context(0, 1))
    seg = Segment(0, 4096)
    try:
        info = SegmentInfo(2, "cuda_va", seg.address, 4096, -1, seg.view)
        try:
            tr.register(info)
        except TransportError as exc:
            assert "cuda_va segment 2" in str(exc) and "cuda_copy" in str(exc)
        else:  # a UCX that registers it anyway must at least never let the CPU at it
            assert 2 in tr._shared.device and 2 not in tr._shared.local
    finally:
        tr.close()
        seg.close()


def test_dead_peer_times_out_naming_it() -> None:
    with Job(options={**tls_options("tcp"), "timeout": "1"}) as j:
        tr = j.t[0][0]
        tr.get(1, 0, 0, memoryview(bytearray(8)))  # endpoint open
        j.t[0][1].close()  # PE 1 stops serving
        start = time.monotonic()
        with pytest.raises(TransportError, match=r"PE 1 .*(no completion within 1 s|failed)"):
            tr.amo(1, 0, 0, AmoOp.FETCH, 8, 0, 0, True)
        assert time.monotonic() - start < 10


# -- options -------------------------------------------------------------------------------


def test_options_are_validated() -> None:
    with pytest.raises(ConfigError, match=r"VKSHMEM_RAIL3.*unknown option 'bogus'"):
        UcxTransport(context(0, 1, rail=3, options={"bogus": "1"}))
    for key, value in [("timeout", "-1"), ("spin", "x"), ("wait_spin", "-5"),
                       ("atomic", "nic"), ("errmode", "maybe"), ("selftest", "perhaps"),
                       ("heap", "gpu"), ("direct", "sometimes")]:
        with pytest.raises(ConfigError, match=f"{key}="):
            UcxTransport(context(0, 1, options={key: value}))


def test_rail_options_set_ucx_variables() -> None:
    tr = UcxTransport(context(0, 1, options={
        "tls": "tcp,self", "dev": "lo", "atomic": "guess", "UCX_RNDV_THRESH": "16k",
        "ucx_max_rndv_rails": "1", "spin": "5", "wait_spin": "0", "errmode": "peer",
        "heap": "core", "direct": "off", "trusted": "on"}))  # heap=core: no UCX_ALLOC_PRIO
    try:
        assert tr.stats()["settings"] == {
            "UCX_TLS": "tcp,self", "UCX_NET_DEVICES": "lo", "UCX_ATOMIC_MODE": "guess",
            "UCX_RNDV_THRESH": "16k", "UCX_MAX_RNDV_RAILS": "1"}
    finally:
        tr.close()
    tr = UcxTransport(context(0, 1, options={"dev": "mlx5_0/1,mlx5_1/1"}))
    try:  # ':' separates rail options: a device's port is written with '/'
        assert tr.stats()["settings"]["UCX_NET_DEVICES"] == "mlx5_0:1,mlx5_1:1"
    finally:
        tr.close()


def test_ucx_environment_atomic_mode_is_respected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UCX_ATOMIC_MODE", "guess")
    tr = UcxTransport(context(0, 1))
    try:
        assert "UCX_ATOMIC_MODE" not in tr.stats()["settings"]
    finally:
        tr.close()


def test_a_variable_ucx_rejects_is_a_transport_error() -> None:
    with pytest.raises(TransportError, match="UCX_RNDV_THRESH=banana"):
        UcxTransport(context(0, 1, options={"UCX_RNDV_THRESH": "banana"}))
    with pytest.raises(TransportError, match="cannot open UCX"):
        UcxTransport(context(0, 1, options={"tls": "no_such_transport"}))


# -- lifetime ------------------------------------------------------------------------------


def test_close_twice_no_leaked_threads_or_fds() -> None:
    UcxTransport(context(0, 1)).close()  # UCX's one-time set-up out of the way
    contract.close_twice_without_leaks(Job, exact_threads=False, quiet_after_close_raises=True)


def test_progress_thread_sleeps_when_idle(sm_job: Job) -> None:
    tr = sm_job.t[0][1]
    tr.amo(1, 0, 0, AmoOp.ADD, 8, 1, 0, True)
    before = tr.stats()["wakeups"]
    time.sleep(0.5)
    assert tr.stats()["wakeups"] - before <= 10  # woken by its 100 ms timer at most
