"""The verbs transport's data path under the shared transport contract, in one process, on two
back ends:

* ``model``: the plugin's software loopback model of a provider (``csrc/vkv_model.c``, not a
  NIC): the data path (``vkv_put``/``get``/``amo``/``quiet``, staging, inline, fence, the
  sequence-tagged waits, completion errors, timeouts) runs unchanged through libibverbs'
  inline ``ibv_post_send``/``ibv_poll_cq``, which the model serves by executing each WR on this
  process's memory after checking its opcode, keys and alignment. Runs everywhere.
* ``device``: a real RDMA device, wherever ``tests/rdma.py`` finds or creates one; skipped
  elsewhere with its reason (NOT run where this was written: there is no device).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

import pytest

from vkshmem.core.errors import ConfigError, TransportError
from vkshmem.core.transports.contract import AmoOp

pytest.importorskip("vkshmem_verbs")
from rdma import rdma_device
from vkshmem_verbs._options import Options
from vkshmem_verbs._transport import VerbsTransport
from vkshmem_verbs._verbs import ffi, lib

from vkshmem.testing import transport as contract
from vkshmem.testing.transport import word

DEVICE, WHY = rdma_device()
pytestmark = pytest.mark.timeout(180)
SEG_SIZES = {0: 1 << 20, 2: 64 * 1024}


class ModelTransport(VerbsTransport):
    """The verbs transport on the software loopback model instead of a device."""

    def _open_device(self, opts: Options) -> tuple[Any, str]:
        d = lib.vkv_open_model(opts.depth, opts.max_inline, opts.staging_kib * 1024,
                               opts.staging_slots)
        assert d != ffi.NULL
        return d, "model"

    def model(self, hold: int = -1, fail_next: int = -1) -> tuple[int, int, int, int]:
        """(fences, inline WRs, last RTR dest QPN, queued completions); sets the knobs."""
        out = ffi.new("uint64_t[4]")
        lib.vkv_model_control(self._d, hold, fail_next, out)
        return tuple(out)  # type: ignore[return-value]


class ModelJob(contract.Job[ModelTransport]):
    transport = ModelTransport
    seg_sizes = SEG_SIZES


class DeviceJob(contract.Job[VerbsTransport]):
    transport = VerbsTransport
    default_options = {"device": DEVICE or ""}
    seg_sizes = SEG_SIZES


JOBS = {"model": ModelJob, "device": DeviceJob}
BACKENDS = pytest.mark.parametrize("backend", [
    "model", pytest.param("device", marks=pytest.mark.skipif(DEVICE is None, reason=WHY))])


@pytest.fixture
def shm_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VKSHMEM_SHM", "0")  # every AMO goes through the NIC


@pytest.fixture(params=BACKENDS.args[1])
def job(request: pytest.FixtureRequest, shm_off: None) -> Iterator[contract.Job]:
    with JOBS[request.param]() as j:
        yield j


@pytest.fixture
def model_job(shm_off: None) -> Iterator[ModelJob]:
    with ModelJob() as j:
        yield j


# -- the contract, on both back ends -------------------------------------------------------------


def test_put_get_random(job: contract.Job) -> None:
    contract.put_get_random(job, rounds=150, nbi_gets=True)


def test_get_sees_an_earlier_put_without_quiet(job: contract.Job) -> None:
    contract.get_sees_an_earlier_put_without_quiet(job, rounds=30)


def test_put_and_get_typed_memoryviews(job: contract.Job) -> None:
    contract.put_and_get_typed_memoryviews(job)


def test_large_transfers(job: contract.Job) -> None:
    contract.large_transfers(job)


@BACKENDS
def test_concurrent_transfers_between_three_pes(backend: str, shm_off: None) -> None:
    with JOBS[backend](n=3, sizes={0: 9 << 20}) as j:
        contract.concurrent_transfers_between_three_pes(j)


def test_quiet_after_many_put_nbi(job: contract.Job) -> None:
    contract.quiet_after_many_put_nbi(job, 3000)


def test_quiet_and_fence_with_nothing_outstanding(job: contract.Job) -> None:
    contract.quiet_and_fence_with_nothing_outstanding(job)


@contract.ALL_OPS
@contract.WIDTHS
def test_amo_fetching(job: contract.Job, op: AmoOp, width: int) -> None:
    contract.amo_fetching(job, op, width, rounds=20)


@contract.NON_FETCHING_OPS
@contract.WIDTHS
def test_amo_non_fetching(job: contract.Job, op: AmoOp, width: int) -> None:
    contract.amo_non_fetching(job, op, width, cases=20, from_pes=(0, 1))


@contract.WIDTHS
def test_compare_swap_success_and_failure(job: contract.Job, width: int) -> None:
    contract.compare_swap_success_and_failure(job, width)


def test_amo_operands_are_masked_to_the_width(job: contract.Job) -> None:
    contract.amo_operands_are_masked_to_the_width(job)


def test_concurrent_fetch_add_from_threads(job: contract.Job) -> None:
    contract.concurrent_fetch_add_from_threads(job, threads=4, per_thread=300)


def test_range_errors_are_caught_before_sending(job: contract.Job) -> None:
    contract.range_errors_are_caught_before_sending(job)


@BACKENDS
def test_amos_refused_while_the_shm_path_applies_cpu_atomics(
        backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VKSHMEM_SHM", "1")
    with JOBS[backend]() as j:
        with pytest.raises(ConfigError, match="VKSHMEM_SHM=0 so every AMO goes through the NIC"):
            j.t[0][0].amo(1, 0, 0, AmoOp.ADD, 8, 1, 0, True)
        j.t[0][0].put(1, 0, 0, memoryview(b"puts ok!"))  # only AMOs are refused
        assert bytes(j.mem(1)[:8]) == b"puts ok!"
    with JOBS[backend](options={"atomics": "mixed", "device": DEVICE or ""}) as j:
        assert j.t[0][0].amo(1, 0, 0, AmoOp.ADD, 8, 5, 0, True) == 0
        assert word(j.mem(1), 0, 8) == 5


# -- the data path's own mechanics, on the model --------------------------------------------------


def test_small_puts_go_inline_registered_ones_zero_copy_others_staged(model_job: ModelJob) -> None:
    tr, mem = model_job.t[0][0], model_job.mem(1)
    tr.put(1, 0, 0, memoryview(b"x" * 64))  # max_inline: the NIC copies it at post
    assert tr.model()[1] == 1 and tr.stats()["staged_bytes"] == 0
    own = model_job.mem(0)  # PE 0's registered segment: sent from where it is
    own[4096:4096 + 1000] = b"z" * 1000
    tr.put(1, 0, 8192, own[4096:5096])
    assert tr.stats()["staged_bytes"] == 0 and bytes(mem[8192:9192]) == b"z" * 1000
    data = bytes(range(256)) * 800  # 200 KiB from private memory: 4 staging slots of 64 KiB
    tr.put_nbi(1, 0, 65536, memoryview(data))
    tr.quiet()
    assert tr.stats()["staged_bytes"] == len(data) and bytes(mem[65536:65536 + len(data)]) == data
    out = bytearray(len(data))
    tr.get(1, 0, 65536, memoryview(out))  # into private memory: staged too, slot by slot
    assert out == data
    s = tr.stats()
    assert s["posted"] == s["completed"] and s["outstanding"] == 0


def test_transfers_larger_than_the_staging_area_wrap_around_it(shm_off: None) -> None:
    """Four 16 KiB slots (64 KiB) carry 1 MiB each way: every slot is reused many times, a
    put's pieces waiting for slots its own earlier pieces hold."""
    opts = {"staging_kib": "16", "staging_slots": "4"}
    with ModelJob(options=opts, sizes={0: 2 << 20}) as j:
        tr, data = j.t[0][0], bytes(range(251)) * 4178  # ~1 MiB, not a multiple of a slot
        tr.put_nbi(1, 0, 4096, memoryview(data))
        tr.put(1, 0, 4096 + len(data), memoryview(data[:70000]))
        out = bytearray(len(data))
        tr.get(1, 0, 4096, memoryview(out))
        assert out == data and bytes(j.mem(1)[4096 + len(data):][:70000]) == data[:70000]
        assert tr.stats()["staged_bytes"] == len(data) + 70000


