"""Waiting on local memory that peers write: spin in C (GIL released), then re-check in Python.

Every wait honours ``VKSHMEM_WAIT_TIMEOUT`` (the waits of barriers, collectives and
allocations also ``VKSHMEM_COLLECTIVE_TIMEOUT``: :meth:`Waiter.for_collectives`), stays
interruptible by Ctrl-C, raises
:class:`~vkshmem.core.errors.PeerFailedError` once another PE of the job is known to have failed
(:mod:`vkshmem.core.liveness.channel`), and drives the progress of transports that need it while it
waits.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from ._native import ffi, lib
from .errors import PeerFailedError, WaitTimeoutError
from .liveness.channel import Liveness
from .transports.contract import Transport

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
        self._collective: CollectiveWaiter | None = None

    def for_collectives(self, timeout: float) -> Waiter:
        """The waiter of barriers, collectives and allocations: this one, bounded by
        ``timeout`` seconds (``VKSHMEM_COLLECTIVE_TIMEOUT``; 0: only by this waiter's own
        timeout) as well; made once."""
        cw = self._collective
        if cw is None or cw.collective_timeout != timeout:
            cw = self._collective = CollectiveWaiter(self, timeout)
        return cw

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


class CollectiveWaiter(Waiter):
    """The waits inside barriers, collectives and allocation barriers: those of ``base``
    (progress, liveness, interrupts), bounded by the shorter of ``base``'s timeout
    (``VKSHMEM_WAIT_TIMEOUT``) and ``collective_timeout`` (``VKSHMEM_COLLECTIVE_TIMEOUT``), 0
    being no bound. A PE that skips a collective, calls another one or calls it with another
    count leaves its peers waiting for signals that never come: this bound turns that into a
    WaitTimeoutError naming the call and the PE waited for, on every PE left waiting."""

    def __init__(self, base: Waiter, collective_timeout: float) -> None:
        self.base = base
        self.collective_timeout = collective_timeout
        self.progress = base.progress
        self.liveness = base.liveness
        self.failed_address = base.failed_address
        self._collective = None

    @property  # type: ignore[override]
    def timeout(self) -> float:
        """The bound of these waits (read at each wait: the base's may change)."""
        bounds = [t for t in (self.base.timeout, self.collective_timeout) if t > 0]
        return min(bounds) if bounds else 0

    def for_collectives(self, timeout: float) -> Waiter:
        return self.base.for_collectives(timeout)

    def timeout_error(self, what: str) -> WaitTimeoutError:
        if not self.collective_timeout or self.timeout < self.collective_timeout:
            return self.base.timeout_error(what)
        return WaitTimeoutError(
            f"{what} did not happen within {self.timeout:g} s (VKSHMEM_COLLECTIVE_TIMEOUT; "
            "0 waits for ever): a PE of the team has not made this call, made another "
            "collective or barrier, or made it with other arguments (count, root, op)")
