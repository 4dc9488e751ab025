"""The compiled hot path (vkshmem.core._fast), in this process as a job of one PE: every entry
does the work of its Python function in C when it can, and otherwise (a bad PE, bounds, a
non-contiguous or read-only array, another dtype, a context, ...) hands the call, untouched,
to that function, so errors keep their classes and messages."""

from __future__ import annotations

import contextlib
import ctypes
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from vkshmem.core import _fast, fast
from vkshmem.core.errors import VkshmemError

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def shmem() -> Iterator[Any]:
    """The API with a one-PE runtime running in this process (finalized afterwards)."""
    from vkshmem._api import (
        alloc,
        amo,
        amo_nbi,
        collectives,
        lifecycle,
        reductions,
        rma,
        signal,
        sync,
        team,
    )

    lifecycle.init()
    api = type("Api", (), {})()
    for mod in (alloc, amo, amo_nbi, collectives, lifecycle, reductions, rma, signal, sync,
                team):
        for name in mod.__all__:
            setattr(api, name, getattr(mod, name))
    try:
        yield api
    finally:
        lifecycle.finalize()


def same_error(fn: Callable[..., Any], *args: Any, **kw: Any) -> BaseException:
    """``fn`` (an entry) and its Python function raise the same error for these arguments."""
    with pytest.raises(Exception) as fast_exc:
        fn(*args, **kw)
    with pytest.raises(Exception) as py_exc:
        fn.__wrapped__(*args, **kw)
    assert type(fast_exc.value) is type(py_exc.value)
    assert str(fast_exc.value) == str(py_exc.value)
    return fast_exc.value


def test_entries_look_like_their_python_functions(shmem: Any) -> None:
    put = shmem.put
    assert isinstance(put, _fast.FastCall) and inspect.isfunction(put.__wrapped__)
    assert put.__name__ == "put" and put.__doc__ == put.__wrapped__.__doc__
    assert list(inspect.signature(put).parameters) == ["target", "source", "pe", "size", "ctx",
                                                      "stream"]
    assert "put" in repr(put)


def test_fast_paths_do_the_work_without_python(shmem: Any) -> None:
    """Spied Python functions: the fast path calls them only for what it does not take."""
    calls: list[str] = []

    def put(target: Any, source: Any, pe: Any, size: Any = None, ctx: Any = None) -> None:
        calls.append("put")

    def atomic_fetch_add(target: Any, value: Any, pe: Any, ctx: Any = None) -> Any:
        calls.append("fadd")

    fput = fast.entry("put", put)
    fadd = fast.entry("amo", atomic_fetch_add, op=4, fetch=True, ints_only=True)
    a = shmem.zeros(8, np.int64)
    fput(a, np.arange(8, dtype=np.int64), 0)
    fput(a[2:4], np.full(5, 7, np.int64), pe=0, size=2)
    assert calls == [] and a.tolist() == [0, 1, 7, 7, 4, 5, 6, 7]
    assert fadd(a[:1], 5, 0) == 0 and fadd(a[:1], value=-1, pe=0) == 5 and a[0] == 4
    assert calls == []
    fput(a, np.zeros(8, np.int32), 0)  # another dtype
    fput(a[::2], np.zeros(4, np.int64), 0)  # not contiguous
    fput(np.zeros(8, np.int64), a, 0)  # not symmetric
    fput(a, a, 1)  # no such PE
    fput(a, a, 0, ctx=object())  # a context
    with pytest.raises(TypeError, match="nosuch"):
        fput(a, a, 0, nosuch=1)  # an unknown keyword: Python's own error
    fadd(a[:1], 1.5, 0)  # not an integer operand
    fadd(a[:1], True, 0)  # a bool: the Python path decides
    assert calls == ["put"] * 5 + ["fadd"] * 2


