"""The exceptions vkshmem raises.

Every error is a :class:`VkshmemError`; the subclasses say which part failed and carry what a
user needs to fix it (the variable to change, the transport and its native status, ...).
"""

from __future__ import annotations

__all__ = [
    "BootstrapError",
    "ConfigError",
    "FeatureNotAvailableError",
    "HeapExhaustedError",
    "InvalidArgumentError",
    "InvalidTypeError",
    "NotAllocatedError",
    "PeerFailedError",
    "PluginError",
    "TransportError",
    "ValueRangeError",
    "VkshmemError",
    "WaitTimeoutError",
]


class VkshmemError(RuntimeError):
    """Base class of every error raised by vkshmem."""


class ConfigError(VkshmemError, ValueError):
    """A ``VKSHMEM_*`` variable (or a launcher option) has a value that cannot be used."""

    def __init__(self, variable: str, message: str) -> None:
        self.variable = variable
        super().__init__(f"{variable}: {message}")


class BootstrapError(VkshmemError):
    """PEs could not find each other or exchange their start-up information."""


class PluginError(VkshmemError):
    """A plugin could not be loaded, or broke its contract."""


class TransportError(VkshmemError):
    """A transport failed; carries the transport's name and its native status, if any."""

    def __init__(self, transport: str, message: str, status: object = None) -> None:
        self.transport = transport
        self.status = status
        suffix = f" (native status: {status})" if status is not None else ""
        super().__init__(f"transport {transport!r}: {message}{suffix}")


class HeapExhaustedError(VkshmemError, MemoryError):
    """A symmetric allocation did not fit in the heap of its memory domain."""

    def __init__(self, domain: str, requested: int, available: int, variable: str) -> None:
        self.domain = domain
        self.requested = requested
        self.available = available
        self.variable = variable
        how = f"{variable} (e.g. {variable}=2G)" if variable.isupper() else variable
        super().__init__(
            f"symmetric {domain} heap exhausted: asked for {requested} bytes, the largest free "
            f"block is {available} bytes; raise {how}"
        )


class InvalidArgumentError(VkshmemError, ValueError):
    """A call got a bad PE, an address outside the symmetric heap, mismatched dtypes or sizes."""


class InvalidTypeError(InvalidArgumentError, TypeError):
    """An argument has the wrong type: not a numpy array where one is needed, a float where an
    integer is needed, ... (a ``TypeError`` too, as shmem4py raises for these)."""


class ValueRangeError(InvalidArgumentError, OverflowError):
    """A value does not fit the dtype it must be stored in (an ``OverflowError`` too, as
    numpy raises for it, e.g. ``full(4, 2**70, dtype=np.uint8)``)."""


class NotAllocatedError(InvalidArgumentError, KeyError):
    """``free``/``realloc`` of memory that is not a live symmetric allocation: a double free,
    or a slice that does not start where the allocation does (a ``KeyError`` too, as shmem4py
    raises on a second ``free``)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class FeatureNotAvailableError(VkshmemError, NotImplementedError):
    """An optional part (a plugin, a driver, a library) that this call needs is not present."""


class WaitTimeoutError(VkshmemError, TimeoutError):
    """A wait (wait_until, barrier, bootstrap exchange) ran past its time limit."""


class PeerFailedError(VkshmemError):
    """Another PE of the job failed (its process was killed or crashed, raised an uncaught
    exception, or its host went silent for ``VKSHMEM_FAILURE_TIMEOUT`` seconds), so a blocking
    call that needs it cannot complete. Carries the failed PE (``pe``) and why (``reason``).

    Raised by every blocking call (barriers, waits, locks, collectives, and RMA or AMOs
    addressed to the failed PE) once this PE has heard of the failure; see
    :mod:`vkshmem.core.liveness.channel`."""

    def __init__(self, pe: int, reason: str, what: str = "") -> None:
        self.pe = pe
        self.reason = reason
        lead = f"{what}: " if what else ""
        super().__init__(f"{lead}PE {pe} failed: {reason} (vkshmem failure detection; "
                         f"VKSHMEM_FAILURE_TIMEOUT bounds how long a silent peer takes to be "
                         f"noticed)")
