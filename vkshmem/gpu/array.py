"""``DeviceArray``: an array in the symmetric GPU heap of the Vulkan domain.

What ``shmem.zeros(..., domain='gpu')`` returns there: a
:class:`~vkshmem.core.domains.array.DomainArray` (offset, shape, dtype, views, ``to_numpy``,
``copy_from``, ...) plus what Vulkan adds: the device address kernels take. On NVIDIA GPUs it
is also a DLPack tensor and has ``__cuda_array_interface__`` (the heap imported into CUDA by
the domain's accelerator, :mod:`vkshmem.gpu.accel`: vkshmem-cuda): ``torch.from_dlpack(a)``,
``cupy.asarray(a)``, no copy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vkshmem.core.dlpack import KDL_CUDA, cuda_array_interface, dlpack_capsule
from vkshmem.core.domains.array import DomainArray

if TYPE_CHECKING:
    from .domain.vulkan import VulkanDomain

__all__ = ["DeviceArray"]


class DeviceArray(DomainArray):
    """A C-contiguous array in the symmetric GPU heap (see the module docstring)."""

    __slots__ = ()
    domain: VulkanDomain

    @property
    def device_address(self) -> int:
        """Vulkan device address of the first element (for shaders' push constants)."""
        return self.domain.memory.device_address + self.offset

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        try:
            view = self.domain.accel.view()
        except BufferError as exc:
            raise AttributeError(f"no __cuda_array_interface__: {exc}") from None
        return cuda_array_interface(view.pointer + self.offset, self.shape, self.dtype)

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, dl_device: Any = None,
                   copy: Any = None) -> Any:
        """A DLPack capsule of this array's memory as CUDA sees it (NVIDIA; no copy).
        BufferError elsewhere, saying why."""
        view = self.domain.accel.view()
        return dlpack_capsule(view.pointer + self.offset, self.shape, self.dtype, view.ordinal,
                              self, dl_device, copy)

    def __dlpack_device__(self) -> tuple[int, int]:
        """(kDLCUDA, the CUDA device); BufferError where the heap has no CUDA view."""
        return (KDL_CUDA, self.domain.accel.view().ordinal)

    def __repr__(self) -> str:
        return (f"DeviceArray(shape={self.shape}, dtype={self.dtype}, offset={self.offset}, "
                f"device={self.domain.device.name!r})")
