"""The service kernel: small copies and AMOs without a kernel launch or a stream wait.

A one-block kernel (:data:`~.kernels.SERVICE_SOURCE`) stays resident on the PE's GPU while
requests keep coming and serves them from a mailbox in mapped pinned host memory: the host
stores the request and its sequence number, the block copies (up to
:data:`~.kernels.SERVICE_MAX` bytes; host data travel inline in the mailbox, and their first
128 bytes are read together with the request's header, so a small put from host memory costs
one read over PCIe after the poll, not two) or runs the AMO,
fences system-wide and stores the sequence number back, which the host sees with a load. An
operation then costs the GPU's poll of host memory and its reply (a few microseconds) instead of
a launch or an async copy plus a stream wait (9-16 µs from Python on an H100).

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

from vkshmem.core.errors import ConfigError

from ._ops import ffi as _ffi
from ._ops import lib as _lib
from .driver import CudaError, check
from .kernels import SERVICE_MAX, SERVICE_NAME, SERVICE_SOURCE, SERVICE_THREADS, compile_kernel

if TYPE_CHECKING:
    from .driver import Device

__all__ = ["ENV_SERVICE", "Service", "service_mode"]

ENV_SERVICE = "VKSHMEM_CUDA_SERVICE"
ENV_IDLE = "VKSHMEM_CUDA_SERVICE_IDLE_US"
_COPY, _AMO = 1, 2
_BOX = 128  # the mailbox header; the payload follows


def service_mode() -> str:
    """``VKSHMEM_CUDA_SERVICE``: auto (default), on or off."""
    text = os.environ.get(ENV_SERVICE, "").strip().lower() or "auto"
    if text not in ("auto", "on", "off"):
        raise ConfigError(ENV_SERVICE, f"bad value {text!r}: auto, on or off")
    return text


def _idle_ns() -> int:
    text = os.environ.get(ENV_IDLE, "").strip()
    try:
        value = float(text) if text else 1000.0
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ConfigError(ENV_IDLE, f"bad value {text!r}: microseconds > 0")
    return int(value * 1000)


class Service:
    """The service kernel of one :class:`~.driver.Device` (see the module docstring). Its
    calls raise :class:`~.driver.CudaError`; after a failure or a timeout :attr:`broken` is
    set and the caller takes its other paths."""

    max_bytes = SERVICE_MAX

    def __init__(self, device: Device, timeout: float) -> None:
        cu = device.cu
        self.device = device
        self.timeout_ns = int(timeout * 1e9)
        device.current()
        self._fn = int(compile_kernel(cu, check, device.dev, SERVICE_SOURCE, SERVICE_NAME,
                                      CudaError))
        self._stream = check(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING),
                             "cuStreamCreate")
        self._box = int(check(cu.cuMemHostAlloc(_BOX + SERVICE_MAX, 2), "cuMemHostAlloc"))
        box_dev = int(check(cu.cuMemHostGetDevicePointer(self._box, 0),
                            "cuMemHostGetDevicePointer"))
        self._h = _lib.vkc_svc_new(device.ctx_ptr, int(self._stream), self._fn, self._box,
                                   box_dev, SERVICE_THREADS, _idle_ns(), device.spin_ns)
        if self._h == _ffi.NULL:
            raise MemoryError("the CUDA service's state")
        self._result = _ffi.new("uint64_t *")
        self.broken = False

    @property
    def launches(self) -> int:
        """How often the kernel was launched (once, plus once per idle exit)."""
        return int(_lib.vkc_svc_launches(self._h))

    def _call(self, op: int, width: int, dst: int, src: int, nbytes: int, operand: int,
              compare: int, host_in: int, host_out: int, what: str) -> int:
        res = _lib.vkc_svc_call(self._h, op, width, dst, src, nbytes, operand, compare,
                                host_in, host_out, self._result, self.timeout_ns)
        if res:
            self.broken = True
            if res == _lib.VKC_SVC_TIMEOUT:
                raise CudaError(f"{what} by the CUDA service kernel did not complete within "
                                f"{self.timeout_ns / 1e9:g} s (VKSHMEM_GPU_TIMEOUT; "
                                f"{ENV_SERVICE}=off avoids the service)", res)
            self.device._done(res, f"{what} by the CUDA service kernel")
        return int(self._result[0])

    def copy(self, dst: int, src: int, nbytes: int) -> None:
        """``nbytes`` (≤ :attr:`max_bytes`) between device addresses this GPU maps."""
        self._call(_COPY, 0, dst, src, nbytes, 0, 0, 0, 0, "a copy")

    def write(self, dst: int, host: int, nbytes: int) -> None:
        """``nbytes`` (≤ :attr:`max_bytes`) from host address ``host`` to device ``dst``."""
        self._call(_COPY, 0, dst, 0, nbytes, 0, 0, host, 0, "a host-to-device copy")

    def read(self, host: int, src: int, nbytes: int) -> None:
        """``nbytes`` (≤ :attr:`max_bytes`) from device ``src`` to host address ``host``."""
        self._call(_COPY, 0, 0, src, nbytes, 0, 0, 0, host, "a device-to-host copy")

    def amo(self, addr: int, op: int, width: int, operand: int, compare: int) -> int:
        """The AMO ``op`` (AmoOp number) on the ``width``-byte word at ``addr``: the old
        value."""
        return self._call(_AMO, width, addr, op, 0, operand, compare, 0, 0, "an AMO")

    def close(self) -> None:
        """End the kernel (bounded by the timeout) and free the mailbox and stream."""
        if self._h == _ffi.NULL:
            return
        cu = self.device.cu
        res = _lib.vkc_svc_stop(self._h, self.timeout_ns)
        _lib.vkc_svc_free(self._h)
        self._h = _ffi.NULL
        self.device.current()
        if res == 0:  # a kernel still resident would fault on the freed mailbox
            cu.cuStreamDestroy(self._stream)
            cu.cuMemFreeHost(self._box)

