"""The service kernel: small copies and AMOs on an NVIDIA GPU without a kernel launch or a
stream wait, for the cuda domain (``vkshmem_cuda.service``) and the Vulkan domain's AMOs
(:class:`~vkshmem_cuda.vulkan_accel.copier.CudaCopier`).

A one-block kernel (:data:`~vkshmem_cuda.kernels.SERVICE_SOURCE`) stays resident on the
GPU while requests keep coming and serves them from a mailbox in mapped pinned host memory:
the host stores the request and its sequence number; the block copies (up to
:data:`~vkshmem_cuda.kernels.SERVICE_MAX` bytes; host data travel inline in the mailbox,
their first 128 bytes read together with the request's header) or runs the AMO, fences
system-wide and stores the sequence number back, which the host sees with a load. An operation
then costs the GPU's poll of host memory and its reply (about 5 µs from C on an H100) instead
of a launch or an async copy plus a stream wait (9-16 µs from Python). The host side is one
GIL-free C call per operation (``csrc/cudasvc.c``, in :mod:`vkshmem_cuda._ops`).

The kernel ends after ``idle_ns`` without a request (so a device-wide synchronize of the
application's waits at most that long) and when :meth:`CudaService.park` asks it to: the GPU
time-slices this CUDA context against other contexts on it (other processes', and the same
process's Vulkan device), so work of theirs waits while the kernel is resident. The next
request launches it again.
"""

from __future__ import annotations

from typing import Any

from . import _ops
from .kernels import SERVICE_MAX, SERVICE_NAME, SERVICE_SOURCE, SERVICE_THREADS, compile_kernel

__all__ = ["BOX_BYTES", "CudaService"]

_COPY, _AMO = 1, 2
_BOX = 128  # the mailbox header; the payload follows
#: bytes of one mailbox box (header and payload)
BOX_BYTES = _BOX + SERVICE_MAX
_PINNED_MAPPED = 2  # CU_MEMHOSTALLOC_DEVICEMAP


class CudaService:
    """The service kernel in CUDA context ``ctx`` (a ``CUcontext``) of device ``dev`` (see the
    module docstring). Failed calls raise ``error`` (naming ``off_hint``, how to avoid the
    service); after a failure or a timeout :attr:`broken` is set and the caller takes its
    other paths. Thread-safe (the C side serialises requests).

    ``request_box``: (CPU address, device address) of :data:`BOX_BYTES` of device memory the
    CPU maps (write-combined is fine), where requests then go: the kernel polls them there
    instead of across PCIe (replies still come back in pinned host memory). Default: requests
    and replies share one box in pinned host memory."""

    max_bytes = SERVICE_MAX

    def __init__(self, cu: Any, dev: Any, ctx: Any, spin_ns: int, timeout: float,
                 idle_ns: int, error: type[Exception], off_hint: str,
                 request_box: tuple[int, int] | None = None) -> None:
        self._cu, self._ctx = cu, ctx
        self._error, self._hint = error, off_hint
        self.timeout_ns = int(timeout * 1e9)
        self._ffi, self._lib = _ops.ffi, _ops.lib
        self._h = self._ffi.NULL
        self._stream: Any = None
        self._box = 0
        if self._lib.vkc_load() != 0:
            raise error(f"the CUDA service kernel: could not load "
                        f"{self._ffi.string(self._lib.vkc_missing()).decode()}")
        self._check(cu.cuCtxPushCurrent(ctx), "cuCtxPushCurrent")
        try:
            fn = int(compile_kernel(cu, self._check, dev, SERVICE_SOURCE, SERVICE_NAME, error))
            self._stream = self._check(
                cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate")
            self._box = int(self._check(cu.cuMemHostAlloc(BOX_BYTES, _PINNED_MAPPED),
                                        "cuMemHostAlloc"))
            box_dev = int(self._check(cu.cuMemHostGetDevicePointer(self._box, 0),
                                      "cuMemHostGetDevicePointer"))
            req, req_dev = request_box or (self._box, box_dev)
            #: whether requests go into device memory (``request_box``), not pinned memory
            self.requests_on_gpu = request_box is not None
            self._h = self._lib.vkc_svc_new(int(ctx), int(self._stream), fn, req, req_dev,
                                            self._box, box_dev, SERVICE_THREADS, idle_ns,
                                            spin_ns)
        except BaseException:
            self._free()
            raise
        finally:
            cu.cuCtxPopCurrent()
        if self._h == self._ffi.NULL:
            self.close()
            raise MemoryError("the CUDA service's state")
        self._result = self._ffi.new("uint64_t *")
        self._call_c = self._lib.vkc_svc_call  # bound once: the hot path's call
        self.broken = False
        #: how often :meth:`park` asked a resident kernel to end
        self.parks = 0

    def _check(self, res: Any, what: str) -> Any:
        err, *values = res if isinstance(res, tuple) else (res,)
        if int(err):
            self._raise(int(err), what)
        return values[0] if len(values) == 1 else values

    def _raise(self, res: int, what: str) -> None:
        cu = self._cu
        _e, name = cu.cuGetErrorName(cu.CUresult(res))
        raise self._error(f"{what} (the CUDA service kernel) failed: "
                          f"{name.decode() if isinstance(name, bytes) else res}")

    @property
    def launches(self) -> int:
        """How often the kernel was launched (once, plus once after each idle exit or park)."""
        return int(self._lib.vkc_svc_launches(self._h)) if self._h != self._ffi.NULL else 0

    def _call(self, op: int, width: int, dst: int, src: int, nbytes: int, operand: int,
              compare: int, host_in: int, host_out: int, what: str) -> int:
        if self._h == self._ffi.NULL:
            raise self._error(f"{what} through the CUDA service kernel after it was closed")
        res = self._call_c(self._h, op, width, dst, src, nbytes, operand, compare, host_in,
                           host_out, self._result, self.timeout_ns)
        if res:
            self.broken = True
            if res == self._lib.VKC_SVC_TIMEOUT:
                raise self._error(f"{what} by the CUDA service kernel did not complete within "
                                  f"{self.timeout_ns / 1e9:g} s (VKSHMEM_GPU_TIMEOUT; "
                                  f"{self._hint})")
            self._raise(res, what)
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
        """The AMO ``op`` (AmoOp number) on the ``width``-byte word at device address
        ``addr``: the old value."""
        return self._call(_AMO, width, addr, op, 0, operand, compare, 0, 0, "an AMO")

    def park(self) -> None:
        """Ask a resident kernel to end now, without waiting (a store into the mailbox;
        nothing where none is resident): other contexts' work on the GPU then runs."""
        if self._h != self._ffi.NULL and self._lib.vkc_svc_park(self._h):
            self.parks += 1

    def close(self) -> None:
        """End the kernel (bounded by the timeout) and free the mailbox and stream."""
        if self._h == self._ffi.NULL:
            self._free()
            return
        res = self._lib.vkc_svc_stop(self._h, self.timeout_ns)
        self._lib.vkc_svc_free(self._h)
        self._h = self._ffi.NULL
        self.broken = True
        if res == 0:  # a kernel still resident would fault on the freed mailbox
            self._free()

    def _free(self) -> None:
        cu = self._cu
        if self._stream is None and not self._box:
            return
        cu.cuCtxPushCurrent(self._ctx)
        try:
            if self._stream is not None:
                cu.cuStreamDestroy(self._stream)
                self._stream = None
            if self._box:
                cu.cuMemFreeHost(self._box)
                self._box = 0
        finally:
            cu.cuCtxPopCurrent()
