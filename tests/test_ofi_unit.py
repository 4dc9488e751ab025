"""Unit tests of the ofi transport, in one process over real libfabric.

Two (or three) transports are opened by hand as the PEs of a small job, each registering
memfd-backed segments, and exchange their endpoint names and key blobs through
:class:`PeerInfo` as the core would. No mocks: every operation goes through libfabric, over the
providers Debian 12's libfabric 1.17 has that are known to work: ``tcp;ofi_rxm`` on loopback and
``shm`` (the checks that are cheap also over ``sockets``, which takes ~10 ms per operation).
"""

from __future__ import annotations

import re
import struct
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from vkshmem.core.config import Config
from vkshmem.core.errors import ConfigError, TransportError
from vkshmem.core.plugins.loader import load_plugins
from vkshmem.core.transports.contract import (
    AMO,
    RMA,
    AmoOp,
    PeerInfo,
    SegmentInfo,
    TransportContext,
)

vkshmem_ofi = pytest.importorskip("vkshmem_ofi")
from vkshmem_ofi._ofi import lib as vko  # noqa: E402
from vkshmem_ofi._transport import OfiTransport  # noqa: E402

from vkshmem.testing import Segment  # noqa: E402
from vkshmem.testing import transport as contract  # noqa: E402
from vkshmem.testing.transport import word  # noqa: E402

pytestmark = pytest.mark.timeout(180)

SEG_SIZES = {0: 1 << 20, 2: 64 * 1024}
PROVIDERS = {"tcp": "tcp;ofi_rxm", "shm": "shm"}


def context(pe: int, n: int, rail: int = 0, options: dict[str, str] | None = None,
            ) -> TransportContext:
    return contract.context(pe, n, rail, options or {"provider": PROVIDERS["tcp"]})


class Job(contract.Job[OfiTransport]):
    """``n`` PEs of one node, each with one ofi transport per rail."""

    transport = OfiTransport
    default_options = {"provider": PROVIDERS["tcp"]}
    seg_sizes = SEG_SIZES


@pytest.fixture(params=list(PROVIDERS))
def job(request: pytest.FixtureRequest) -> Iterator[Job]:
    with Job(options={"provider": PROVIDERS[request.param]}) as j:
        yield j


@pytest.fixture
def tcp_job() -> Iterator[Job]:
    with Job() as j:
        yield j


# -- discovery -----------------------------------------------------------------------------


def test_spec_is_registered_through_the_entry_point() -> None:
    reg = load_plugins(Config({}))
    spec = reg.transports["ofi"]
    assert reg.origin["ofi"] == "vkshmem-ofi"
    assert spec is vkshmem_ofi.SPEC and OfiTransport.spec is spec
    assert spec.amo_ops == set(AmoOp) and spec.amo_widths == {4, 8}
    assert spec.native_fence  # fence = completion of AMOs (and puts unless ordered)
    assert reg.transports["hostproxy"].priority < spec.priority


def test_the_factory_opens_the_default_provider_and_reports_it() -> None:
    tr = vkshmem_ofi.SPEC.factory(contract.context(0, 1))
    try:
        stats = tr.stats()
        assert stats["provider"] == "tcp;ofi_rxm" and stats["provider_from"] == "the default"
        assert stats["libfabric"].startswith("1.")
        assert stats["progress_waits"]  # the progress thread sleeps on the CQ's wait object
        assert tr.emulated_atomics == ()  # every AMO is native on tcp;ofi_rxm
    finally:
        tr.close()


def test_the_provider_variable_chooses_the_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(vkshmem_ofi.PROVIDER_VAR, "shm")
    tr = OfiTransport(contract.context(0, 1))
    try:
        assert tr.stats()["provider"] == "shm"
        assert tr.stats()["provider_from"] == vkshmem_ofi.PROVIDER_VAR
    finally:
        tr.close()


# -- RMA -----------------------------------------------------------------------------------