def test_rma_moves_data(shmem: Any) -> None:
    a = shmem.zeros(16, np.float64)
    src = np.linspace(0, 1, 16)
    shmem.put(a, src, 0)
    shmem.quiet()
    out = np.empty(16)
    shmem.get(out, a, 0)
    assert np.array_equal(out, src) and np.array_equal(a, src)
    big = shmem.zeros(1 << 17, np.uint8)  # a copy large enough to release the GIL
    shmem.put_nbi(big, np.full(1 << 17, 3, np.uint8), 0)
    back = np.zeros(1 << 17, np.uint8)
    shmem.get_nbi(back, big, 0)
    shmem.quiet()
    assert (back == 3).all()
    shmem.put(a, np.zeros((2, 2)), 0, size=3)  # any shape: elements in memory order
    assert a[:3].tolist() == [0, 0, 0] and a[3] == src[3]


def test_rma_errors_are_the_python_functions(shmem: Any) -> None:
    a = shmem.zeros(8, np.int64)
    src = np.ones(8, np.int64)
    for fn in (shmem.put, shmem.put_nbi):
        assert "does not exist" in str(same_error(fn, a, src, 3))
        same_error(fn, a, src, -1)
        same_error(fn, a, src, "0")
        same_error(fn, a, src, 0, 9)  # size beyond both arrays
        same_error(fn, a, src, 0, -1)
        same_error(fn, a, src.astype(np.int32), 0)  # dtype mismatch
        same_error(fn, np.zeros(8, np.int64), src, 0)  # not symmetric
        same_error(fn, a[::2], src, 0)  # not contiguous
        same_error(fn, a, [1, 2], 0)  # not an array
        same_error(fn, a.astype(object), src.astype(object), 0)
    ro = np.ones(8, np.int64)
    ro.flags.writeable = False
    for fn in (shmem.get, shmem.get_nbi):
        same_error(fn, np.empty(8, np.int64), a, 4)
        assert "read-only" in str(same_error(fn, ro, a, 0))
        same_error(fn, np.empty(8, np.int64), np.ones(8, np.int64), 0)  # source not symmetric
        same_error(fn, np.empty(4, np.float64), a, 0)


def test_amos(shmem: Any) -> None:
    w = shmem.zeros(4, np.int64)
    u = shmem.zeros(2, np.uint32)
    f = shmem.zeros(2, np.float32)
    x = w[1:2]
    assert shmem.atomic_fetch_add(x, -3, 0) == 0 and shmem.atomic_fetch(x, 0) == -3
    assert shmem.atomic_compare_swap(x, -3, 10, 0) == -3 and x[0] == 10
    shmem.atomic_inc(x, 0)
    assert shmem.atomic_fetch_inc(x, 0) == 11 and shmem.atomic_swap(x, 2**63 - 1, 0) == 12
    shmem.atomic_add(x, 1, 0)  # wraps
    assert x[0] == -(2**63)
    assert shmem.atomic_fetch_xor(u[:1], -1, 0) == 0 and u[0] == 2**32 - 1
    shmem.atomic_and(u[:1], 0xF0, 0)
    shmem.atomic_or(u[:1], 1, 0)
    assert shmem.atomic_fetch_and(u[:1], 0xFF, 0) == 0xF1
    shmem.atomic_set(f[1:], 2.5, 0)
    assert shmem.atomic_swap(f[1:], 1e30, 0) == 2.5
    assert shmem.atomic_fetch(f[1:], 0) == np.float32(1e30)
    shmem.atomic_op(x, 5, shmem_amo("set"), 0)
    assert shmem.atomic_fetch_op(x, 1, "inc", 0) == 5 and x[0] == 6
    fetch = np.zeros(1, np.int64)
    shmem.atomic_fetch_add_nbi(fetch, x, 4, 0)
    shmem.atomic_compare_swap_nbi(fetch[:1], x, 10, 0, 0)
    assert fetch[0] == 10 and x[0] == 0
    shmem.atomic_fetch_op_nbi(fetch, x, 7, "set", 0)
    assert fetch[0] == 0 and x[0] == 7


