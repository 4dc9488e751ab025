"""The transport contract, collected: :class:`TransportContract`, run against one transport.

The class holds one test per promise of :class:`~vkshmem.core.transports.contract.Transport`, in one
process (a :class:`~vkshmem.testing.job.Job` of hand-opened transports, calling the checks of
:mod:`vkshmem.testing.transport`) and under the launcher (PE jobs of 1, 2 and 4 PEs that reach
each other through the transport alone). What a test needs that the transport's spec does not
declare (an AMO it does not do, host memory, same-node reach) is skipped, with the reason.

The tests take the fixture ``vkshmem_transport``, a :class:`TransportUnderTest`. The pytest
plugin (``pytest_plugins = ["vkshmem.testing"]``) provides it from ``--vkshmem-transport=NAME``
and collects the class on its own; a subclass named ``Test...`` in a test module may provide it
in its body instead (as a fixture method), e.g. to test a transport not installed.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

import vkshmem.testing.transport as contract
from vkshmem.core.config import Config
from vkshmem.core.errors import InvalidArgumentError, VkshmemError
from vkshmem.core.plugins.apiversion import check_api_version
from vkshmem.core.plugins.loader import load_plugins
from vkshmem.core.transports.contract import AmoOp, PeerInfo, TransportSpec

from .job import Job, fd_count
from .launch import check_pes, pe_script, run_pes

__all__ = ["TransportContract", "TransportUnderTest"]


@dataclass(frozen=True)
class TransportUnderTest:
    """The transport a :class:`TransportContract` checks, and where it legitimately differs.

    ``distribution`` is the distribution that registers it (None: not installed, so the PEs
    the launcher starts cannot find it and the multi-PE tests are skipped). ``options`` are its
    rail options (``VKSHMEM_RAIL0=name:key=value``), ``env`` more variables for the PE jobs.
    ``progress_threads``: the threads each open transport runs (checked exactly; None: not
    checked). ``quiet_after_close_raises``: ``quiet`` on a closed transport raises (else it
    may do nothing). ``cpu_atomics``: its AMOs are atomic with the core's CPU atomics on the
    same word (they go through ``TransportContext.amo_function`` or the same instructions).
    ``rounds`` scales the randomized tests.
    """

    spec: TransportSpec
    distribution: str | None = None
    options: Mapping[str, str] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    seg_sizes: Mapping[int, int] = field(default_factory=lambda: {0: 1 << 20, 1: 64 * 1024})
    progress_threads: int | None = None
    quiet_after_close_raises: bool = False
    cpu_atomics: bool = True
    rounds: int = 100
    timeout: int = 120

    @classmethod
    def from_registry(cls, name: str, **kwargs: Any) -> TransportUnderTest:
        """The transport ``name`` as vkshmem finds it: registered through an entry point of
        an installed distribution (``kwargs``: the other fields)."""
        reg = load_plugins(Config({}))
        if name not in reg.transports:
            raise LookupError(f"no transport {name!r} is registered (registered: "
                              f"{', '.join(sorted(reg.transports)) or 'none'}): is the plugin "
                              "installed in this environment?")
        return cls(reg.transports[name], reg.origin.get(name), **kwargs)

    @property
    def name(self) -> str:
        """The transport's name."""
        return self.spec.name

    def job_class(self) -> type[Job[Any]]:
        """The :class:`Job` class opening this transport with its options."""
        return Job.of(self.spec.factory, dict(self.options), dict(self.seg_sizes))

    def does(self, op: AmoOp, width: int) -> bool:
        """Whether the spec declares AMO ``op`` on ``width``-byte words."""
        return op in self.spec.amo_ops and width in self.spec.amo_widths

    def need_amo(self, *needs: tuple[AmoOp, int]) -> None:
        """Skip the calling test unless the spec declares every ``(op, width)`` of ``needs``."""
        for op, width in needs:
            if not self.does(op, width):
                pytest.skip(f"{self.name} does not declare {op.name} on {width}-byte words")

    def pe_env(self) -> dict[str, str]:
        """The variables of a PE job that moves everything through this transport."""
        env = {"VKSHMEM_SHM": "0", "VKSHMEM_TRANSPORTS": self.name}
        if self.options:
            env["VKSHMEM_RAIL0"] = ":".join([self.name,
                                             *(f"{k}={v}" for k, v in self.options.items())])
        return {**env, **self.env}


