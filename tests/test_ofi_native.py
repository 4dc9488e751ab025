"""The ofi transport's C data path for the core's compiled hot path (``OfiTransport.native_ops``,
``csrc/vko_native.c``).

Across processes (the launcher, 1/2/4 PEs, ``VKSHMEM_SHM=0``) over ``shm`` and
``tcp;ofi_rxm``: tests/pe/ofi_native.py checks put/get (blocking and nbi), fence, quiet and
every AMO, and that they ran in C (the transport's ``native_calls`` grows, its Python methods
are not called), also with AMOs forced onto the compare-and-swap fallback (``emulate=``).

In one process (two real transports, as in test_ofi_unit.py): the struct's functions called
directly through ctypes, for the VK_NATIVE_TRY protocol (what completes with the GIL held,
what answers AGAIN), quiet deferring to Python while it holds non-blocking buffers, and the
statuses of a dead peer (timeout) and of a failed job (the core's liveness word), which
``native_error`` turns into the errors the Python methods raise.
"""

from __future__ import annotations

import ctypes
import os
import time

import pytest
from test_multipe import MODES, launch

from vkshmem.core.errors import ConfigError, TransportError
from vkshmem.core.transports.contract import AmoOp

pytest.importorskip("vkshmem_ofi")
from test_ofi_unit import PROVIDERS, Job
from vkshmem_ofi._ofi import lib as vko

from vkshmem.testing import transport as contract

pytestmark = pytest.mark.timeout(120)

# vkshmem/core/_native.h: VK_NATIVE_TRY, VK_NATIVE_AGAIN, VK_NATIVE_PYTHON
TRY, AGAIN, PYTHON = 2, 1, 2

_RMA = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int32, ctypes.c_uint32,
                        ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
_AMO = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int32, ctypes.c_uint32,
                        ctypes.c_uint64, ctypes.c_int, ctypes.c_int, ctypes.c_uint64,
                        ctypes.c_uint64, ctypes.c_int, ctypes.POINTER(ctypes.c_uint64))
_SYNC = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int)


class Ops(ctypes.Structure):
    """``struct vk_native_ops``."""

    _fields_ = [("self", ctypes.c_void_p), ("put", _RMA), ("get", _RMA), ("amo", _AMO),
                ("quiet", _SYNC), ("fence", _SYNC), ("flags", ctypes.c_uint)]


def ops_of(tr: object) -> Ops:
    address = tr.native_ops()  # type: ignore[attr-defined]
    assert address
    return Ops.from_address(address)


# -- across processes ---------------------------------------------------------------------------


@pytest.mark.parametrize("npes", [1, 2, 4])
@pytest.mark.parametrize("mode", ["ofi-shm", "ofi-tcp"])
def test_rma_amos_quiet_fence_run_in_c(mode: str, npes: int) -> None:
    r = launch("ofi_native", npes, MODES[mode])
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert r.stdout.count("ofi native ok") == npes, r.stdout
    assert "emulated: []" in r.stdout, r.stdout


@pytest.mark.parametrize("prov,npes,emulate", [
    ("shm", 4, "all"), ("tcp;ofi_rxm", 2, "fetch_add,and,xor,set,swap")])
def test_the_compare_and_swap_fallback_runs_under_the_c_path(prov: str, npes: int,
                                                              emulate: str) -> None:
    """AMOs the provider is taken not to have (emulate=) still go through the C path, as
    compare-and-swap loops, and stay atomic under contention from every PE."""
    env = {"VKSHMEM_SHM": "0", "VKSHMEM_RAIL0": f"ofi:provider={prov}:emulate={emulate}"}
    r = launch("ofi_native", npes, env)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert r.stdout.count("ofi native ok") == npes, r.stdout
    assert "emulated: []" not in r.stdout and "fetch_add/64" in r.stdout, r.stdout


# -- in one process: the struct's functions themselves ---------------------------------------


