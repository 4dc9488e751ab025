"""Waiting on local memory that peers write: spin in C (GIL released), then re-check in Python.

Every wait honours ``VKSHMEM_WAIT_TIMEOUT`` and stays interruptible by Ctrl-C, and it drives
the progress of transports that need it while it waits.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from ._native import ffi, lib
from .errors import WaitTimeoutError
from .transport import Transport

__all__ = ["Waiter"]

_SPIN_NS = 200_000  # re-enter Python (signals, timeout, progress) at least this often


class Waiter:
    """Waits for a predicate on ``nbytes`` of local memory at ``address`` to become true."""

    def __init__(self, timeout: float, progress: Sequence[Transport] = ()) -> None:
        self.timeout = timeout
        self.progress = [t for t in progress if type(t).progress is not Transport.progress]

    def wait(self, pred: Callable[[], object], address: int, nbytes: int, what: str) -> None:
        """Return once ``pred()`` is true; raise WaitTimeoutError after the configured time."""
        snap = ffi.new("char[]", nbytes)  # per wait: threads may wait concurrently
        src = ffi.cast("void *", address)
        deadline = time.monotonic() + self.timeout if self.timeout else None
        while True:
            ffi.memmove(snap, src, nbytes)
            if pred():
                return
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
