"""Waiting on local memory that peers write: spin in C (GIL released), then re-check in Python.

Every wait honours ``VKSHMEM_WAIT_TIMEOUT``, stays interruptible by Ctrl-C, raises
:class:`~vkshmem.core.errors.PeerFailedError` once another PE of the job is known to have failed
(:mod:`vkshmem.core.liveness`), and drives the progress of transports that need it while it
waits.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from ._native import ffi, lib
from .errors import PeerFailedError, WaitTimeoutError
from .liveness import Liveness
from .transport import Transport

__all__ = ["Waiter"]

_SPIN_NS = 200_000  # re-enter Python (signals, timeout, progress) at least this often


class Waiter:
    """Waits for a predicate on ``nbytes`` of local memory at ``address`` to become true."""

    def __init__(self, timeout: float, progress: Sequence[Transport] = (),
                 liveness: Liveness | None = None) -> None:
        self.timeout = timeout
        self.progress = [t for t in progress if type(t).progress is not Transport.progress]
        self.liveness = liveness
        #: address of the liveness words the native waits read (0: none)
        self.failed_address = 0 if liveness is None else liveness.address

    def wait(self, pred: Callable[[], object], address: int, nbytes: int, what: str) -> None:
        """Return once ``pred()`` is true; raise WaitTimeoutError after the configured time,
        PeerFailedError once a PE of the job is known to have failed."""
        snap = ffi.new("char[]", nbytes)  # per wait: threads may wait concurrently
        src = ffi.cast("void *", address)
        deadline = time.monotonic() + self.timeout if self.timeout else None
        lv = self.liveness
        while True:
            ffi.memmove(snap, src, nbytes)
            if pred():
                return
            if lv is not None and lv.any:
                raise lv.error(what)
            for t in self.progress:
                t.progress()
            lib.vk_spin_change(src, snap, nbytes, _SPIN_NS)
            if deadline is not None and time.monotonic() > deadline:
                raise self.timeout_error(what)

    def timeout_error(self, what: str) -> WaitTimeoutError:
        """The error of a wait for ``what`` that outlasted the timeout (also raised by the
        native waits of :mod:`vkshmem.core.fast`)."""
        return WaitTimeoutError(f"{what} did not happen within {self.timeout:g} s "
                                "(VKSHMEM_WAIT_TIMEOUT; 0 waits for ever)")

    def failure_error(self, what: str) -> PeerFailedError:
        """The error of a wait for ``what`` that cannot end because a PE failed (raised by
        the native waits of :mod:`vkshmem.core.fast` when the liveness words say so)."""
        assert self.liveness is not None
        return self.liveness.error(what)

    def translate(self, exc: BaseException, pe: int = -1) -> BaseException:
        """``exc``, a transport's error on an operation addressed to ``pe`` (-1: unknown), as
        a PeerFailedError when a failed PE caused it (see :meth:`Liveness.translate`)."""
        if self.liveness is None:
            return exc
        return self.liveness.translate(exc, None if pe < 0 else pe)
