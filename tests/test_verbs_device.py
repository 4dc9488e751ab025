"""The verbs transport on a real RDMA device: the shared transport contract, in one process.

Runs wherever ``/sys/class/infiniband`` lists a device or a soft RoCE device can be created
(``tests/rdma.py``); elsewhere every test is skipped with the reason that probe found. Written
against the contract the other transports pass; NOT run where it was written (no device).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from vkshmem.core.transport import AmoOp

pytest.importorskip("vkshmem_verbs")
import transport_contract as contract
from rdma import rdma_device
from vkshmem_verbs._transport import VerbsTransport

DEVICE, WHY = rdma_device()
pytestmark = [pytest.mark.timeout(180), pytest.mark.skipif(DEVICE is None, reason=WHY)]


class Job(contract.Job[VerbsTransport]):
    """``n`` PEs of one node, each with one verbs transport per rail on the same device."""

    transport = VerbsTransport
    default_options = {"device": DEVICE or ""}
    seg_sizes = {0: 1 << 20, 2: 64 * 1024}


@pytest.fixture
def job(monkeypatch: pytest.MonkeyPatch) -> Iterator[Job]:
    monkeypatch.setenv("VKSHMEM_SHM", "0")  # every AMO goes through the NIC
    with Job() as j:
        yield j


def test_stats_report_the_port_and_the_amo_table(job: Job) -> None:
    s = job.t[0][0].stats()
    assert s["device"] == DEVICE and s["active_mtu"] in (256, 512, 1024, 2048, 4096)
    assert s["amo"][("add", 8, 0)] == "nic fetch-add"


def test_put_get_random(job: Job) -> None:
    contract.put_get_random(job, rounds=150, nbi_gets=True)


def test_get_sees_an_earlier_put_without_quiet(job: Job) -> None:
    contract.get_sees_an_earlier_put_without_quiet(job, rounds=30)


def test_put_and_get_typed_memoryviews(job: Job) -> None:
    contract.put_and_get_typed_memoryviews(job)


def test_large_transfers(job: Job) -> None:
    contract.large_transfers(job)


def test_concurrent_transfers_between_three_pes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VKSHMEM_SHM", "0")
    with Job(n=3, sizes={0: 9 << 20}) as j:
        contract.concurrent_transfers_between_three_pes(j)


def test_quiet_after_many_put_nbi(job: Job) -> None:
    contract.quiet_after_many_put_nbi(job, 3000)


def test_quiet_and_fence_with_nothing_outstanding(job: Job) -> None:
    contract.quiet_and_fence_with_nothing_outstanding(job)


@contract.ALL_OPS
@contract.WIDTHS
def test_amo_fetching(job: Job, op: AmoOp, width: int) -> None:
    contract.amo_fetching(job, op, width, rounds=20)


@contract.NON_FETCHING_OPS
@contract.WIDTHS
def test_amo_non_fetching(job: Job, op: AmoOp, width: int) -> None:
    contract.amo_non_fetching(job, op, width, cases=20, from_pes=(0, 1))


@contract.WIDTHS
def test_compare_swap_success_and_failure(job: Job, width: int) -> None:
    contract.compare_swap_success_and_failure(job, width)


def test_amo_operands_are_masked_to_the_width(job: Job) -> None:
    contract.amo_operands_are_masked_to_the_width(job)


def test_concurrent_fetch_add_from_threads(job: Job) -> None:
    contract.concurrent_fetch_add_from_threads(job, threads=4, per_thread=500)


def test_range_errors_are_caught_before_sending(job: Job) -> None:
    contract.range_errors_are_caught_before_sending(job)


def test_amos_refused_while_the_shm_path_applies_cpu_atomics(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("VKSHMEM_SHM", "1")
    with Job() as j:
        with pytest.raises(Exception, match="VKSHMEM_SHM=0"):
            j.t[0][0].amo(1, 0, 0, AmoOp.ADD, 8, 1, 0, True)
        j.t[0][0].put(1, 0, 0, memoryview(b"puts ok!"))  # only AMOs are refused