def shmem_amo(name: str) -> Any:
    from vkshmem._api.enums import AMO

    return AMO(name)


def test_amo_errors_are_the_python_functions(shmem: Any) -> None:
    w = shmem.zeros(4, np.int64)
    f = shmem.zeros(2, np.float64)
    same_error(shmem.atomic_fetch_add, w[:1], 1, 7)  # bad PE
    same_error(shmem.atomic_fetch_add, w[:2], 1, 0)  # two elements
    same_error(shmem.atomic_fetch_add, w[:1], 1.5, 0)  # not an integer
    same_error(shmem.atomic_fetch_add, f[:1], 1, 0)  # float target of an integer AMO
    same_error(shmem.atomic_add, np.zeros(1, np.int64), 1, 0)  # not symmetric
    same_error(shmem.atomic_add, w.view(np.int8)[1:2], 1, 0)  # an int8 word
    same_error(shmem.atomic_set, w.view(np.int32)[1:2].view(np.float32), 1e300, 0)
    same_error(shmem.atomic_compare_swap, w[:1], "x", 1, 0)
    same_error(shmem.atomic_op, w[:1], 1, "avg", 0)
    same_error(shmem.atomic_fetch_op, f[:1], 1, "and", 0)
    same_error(shmem.atomic_fetch_add_nbi, np.zeros(1, np.int32), w[:1], 1, 0)  # fetch dtype
    same_error(shmem.atomic_fetch_add_nbi, np.zeros(2, np.int64), w[:1], 1, 0)  # fetch size
    ro = np.zeros(1, np.int64)
    ro.flags.writeable = False
    same_error(shmem.atomic_fetch_nbi, ro, w[:1], 0)
    # an unaligned word of the heap
    same_error(shmem.atomic_fetch, w.view(np.uint8)[4:12].view(np.int64), 0)


