"""``DeviceArray``: an array in the symmetric GPU heap of the Vulkan domain.

What ``shmem.zeros(..., domain='gpu')`` returns there: a
:class:`~vkshmem.core.domainarray.DomainArray` (offset, shape, dtype, views, ``to_numpy``,
``copy_from``, ...) plus what Vulkan adds: the device address kernels take.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vkshmem.core.domainarray import DomainArray

if TYPE_CHECKING:
    from .domain import VulkanDomain

__all__ = ["DeviceArray"]


class DeviceArray(DomainArray):
    """A C-contiguous array in the symmetric GPU heap (see the module docstring)."""

    __slots__ = ()
    domain: VulkanDomain

    @property
    def device_address(self) -> int:
        """Vulkan device address of the first element (for shaders' push constants)."""
        return self.domain.memory.device_address + self.offset

    def __repr__(self) -> str:
        return (f"DeviceArray(shape={self.shape}, dtype={self.dtype}, offset={self.offset}, "
                f"device={self.domain.device.name!r})")