def test_info_lists_the_provider_variable(monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """`vkshmem info` prints the plugin's variable (TransportSpec.variables) with its value."""
    from vkshmem_ofi import SPEC

    from vkshmem._info import _plugin_variables

    monkeypatch.setenv("VKSHMEM_OFI_PROVIDER", "shm")
    _plugin_variables(SPEC.variables)
    out = capsys.readouterr().out
    assert re.search(r"\* VKSHMEM_OFI_PROVIDER +=\s+shm +\[default tcp;ofi_rxm\]", out), out


def test_put_get_random(job: Job) -> None:
    contract.put_get_random(job, rounds=150, nbi_gets=True)


def test_get_sees_an_earlier_put_without_quiet(job: Job) -> None:
    contract.get_sees_an_earlier_put_without_quiet(job, rounds=30)


def test_put_and_get_typed_memoryviews(tcp_job: Job) -> None:
    contract.put_and_get_typed_memoryviews(tcp_job)


def test_large_transfers(job: Job) -> None:
    contract.large_transfers(job)


@pytest.mark.parametrize("prov", list(PROVIDERS))
def test_concurrent_large_transfers_between_three_pes(prov: str) -> None:
    with Job(n=3, sizes={0: 9 << 20}, options={"provider": PROVIDERS[prov]}) as j:
        contract.concurrent_transfers_between_three_pes(j)


def test_quiet_after_many_nbi(job: Job) -> None:
    n = 3000
    contract.quiet_after_many_put_nbi(
        job, n, before_quiet=lambda tr: tr.amo(1, 0, 8 * n, AmoOp.SET, 8, 77, 0, False))
    assert word(job.mem(1), 8 * n, 8) == 77


def test_quiet_and_fence_with_nothing_outstanding(job: Job) -> None:
    contract.quiet_and_fence_with_nothing_outstanding(job)


def test_fence_orders_data_before_a_flag(job: Job) -> None:
    tr, mem = job.t[0][0], job.mem(1)
    for i in range(1, 20):
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
    contract.amo_fetching(job, op, width, rounds=10)


@contract.WIDTHS
@contract.NON_FETCHING_OPS
def test_amo_non_fetching(job: Job, op: AmoOp, width: int) -> None:
    contract.amo_non_fetching(job, op, width, cases=30, from_pes=(0, 1))


@contract.WIDTHS
def test_compare_swap_success_and_failure(job: Job, width: int) -> None:
    contract.compare_swap_success_and_failure(job, width)


def test_amo_operands_are_masked_to_the_width(tcp_job: Job) -> None:
    contract.amo_operands_are_masked_to_the_width(tcp_job)


@contract.WIDTHS
@pytest.mark.parametrize("fetch", [True, False])
def test_emulated_atomics_by_compare_and_swap(width: int, fetch: bool) -> None:
    """The fallback where a provider lacks an op: every op forced through the CAS loop gives
    the same words and fetched values as the native ones."""
    with Job(options={"provider": PROVIDERS["tcp"], "emulate": "all"}) as j:
        assert "fetch_add/64" in j.t[0][0].emulated_atomics
        for op in AmoOp:
            if fetch:
                contract.amo_fetching(j, op, width, rounds=5)
            elif not op.fetching_only:
                contract.amo_non_fetching(j, op, width, cases=10, from_pes=(0,))


def test_emulated_fetch_add_is_atomic_under_contention() -> None:
    with Job(options={"provider": PROVIDERS["tcp"], "emulate": "add,fetch_add"}) as j:
        contract.concurrent_fetch_add_from_threads(j, threads=3, per_thread=60)


@contract.NON_FETCHING_OPS
def test_injected_atomics_are_complete_after_quiet_over_tcp(op: AmoOp) -> None:
    """The shm workaround (non-fetching AMOs as fi_inject_atomic, flushed at quiet by a fetching
    read of each PE they went to) is correct on tcp;ofi_rxm too, where it is optional."""
    with Job(options={"provider": PROVIDERS["tcp"], "inject_amo": "on"}) as j:
        contract.amo_non_fetching(j, op, 8, cases=20, from_pes=(0,))


def test_concurrent_fetch_add_from_threads(job: Job) -> None:
    contract.concurrent_fetch_add_from_threads(job, threads=4, per_thread=150)


@pytest.mark.parametrize("prov", list(PROVIDERS))
def test_amos_are_atomic_across_two_rails_and_the_cpu(prov: str) -> None:
    """Provider atomics (applied by the target's progress) and the core's CPU atomics on the
    same word do not lose updates: the providers apply AMOs with the same CPU atomics."""
    with Job(rails=2, options={"provider": PROVIDERS[prov]}) as j:
        contract.amos_are_atomic_across_two_rails(j, per_thread=200, cpu_adds=300)


# -- contexts, errors, options, lifetime -----------------------------------------------------


def test_contexts_complete_their_own_operations(job: Job) -> None:
    tr = job.t[0][0]
    ctx = tr.create_context()
    try:
        for i in range(200):
            ctx.put_nbi(1, 0, 8 * i, memoryview(struct.pack("<Q", i + 7)))
        ctx.quiet()
        assert all(word(job.mem(1), 8 * i, 8) == i + 7 for i in range(200))
        assert ctx.amo(1, 0, 0, AmoOp.ADD, 8, 1, 0, True) == 7
    finally:
        ctx.close()
    ctx.close()
    tr.put(1, 0, 0, memoryview(b"after ok"))  # the transport outlives its context
    tr.quiet()


def test_range_and_argument_errors_are_caught_before_sending(tcp_job: Job) -> None:
    contract.range_errors_are_caught_before_sending(tcp_job)


def test_a_peer_without_an_address_is_not_reached() -> None:
    tr = OfiTransport(context(0, 2))
    try:
        tr.connect({1: PeerInfo(1, "node0", True, None, {})})
        with pytest.raises(TransportError, match="PE 1 is not reachable"):
            tr.put(1, 0, 0, memoryview(b"x"))
    finally:
        tr.close()


def test_shm_reaches_only_this_node() -> None:
    tr = OfiTransport(context(0, 2, options={"provider": "shm"}))
    try:
        assert not tr.reaches(PeerInfo(1, "node1", False, b"x", {}))
        assert tr.reaches(PeerInfo(1, "node0", True, b"x", {}))
    finally:
        tr.close()


def test_only_host_memory_can_be_registered() -> None:
    contract.only_host_memory_can_be_registered(OfiTransport(context(0, 1)), vko.VKO_MAX_SEGS)


def test_dmabuf_registration_names_what_is_missing() -> None:
    """libfabric 1.17 has no FI_MR_DMABUF: the dma-buf path says so (and how to get it)."""
    if vko.vko_has_dmabuf():
        pytest.skip("built against a libfabric with FI_MR_DMABUF")
    tr = OfiTransport(context(0, 1))
    seg = Segment(0, 4096)
    try:
        info = SegmentInfo(0, "dmabuf", seg.address, 4096, seg.fd, seg.view)
        with pytest.raises(TransportError, match=r"FI_MR_DMABUF.*VKSHMEM_OFI_PREFIX"):
            tr.register(info)
    finally:
        tr.close()
        seg.close()


def test_gpu_memory_with_a_dmabuf_fd_names_what_is_missing() -> None:
    """A GPU segment whose domain exports a dma-buf (SegmentInfo.dmabuf_fd): on a build
    without FI_MR_DMABUF the open transport carries nothing on it (the core never hands it
    one), host memory still everything, and a registration names VKSHMEM_OFI_PREFIX."""
    if vko.vko_has_dmabuf():
        pytest.skip("built against a libfabric with FI_MR_DMABUF (tests/test_ofi_libfabric2.py)")
    assert vkshmem_ofi.SPEC.memory_kinds == {"host", "dmabuf"}  # what a build may offer
    tr = OfiTransport(context(0, 1))
    seg = Segment(0, 4096)
    try:
        assert tr.carries("opaque_fd", True) == frozenset()
        assert tr.carries("cuda_va", True) == frozenset()
        assert tr.carries("host") == {RMA, AMO}
        info = SegmentInfo(0, "opaque_fd", seg.address, 4096, seg.fd, seg.view,
                           dmabuf_fd=seg.fd)
        with pytest.raises(TransportError, match=r"FI_MR_DMABUF.*VKSHMEM_OFI_PREFIX"):
            tr.register(info)
    finally:
        tr.close()
        seg.close()


def test_dead_peer_times_out_naming_it() -> None:
    with Job(options={"provider": PROVIDERS["tcp"], "timeout": "1"}) as j:
        tr = j.t[0][0]
        tr.get(1, 0, 0, memoryview(bytearray(8)))
        j.t[0][1].close()
        start = time.monotonic()
        with pytest.raises(TransportError, match=r"PE 1 .*(no completion within 1 s|failed)"):
            tr.amo(1, 0, 0, AmoOp.FETCH, 8, 0, 0, True)
        assert time.monotonic() - start < 10


def test_options_are_validated() -> None:
    with pytest.raises(ConfigError, match=r"VKSHMEM_RAIL3.*unknown option 'bogus'"):
        OfiTransport(context(0, 1, rail=3, options={"bogus": "1"}))
    for key, value in [("timeout", "-1"), ("poll_us", "x"), ("idle_poll_us", "0"),
                       ("spin_us", "-5"), ("inject_amo", "maybe"), ("emulate", "frobnicate"),
                       ("emulate", "cswap"), ("force", "2")]:
        with pytest.raises(ConfigError, match=rf"VKSHMEM_RAIL0.*{key}"):
            OfiTransport(context(0, 1, options={key: value}))


@pytest.mark.parametrize("prov", ["net", "udp;ofi_rxd"])
def test_known_broken_providers_are_refused_by_name(prov: str) -> None:
    with pytest.raises(ConfigError, match=rf"VKSHMEM_RAIL0.*{prov}.*force=1"):
        OfiTransport(context(0, 1, options={"provider": prov}))


def test_an_unknown_provider_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(vkshmem_ofi.PROVIDER_VAR, "nosuchprov")
    with pytest.raises(TransportError, match=r"'nosuchprov'.*VKSHMEM_OFI_PROVIDER.*fi_info"):
        OfiTransport(contract.context(0, 1))


def test_sockets_provider_carries_puts_gets_and_amos() -> None:
    with Job(options={"provider": "sockets"}) as j:
        contract.put_get_random(j, rounds=20, nbi_gets=False)
        contract.compare_swap_success_and_failure(j, 8)
        contract.amo_fetching(j, AmoOp.ADD, 4, rounds=3)


def test_close_twice_no_leaked_threads_or_fds() -> None:
    contract.close_twice_without_leaks(Job, exact_threads=False, quiet_after_close_raises=True)


def test_misuse_of_a_closed_transport_raises() -> None:
    tr = OfiTransport(context(0, 1))
    tr.close()
    seg = Segment(0, 4096)
    try:
        with pytest.raises(TransportError, match="closed"):
            tr.address()
        with pytest.raises(TransportError, match="closed"):
            tr.register(seg.info())
    finally:
        seg.close()


def test_discovering_the_plugin_loads_no_libfabric() -> None:
    """Plugin discovery must not load libfabric (nor the native module that links it): an MPI
    library the mpi bootstrap loads later brings its own libfabric.so.1, and finding the
    system's already loaded under that soname it fails (FABRIC_1.9 not found)."""
    probe = ("import vkshmem_ofi; from vkshmem.core.config import load; "
             "from vkshmem.core.plugins.loader import load_plugins; p = load_plugins(load()); "
             "assert 'ofi' in p.transports; "
             "print(sum('libfabric' in line for line in open('/proc/self/maps')))")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "0", "libfabric is mapped after discovery"
