"""The compiled hot path's protocol with a transport's C data path (``struct vk_native_ops``,
``Transport.native_ops``): quiet/fence through the transport's C functions instead of its
Python methods, and the VK_NATIVE_TRY calls made with the GIL held before blocking ones, with
real C function pointers (ctypes) standing in for a transport's."""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
import pytest
from test_fast import _QUIET, routed_through, shmem  # noqa: F401 - shmem: a fixture

from vkshmem.core import _fast, fast

# _native.h: VK_NATIVE_TRY, VK_NATIVE_AGAIN, VK_NATIVE_PYTHON, VK_NATIVE_CAN_TRY
TRY, AGAIN, PYTHON, CAN_TRY = 2, 1, 2, 1


def test_quiet_and_fence_through_the_transports_c_functions(shmem: Any) -> None:  # noqa: F811
    """With a transport open, quiet/fence call its C quiet/fence (fence = its quiet where
    fence_quiet says so); VK_NATIVE_PYTHON takes the Python path, a negative status raises
    the transport's own error; a transport without them sends quiet to Python. Flagged
    VK_NATIVE_CAN_TRY, it is first asked with VK_NATIVE_TRY; VK_NATIVE_AGAIN then makes a
    blocking call."""
    from vkshmem._api import state

    calls: list[str] = []
    status = {"quiet": 0, "fence": 0, "try": AGAIN}

    def quiet(_s: Any, mode: int) -> int:
        calls.append("quiet" if mode == 0 else "try quiet")
        return status["quiet"] if mode == 0 else status["try"]

    def fence(_s: Any, mode: int) -> int:
        calls.append("fence" if mode == 0 else "try fence")
        return status["fence"] if mode == 0 else status["try"]

    class Ops(ctypes.Structure):
        _fields_ = [("self", ctypes.c_void_p), ("put", ctypes.c_void_p),
                    ("get", ctypes.c_void_p), ("amo", ctypes.c_void_p),
                    ("quiet", _QUIET), ("fence", _QUIET), ("flags", ctypes.c_uint)]

    class Fake:
        def native_error(self, status: int, doing: str, pe: int, seg: int, offset: int,
                         nbytes: int, buffer: object) -> BaseException:
            return OSError(f"{doing} PE {pe}: status {status}, buffer {buffer}")

    both = Ops(None, None, None, None, _QUIET(quiet), _QUIET(fence), 0)
    trying = Ops(None, None, None, None, _QUIET(quiet), _QUIET(fence), CAN_TRY)
    no_fence = Ops(None, None, None, None, _QUIET(quiet), _QUIET(), 0)
    rt = state.rt

    def configure(ops: Ops, fence_quiet: bytes) -> None:
        table = np.array([ctypes.addressof(ops)], np.uint64).tobytes()
        _fast.configure(my_pe=rt.my_pe, direct=b"\1", ops=np.zeros(1, np.uint64).tobytes(),
                        transports=(None,), quiet_fence=False, native_waits=True,
                        crowded=False, waiter=rt.waiter, seg_heaps=rt.domains.seg_heaps,
                        quiet_ops=table, fence_quiet=fence_quiet, quiet_transports=(Fake(),))

    try:
        configure(both, b"\0")
        shmem.quiet()
        shmem.fence()
        assert calls == ["quiet", "fence"]
        configure(both, b"\1")  # fence is a quiet on this transport
        shmem.fence()
        assert calls[2:] == ["quiet"]
        status["quiet"] = PYTHON  # "call the Python quiet": no transport is open there
        shmem.quiet()
        assert calls[3:] == ["quiet"]
        status["quiet"] = -5
        with pytest.raises(OSError, match="quiet PE -1: status -5, buffer None"):
            shmem.quiet()
        status["fence"] = -6
        configure(both, b"\0")
        with pytest.raises(OSError, match="fence PE -1: status -6"):
            shmem.fence()
        status.update(quiet=0, fence=0)
        del calls[:]
        configure(trying, b"\0")
        shmem.quiet()  # the try call would wait: a blocking one follows
        status["try"] = 0
        shmem.quiet()
        shmem.fence()
        assert calls == ["try quiet", "quiet", "try quiet", "try fence"]
        del calls[:]
        configure(no_fence, b"\0")  # not offered: quiet and fence take Python
        shmem.quiet()
        shmem.fence()
        assert calls == []
    finally:
        fast.configure(rt)
        fast.set_world(rt)
    shmem.quiet()
    assert calls == []


_RMA = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int32, ctypes.c_uint32,
                        ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
_AMO = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int32, ctypes.c_uint32,
                        ctypes.c_uint64, ctypes.c_int, ctypes.c_int, ctypes.c_uint64,
                        ctypes.c_uint64, ctypes.c_int, ctypes.POINTER(ctypes.c_uint64))


@pytest.mark.parametrize("can_try", [True, False])
def test_try_calls_then_blocking_ones(shmem: Any, can_try: bool) -> None:  # noqa: F811
    """A transport flagged VK_NATIVE_CAN_TRY gets each put/get/AMO first as a VK_NATIVE_TRY
    call (GIL held); VK_NATIVE_AGAIN makes the core repeat it as a blocking call, an error
    of the try call is raised as the blocking one's would be. Unflagged: blocking calls only."""

    calls: list[tuple[str, int]] = []
    answer = {"put": AGAIN, "get": 0, "amo": AGAIN}

    def put(_s: Any, pe: int, seg: int, off: int, buf: int, n: int, nbi: int) -> int:
        calls.append(("put", nbi))
        return answer["put"] if nbi == TRY else min(answer["put"], 0)

    def get(_s: Any, pe: int, seg: int, off: int, buf: int, n: int, nbi: int) -> int:
        calls.append(("get", nbi))
        ctypes.memmove(buf, b"\x01" * n, n)
        return answer["get"] if nbi == TRY else 0

    def amo(_s: Any, pe: int, seg: int, off: int, op: int, width: int, operand: int,
            compare: int, fetch: int, result: Any) -> int:
        calls.append(("amo", fetch))
        result[0] = 5
        return answer["amo"] if fetch & TRY else 0

    class Ops(ctypes.Structure):
        _fields_ = [("self", ctypes.c_void_p), ("put", _RMA), ("get", _RMA), ("amo", _AMO),
                    ("quiet", _QUIET), ("fence", _QUIET), ("flags", ctypes.c_uint)]

    class Fake:
        def native_error(self, status: int, doing: str, pe: int, seg: int, offset: int,
                         nbytes: int, buffer: object) -> BaseException:
            return OSError(f"{doing} PE {pe}: status {status}")

    ops = Ops(None, _RMA(put), _RMA(get), _AMO(amo), _QUIET(), _QUIET(),
              CAN_TRY if can_try else 0)
    a = shmem.zeros(4, np.int64)
    with routed_through(ops, Fake()):
        shmem.put(a[:1], np.array([7], np.int64), 0)
        out = np.zeros(1, np.int64)
        shmem.get(out, a[1:2], 0)
        assert shmem.atomic_fetch_add(a[2:3], 1, 0) == 5
        answer["put"] = -9
        with pytest.raises(OSError, match="put to PE 0: status -9"):
            shmem.put(a[:1], np.array([7], np.int64), 0)
    assert out[0] == 0x0101010101010101
    if can_try:
        assert calls == [("put", TRY), ("put", 0), ("get", TRY), ("amo", 1 | TRY), ("amo", 1),
                         ("put", TRY)]
    else:
        assert calls == [("put", 0), ("get", 0), ("amo", 1), ("put", 0)]
