"""Argument checks shared by the API: symmetric addresses, PEs, dtypes, sizes.

These run on every RMA/AMO call, so they do the least work that catches the error: one
``ffi.from_buffer`` and one native lookup resolve an array to ``(segment, offset)``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core._native import ffi, lib
from ..core.domains.contract import DomainArray
from ..core.domains.heap import DomainHeap
from ..core.errors import InvalidArgumentError, InvalidTypeError, NotAllocatedError
from . import state

__all__ = ["ND", "DomainArray", "check_pe", "contiguous", "foreign", "heap_of", "locate", "place",
           "resolve", "same_dtype", "segment_route"]

_MASK48 = (1 << 48) - 1
#: numpy's array type: the hot paths test ``type(a) is not ND`` before anything slower
ND = np.ndarray


def foreign(a: Any, b: Any = None) -> bool:
    """Whether ``a`` or ``b`` lives in a domain's memory the CPU cannot address (an array type
    of a domain plugin, e.g. a DeviceArray). Hot paths test ``type(x) is not ND`` first."""
    return isinstance(a, DomainArray) or isinstance(b, DomainArray)


def check_pe(pe: Any) -> int:
    """``pe`` as an int in ``[0, n_pes)``, or an InvalidArgumentError."""
    n = state.rt.n_pes
    if type(pe) is not int:
        try:
            pe = int(pe.__index__())
        except AttributeError:
            raise InvalidTypeError(f"PE must be an integer, got {pe!r}") from None
    if 0 <= pe < n:
        return pe
    raise InvalidArgumentError(f"PE {pe} does not exist: this job has PEs 0..{n - 1}")


def contiguous(a: np.ndarray) -> np.ndarray | None:
    """A C-contiguous view of ``a``'s memory in memory order (``a.T`` for Fortran order)."""
    flags = a.flags
    if flags.c_contiguous:
        return a
    if flags.f_contiguous:
        return a.T
    return None


def locate(a: np.ndarray, nbytes: int, what: str) -> tuple[int, int]:
    """``(segment, offset)`` of symmetric array ``a`` whose first ``nbytes`` will be accessed
    (a numpy array or memoryview over a CPU-addressable segment, or a domain's array)."""
    if type(a) is not ND and isinstance(a, DomainArray):
        heap, off = place(a, nbytes, what)
        return heap.seg_id, off
    try:
        r = lib.vk_locate(ffi.from_buffer(a), nbytes)
    except (TypeError, BufferError, ValueError):
        state.require()
        if not isinstance(a, np.ndarray):
            raise InvalidTypeError(
                f"{what} must be a numpy array from the symmetric heap, got "
                f"{type(a).__name__}") from None
        raise InvalidArgumentError(
            f"{what} is not contiguous: a symmetric RMA target must be a contiguous array or "
            "slice (use iput/iget for strided access)") from None
    if r >= 0:
        return r >> 48, r & _MASK48
    state.require()  # no heap at all: say why
    if r == -2:
        raise InvalidArgumentError(f"{what}: {nbytes} bytes from this array run past the end "
                                   "of the symmetric heap")
    if r == -3:
        raise NotAllocatedError(
            f"{what}: no live symmetric allocation holds this memory: it was freed (shmem.free, "
            "or moved by shmem.realloc); use the array the allocation routine returned since")
    raise InvalidArgumentError(
        f"{what} is not in the symmetric heap: allocate it with shmem.zeros/empty/array/"
        "new_array (or a view/slice of such an array)")


def heap_of(a: DomainArray, what: str) -> DomainHeap:
    """The open heap ``a`` belongs to (see :meth:`MemoryDomains.heap_of_array
    <vkshmem.core.domains.registry.MemoryDomains.heap_of_array>`)."""
    return state.rt.domains.heap_of_array(a, what)


def place(a: DomainArray, nbytes: int, what: str) -> tuple[DomainHeap, int]:
    """``(heap, offset)`` of a domain's array whose first ``nbytes`` will be accessed."""
    heap = state.domain_heaps.get(a.domain)
    if heap is None:
        heap_of(a, what)  # raises
    off = a.offset
    if off + nbytes > heap.size:
        raise InvalidArgumentError(f"{what}: {nbytes} bytes from this {type(a).__name__} run "
                                   f"past the end of the {heap.name} heap")
    return heap, off


def segment_route(t: Any, seg: int) -> Any:
    """The endpoint for segment ``seg``: ``t`` for the host heap, else the domain's heap
    (which routes each peer: imported memory, a transport, or the domain proxy)."""
    heap = state.seg_heaps[seg]
    return t if heap is None else heap


def same_dtype(target: np.ndarray, source: np.ndarray) -> np.dtype:
    """The common dtype, or an error naming both."""
    try:
        dt = target.dtype
        sdt = source.dtype
    except AttributeError:
        bad = target if not isinstance(target, np.ndarray) else source
        raise InvalidTypeError(
            f"expected numpy arrays, got {type(bad).__name__}") from None
    if sdt is not dt and sdt != dt:
        raise InvalidArgumentError(f"dtype mismatch: target is {dt}, source is {sdt}")
    if dt.hasobject:
        raise InvalidArgumentError("arrays of Python objects cannot be moved between PEs")
    return dt


def resolve(ctx: Any, pe: Any) -> tuple[int, Any]:
    """``(world PE, transport)`` for operation on ``pe`` in context ``ctx``.

    ``ctx=None`` is the default context (``pe`` is a world PE). A context made from a team
    takes team-relative PE numbers and carries its own endpoints (``Ctx.target``). A PE known
    to have failed raises PeerFailedError (instead of reaching its stale memory).
    """
    if ctx is None:
        pe = check_pe(pe)
        rt = state.rt
        if rt.liveness.any:
            rt.liveness.check(pe, f"operation on PE {pe}")
        return pe, state.route_transport[pe]
    try:
        target = ctx.target
    except AttributeError:
        raise InvalidTypeError(f"ctx must be a shmem.Ctx (or None for the default context), "
                               f"got {type(ctx).__name__}") from None
    pe, t = target(pe)
    lv = state.rt.liveness
    if lv.any:
        lv.check(pe, f"operation on PE {pe}")
    return pe, t
