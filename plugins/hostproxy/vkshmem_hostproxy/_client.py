"""The hostproxy client (``csrc/hp_client.c``) seen from Python.

One native client per transport endpoint sends every request of this PE: the transport's
Python methods call it through cffi (these wrappers), and the core's compiled hot path calls
the same C functions through the ``struct vk_native_ops`` of :meth:`Client.native_ops`, with
no Python in between. A failure comes back as a status; :meth:`Client.error` turns it into
the exception to raise, from the calling thread's last message.

A signal that interrupts one of its waits calls :func:`_hpc_signalled` (with the GIL), which
runs Python's signal handlers; an exception one raises (Ctrl-C's KeyboardInterrupt) is kept
here, the request's connection retired, and :meth:`Client.error` hands the exception back.
"""

from __future__ import annotations

import ctypes
import hashlib
import hmac
import struct
import threading
import weakref
from types import TracebackType
from typing import Any

from vkshmem.plugin import STATUS, InvalidArgumentError, TransportError

from ._options import NAME
from ._server import ffi, lib

__all__ = ["Client", "hp_mac"]

_M64 = (1 << 64) - 1
#: statuses of the C client (vkshmem/plugin.h) that are the caller's mistake
_INVALID = frozenset(STATUS[name] for name in ("SEG", "BOUNDS", "ALIGN", "AMO"))
_INTR = STATUS["INTR"]
_OFF_MAX = (1 << 63) - 1
_interrupt = threading.local()  # the exception a signal handler raised in a client's wait
_check_signals = ctypes.pythonapi.PyErr_CheckSignals


def hp_mac(key: bytes, label: bytes, nc: bytes, ns: bytes, client_pe: int,
           server_pe: int) -> bytes:
    """The MAC of the hostproxy handshake in Python (``hashlib``): the reference that the C
    client and server (``csrc/hp_server.h`` describes the exchange) are checked against."""
    return hmac.new(key, label + nc + ns + struct.pack("<II", client_pe, server_pe),
                    hashlib.sha256).digest()


def _keep(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> int:
    _interrupt.exc = exc
    return 1


@ffi.def_extern(onerror=_keep)
def _hpc_signalled() -> int:
    """A wait of the C client was interrupted by a signal: run Python's handlers (in the main
    thread; elsewhere nothing runs). 0: go on waiting; an exception: kept by ``_keep``."""
    _check_signals()
    return 0


def _offset(offset: int) -> int:
    """``offset`` as the C client's int64 (a negative one is reported as out of range)."""
    return offset if -1 <= offset <= _OFF_MAX else (-1 if offset < 0 else _OFF_MAX)


class Client:
    """A native hostproxy client of PE ``my_pe`` (see the module docstring)."""

    __slots__ = ("__weakref__", "_c", "_finalizer", "_ops")

    def __init__(self, my_pe: int, n_pes: int, rail: int, key: bytes, timeout: float,
                 amo_function: int) -> None:
        c = lib.hpc_create(my_pe, n_pes, rail, key, timeout, amo_function)
        if c == ffi.NULL:
            raise MemoryError("hostproxy: cannot allocate a client")
        self._c: Any = c
        self._ops: Any = None
        self._finalizer = weakref.finalize(self, lib.hpc_free, c)

    def set_local(self, seg: int, address: int, size: int) -> None:
        """This PE's segment ``seg`` (requests to this PE are applied to it in place)."""
        lib.hpc_set_local(self._c, seg, address, size)

    def set_target(self, pe: int, host: str, port: int, sizes: dict[int, int]) -> None:
        """Where PE ``pe``'s server listens and the sizes of its segments."""
        if lib.hpc_set_target(self._c, pe, host.encode(), str(port).encode()):
            raise TransportError(NAME, f"cannot record PE {pe}'s address (out of memory or "
                                 "PE out of range)")
        for seg, size in sizes.items():
            if lib.hpc_set_size(self._c, pe, seg, size):
                raise TransportError(NAME, f"PE {pe} published segment {seg}, outside "
                                     f"0..{lib.HP_MAX_SEGS - 1}")

    def error(self, rc: int) -> BaseException:
        """The exception for status ``rc`` of a call that this thread just made."""
        if rc == _INTR:
            exc = getattr(_interrupt, "exc", None)
            _interrupt.exc = None
            return exc if exc is not None else KeyboardInterrupt()
        buf = ffi.new("char[]", lib.HPC_MSGLEN)
        status = lib.hpc_last_error(buf, lib.HPC_MSGLEN)
        msg = ffi.string(buf).decode(errors="replace")
        if rc in _INVALID:
            return InvalidArgumentError(msg)
        return TransportError(NAME, msg, status=status or None)

    def put(self, pe: int, seg: int, offset: int, src: memoryview) -> None:
        """Send the bytes; return once the kernel has them (``src`` reusable)."""
        rc = lib.hpc_put(self._c, pe, seg, _offset(offset), ffi.from_buffer(src), src.nbytes)
        if rc:
            raise self.error(rc)

    def get(self, pe: int, seg: int, offset: int, dst: memoryview) -> None:
        """Request the bytes and receive them straight into ``dst``."""
        buf = ffi.from_buffer(dst, require_writable=True)
        rc = lib.hpc_get(self._c, pe, seg, _offset(offset), buf, dst.nbytes)
        if rc:
            raise self.error(rc)

    def amo(self, pe: int, seg: int, offset: int, op: int, width: int, operand: int,
            compare: int, fetch: bool) -> int:
        """Apply the AMO at the target; the old value when ``fetch`` (which waits)."""
        out = ffi.new("uint64_t *")
        rc = lib.hpc_amo(self._c, pe, seg, _offset(offset), op, width, operand & _M64,
                         compare & _M64, fetch, out)
        if rc:
            raise self.error(rc)
        return int(out[0])

    def quiet(self) -> None:
        """FLUSH every connection with un-acknowledged puts/AMOs; wait for every ack."""
        rc = lib.hpc_quiet(self._c)
        if rc:
            raise self.error(rc)

    def native_ops(self) -> int:
        """The address of this client's ``struct vk_native_ops`` (valid while it lives)."""
        if self._ops is None:
            self._ops = ffi.new("struct vk_native_ops *")
            lib.hpc_native_ops(self._c, self._ops)
        return int(ffi.cast("uintptr_t", self._ops))

    def stats(self) -> dict[str, int]:
        """Requests (and quiets) sent through the core's compiled path (``native``), through
        the Python methods (``python``), and connections opened (``opened``)."""
        out = ffi.new("uint64_t[3]")
        lib.hpc_stats(self._c, out)
        return {"native": int(out[0]), "python": int(out[1]), "opened": int(out[2])}

    def close(self) -> None:
        """Close every connection (later requests fail: the transport is closed)."""
        lib.hpc_close(self._c)
