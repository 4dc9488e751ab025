"""``CudaArray``: an array in the symmetric heap of the ``cuda`` domain.

A :class:`~vkshmem.core.domains.array.DomainArray` (offset, shape, dtype, views, ``to_numpy``,
``copy_from``) that CUDA libraries take as it is: ``__cuda_array_interface__`` (version 3)
points at this PE's mapping, so ``cupy.asarray(a)`` and ``torch.as_tensor(a, device="cuda")``
view the symmetric memory without a copy, and kernels may read and write it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from vkshmem.plugin import KDL_CUDA, DomainArray, cuda_array_interface, dlpack_capsule

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
        return cuda_array_interface(self.device_pointer, self.shape, self.dtype)

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, dl_device: Any = None,
                   copy: Any = None) -> Any:
        """A DLPack capsule of this array's memory (no copy; see :mod:`.dlpack`)."""
        return dlpack_capsule(self.device_pointer, self.shape, self.dtype,
                              self.domain.device.ordinal, self, dl_device, copy)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (KDL_CUDA, self.domain.device.ordinal)


class PeerView:
    """``shmem.ptr(a, pe)`` for a CudaArray: another PE's array as mapped on this PE's GPU
    (loads and stores by kernels and CUDA libraries go straight to that PE's memory)."""

    __slots__ = ("device_id", "dtype", "pointer", "shape")

    def __init__(self, pointer: int, shape: tuple[int, ...], dtype: np.dtype,
                 device_id: int) -> None:
        self.pointer = pointer
        self.shape = shape
        self.dtype = dtype
        self.device_id = device_id

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return cuda_array_interface(self.pointer, self.shape, self.dtype)

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, dl_device: Any = None,
                   copy: Any = None) -> Any:
        return dlpack_capsule(self.pointer, self.shape, self.dtype, self.device_id, self,
                              dl_device, copy)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (KDL_CUDA, self.device_id)
