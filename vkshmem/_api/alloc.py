"""Symmetric allocation: every call here is collective (all PEs, same arguments, same order).

Allocations are aligned to at least 64 bytes, zero-filled (or filled) before the closing
barrier, and checked cheaply to be the same on every PE.

``domain`` picks the memory: ``'host'`` (default; numpy arrays over the host heap), ``'gpu'``
(the highest-priority GPU memory domain installed, e.g. ``'vulkan'``: its arrays, such as
:class:`~vkshmem.gpu.array.DeviceArray`, over its symmetric heap, opened on first use —
collective like every allocation), ``'auto'`` (that GPU domain when every PE has a real GPU,
not only a CPU Vulkan driver such as lavapipe; host memory otherwise), or an installed memory
domain's name (``vkshmem info`` lists them).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np

from ..core.errors import (
    InvalidArgumentError,
    InvalidTypeError,
    NotAllocatedError,
    ValueRangeError,
)
from ..core.heap import MIN_ALIGN
from ..core.runtime import HOST_SEG
from . import state
from .args import DomainArray, contiguous, heap_of, locate

__all__ = ["alloc", "array", "del_array", "empty", "free", "fromalloc", "full", "new_array",
           "ones", "realloc", "zeros"]

Shape = int | Sequence[int]


def _check_domain(domain: str) -> str:
    """``'host'`` or an installed domain's name (``'gpu'``, ``'auto'`` resolved; collective
    the first time)."""
    if domain == "host":
        return domain
    return state.rt.domains.resolve_domain(domain)


def _domain_array(where: str, shape: Shape, dt: np.dtype, align: int | None, clear: bool,
                  value: Any = None, order: str = "C") -> Any:
    """Collective: an array of domain ``where`` (zeroed when ``clear``, else filled with
    ``value`` if given)."""
    if order == "F":
        raise InvalidArgumentError(f"{where} arrays are C-ordered: order='F' is not available")
    heap = state.rt.domains.domain(where)
    count = _count(shape)
    nbytes = count * dt.itemsize
    fill = None
    if value is not None:
        data = np.empty(_dims(shape), dt)
        np.copyto(data, _fill_source(value, dt, data.shape), casting="unsafe")

        def fill(off: int) -> None:
            if nbytes:
                heap.write_local(off, memoryview(data.reshape(-1)).cast("B"))

    off = heap.alloc(nbytes, align or MIN_ALIGN, clear and value is None, fill)
    return heap.domain.make_array(off, _dims(shape), dt)


def _fill_source(value: Any, dt: np.dtype, dims: tuple[int, ...]) -> np.ndarray:
    """``value`` as the array a fill copies with ``casting='unsafe'``, as shmem4py's fills do:
    an array of the value's own dtype, so ``-1`` fills uint8 with 255 and ``2.7`` int32 with 2
    whatever numpy's rules for Python scalars are. What cannot be cast at all (an integer
    beyond 64 bits into an integer dtype) or broadcast raises here, before any allocation."""
    try:
        src = np.asarray(value)
        if src.dtype.hasobject:
            src = src.astype(dt)
        np.broadcast_shapes(src.shape, dims)
    except (TypeError, ValueError, OverflowError) as exc:
        error = ValueRangeError if isinstance(exc, OverflowError) else InvalidArgumentError
        raise error(f"{value!r} cannot fill an array of shape {dims} and dtype {dt}: "
                    f"{exc}") from None
    return src


def _plain(dt: np.dtype) -> np.dtype:
    """``dt``, or an error for a dtype that holds Python objects (no symmetric array can)."""
    if dt.hasobject:
        raise InvalidArgumentError(f"symmetric arrays cannot hold Python objects ({dt})")
    return dt


def _dims(shape: Shape) -> tuple[int, ...]:
    """``shape`` as a tuple of dimensions, or an error naming what is wrong with it."""
    try:
        if isinstance(shape, (int, np.integer)):
            dims: tuple[int, ...] = (operator.index(shape),)
        else:
            dims = tuple(operator.index(d) for d in shape)
    except TypeError:
        raise InvalidTypeError(f"shape must be an integer or a sequence of integers, got "
                               f"{shape!r}") from None
    if any(d < 0 for d in dims):
        raise InvalidArgumentError(f"negative dimensions are not allowed: shape {dims}")
    return dims


def _count(shape: Shape) -> int:
    """Elements of an array of ``shape`` (checked)."""
    return math.prod(_dims(shape))


def _dtype(dtype: Any) -> np.dtype:
    try:
        return _plain(np.dtype(dtype))
    except TypeError as exc:
        raise InvalidTypeError(f"dtype {dtype!r} is not a numpy data type: {exc}") from None


def _bytes(count: Any, size: Any) -> int:
    try:
        return operator.index(count) * operator.index(size)
    except TypeError:
        raise InvalidTypeError(f"alloc: count and size must be integers, got {count!r} and "
                               f"{size!r}") from None


def _allocate(nbytes: int, align: int | None, clear: bool,
              fill: Callable[[memoryview], None] | None = None) -> memoryview:
    rt = state.rt
    off = rt.host.alloc(nbytes, align or MIN_ALIGN, clear and fill is None, fill)
    return rt.host.segment.buffer[off:off + nbytes]


def alloc(count: int, size: int = 1, align: int | None = None, hints: int | None = None,
          clear: bool = True, domain: str = "host") -> memoryview:
    """Collective: ``count * size`` bytes of the symmetric heap as a memoryview.

    ``align`` (a power of two, at least 64 is always given), ``hints`` (``MALLOC`` flags,
    accepted), ``clear`` zero-fills before the closing barrier.
    """
    where = _check_domain(domain)
    nbytes = _bytes(count, size)
    if nbytes < 0:
        raise InvalidArgumentError(f"cannot allocate {count} x {size} bytes")
    if where != "host":
        return _domain_array(where, nbytes, np.dtype(np.uint8), align, clear)  # type: ignore
    return _allocate(nbytes, align, clear)


def _place(obj: Any, what: str) -> tuple[int, int]:
    """``(segment, offset)`` where the allocation ``obj`` starts (as an allocation routine
    returned it: any order, any shape, 0-d and empty included, in any domain);
    NotAllocatedError when no live allocation starts there."""
    rt = state.rt
    if isinstance(obj, DomainArray):
        heap = heap_of(obj, what)
        if obj.base is not None:
            raise InvalidArgumentError(f"{what}: pass the allocated {type(obj).__name__}, not "
                                       "a view")
        _check_live(heap.heap.used, obj.offset, what)
        return heap.seg_id, obj.offset
    if isinstance(obj, np.ndarray):
        mem = contiguous(obj)  # a Fortran-ordered array starts where its transpose does
        if mem is None:
            raise InvalidArgumentError(f"{what}: a strided view is not an allocation; pass the "
                                       "array the allocation routine returned")
    elif isinstance(obj, memoryview):
        mem = obj
    else:
        raise InvalidTypeError(f"{what} takes a symmetric array or memoryview, got "
                               f"{type(obj).__name__}")
    seg, off = locate(mem, 0, what)
    heap = state.seg_heaps[seg]
    if heap is not None:  # a numpy array over a domain's CPU-addressable memory
        _check_live(heap.heap.used, off, what)
    elif seg == HOST_SEG:
        _check_live(rt.host.allocator.used, off, what)
    else:
        raise InvalidArgumentError(f"{what}: not a symmetric allocation")
    return seg, off


def _check_live(used: Any, off: int, what: str) -> None:
    if off not in used:
        raise NotAllocatedError(
            f"{what}: no live symmetric allocation starts at offset {off} (freed already, or "
            "a slice that does not start where the allocation does)")


def free(mem: memoryview | np.ndarray | None) -> None:
    """Collective: release a symmetric allocation (the array or memoryview an allocation
    routine returned, in any domain). ``None`` does nothing (OpenSHMEM's free of a null
    pointer); a second ``free`` of the same allocation raises NotAllocatedError (a KeyError,
    as in shmem4py)."""
    if mem is None:
        return
    rt = state.rt
    seg, off = _place(mem, "free")
    heap = state.seg_heaps[seg]
    if heap is not None:
        heap.free(off)
    else:
        rt.host.free(off)


def realloc(mem: memoryview | np.ndarray, count: int, size: int | None = None,
            align: int | None = None) -> Any:
    """Collective: resize an allocation, keeping its contents up to the smaller size.

    A memoryview becomes ``count * (size or 1)`` bytes; an array becomes a 1-D array of
    ``count`` elements of its dtype. The old object must not be used afterwards.
    """
    rt = state.rt
    seg, off = _place(mem, "realloc")
    if seg != HOST_SEG and not isinstance(mem, DomainArray):
        raise InvalidArgumentError(f"realloc: only host-heap and GPU allocations can be "
                                   f"resized (this one is in segment {seg})")
    if isinstance(mem, DomainArray):
        heap = heap_of(mem, "realloc")
        elements = _bytes(count, size) // mem.dtype.itemsize if size else _bytes(count, 1)
        new = _domain_array(heap.name, elements, mem.dtype, align, True)
        n = min(new.nbytes, mem.nbytes)
        if n:
            heap.copy_local(new.offset, off, n)
        heap.free(off)
        return new
    if isinstance(mem, np.ndarray):
        dt = mem.dtype
        nbytes = _bytes(count, dt.itemsize)
    else:
        dt = None
        nbytes = _bytes(count, size or 1)
    new = rt.host.realloc(off, nbytes, align or MIN_ALIGN)
    buf = rt.host.segment.buffer[new:new + nbytes]
    return buf if dt is None else np.frombuffer(buf, dt)


def fromalloc(mem: memoryview, shape: Shape | None = None, dtype: Any = None,
              order: Literal["C", "F"] = "C") -> np.ndarray:
    """A numpy array over memory from ``alloc`` (not collective)."""
    dt = np.dtype(dtype)
    a = np.frombuffer(mem, dt)
    if shape is None:
        return a
    return a.reshape(shape, order=order)


def new_array(shape: Shape, dtype: Any = float, order: Literal["C", "F"] = "C", *,
              align: int | None = None, hints: int | None = None, clear: bool = True,
              domain: str = "host") -> np.ndarray:
    """Collective: a new symmetric array (zero-filled when ``clear``); the domain's array type
    (a DeviceArray with ``domain='gpu'``) for other domains."""
    where = _check_domain(domain)
    dt = _dtype(dtype)
    if where != "host":
        return _domain_array(where, shape, dt, align, clear, order=order)  # type: ignore
    count = _count(shape)
    return fromalloc(_allocate(count * dt.itemsize, align, clear), shape, dt, order)


def _filled(shape: Shape, dt: np.dtype, order: Literal["C", "F"], align: int | None,
            value: Any) -> np.ndarray:
    count = _count(shape)
    src = _fill_source(value, _plain(dt), _dims(shape))

    def fill(buf: memoryview) -> None:
        np.copyto(np.frombuffer(buf, dt).reshape(shape, order=order), src, casting="unsafe")

    return fromalloc(_allocate(count * dt.itemsize, align, False, fill), shape, dt, order)


def del_array(a: np.ndarray) -> None:
    """Collective: release an array from ``new_array``/``zeros``/...."""
    free(a)


def empty(shape: Shape, dtype: Any = float, order: Literal["C", "F"] = "C", *,
          align: int | None = None, hints: int | None = None,
          domain: str = "host") -> np.ndarray:
    """Collective: a symmetric array with undefined contents."""
    return new_array(shape, dtype, order, align=align, hints=hints, clear=False, domain=domain)


def zeros(shape: Shape, dtype: Any = float, order: Literal["C", "F"] = "C", *,
          align: int | None = None, hints: int | None = None,
          domain: str = "host") -> np.ndarray:
    """Collective: a symmetric array of zeros."""
    return new_array(shape, dtype, order, align=align, hints=hints, clear=True, domain=domain)


def ones(shape: Shape, dtype: Any = float, order: Literal["C", "F"] = "C", *,
         align: int | None = None, hints: int | None = None,
         domain: str = "host") -> np.ndarray:
    """Collective: a symmetric array of ones."""
    where = _check_domain(domain)
    if where != "host":
        return _domain_array(where, shape, _dtype(dtype), align, False, 1, order)  # type: ignore
    return _filled(shape, _dtype(dtype), order, align, 1)


def full(shape: Shape, fill_value: Any, dtype: Any = None, order: Literal["C", "F"] = "C", *,
         align: int | None = None, hints: int | None = None,
         domain: str = "host") -> np.ndarray:
    """Collective: a symmetric array filled with ``fill_value``."""
    where = _check_domain(domain)
    dt = np.array(fill_value).dtype if dtype is None else _dtype(dtype)
    if where != "host":
        return _domain_array(where, shape, dt, align, False, fill_value, order)  # type: ignore
    return _filled(shape, dt, order, align, fill_value)


def array(obj: Any, dtype: Any = None, *, order: Literal["K", "A", "C", "F"] = "K",
          align: int | None = None, hints: int | None = None,
          domain: str = "host") -> np.ndarray:
    """Collective: a symmetric copy of ``obj`` (every PE passes its own data)."""
    where = _check_domain(domain)
    tmp = np.asarray(obj, dtype=dtype)
    if where != "host":
        return _domain_array(where, tmp.shape, tmp.dtype, align, False, tmp)  # type: ignore
    layout: Literal["C", "F"] = "F" if (order == "F" or (
        order in "KA" and tmp.flags.f_contiguous and not tmp.flags.c_contiguous)) else "C"
    return _filled(tmp.shape, tmp.dtype, layout, align, tmp)
