"""The reduce kernel of one device (:data:`~.kernels.REDUCE_NAME`): compiled with NVRTC per
(op, dtype, loads in flight) on first use, launched by one C call (``vkc_reduce``)."""

from __future__ import annotations

import numpy as np

from ._ops import ffi as _ffi
from ._ops import lib as _lib
from .driver import CudaError, Device, check
from .kernels import MAX_SOURCES, REDUCE_NAME, compile_kernel, reduce_source

__all__ = ["Reducer"]


class Reducer:
    """The reduce kernels of ``device`` (the domain's and its pair all-reduce's)."""

    def __init__(self, device: Device) -> None:
        self.device = device
        self._fns: dict[tuple[str, np.dtype, int], int] = {}

    def fn(self, op: str, dtype: np.dtype, unroll: int = 4) -> int:
        """The kernel's function handle for ``op`` on ``dtype`` (``unroll``: see
        :func:`~.kernels.reduce_source`; compiled on first use; CudaError where it has none)."""
        key = (op, np.dtype(dtype), unroll)  # the dtype itself: its .name is slow
        fn = self._fns.get(key)
        if fn is None:
            source = reduce_source(op, dtype, unroll)
            if source is None:
                raise CudaError(f"no reduce kernel for {op} on {np.dtype(dtype)}")
            dev = self.device
            dev.current()
            fn = self._fns[key] = int(compile_kernel(dev.cu, check, dev.dev, source,
                                                     REDUCE_NAME, CudaError))
        return fn

    def grid(self, count: int, dtype: np.dtype, block: int, per_sm: int = 4) -> int:
        """Blocks over ``count`` elements (16 bytes a thread, at most ``per_sm`` blocks per
        SM: the kernel loops)."""
        return max(1, min(self.device.sms * per_sm,
                          -(-count * np.dtype(dtype).itemsize // (16 * block))))

    def run(self, dsts: list[int], sources: list[int], count: int, op: str,
            dtype: np.dtype, stream: int = 0) -> None:
        """``d[i] = op over sources[j][i]`` for every ``d`` of ``dsts`` (device addresses this
        GPU maps; at most :data:`~.kernels.MAX_SOURCES` of them) by the kernel (for the pairs
        :func:`~.kernels.reduce_source` covers), complete on return; on ``stream``, issued
        only, where given (at most MAX_SOURCES sources then)."""
        dev = self.device
        fn = self.fn(op, dtype)
        block = 512
        grid = self.grid(count, dtype, block)
        first = sources[:MAX_SOURCES]
        rest = sources[MAX_SOURCES:]
        outs = _ffi.new("uint64_t[]", dsts)
        srcs = _ffi.new("uint64_t[]", first)
        dev._done(_lib.vkc_reduce(dev.ctx_ptr, stream or dev.stream_ptr, fn, outs,
                                  len(dsts), srcs, len(first), count, grid, block,
                                  -1 if stream else dev.spin_ns), "reduce kernel")
        while rest:  # more sources than one launch takes: fold them into the first target
            part, rest = [dsts[0], *rest[:MAX_SOURCES - 1]], rest[MAX_SOURCES - 1:]
            srcs = _ffi.new("uint64_t[]", part)
            dev._done(_lib.vkc_reduce(dev.ctx_ptr, dev.stream_ptr, fn, outs,
                                      len(dsts) if not rest else 1, srcs, len(part), count,
                                      grid, block, dev.spin_ns), "reduce kernel")
