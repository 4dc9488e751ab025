"""A CUDA heap's operations in C for the domain proxy's native rounds (``struct vkc_domain`` of
``csrc/cudacalls.c`` behind the core's ``struct vk_domain_ops``), shared by the Vulkan domain's
CUDA copier and the ``cuda`` domain plugin. Each of them compiles ``cudacalls.c`` into its own
cffi module, so the module's ``ffi``/``lib`` are passed in."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["NativeDomain"]


class NativeDomain:
    """Copies on a stream of their own and AMOs with result words of their own (AMO kernel
    ``amo_fn``; 0: AMOs stay in Python) on the heap at CUDA address ``base``; made once,
    released by :meth:`close` (the context current)."""

    def __init__(self, cu: Any, ffi: Any, lib: Any, check: Callable[[Any, str], Any],
                 ctx_ptr: int, base: int, spin_ns: int, amo_fn: int) -> None:
        self._cu, self._ffi, self._lib = cu, ffi, lib
        self._stream = check(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING),
                             "cuStreamCreate")
        d = self._d = ffi.new("struct vkc_domain *")
        d.ctx, d.stream, d.base, d.spin_ns = ctx_ptr, int(self._stream), base, spin_ns
        if amo_fn:
            d.amo_fn = amo_fn
            d.amo_host = int(check(cu.cuMemHostAlloc(64, 2), "cuMemHostAlloc"))
            d.amo_dev = int(check(cu.cuMemHostGetDevicePointer(d.amo_host, 0),
                                  "cuMemHostGetDevicePointer"))

    def fill(self, address: int, size: int, mapped: int = 0, write_max: int = 0,
             read_max: int = 0) -> None:
        """Fill the core's ``struct vk_domain_ops`` at ``address``: these functions, the
        segment's size, and its CPU mapping (0: none) with the sizes copied through it."""
        ops = self._ffi.cast("struct vk_domain_ops *", address)
        self._lib.vkc_domain_ops(self._d, ops)
        ops.size, ops.mapped = size, self._ffi.cast("uint8_t *", mapped)
        ops.write_max, ops.read_max = write_max, read_max

    def close(self) -> None:
        """Release the result words and the stream (the serving thread has stopped)."""
        if self._d.amo_host:
            self._cu.cuMemFreeHost(self._d.amo_host)
            self._d.amo_host = 0
        if self._stream is not None:
            self._cu.cuStreamDestroy(self._stream)
            self._stream = None
