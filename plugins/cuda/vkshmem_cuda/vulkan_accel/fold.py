"""Folds into two targets at once for the Vulkan domain's CUDA links (NVIDIA).

A ring all-reduce's last fold (``dst op= src`` in this PE's heap) is followed by a push of the
result into the right member's heap; where that member's heap is mapped on this GPU (a direct
:class:`~.link.CudaLink`), one pass of the reduce kernel
(:func:`~vkshmem_cuda.kernels.reduce_source`: 16-byte loads of local memory, stores into
both targets, the remote one across NVLink) does both, so the link carries the result while
the GPU reads the operands instead of after.
"""

from __future__ import annotations

import ctypes
import logging
from typing import TYPE_CHECKING, Any

import numpy as np

from vkshmem.plugin import FeatureNotAvailableError, GpuError

from ..kernels import MAX_SOURCES, REDUCE_NAME, compile_kernel, reduce_source

if TYPE_CHECKING:
    from .view import CudaView

__all__ = ["CudaFolds"]

log = logging.getLogger("vkshmem")

_BLOCK = 512
_UNROLL = 2  # 16-byte packs in flight per thread per source: the operands are local
_PER_SM = 2  # blocks per SM (the kernel loops)


class _Pointers(ctypes.Structure):
    """The kernel's ``struct sources`` (passed by value)."""

    _fields_ = [("p", ctypes.c_uint64 * MAX_SOURCES)]


class CudaFolds:
    """The reduce kernels of ``view``'s GPU, compiled per (op, dtype) at first use, launched
    on ``stream`` (the caller holds the stream and makes the view's context current)."""

    def __init__(self, view: CudaView, stream: Any) -> None:
        self.view = view
        self.cu = view.cu
        self.stream = stream
        self._fns: dict[tuple[str, np.dtype], Any] = {}  # by the dtype (its .name is slow)
        self.sms = int(self._check(self.cu.cuDeviceGetAttribute(
            self.cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, view.device),
            "multiprocessor count"))

    def _check(self, res: Any, what: str) -> Any:
        return self.view.check(res, what, GpuError, "a fold through a CUDA link")

    def known(self, op: str, dtype: np.dtype) -> bool:
        """Whether :meth:`kernel` has answered for ``op`` on ``dtype`` before (a lookup)."""
        return (op, np.dtype(dtype)) in self._fns

    def kernel(self, op: str, dtype: np.dtype) -> Any:
        """The kernel for ``op`` on ``dtype``, or None where there is none (a pair the kernel
        does not do, or no NVRTC: logged once)."""
        key = (op, np.dtype(dtype))
        if key not in self._fns:
            source = reduce_source(op, dtype, _UNROLL)
            fn = None
            if source is not None:
                try:
                    fn = compile_kernel(self.cu, self._check, self.view.device, source,
                                        REDUCE_NAME, GpuError)
                except (FeatureNotAvailableError, GpuError) as exc:
                    log.info("folds across CUDA links stay two steps: %s", exc)
            self._fns[key] = fn
        return self._fns[key]

    #: threads per block of the reduce kernel's launches
    block = _BLOCK

    def grid(self, count: int, dtype: np.dtype) -> int:
        """Blocks for ``count`` elements: one 16-byte pack per thread, at most ``_PER_SM``
        blocks per SM (the kernel loops)."""
        packs = -(-count * np.dtype(dtype).itemsize // 16)
        return max(1, min(self.sms * _PER_SM, -(-packs // _BLOCK)))

    def run(self, fn: Any, dsts: list[int], srcs: list[int], count: int,
            dtype: np.dtype) -> None:
        """``d[i] = srcs[0][i] op srcs[1][i] ...`` for every ``d`` in ``dsts`` (CUDA addresses
        this GPU reaches), complete on return."""
        cu = self.cu
        dst, src = _Pointers(), _Pointers()
        for i, p in enumerate(dsts):
            dst.p[i] = p
        for i, p in enumerate(srcs):
            src.p[i] = p
        args = (dst, ctypes.c_int(len(dsts)), src, ctypes.c_int(len(srcs)),
                ctypes.c_uint64(count))
        params = (ctypes.c_void_p * len(args))(*[ctypes.addressof(a) for a in args])
        grid = self.grid(count, dtype)
        self._check(cu.cuLaunchKernel(fn, grid, 1, 1, _BLOCK, 1, 1, 0, self.stream,
                                      ctypes.addressof(params), 0), "cuLaunchKernel (fold)")
        self._check(cu.cuStreamSynchronize(self.stream), "cuStreamSynchronize (fold)")
