"""``CudaArray``: an array in the symmetric heap of the ``cuda`` domain.

A :class:`~vkshmem.core.domainarray.DomainArray` (offset, shape, dtype, views, ``to_numpy``,
``copy_from``) that CUDA libraries take as it is: ``__cuda_array_interface__`` (version 3)
points at this PE's mapping, so ``cupy.asarray(a)`` and ``torch.as_tensor(a, device="cuda")``
view the symmetric memory without a copy, and kernels may read and write it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from vkshmem.core.domainarray import DomainArray

if TYPE_CHECKING:
    from .domain import CudaDomain

__all__ = ["CudaArray", "PeerView"]


class CudaArray(DomainArray):
    """A C-contiguous array in the symmetric CUDA heap (see the module docstring)."""

    __slots__ = ()
    domain: CudaDomain

    @property
    def device_pointer(self) -> int:
        """CUDA device address of the first element, in this process."""
        return self.domain.local.va + self.offset

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return _interface(self.device_pointer, self.shape, self.dtype)


def _interface(pointer: int, shape: tuple[int, ...], dtype: np.dtype) -> dict[str, Any]:
    return {"shape": shape, "typestr": dtype.str, "descr": [("", dtype.str)],
            "data": (pointer, False), "strides": None, "version": 3, "stream": None}


class PeerView:
    """``shmem.ptr(a, pe)`` for a CudaArray: another PE's array as mapped on this PE's GPU
    (loads and stores by kernels and CUDA libraries go straight to that PE's memory)."""

    __slots__ = ("dtype", "pointer", "shape")

    def __init__(self, pointer: int, shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.pointer = pointer
        self.shape = shape
        self.dtype = dtype

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return _interface(self.pointer, self.shape, self.dtype)
