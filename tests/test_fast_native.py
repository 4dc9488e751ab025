"""The compiled quiet/fence with a transport open: the core calls the transport's C quiet and
fence (``struct vk_native_ops``, ``Transport.native_ops``) instead of the Python methods, with
real C function pointers (ctypes) standing in for a transport's."""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
import pytest
from test_fast import _QUIET, shmem  # noqa: F401 - shmem is a fixture, used by name

from vkshmem.core import _fast, fast


def test_quiet_and_fence_through_the_transports_c_functions(shmem: Any) -> None:  # noqa: F811
    """With a transport open, quiet/fence call its C quiet/fence (fence = its quiet where
    fence_quiet says so); a positive status takes the Python path, a negative one raises the
    transport's own error; a transport without them sends quiet to Python."""
    from vkshmem._api import state

    calls: list[str] = []
    status = {"quiet": 0, "fence": 0}

    def quiet(_s: Any) -> int:
        calls.append("quiet")
        return status["quiet"]

    def fence(_s: Any) -> int:
        calls.append("fence")
        return status["fence"]

    class Ops(ctypes.Structure):
        _fields_ = [("self", ctypes.c_void_p), ("put", ctypes.c_void_p),
                    ("get", ctypes.c_void_p), ("amo", ctypes.c_void_p),
                    ("quiet", _QUIET), ("fence", _QUIET)]

    class Fake:
        def native_error(self, status: int, doing: str, pe: int, seg: int, offset: int,
                         nbytes: int, buffer: object) -> BaseException:
            return OSError(f"{doing} PE {pe}: status {status}, buffer {buffer}")

    both = Ops(None, None, None, None, _QUIET(quiet), _QUIET(fence))
    no_fence = Ops(None, None, None, None, _QUIET(quiet), _QUIET())
    rt = state.rt

    def configure(ops: Ops, fence_quiet: bytes) -> None:
        table = np.array([ctypes.addressof(ops)], np.uint64).tobytes()
        _fast.configure(my_pe=rt.my_pe, direct=b"\1", ops=np.zeros(1, np.uint64).tobytes(),
                        transports=(None,), quiet_fence=False, native_waits=True,
                        crowded=False, waiter=rt.waiter, seg_heaps=rt.seg_heaps,
                        quiet_ops=table, fence_quiet=fence_quiet, quiet_transports=(Fake(),))

    try:
        configure(both, b"\0")
        shmem.quiet()
        shmem.fence()
        assert calls == ["quiet", "fence"]
        configure(both, b"\1")  # fence is a quiet on this transport
        shmem.fence()
        assert calls[2:] == ["quiet"]
        status["quiet"] = 1  # "call the Python quiet": no transport is open there
        shmem.quiet()
        assert calls[3:] == ["quiet"]
        status["quiet"] = -5
        with pytest.raises(OSError, match="quiet PE -1: status -5, buffer None"):
            shmem.quiet()
        status["fence"] = -6
        configure(both, b"\0")
        with pytest.raises(OSError, match="fence PE -1: status -6"):
            shmem.fence()
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