def test_waits_and_tests(shmem: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from vkshmem._api import state
    from vkshmem._api.enums import CMP
    from vkshmem.core.errors import WaitTimeoutError

    v = shmem.zeros(2, np.int32)
    v[0] = 5
    shmem.wait_until(v[:1], CMP.EQ, 5)
    shmem.wait_until(v[:1], "ge", -1)
    assert shmem.test(v[:1], CMP.GT, 4) is True and shmem.test(v[:1], "<", 5) is False
    assert shmem.test(v[:1], CMP.NE, 2**40) is True  # out of range: the Python comparison
    u = shmem.zeros(1, np.uint64)
    assert shmem.test(u, CMP.LT, 2**64 - 1) and not shmem.test(u, CMP.LT, 0)
    assert shmem.test(u, CMP.GT, -1) == shmem.test.__wrapped__(u, CMP.GT, -1)
    monkeypatch.setattr(state.rt.waiter, "timeout", 0.05)
    exc = same_error(shmem.wait_until, v[:1], CMP.EQ, 6)
    assert isinstance(exc, WaitTimeoutError) and "wait_until(ivar" in str(exc)
    assert "VKSHMEM_WAIT_TIMEOUT" in str(exc)
    same_error(shmem.wait_until, v, CMP.EQ, 5)  # two elements
    same_error(shmem.test, v[:1], "approx", 5)


def test_signals(shmem: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from vkshmem._api import state
    from vkshmem._api.enums import CMP

    sig = shmem.new_signal()
    t = shmem.zeros(4, np.int32)
    shmem.put_signal(t, np.arange(4, dtype=np.int32), 0, sig, 3, shmem.SIGNAL_SET)
    shmem.put_signal_nbi(t[2:], np.zeros(2, np.int32), 0, sig, -1, shmem.SIGNAL_ADD)
    assert t.tolist() == [0, 1, 0, 0] and shmem.signal_fetch(sig) == 2
    shmem.signal_add(sig, 2**64 - 1, 0)
    shmem.signal_set(sig, 7, pe=0)
    assert shmem.signal_wait_until(sig, CMP.GE, 5) == 7 and shmem.signal_fetch(sig) == 7
    assert shmem.signal_wait_until(sig, "ne", -1) == 7
    same_error(shmem.put_signal, t, np.zeros(4, np.int32), 0, sig, 1, 3)  # bad sigop
    same_error(shmem.put_signal, t, np.zeros(4, np.int32), 0, t[:1], 1, shmem.SIGNAL_SET)
    same_error(shmem.put_signal, t, np.zeros(4, np.int32), 2, sig, 1, shmem.SIGNAL_SET)
    same_error(shmem.signal_add, np.zeros(1, np.uint64), 1, 0)  # not symmetric
    same_error(shmem.signal_set, sig, 1.5, 0)
    same_error(shmem.signal_fetch, sig.view(np.int32))
    monkeypatch.setattr(state.rt.waiter, "timeout", 0.05)
    exc = same_error(shmem.signal_wait_until, sig, CMP.EQ, 8)
    assert "signal_wait_until(signal" in str(exc)


def test_barriers_and_small_collectives(shmem: Any) -> None:
    shmem.barrier_all()
    shmem.sync_all()
    shmem.sync()
    t = shmem.zeros(4, np.float64)
    shmem.broadcast(t, np.arange(4.0), 0)
    assert t.tolist() == [0, 1, 2, 3]
    shmem.sum_reduce(t, np.ones(4))
    shmem.max_reduce(t[:2], np.full(2, 9.0))
    assert t.tolist() == [9, 9, 1, 1]
    shmem.fcollect(t[1:3], np.array([5.0, 6.0]))
    shmem.fcollect(t[:2], t[:1], 1)  # in place: this PE's own block
    assert t.tolist() == [9, 5, 6, 1]
    same_error(shmem.fcollect, t[:2], t[1:], 2)  # overlaps the target elsewhere
    same_error(shmem.fcollect, t[:1], np.ones(2))  # does not fit
    same_error(shmem.broadcast, t, np.ones(4), 1)  # no such root
    same_error(shmem.sum_reduce, t, np.ones(4, np.int64))
    same_error(shmem.and_reduce, t, np.ones(4))
    same_error(shmem.reduce, t, np.ones(4), "avg")
    ro = shmem.zeros(2, np.int64)
    ro.flags.writeable = False
    same_error(shmem.sum_reduce, ro, np.ones(2, np.int64))


def test_finalized_entries_say_so(shmem: Any) -> None:
    """After finalize, every entry runs its Python function, which names the problem; a new
    init enables them again."""
    a = shmem.zeros(1, np.int64)
    team = shmem.TEAM_WORLD.state
    shmem.finalize()
    try:
        assert not _fast.enabled() and not team.native.valid
        for call in (lambda: shmem.put(a, a, 0), lambda: shmem.atomic_fetch(a, 0),
                     shmem.quiet, shmem.barrier_all, shmem.sync,
                     lambda: shmem.sum_reduce(a, a)):
            with pytest.raises(VkshmemError, match="not initialised"):
                call()
        with pytest.raises(RuntimeError, match="finalized"):
            team.native.sync()
    finally:
        shmem.init()
    assert _fast.enabled() and shmem.TEAM_WORLD.state.native.valid
    b = shmem.zeros(1, np.int64)
    shmem.atomic_add(b, 2, 0)
    assert b[0] == 2


_QUIET = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int)


@contextlib.contextmanager
def routed_through(ops: ctypes.Structure, transport: object) -> Iterator[None]:
    """The fast paths configured as if this PE were PE 5 reaching PE 0 through ``transport``,
    whose C data path is ``ops`` (a ``struct vk_native_ops``); the real configuration after."""
    from vkshmem._api import state

    rt = state.rt
    try:
        table = np.array([ctypes.addressof(ops)], np.uint64).tobytes()
        _fast.configure(my_pe=5, direct=b"\0", ops=table, transports=(transport,),
                        quiet_fence=True, native_waits=True, crowded=False, waiter=rt.waiter,
                        seg_heaps=rt.domains.seg_heaps)
        yield
    finally:
        fast.configure(rt)
        fast.set_world(rt)


def test_native_transport_route(shmem: Any) -> None:
    """A PE routed through a transport with a C data path (Transport.native_ops): the entries
    call it with the heap offset, and turn a failure into the transport's own error."""

    calls: list[tuple[Any, ...]] = []
    PUT = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int32, ctypes.c_uint32,
                           ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    AMO = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int32, ctypes.c_uint32,
                           ctypes.c_uint64, ctypes.c_int, ctypes.c_int, ctypes.c_uint64,
                           ctypes.c_uint64, ctypes.c_int, ctypes.POINTER(ctypes.c_uint64))

    class Ops(ctypes.Structure):
        _fields_ = [("self", ctypes.c_void_p), ("put", PUT), ("get", PUT), ("amo", AMO),
                    ("quiet", _QUIET), ("fence", _QUIET), ("flags", ctypes.c_uint)]

    def put(_s: Any, pe: int, seg: int, off: int, buf: int, n: int, nbi: int) -> int:
        calls.append(("put", pe, seg, off, ctypes.string_at(buf, n), nbi))
        return -7 if n == 16 else 0

    def get(_s: Any, pe: int, seg: int, off: int, buf: int, n: int, nbi: int) -> int:
        ctypes.memmove(buf, b"\x2a" * n, n)
        calls.append(("get", pe, seg, off, n))
        return 0

    def amo(_s: Any, pe: int, seg: int, off: int, op: int, width: int, operand: int,
            compare: int, fetch: int, result: Any) -> int:
        calls.append(("amo", off, op, width, operand, fetch))
        result[0] = 41
        return 0

    class Fake:
        def native_error(self, status: int, doing: str, pe: int, seg: int, offset: int,
                         nbytes: int, buffer: object) -> BaseException:
            return OSError(f"{doing} PE {pe}: status {status}, {nbytes} bytes")

    ops = Ops(None, PUT(put), PUT(get), AMO(amo))
    a = shmem.zeros(4, np.int64)
    with routed_through(ops, Fake()):
        shmem.put(a[1:2], np.array([7], np.int64), 0)
        out = np.zeros(2, np.int64)
        shmem.get(out, a[2:], 0)
        assert shmem.atomic_fetch_add(a[3:], 9, 0) == 41
        with pytest.raises(OSError, match="put to PE 0: status -7, 16 bytes"):
            shmem.put(a[:2], np.zeros(2, np.int64), 0)
    base = calls[0][3] - 8
    assert calls[0] == ("put", 0, 0, base + 8, (7).to_bytes(8, "little"), 0)
    assert calls[1] == ("get", 0, 0, base + 16, 16) and out.tolist() == [0x2A2A2A2A2A2A2A2A] * 2
    assert calls[2] == ("amo", base + 24, 4, 8, 9, 1) and len(calls) == 4



def test_the_per_call_paths_bind_the_runtime_parts_lists(shmem: Any) -> None:
    """The API's per-call state indexes the routing part's own list (no copy, no hops), and
    the runtime's parts are the objects its quiet, fence and allocation work through."""
    from vkshmem._api import state

    rt = state.rt
    assert state.route_transport is rt.routing.route_transport
    assert state.shm is rt.routing.shm and state.seg_heaps is rt.domains.seg_heaps
    assert state.domain_heaps is rt.domains.domain_heaps
    assert rt.routing.route_transport == [r.transport for r in rt.routing.routes]
    assert rt.routing.route_transport[0] is rt.routing.shm  # this PE: the shm path
    a = shmem.zeros(4, np.int64)
    off = a.__array_interface__["data"][0] - rt.host.segment.address
    assert off in rt.host.allocator.used and rt.domains.seg_heaps[0] is None
    shmem.free(a)
    assert off not in rt.host.allocator.used
