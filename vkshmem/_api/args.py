"""Argument checks shared by the API: symmetric addresses, PEs, dtypes, sizes.

These run on every RMA/AMO call, so they do the least work that catches the error: one
``ffi.from_buffer`` and one native lookup resolve an array to ``(segment, offset)``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core._native import ffi, lib
from ..core.domain import DomainArray
from ..core.domainheap import DomainHeap
from ..core.errors import InvalidArgumentError, InvalidTypeError, NotAllocatedError
from . import state

__all__ = ["ND", "DomainArray", "check_pe", "contiguous", "count_of", "element_count",
           "foreign", "heap_of", "host_copy", "locate", "place", "resolve", "same_dtype",
           "segment_route"]

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
    """The open heap ``a`` belongs to, or an error when that heap is gone (an earlier
    ``init``)."""
    heap = state.rt.domain_heaps.get(a.domain)
    if heap is None:
        raise InvalidArgumentError(f"{what}: this {type(a).__name__} belongs to a "
                                   f"{a.domain.spec.name} heap that was released (finalize); "
                                   "allocate it again")
    return heap


def place(a: DomainArray, nbytes: int, what: str) -> tuple[DomainHeap, int]:
    """``(heap, offset)`` of a domain's array whose first ``nbytes`` will be accessed."""
    heap = state.rt.domain_heaps.get(a.domain)
    if heap is None:
        heap_of(a, what)  # raises
    off = a.offset
    if off + nbytes > heap.size:
        raise InvalidArgumentError(f"{what}: {nbytes} bytes from this {type(a).__name__} run "
                                   f"past the end of the {heap.name} heap")
    return heap, off


def host_copy(a: Any) -> Any:
    """``a`` itself, or for a domain's array a numpy copy of its contents (a local source)."""
    return a.to_numpy() if isinstance(a, DomainArray) else a


def segment_route(t: Any, seg: int) -> Any:
    """The endpoint for segment ``seg``: ``t`` for the host heap, else the domain's heap
    (which routes each peer: imported memory, a transport, or the domain proxy)."""
    heap = state.rt.seg_heaps[seg]
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


def count_of(target: np.ndarray, source: np.ndarray, size: int | None) -> int:
    """Elements to move: ``size`` checked against both arrays, or the smaller length."""
    if size is None:
        t, s = target.size, source.size
        return t if t < s else s
    return element_count(size, target.size, source.size)


def element_count(size: Any, *limits: int) -> int:
    """Validate an explicit element count against the lengths it must fit in."""
    try:
        n = int(size.__index__())
    except AttributeError:
        raise InvalidTypeError(f"size must be an integer, got {size!r}") from None
    if n < 0:
        raise InvalidArgumentError(f"size must be >= 0, got {n}")
    for limit in limits:
        if n > limit:
            raise InvalidArgumentError(f"size {n} is larger than a buffer of {limit} elements")
    return n



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
        return pe, rt.route_transport[pe]
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