def test_fence_flags_the_next_work_request_to_each_pe(model_job: ModelJob) -> None:
    tr = model_job.t[0][0]
    tr.put(1, 0, 0, memoryview(b"a"))
    assert tr.model()[0] == 0
    tr.fence()
    tr.put(1, 0, 0, memoryview(b"b"))
    tr.put(1, 0, 0, memoryview(b"c"))
    assert tr.model()[0] == 1  # only the first after the fence
    tr.amo(0, 0, 0, AmoOp.ADD, 8, 1, 0, False)  # PE 0's flag was set by the fence too
    assert tr.model()[0] == 2


def test_each_qp_is_connected_to_the_peers_qp_for_this_pe(shm_off: None) -> None:
    from vkshmem_verbs._conn import ConnData

    with ModelJob(n=3) as j:
        data = [ConnData.decode(t.address(), pe, 3) for pe, t in enumerate(j.t[0])]
        for pe, t in enumerate(j.t[0]):  # connect went through PEs 0, 1, 2: 2 came last
            assert t.model()[2] == data[2].qps[pe][0]
        assert j.t[0][2].model()[2] == data[2].qps[2][0]  # PE 2's own QP: connected to itself


def test_a_failed_completion_is_named_and_fails_the_rail(model_job: ModelJob) -> None:
    tr = model_job.t[0][0]
    tr.model(fail_next=1)
    with pytest.raises(TransportError, match="put to PE 1 failed on model: work completion "
                       "remote access error"):
        tr.put(1, 0, 0, memoryview(b"x" * 100))
    with pytest.raises(TransportError, match="remote access error"):
        tr.get(1, 0, 0, memoryview(bytearray(8)))  # the rail stays failed
    with pytest.raises(TransportError, match="remote access error"):
        tr.quiet()