class TransportContract:
    """The transport contract as tests (see the module docstring); subclass it as ``Test...``
    with a ``vkshmem_transport`` fixture, or let the pytest plugin collect it."""

    @pytest.fixture
    def job(self, vkshmem_transport: TransportUnderTest) -> Iterator[Job[Any]]:
        """A two-PE job of the transport under test (host memory)."""
        if "host" not in vkshmem_transport.spec.memory_kinds:
            pytest.skip(f"{vkshmem_transport.name} does not register host memory")
        with vkshmem_transport.job_class()() as j:
            yield j

    # -- the spec ----------------------------------------------------------------------------

    def test_spec_is_well_formed(self, vkshmem_transport: TransportUnderTest) -> None:
        spec = vkshmem_transport.spec
        assert isinstance(spec, TransportSpec)
        assert spec.name and spec.name.isidentifier(), spec.name
        assert callable(spec.factory)
        assert check_api_version(spec.api_version) is None
        assert spec.reach and spec.reach <= {"intra", "inter"}, spec.reach
        assert spec.amo_widths <= {4, 8} and spec.amo_ops <= set(AmoOp)
        assert spec.memory_kinds, "a transport registers some memory"
        for name, default, meaning in spec.variables:
            assert name.startswith("VKSHMEM_") and isinstance(default, str) and meaning

    def test_reaches_only_peers_that_opened_it(self, job: Job[Any]) -> None:
        tr = job.t[0][0]
        assert not tr.reaches(PeerInfo(1, "node0", True, None, {}))

    # -- RMA ---------------------------------------------------------------------------------

    def test_put_get_random(self, job: Job[Any], vkshmem_transport: TransportUnderTest) -> None:
        contract.put_get_random(job, rounds=vkshmem_transport.rounds, nbi_gets=True)

    def test_get_sees_an_earlier_put_without_quiet(
        self, job: Job[Any], vkshmem_transport: TransportUnderTest,
    ) -> None:
        vkshmem_transport.need_amo((AmoOp.SET, 8), (AmoOp.FETCH, 8))
        contract.get_sees_an_earlier_put_without_quiet(job, rounds=20)

    def test_put_and_get_typed_memoryviews(self, job: Job[Any]) -> None:
        contract.put_and_get_typed_memoryviews(job)

    def test_large_transfers(self, job: Job[Any]) -> None:
        contract.large_transfers(job)

    def test_concurrent_transfers_between_three_pes(
        self, vkshmem_transport: TransportUnderTest,
    ) -> None:
        if "host" not in vkshmem_transport.spec.memory_kinds:
            pytest.skip(f"{vkshmem_transport.name} does not register host memory")
        with vkshmem_transport.job_class()(n=3, sizes={0: 9 << 18}) as j:
            contract.concurrent_transfers_between_three_pes(j)

    def test_quiet_after_many_put_nbi(self, job: Job[Any]) -> None:
        contract.quiet_after_many_put_nbi(job, 2000)

    def test_quiet_and_fence_with_nothing_outstanding(self, job: Job[Any]) -> None:
        contract.quiet_and_fence_with_nothing_outstanding(job)

    # -- AMOs --------------------------------------------------------------------------------

    @contract.WIDTHS
    @contract.ALL_OPS
    def test_amo_fetching(self, job: Job[Any], vkshmem_transport: TransportUnderTest,
                          op: AmoOp, width: int) -> None:
        vkshmem_transport.need_amo((op, width))
        # the core never asks SET for the old word (it asks SWAP)
        contract.amo_fetching(job, op, width, rounds=20, set_fetches=False)

    @contract.WIDTHS
    @contract.NON_FETCHING_OPS
    def test_amo_non_fetching(self, job: Job[Any], vkshmem_transport: TransportUnderTest,
                              op: AmoOp, width: int) -> None:
        vkshmem_transport.need_amo((op, width))
        # what a non-fetching AMO returns is the transport's business
        contract.amo_non_fetching(job, op, width, cases=30, from_pes=(0, 1), returns_zero=False)

    @contract.WIDTHS
    def test_compare_swap_success_and_failure(
        self, job: Job[Any], vkshmem_transport: TransportUnderTest, width: int,
    ) -> None:
        vkshmem_transport.need_amo((AmoOp.CSWAP, width))
        contract.compare_swap_success_and_failure(job, width)

    def test_amo_operands_are_masked_to_the_width(
        self, job: Job[Any], vkshmem_transport: TransportUnderTest,
    ) -> None:
        vkshmem_transport.need_amo((AmoOp.ADD, 4))
        contract.amo_operands_are_masked_to_the_width(job)

    def test_concurrent_fetch_add_from_threads(
        self, job: Job[Any], vkshmem_transport: TransportUnderTest,
    ) -> None:
        vkshmem_transport.need_amo((AmoOp.ADD, 8))
        contract.concurrent_fetch_add_from_threads(job, threads=4, per_thread=200)

    def test_amos_are_atomic_across_two_rails(self, vkshmem_transport: TransportUnderTest,
                                              ) -> None:
        vkshmem_transport.need_amo((AmoOp.ADD, 8))
        if "host" not in vkshmem_transport.spec.memory_kinds:
            pytest.skip(f"{vkshmem_transport.name} does not register host memory")
        cpu_adds = 300 if vkshmem_transport.cpu_atomics else 0
        with vkshmem_transport.job_class()(n=2, rails=2) as j:
            contract.amos_are_atomic_across_two_rails(j, per_thread=300, cpu_adds=cpu_adds)

    # -- bad requests ------------------------------------------------------------------------

    def test_bad_requests_raise_and_leave_it_usable(
        self, job: Job[Any], vkshmem_transport: TransportUnderTest,
    ) -> None:
        """Out-of-range, unknown-segment, misaligned and wrong-width requests raise (a
        :class:`~vkshmem.core.errors.VkshmemError`; out of range: InvalidArgumentError) on
        the initiator, touch nothing, and leave the transport usable."""
        tr, mem = job.t[0][0], job.mem(1)
        size = job.sizes[0]
        mem[size - 16:] = b"\x5a" * 16
        with pytest.raises(InvalidArgumentError):
            tr.put(1, 0, size - 4, memoryview(b"12345678"))
        with pytest.raises(InvalidArgumentError):
            tr.get(1, 0, size, memoryview(bytearray(1)))
        with pytest.raises(VkshmemError):
            tr.put(1, 7, 0, memoryview(b"x"))
        if vkshmem_transport.does(AmoOp.ADD, 8):
            with pytest.raises(InvalidArgumentError):
                tr.amo(1, 0, size, AmoOp.ADD, 8, 1, 0, True)
            with pytest.raises(InvalidArgumentError):
                tr.amo(1, 0, 6, AmoOp.ADD, 8, 1, 0, True)
        with pytest.raises(InvalidArgumentError):
            tr.amo(1, 0, 0, AmoOp.ADD, 2, 1, 0, True)
        tr.quiet()
        assert mem[size - 16:] == b"\x5a" * 16
        tr.put(1, 0, 0, memoryview(struct.pack("<Q", 42)))
        tr.quiet()
        assert mem[:8] == struct.pack("<Q", 42)

    def test_the_same_segment_registers_twice(self, job: Job[Any]) -> None:
        seg = job.segs[0][0]
        assert isinstance(job.t[0][0].register(seg.info()), bytes)

    # -- lifetime ----------------------------------------------------------------------------

    def test_close_twice_without_leaks(self, vkshmem_transport: TransportUnderTest) -> None:
        if "host" not in vkshmem_transport.spec.memory_kinds:
            pytest.skip(f"{vkshmem_transport.name} does not register host memory")
        fds = fd_count()
        threads = vkshmem_transport.progress_threads
        contract.close_twice_without_leaks(
            vkshmem_transport.job_class(), exact_threads=threads is not None,
            quiet_after_close_raises=vkshmem_transport.quiet_after_close_raises,
            progress_threads=threads or 0)
        assert fd_count() == fds

    # -- PE jobs under the launcher ----------------------------------------------------------

    @pytest.mark.parametrize("npes", [1, 2, 4])
    def test_carries_a_job(self, vkshmem_transport: TransportUnderTest, npes: int) -> None:
        """``vkshmem run -n npes`` with the shm path off and only this transport: every PE's
        one route is it, and RMA, AMOs, signals and collectives work."""
        if vkshmem_transport.distribution is None:
            pytest.skip(f"{vkshmem_transport.name} is not installed: the PEs find transports "
                        "through entry points")
        if "intra" not in vkshmem_transport.spec.reach:
            pytest.skip(f"{vkshmem_transport.name} does not reach PEs of this node")
        r = run_pes(pe_script("transport_job"), npes, vkshmem_transport.pe_env(),
                    timeout=vkshmem_transport.timeout)
        check_pes(r, "transport_job", npes)
        routes = [line for line in r.stdout.splitlines() if "routes: [" in line]
        assert len(routes) == npes, r.stdout
        want = f"routes: ['{vkshmem_transport.name}']"
        assert all(line.endswith(want) for line in routes), routes
