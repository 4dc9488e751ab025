"""Host memory imported into a Vulkan device (``VK_EXT_external_memory_host``).

A :class:`HostImport` is a transfer buffer whose memory *is* a range of this process's host
memory (pinned by the driver for as long as it is imported), so a copy between it and GPU memory
is one DMA transfer: no staging buffer and no CPU memcpy. The GPU domain imports the core's
host heap once (CPU<->GPU puts and gets between symmetric arrays).

The spec's rules, checked here: the pointer and the size must be multiples of
``minImportedHostPointerAlignment`` (so a range is widened to whole aligned blocks of the same
mapping, whose pages are all mapped), the memory type must be one that
``vkGetMemoryHostPointerPropertiesEXT`` allows, and the host memory must stay mapped until the
import is freed. An import the driver refuses raises :class:`~vkshmem.gpu.errors.GpuError`; the
callers then fall back to the staging path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vkshmem.core.errors import FeatureNotAvailableError, InvalidArgumentError

from ..errors import GpuError
from ._vk import check

if TYPE_CHECKING:
    from .logical import LogicalDevice

__all__ = ["HostImport", "import_alignment"]


def import_alignment(device: LogicalDevice) -> int:
    """``minImportedHostPointerAlignment`` of ``device`` (0 without the extension)."""
    if not device.has_memory_host:
        return 0
    vk = device._vk
    ffi = vk.ffi
    ext = ffi.new("VkPhysicalDeviceExternalMemoryHostPropertiesEXT*", {
        "sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_EXTERNAL_MEMORY_HOST_PROPERTIES_EXT})
    props = ffi.new("VkPhysicalDeviceProperties2*", {
        "sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, "pNext": ext})
    vk.lib.vkGetPhysicalDeviceProperties2(device.physical, props)
    return int(ext.minImportedHostPointerAlignment)


class HostImport:
    """``size`` bytes of host memory at ``address`` as a device buffer (see module doc).

    Quacks like :class:`~vkshmem.gpu.vk.memory.GpuMemory` for copies: ``buffer``, ``memory``,
    ``size``, ``device_address`` (shader copies) and ``check_range``. ``offset_of(address)``
    is the buffer offset of a host address inside the range. The range is widened to the
    device's import alignment.
    """

    def __init__(self, device: LogicalDevice, address: int, size: int) -> None:
        device.check_open()
        vk = device._vk
        ffi, lib = vk.ffi, vk.lib
        align = device.host_alignment
        if not align:
            raise FeatureNotAvailableError(f"{device.info.name} cannot import host memory "
                                           "(no VK_EXT_external_memory_host)")
        if address <= 0 or size <= 0:
            raise InvalidArgumentError(f"cannot import {size} bytes at {address:#x}")
        self.device = device
        self.base = address - address % align
        self.size = -(-(address + size - self.base) // align) * align
        self.buffer: Any = None
        self.memory: Any = None
        self.device_address = 0
        handle_type = vk.VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT
        try:
            pointer = ffi.cast("void*", self.base)
            props = ffi.new("VkMemoryHostPointerPropertiesEXT*", {
                "sType": vk.VK_STRUCTURE_TYPE_MEMORY_HOST_POINTER_PROPERTIES_EXT})
            query = device._device_fn("vkGetMemoryHostPointerPropertiesEXT")
            check(query(device.handle, handle_type, pointer, props),
                  "vkGetMemoryHostPointerPropertiesEXT")
            ext_info = ffi.new("VkExternalMemoryBufferCreateInfo*", {
                "sType": vk.VK_STRUCTURE_TYPE_EXTERNAL_MEMORY_BUFFER_CREATE_INFO,
                "handleTypes": handle_type})
            binfo = ffi.new("VkBufferCreateInfo*", {
                "sType": vk.VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, "pNext": ext_info,
                "size": self.size,
                "usage": vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT | vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT
                | vk.BUFFER_USAGE_SHADER_DEVICE_ADDRESS_BIT,
                "sharingMode": vk.VK_SHARING_MODE_EXCLUSIVE})
            out = ffi.new("VkBuffer*")
            check(lib.vkCreateBuffer(device.handle, binfo, ffi.NULL, out), "vkCreateBuffer")
            self.buffer = out[0]
            req = ffi.new("VkMemoryRequirements*")
            lib.vkGetBufferMemoryRequirements(device.handle, self.buffer, req)
            bits = req.memoryTypeBits & props.memoryTypeBits
            if not bits:
                raise GpuError(f"no memory type of {device.info.name} can hold imported host "
                               f"memory for a transfer buffer (buffer {req.memoryTypeBits:#x}, "
                               f"host pointer {props.memoryTypeBits:#x})")
            type_index = (bits & -bits).bit_length() - 1
            flags = ffi.new("VkMemoryAllocateFlagsInfo*", {
                "sType": vk.VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_FLAGS_INFO,
                "flags": vk.MEMORY_ALLOCATE_DEVICE_ADDRESS_BIT})
            imp = ffi.new("VkImportMemoryHostPointerInfoEXT*", {
                "sType": vk.VK_STRUCTURE_TYPE_IMPORT_MEMORY_HOST_POINTER_INFO_EXT,
                "pNext": flags, "handleType": handle_type, "pHostPointer": pointer})
            ainfo = ffi.new("VkMemoryAllocateInfo*", {
                "sType": vk.VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, "pNext": imp,
                "allocationSize": self.size, "memoryTypeIndex": type_index})
            mem = ffi.new("VkDeviceMemory*")
            res = lib.vkAllocateMemory(device.handle, ainfo, ffi.NULL, mem)
            if res != 0:
                raise GpuError(f"importing {self.size} bytes of host memory at {self.base:#x} "
                               f"into {device.info.name} failed: {vk.result_name(res)}", res)
            self.memory = mem[0]
            check(lib.vkBindBufferMemory(device.handle, self.buffer, self.memory, 0),
                  "vkBindBufferMemory")
            addr = ffi.new("VkBufferDeviceAddressInfo*", {
                "sType": vk.VK_STRUCTURE_TYPE_BUFFER_DEVICE_ADDRESS_INFO, "buffer": self.buffer})
            #: where shaders see the range (copy.comp reads it over PCIe); 0 where none
            self.device_address = int(lib.vkGetBufferDeviceAddress(device.handle, addr))
        except BaseException:
            self.close()
            raise

    def offset_of(self, address: int, nbytes: int) -> int:
        """The buffer offset of host ``address`` if ``nbytes`` from it lie inside, else -1."""
        rel = address - self.base
        return rel if 0 <= rel and rel + nbytes <= self.size else -1

    def check_range(self, offset: int, nbytes: int, what: str) -> None:
        if offset < 0 or nbytes < 0 or offset + nbytes > self.size:
            raise InvalidArgumentError(f"{what}: {nbytes} bytes at offset {offset} are outside "
                                       f"the {self.size}-byte host import")

    def close(self) -> None:
        """Release the import (the host memory stays the caller's); safe to call twice."""
        dev = self.device
        if dev.handle is None:
            return
        vk = dev._vk
        if self.buffer is not None:
            vk.lib.vkDestroyBuffer(dev.handle, self.buffer, vk.ffi.NULL)
            self.buffer = None
        if self.memory is not None:
            vk.lib.vkFreeMemory(dev.handle, self.memory, vk.ffi.NULL)
            self.memory = None