def test_a_missing_completion_times_out_and_fails_the_rail(shm_off: None) -> None:
    with ModelJob(options={"timeout": "0.2"}) as j:
        tr = j.t[0][0]
        tr.model(hold=1)  # completions are withheld: a peer that never answers
        with pytest.raises(TransportError, match=r"get from PE 1: no completion in 0.2 s "
                           r"\(VKSHMEM_RAIL0 \(timeout=\)\)"):
            tr.get(1, 0, 0, memoryview(bytearray(8)))
        tr.model(hold=0)  # the late completion arrives: the rail is still refused
        with pytest.raises(TransportError, match="unusable"):
            tr.put(1, 0, 0, memoryview(b"late"))


def test_close_twice_without_leaks(shm_off: None) -> None:
    fds, threads = contract.fd_count(), contract.thread_count()
    j = ModelJob(n=3)
    for src in range(3):
        for dst in range(3):
            j.t[0][src].put(dst, 0, 0, memoryview(b"abc"))
            j.t[0][src].amo(dst, 0, 8, AmoOp.ADD, 8, 1, 0, True)
        j.t[0][src].quiet()
    assert contract.thread_count() == threads  # no progress thread
    assert struct.unpack_from("<Q", j.mem(1), 8)[0] == 3
    j.close()
    for tr in j.t[0]:
        tr.close()
        with pytest.raises(TransportError, match="closed"):
            tr.put(1, 0, 0, memoryview(b"x"))
    assert contract.fd_count() == fds
