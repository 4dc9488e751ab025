"""``DomainArray``: a typed, shaped view of a memory domain's symmetric heap.

What the allocation functions return for a domain whose memory the CPU cannot address (the
Vulkan domain's ``DeviceArray`` and the CUDA domain's array are subclasses). It holds no memory
of its own: a byte ``offset`` into this PE's segment of the domain (the same offset names the
same array on every PE), a ``shape`` and a ``dtype``, always C-contiguous. Slicing along the
first axis (step 1) and integer indexing of leading axes give views (of the same subclass);
data moves through the domain's local operations
(:class:`~vkshmem.core.domains.contract.MemoryDomain`
``read``/``write``/``copy`` on ``domain.local``). Every RMA, AMO, signal, wait and collective
call of :mod:`vkshmem.shmem` takes it wherever it takes a numpy array.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import FeatureNotAvailableError, InvalidArgumentError

if TYPE_CHECKING:
    from typing import Self

    from .contract import MemoryDomain

__all__ = ["DomainArray"]


def _shape(shape: Any) -> tuple[int, ...]:
    if isinstance(shape, (int, np.integer)):
        return (int(shape),)
    return tuple(int(s) for s in shape)


class DomainArray:
    """A C-contiguous array in a memory domain's symmetric heap (see the module docstring)."""

    __slots__ = ("__weakref__", "_base", "_size", "domain", "dtype", "offset", "shape")

    def __init__(self, domain: MemoryDomain, offset: int, shape: Any, dtype: Any,
                 base: DomainArray | None = None) -> None:
        self.domain = domain
        self.offset = int(offset)
        self.shape = _shape(shape)
        self.dtype = np.dtype(dtype)
        self._base = base
        self._size = math.prod(self.shape)  # once: every RMA call asks

    # -- numpy-like attributes ------------------------------------------------------------

    @property
    def size(self) -> int:
        """Number of elements."""
        return self._size

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def base(self) -> DomainArray | None:
        """The allocation this is a view of (None for an allocation itself)."""
        return self._base

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError(f"len() of a 0-d {type(self).__name__}")
        return self.shape[0]

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(shape={self.shape}, dtype={self.dtype}, "
                f"offset={self.offset}, domain={self.domain.spec.name!r})")

    # -- views ---------------------------------------------------------------------------------

    def _view(self, offset: int, shape: tuple[int, ...], dtype: np.dtype | None = None
              ) -> Self:
        cls = type(self)
        if cls.__init__ is not DomainArray.__init__:  # a subclass with its own constructor
            return cls(self.domain, offset, shape, dtype or self.dtype, self._base or self)
        # the fields are already checked: no parsing (a slice in an RMA loop stays cheap)
        view = object.__new__(cls)
        view.domain = self.domain
        view.offset = offset
        view.shape = shape
        view.dtype = dtype or self.dtype
        view._base = self._base or self
        view._size = math.prod(shape)
        return view

    def __getitem__(self, key: Any) -> Any:
        """``a[i]`` (a row view, or an element's value for 1-D), ``a[i:j]`` along the first
        axis (step 1), ``a[i, j]`` for leading axes. Other indexing: use ``to_numpy()``."""
        if type(key) is slice and key.step is None and len(self.shape) == 1:  # a[i:j]
            start, stop, _ = key.indices(self.shape[0])
            return self._view(self.offset + start * self.dtype.itemsize, (max(0, stop - start),))
        if not isinstance(key, tuple):
            key = (key,)
        if len(key) > self.ndim:
            raise IndexError(f"too many indices for a {self.ndim}-d {type(self).__name__}")
        offset, shape = self.offset, self.shape
        for i, k in enumerate(key):
            row = math.prod(shape[1:]) * self.itemsize
            if isinstance(k, slice):
                if i != len(key) - 1:
                    raise InvalidArgumentError(
                        f"a {type(self).__name__} slice must be the last index")
                start, stop, step = k.indices(shape[0])
                if step != 1:
                    raise InvalidArgumentError(
                        f"{type(self).__name__} slices must be contiguous (step 1); use "
                        "shmem.iput/iget for strided access, or to_numpy()")
                return self._view(offset + start * row, (max(0, stop - start), *shape[1:]))
            try:
                j = int(k.__index__())
            except AttributeError:
                raise InvalidArgumentError(
                    f"cannot index a {type(self).__name__} with {type(k).__name__}") from None
            if j < 0:
                j += shape[0]
            if not 0 <= j < shape[0]:
                raise IndexError(f"index {k} is out of bounds for axis {i} of size {shape[0]}")
            offset += j * row
            shape = shape[1:]
        view = self._view(offset, shape)
        return view.to_numpy()[()] if not shape else view

    def __setitem__(self, key: Any, value: Any) -> None:
        """``a[key] = value``: write through a view (same indexing as ``__getitem__``)."""
        target = self if key is Ellipsis else self._item_view(key)
        target.copy_from(np.broadcast_to(np.asarray(value, self.dtype), target.shape))

    def _item_view(self, key: Any) -> Self:
        if not isinstance(key, tuple):
            key = (key,)
        if len(key) == self.ndim and all(not isinstance(k, slice) for k in key):
            # a single element: view of one item
            flat = 0
            for k, n in zip(key, self.shape, strict=True):
                j = int(k.__index__())
                j = j + n if j < 0 else j
                if not 0 <= j < n:
                    raise IndexError(f"index {k} is out of bounds for size {n}")
                flat = flat * n + j
            return self._view(self.offset + flat * self.itemsize, ())
        out = self[key]
        assert isinstance(out, DomainArray)
        return out

    def reshape(self, *shape: Any) -> Self:
        """The same memory with another shape (one -1 allowed)."""
        if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)):
            shape = tuple(shape[0])
        new = np.empty(self.size, dtype=np.int8).reshape(*shape).shape  # numpy's checks
        return self._view(self.offset, new)

    def ravel(self) -> Self:
        return self._view(self.offset, (self.size,))

    def view(self, dtype: Any) -> Self:
        """Reinterpret the bytes as ``dtype`` (the last axis rescales, as numpy's ``view``)."""
        dt = np.dtype(dtype)
        last = self.shape[-1] * self.itemsize if self.shape else self.itemsize
        if last % dt.itemsize or self.offset % dt.itemsize:
            raise InvalidArgumentError(
                f"cannot view {self.dtype} with shape {self.shape} at offset {self.offset} as "
                f"{dt}: the last axis ({last} bytes) and the offset must be whole {dt}s")
        shape = (*self.shape[:-1], self.shape[-1] * self.itemsize // dt.itemsize) \
            if self.shape else (self.itemsize // dt.itemsize,)
        return self._view(self.offset, shape, dt)

    # -- data ----------------------------------------------------------------------------------

    def to_numpy(self, zero_copy: bool = False) -> np.ndarray:
        """The contents as a numpy array: a copy, or with ``zero_copy=True`` a view of the CPU
        mapping where the domain has one (elsewhere FeatureNotAvailableError says why)."""
        if zero_copy:
            dom = self.domain
            view = dom.host_view(dom.local)
            if view is None:
                raise FeatureNotAvailableError(
                    f"no CPU view of this {dom.spec.name} memory: {dom.no_view_reason()}. Use "
                    "to_numpy() (a copy) or copy_from()")
            return np.frombuffer(view, self.dtype, self.size, self.offset).reshape(self.shape)
        out = np.empty(self.shape, self.dtype)
        if self.nbytes:
            self.domain.read(self.domain.local, self.offset, memoryview(out.reshape(-1)).cast("B"))
        return out

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        a = self.to_numpy()
        return a if dtype is None else a.astype(dtype, copy=False)

    def ptr(self) -> int:
        """Host address of the first element in the CPU mapping (see ``to_numpy``)."""
        view = self.to_numpy(zero_copy=True)
        return int(view.__array_interface__["data"][0])

    def copy_from(self, src: Any) -> None:
        """Fill from ``src``: a numpy array (or anything ``np.asarray`` takes) with as many
        elements (converted to this dtype), or another array of this domain on this PE (a
        device copy)."""
        dom = self.domain
        if isinstance(src, DomainArray) and src.domain is dom:
            if src.nbytes != self.nbytes:
                raise InvalidArgumentError(f"copy_from: {src.nbytes} bytes into a "
                                           f"{self.nbytes}-byte {type(self).__name__}")
            dom.copy(dom.local, self.offset, dom.local, src.offset, self.nbytes)
            return
        a = np.ascontiguousarray(src, dtype=self.dtype)
        if a.size != self.size:
            raise InvalidArgumentError(
                f"copy_from: {a.size} elements into a {type(self).__name__} of {self.size}")
        if self.nbytes:
            dom.write(dom.local, self.offset, memoryview(a.reshape(-1)).cast("B"))

    def fill(self, value: Any) -> None:
        """Set every element to ``value``."""
        self.copy_from(np.full(self.shape, value, self.dtype))
