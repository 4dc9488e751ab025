"""``CudaArray``: an array in the symmetric heap of the ``cuda`` domain.

A :class:`~vkshmem.core.domainarray.DomainArray` (offset, shape, dtype, views, ``to_numpy``,
``copy_from``) that CUDA libraries take as it is: ``__cuda_array_interface__`` (version 3)
points at this PE's mapping, so ``cupy.asarray(a)`` and ``torch.as_tensor(a, device="cuda")``
view the symmetric memory without a copy, and kernels may read and write it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vkshmem.core.domainarray import DomainArray

if TYPE_CHECKING:
    from .domain import CudaDomain

__all__ = ["CudaArray"]


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
        return {"shape": self.shape, "typestr": self.dtype.str, "descr": [("", self.dtype.str)],
                "data": (self.device_pointer, False), "strides": None, "version": 3,
                "stream": None}
