"""The cuda domain's service kernel (:class:`vkshmem_cuda.service_kernel.CudaService`, vkshmem's
own, which the Vulkan domain's AMOs use too): small copies and AMOs without a kernel launch or
a stream wait.

A one-block kernel stays resident on the PE's GPU while requests keep coming and serves them
from a mailbox in mapped pinned host memory (up to ``SERVICE_MAX`` bytes a copy; host data
travel inline), so an operation costs the GPU's poll of host memory and its reply (a few
microseconds) instead of a launch or an async copy plus a stream wait (9-16 µs from Python on
an H100).

The kernel ends after ``VKSHMEM_CUDA_SERVICE_IDLE_US`` (default 1000) without a request, so a
device-wide synchronize of the application's (``torch.cuda.synchronize()``) waits at most that
long, and the next request launches it again. A resident kernel holds one SM's block slot and
keeps the GPU busy: when several processes share one GPU, CUDA time-slices their contexts and a
resident kernel would hold the others up, so ``VKSHMEM_CUDA_SERVICE=auto`` (the default) uses it
only where this PE is the only one on its GPU; ``on`` forces it, ``off`` never uses it.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from vkshmem.plugin import ConfigError

from .driver import CudaError, env_choice
from .service_kernel import CudaService

if TYPE_CHECKING:
    from .driver import Device

__all__ = ["ENV_SERVICE", "Service", "service_mode"]

ENV_SERVICE = "VKSHMEM_CUDA_SERVICE"
ENV_IDLE = "VKSHMEM_CUDA_SERVICE_IDLE_US"


def service_mode() -> str:
    """``VKSHMEM_CUDA_SERVICE``: auto (default), on or off."""
    return env_choice(ENV_SERVICE)


def _idle_ns() -> int:
    text = os.environ.get(ENV_IDLE, "").strip()
    try:
        value = float(text) if text else 1000.0
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ConfigError(ENV_IDLE, f"bad value {text!r}: microseconds > 0")
    return int(value * 1000)


class Service(CudaService):
    """The service kernel of one :class:`~.driver.Device`; its calls raise
    :class:`~.driver.CudaError` (see :class:`~vkshmem_cuda.service_kernel.CudaService`).
    ``request_box``: (CPU address, device address) of ``BOX_BYTES`` in this PE's heap mapped
    on the CPU (:mod:`.cpumap`), where the kernel then polls for requests."""

    def __init__(self, device: Device, timeout: float,
                 request_box: tuple[int, int] | None = None) -> None:
        super().__init__(device.cu, device.dev, device.ctx, device.spin_ns, timeout, _idle_ns(),
                         CudaError, f"{ENV_SERVICE}=off avoids the service", request_box)
        self.device = device