@pytest.mark.parametrize("prov", list(PROVIDERS))
def test_try_calls_do_only_what_needs_no_wait(prov: str) -> None:
    with Job(options={"provider": PROVIDERS[prov]}) as j:
        tr = j.t[0][0]
        ops = ops_of(tr)
        assert ops.flags & 1 and ops.self
        small, large = ctypes.create_string_buffer(b"x" * 64), ctypes.create_string_buffer(4096)
        out = ctypes.c_uint64()
        assert ops.get(ops.self, 1, 0, 0, large, 8, 0) == 0  # connected (rxm: EAGAIN before)
        # a small put is copied and posted (0); a large one, a get and a fetching AMO would
        # wait (AGAIN, nothing done); the blocking calls then do them
        assert ops.put(ops.self, 1, 0, 128, small, 64, TRY) == 0
        assert ops.put(ops.self, 1, 0, 4096, large, 4096, TRY) == AGAIN
        assert ops.get(ops.self, 1, 0, 128, large, 64, TRY) == AGAIN
        assert ops.amo(ops.self, 1, 0, 0, int(AmoOp.ADD), 8, 5, 0, 1 | TRY, out) == AGAIN
        assert ops.quiet(ops.self, 0) == 0
        assert bytes(j.mem(1)[128:192]) == b"x" * 64
        assert ops.quiet(ops.self, TRY) == 0  # nothing outstanding
        assert ops.amo(ops.self, 1, 0, 0, int(AmoOp.ADD), 8, 5, 0, TRY, out) == 0
        assert ops.quiet(ops.self, 0) == 0
        assert contract.word(j.mem(1), 0, 8) == 5
        assert ops.amo(ops.self, 1, 0, 0, int(AmoOp.ADD), 8, 2, 0, 1, out) == 0
        assert out.value == 5 and contract.word(j.mem(1), 0, 8) == 7
        assert ops.get(ops.self, 1, 0, 128, large, 64, 0) == 0 and large.raw[:64] == b"x" * 64
        assert ops.fence(ops.self, TRY) == 0 and ops.fence(ops.self, 0) == 0
        # while a put is in flight a non-fetching AMO would wait for it (AGAIN)
        assert ops.put(ops.self, 1, 0, 4096, large, 4096, 0) == 0
        assert ops.amo(ops.self, 1, 0, 0, int(AmoOp.ADD), 8, 1, 0, TRY, out) in (0, AGAIN)
        assert ops.quiet(ops.self, 0) == 0
        assert tr.stats()["native_calls"] >= 14


def test_quiet_defers_to_python_while_it_holds_nbi_buffers() -> None:
    with Job() as j:
        tr = j.t[0][0]
        ops = ops_of(tr)
        buf = bytearray(b"y" * 1024)  # larger than the bounce: held until quiet
        tr.put_nbi(1, 0, 256, memoryview(buf))
        assert ops.quiet(ops.self, 0) == PYTHON and ops.quiet(ops.self, TRY) == PYTHON
        tr.quiet()
        assert bytes(j.mem(1)[256:1280]) == bytes(buf)
        assert ops.quiet(ops.self, TRY) == 0


def test_a_dead_peer_and_a_failed_job_end_the_wait_with_their_errors() -> None:
    with Job(options={"provider": PROVIDERS["tcp"], "timeout": "1"}) as j:
        tr = j.t[0][0]
        ops = ops_of(tr)
        out = ctypes.c_uint64()
        assert ops.amo(ops.self, 1, 0, 0, int(AmoOp.FETCH), 8, 0, 0, 1, out) == 0
        j.t[0][1].close()
        start = time.monotonic()
        rc = ops.amo(ops.self, 1, 0, 0, int(AmoOp.FETCH), 8, 0, 0, 1, out)
        assert rc < 0 and time.monotonic() - start < 10
        err = tr.native_error(rc, "AMO on", 1, 0, 0, 8, None)
        assert isinstance(err, TransportError)
        assert "PE 1" in str(err) and ("no completion within 1 s" in str(err) or
                                       "failed" in str(err)), err
    with Job(options={"provider": PROVIDERS["tcp"], "timeout": "30"}) as j:
        tr = j.t[0][0]
        words = (ctypes.c_uint64 * 3)(1, 0, 1)  # the core's liveness words: PE 1 failed
        vko.vko_set_self(tr._shared.ctx, 0, ctypes.addressof(words))
        j.t[0][1].close()
        ops = ops_of(tr)
        start = time.monotonic()
        rc = ops.amo(ops.self, 1, 0, 0, int(AmoOp.FETCH), 8, 0, 0, 1, out)
        assert time.monotonic() - start < 10
        assert rc == vko.VK_ST_FAILED
        err = tr.native_error(rc, "AMO on", 1, 0, 0, 8, None)
        assert "PE 1" in str(err) and "a PE of the job failed" in str(err), err
        assert "a PE of the job failed" in str(tr.native_error(rc, "quiet", -1, 0, 0, 0, None))


def test_the_rail_option_native_0_keeps_the_python_methods() -> None:
    with Job(options={"provider": PROVIDERS["tcp"], "native": "0"}) as j:
        assert j.t[0][0].native_ops() == 0
    with pytest.raises(ConfigError, match=r"VKSHMEM_RAIL0.*native='maybe'"):
        Job(options={"native": "maybe"})


@pytest.mark.parametrize("npes", [2, 3])
def test_the_busy_window_spins_unless_the_node_has_more_pes_than_cpus(npes: int) -> None:
    with Job(n=npes, options={"provider": PROVIDERS["shm"]}) as j:
        assert j.t[0][0].stats()["busy_yield"] == (npes > (os.cpu_count() or 1))
