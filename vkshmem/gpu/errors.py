"""Errors of the Vulkan layer, all subclasses of the core's :class:`VkshmemError`.

A missing loader, driver, device, layer or device feature is the core's
:class:`~vkshmem.core.errors.FeatureNotAvailableError` (its message names the Debian package or
the variable to set); bad arguments are :class:`~vkshmem.core.errors.InvalidArgumentError`.
"""

from __future__ import annotations

from typing import Any

from vkshmem.core.errors import VkshmemError, WaitTimeoutError

__all__ = ["GpuError", "GpuTimeoutError", "RingError"]


class GpuError(VkshmemError):
    """A Vulkan call failed; ``result`` is its VkResult code (None when not from Vulkan)."""

    def __init__(self, message: str, result: int | None = None) -> None:
        self.result = result
        super().__init__(message)


class GpuTimeoutError(GpuError, WaitTimeoutError):
    """GPU work did not finish within its timeout (``VKSHMEM_GPU_TIMEOUT`` or ``timeout=``).

    The work is still in flight: the command buffer involved is not reused until it finishes.
    """


class RingError(GpuError):
    """A request that a kernel enqueued in a request ring failed on the host (raised by
    :meth:`RingService.check <vkshmem.gpu.initiated.ringservice.RingService.check>` and ``stop``).

    ``__cause__`` is the handler's exception and ``descriptor`` the request (None when the
    batch's flush failed). The ring was poisoned: kernels waiting on it got false.
    """

    descriptor: Any = None
