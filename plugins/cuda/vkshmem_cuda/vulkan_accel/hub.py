"""This GPU's side of the Vulkan domain's CUDA links (:mod:`.link`): the heap
as CUDA sees it, a stream and events of its own, the reduce kernels of folds, and a
:class:`~.bounce.RemoteGpu` per other GPU that a bounce link reaches."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from vkshmem.plugin import GpuError

from .. import _ops
from ..vmm import device_by_uuid
from .bounce import SLOTS, RemoteGpu
from .fold import CudaFolds

if TYPE_CHECKING:
    from .view import CudaView

__all__ = ["LinkHub"]

_DISABLE_TIMING = 2  # CU_EVENT_DISABLE_TIMING


class LinkHub:
    """The links of one Vulkan domain: this GPU's side (the heap as CUDA sees it, a stream and
    events of its own) and a :class:`RemoteGpu` per other GPU, made at first use."""

    def __init__(self, view: CudaView, piece: int, spin_ns: int) -> None:
        self.view = view
        self.cu = view.cu
        self.ordinal = view.ordinal
        self.piece = piece
        self.spin_ns = spin_ns
        self._lib = _ops.lib
        if self._lib.vkc_load() != 0:
            raise GpuError("a CUDA link: could not load "
                           f"{_ops.ffi.string(self._lib.vkc_missing()).decode()}")
        self._lock = threading.Lock()
        #: one device copy at a time (this side's stream and events are shared by the links)
        self.copy_lock = threading.Lock()
        self._remotes: dict[int, RemoteGpu] = {}
        cu = self.cu
        with self.on(view.context):
            self.stream = self.check(
                cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate")
            self.local_events = self.events(SLOTS)
        self.stream_ptr = int(self.stream)
        self._stream2: Any = None  # the pair round's second stream (pair_stream)
        self.ctx_ptr = int(view.context)
        self._folds: CudaFolds | None = None  # first fold
        #: bound of a wait for a peer (VKSHMEM_GPU_TIMEOUT, set by the domain)
        self.timeout = 30.0
        #: where this PE's heap keeps its control bytes (segment.CONTROL_BYTES; the symmetric
        #: size), 0 where it has none (a heap of Vulkan's)
        self.control_off = 0

    def _kernels(self) -> CudaFolds:
        if self._folds is None:
            with self.on(self.view.context):
                self._folds = CudaFolds(self.view, self.stream)
        return self._folds

    def fold_kernel(self, op: str, dtype: np.dtype) -> Any:
        """The reduce kernel of ``op`` on ``dtype`` (compiled at first use), None where there
        is none."""
        folds = self._folds
        if folds is not None and folds.known(op, dtype):  # no lock, no context switch
            return folds.kernel(op, dtype)
        with self.copy_lock, self.on(self.view.context):
            return self._kernels().kernel(op, dtype)

    def fold_launch(self, op: str, dtype: np.dtype, count: int) -> tuple[Any, int, int]:
        """(kernel, grid, block) of a fold of ``count`` elements (:meth:`fold_kernel` not
        None)."""
        folds = self._kernels()
        return self.fold_kernel(op, dtype), folds.grid(count, dtype), folds.block

    def fold(self, dsts: list[int], srcs: list[int], count: int, op: str,
             dtype: np.dtype) -> bool:
        """The reduce kernel of ``op`` on ``dtype`` from ``srcs`` into ``dsts`` (CUDA
        addresses this GPU reaches) on this side's stream, complete on return; False where
        there is no such kernel (nothing done)."""
        with self.copy_lock, self.on(self.view.context):
            folds = self._kernels()
            fn = folds.kernel(op, dtype)
            if fn is None:
                return False
            folds.run(fn, dsts, srcs, count, dtype)
        return True

    def pair_stream(self) -> int:
        """The second stream of the two-GPU all-reduce's split round (:mod:`.pair`),
        made at first use (the caller holds :attr:`copy_lock`)."""
        if self._stream2 is None:
            cu = self.cu
            with self.on(self.view.context):
                self._stream2 = self.check(
                    cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING),
                    "cuStreamCreate")
        return int(self._stream2)

    def check(self, res: Any, what: str) -> Any:
        return self.view.check(res, what, GpuError, "a CUDA link to another GPU")

    @contextlib.contextmanager
    def on(self, ctx: Any) -> Iterator[None]:
        """Make ``ctx`` current for the block, then the caller's context again (the
        application's CUDA libraries take the current context for their device)."""
        cu = self.cu
        prev = self.check(cu.cuCtxGetCurrent(), "cuCtxGetCurrent")
        self.check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        try:
            yield
        finally:
            cu.cuCtxSetCurrent(prev)

    def events(self, n: int) -> tuple[Any, list[Any]]:
        """``n`` events of the current context: (a C array of their handles, the handles)."""
        evs = [self.check(self.cu.cuEventCreate(_DISABLE_TIMING), "cuEventCreate")
               for _ in range(n)]
        return _ops.ffi.new("uintptr_t[]", [int(e) for e in evs]), evs

    def ordinal_of(self, uuid_hex: str) -> int:
        """The CUDA device whose UUID the peer's Vulkan device has (its export group)."""
        found = device_by_uuid(self.cu, bytes.fromhex(uuid_hex), self.check)
        if found is None:
            raise GpuError(f"a CUDA link: no CUDA device has the peer's GPU UUID {uuid_hex}")
        return found[0]

    def remote(self, ordinal: int) -> RemoteGpu:
        with self._lock:
            got = self._remotes.get(ordinal)
            if got is None:
                got = self._remotes[ordinal] = RemoteGpu(self, ordinal)
            return got

    def done(self, res: int, what: str) -> None:
        if res:
            _e, name = self.cu.cuGetErrorName(self.cu.CUresult(res))
            raise GpuError(f"{what} through a CUDA link failed: "
                           f"{name.decode() if isinstance(name, bytes) else res} "
                           "(VKSHMEM_GPU_CUDA_LINK=0 sends puts and gets between GPUs through "
                           "the domain proxy)")

    def close(self) -> None:
        with self._lock:
            remotes, self._remotes = list(self._remotes.values()), {}
        for r in remotes:
            r.close()
        with self.on(self.view.context):
            for ev in self.local_events[1]:
                self.cu.cuEventDestroy(ev)
            self.cu.cuStreamDestroy(self.stream)
            if self._stream2 is not None:
                self.cu.cuStreamDestroy(self._stream2)
                self._stream2 = None
