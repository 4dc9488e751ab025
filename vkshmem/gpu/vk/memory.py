"""Device memory that other processes can import: what a symmetric GPU segment is made of.

A :class:`GpuMemory` is one ``VkDeviceMemory`` bound to one ``VkBuffer`` (usage STORAGE,
TRANSFER_SRC, TRANSFER_DST and SHADER_DEVICE_ADDRESS) covering all of it, so it can be copied
to and from and addressed by shaders through its :attr:`~GpuMemory.device_address` plus an
offset. Exportable memory yields an opaque fd (:meth:`~GpuMemory.export_fd`; a dma-buf too
where the driver has ``VK_EXT_external_memory_dma_buf``) that a process on the same device
imports with :meth:`VulkanDevice.import_fd <vkshmem.gpu.vk.device.VulkanDevice.import_fd>`,
given the parameters in :meth:`~GpuMemory.export_info`.
"""

from __future__ import annotations

import os
import struct
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vkshmem.core.errors import FeatureNotAvailableError, InvalidArgumentError

from ..errors import GpuError
from ._vk import check
from .physical import MEM_HOST_CACHED, MEM_HOST_COHERENT, MEM_HOST_VISIBLE

if TYPE_CHECKING:
    from .logical import LogicalDevice

__all__ = ["ExportInfo", "GpuMemory"]

HANDLE_OPAQUE_FD = 0x1
HANDLE_DMA_BUF = 0x200

# VkExternalMemoryFeatureFlagBits
_EXT_DEDICATED_ONLY = 0x1
_EXT_EXPORTABLE = 0x2
_EXT_IMPORTABLE = 0x4


@dataclass(frozen=True)
class ExportInfo:
    """What an importer needs besides the fd: sizes, memory type, dedication, device."""

    size: int
    allocation_size: int
    memory_type_index: int
    dedicated: bool
    device_uuid: bytes
    driver_uuid: bytes
    #: the fd is CUDA's (a VMM allocation, :mod:`~vkshmem_cuda.vmm`): CUDA on another
    #: GPU maps it with ``cuMemImportFromShareableHandle``
    vmm: bool = False

    _FMT = struct.Struct("<QQI?16s16s?")

    def pack(self) -> bytes:
        """A fixed-size blob (for a remote key)."""
        return self._FMT.pack(self.size, self.allocation_size, self.memory_type_index,
                              self.dedicated, self.device_uuid, self.driver_uuid, self.vmm)

    @classmethod
    def unpack(cls, blob: bytes) -> ExportInfo:
        return cls(*cls._FMT.unpack(blob))


def _usage(vk: Any) -> int:
    return (vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT
            | vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT | vk.BUFFER_USAGE_SHADER_DEVICE_ADDRESS_BIT)


def exportable_memory_types(device: LogicalDevice) -> int:
    """The memoryTypeBits a small exportable buffer may use (a probe buffer, destroyed)."""
    vk = device._vk
    ffi, lib = vk.ffi, vk.lib
    ext = ffi.new("VkExternalMemoryBufferCreateInfo*", {
        "sType": vk.VK_STRUCTURE_TYPE_EXTERNAL_MEMORY_BUFFER_CREATE_INFO,
        "handleTypes": HANDLE_OPAQUE_FD})
    info = ffi.new("VkBufferCreateInfo*", {
        "sType": vk.VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, "pNext": ext, "size": 65536,
        "usage": _usage(vk), "sharingMode": vk.VK_SHARING_MODE_EXCLUSIVE})
    buf = ffi.new("VkBuffer*")
    check(lib.vkCreateBuffer(device.handle, info, ffi.NULL, buf), "vkCreateBuffer")
    req = ffi.new("VkMemoryRequirements*")
    lib.vkGetBufferMemoryRequirements(device.handle, buf[0], req)
    lib.vkDestroyBuffer(device.handle, buf[0], ffi.NULL)
    return int(req.memoryTypeBits)


class GpuMemory:
    """One device allocation with a buffer over all of it. Made by the device's
    :meth:`~vkshmem.gpu.vk.device.VulkanDevice.alloc_exportable`, ``alloc`` or ``import_fd``."""

    def __init__(self, device: LogicalDevice) -> None:
        self.device = device
        self.size = 0
        self.allocation_size = 0
        self.memory: Any = None
        self.buffer: Any = None
        self.device_address = 0
        self.memory_type_index = -1
        self.property_flags = 0
        self.exportable = False
        self.imported = False
        self.dedicated = False
        self.handle_types = 0
        self._fbuf: Any = None  # ffi.buffer over the mapping: the exporter of every view
        self._fbuf_refs = 0
        self._ptr: Any = None
        self.host_address: int | None = None
        self.map_reason: str | None = None
        #: bound to a memory type its buffer's memoryTypeBits exclude (the BAR deviation:
        #: see LogicalDevice.bar_type)
        self.bar = False
        self._buffers = device._vk.ffi.new("VkBuffer[]", 1)

    # -- construction -----------------------------------------------------------------------

    @classmethod
    def _allocate(cls, device: LogicalDevice, size: int, *, exportable: bool,
                  host_visible: bool | None, memory_type_index: int | None = None
                  ) -> GpuMemory:
        device.check_open()
        mem = cls(device)
        handle_types = 0
        if exportable:
            handle_types = HANDLE_OPAQUE_FD | (HANDLE_DMA_BUF if device.info.dma_buf else 0)
        try:
            mem._create(size, handle_types, host_visible, import_fd=None,
                        memory_type_index=memory_type_index, dedicated=None)
        except BaseException:
            mem._destroy()
            raise
        mem.exportable = exportable
        device._register(mem)
        return mem

    @classmethod
    def _import(cls, device: LogicalDevice, fd: int, size: int, *,
                memory_type_index: int | None, dedicated: bool | None,
                take_ownership: bool) -> GpuMemory:
        device.check_open()
        own = fd if take_ownership else os.dup(fd)
        mem = cls(device)
        try:
            mem._create(size, HANDLE_OPAQUE_FD, None, import_fd=own,
                        memory_type_index=memory_type_index, dedicated=dedicated)
        except BaseException:
            if own >= 0 and mem.memory is None:  # Vulkan did not take it
                try:
                    os.close(own)
                except OSError:  # lavapipe 22.3 closes it even when the import fails
                    pass
            mem._destroy()
            raise
        mem.imported = True
        device._register(mem)
        return mem

    def _external_features(self, handle_type: int) -> int:
        vk = self.device._vk
        ffi = vk.ffi
        info = ffi.new("VkPhysicalDeviceExternalBufferInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_EXTERNAL_BUFFER_INFO,
            "usage": _usage(vk), "handleType": handle_type})
        props = ffi.new("VkExternalBufferProperties*", {
            "sType": vk.VK_STRUCTURE_TYPE_EXTERNAL_BUFFER_PROPERTIES})
        vk.lib.vkGetPhysicalDeviceExternalBufferProperties(self.device.physical, info, props)
        return int(props.externalMemoryProperties.externalMemoryFeatures)

    def _create(self, size: int, handle_types: int, host_visible: bool | None, *,
                import_fd: int | None, memory_type_index: int | None,
                dedicated: bool | None) -> None:
        dev = self.device
        vk = dev._vk
        ffi, lib = vk.ffi, vk.lib
        if not isinstance(size, int) or size <= 0:
            raise InvalidArgumentError(f"GPU allocation size must be a positive int, got {size!r}")
        if size > dev.info.max_allocation_size:
            raise InvalidArgumentError(
                f"{size} bytes exceed the largest single allocation of {dev.info.name} "
                f"({dev.info.max_allocation_size} bytes)")
        need_dedicated = False
        if handle_types:
            for ht in (HANDLE_OPAQUE_FD, HANDLE_DMA_BUF):
                if not handle_types & ht:
                    continue
                feats = self._external_features(ht)
                want = _EXT_IMPORTABLE if import_fd is not None else _EXT_EXPORTABLE
                if not feats & want:
                    if ht == HANDLE_DMA_BUF:
                        handle_types &= ~ht
                        continue
                    raise FeatureNotAvailableError(
                        f"{dev.info.name} cannot {'import' if import_fd is not None else 'export'}"
                        " storage buffers as opaque fds")
                need_dedicated |= bool(feats & _EXT_DEDICATED_ONLY)
        self.handle_types = handle_types
        self.size = size
        ext_info = ffi.NULL
        if handle_types:
            ext_info = ffi.new("VkExternalMemoryBufferCreateInfo*", {
                "sType": vk.VK_STRUCTURE_TYPE_EXTERNAL_MEMORY_BUFFER_CREATE_INFO,
                "handleTypes": handle_types})
        binfo = ffi.new("VkBufferCreateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, "pNext": ext_info,
            "size": size, "usage": _usage(vk),
            "sharingMode": vk.VK_SHARING_MODE_EXCLUSIVE})
        check(lib.vkCreateBuffer(dev.handle, binfo, ffi.NULL, self._buffers), "vkCreateBuffer")
        self.buffer = self._buffers[0]
        # Requirements, and whether the driver wants a dedicated allocation.
        dreq = ffi.new("VkMemoryDedicatedRequirements*", {
            "sType": vk.VK_STRUCTURE_TYPE_MEMORY_DEDICATED_REQUIREMENTS})
        req2 = ffi.new("VkMemoryRequirements2*", {
            "sType": vk.VK_STRUCTURE_TYPE_MEMORY_REQUIREMENTS_2, "pNext": dreq})
        rinfo = ffi.new("VkBufferMemoryRequirementsInfo2*", {
            "sType": vk.VK_STRUCTURE_TYPE_BUFFER_MEMORY_REQUIREMENTS_INFO_2,
            "buffer": self.buffer})
        lib.vkGetBufferMemoryRequirements2(dev.handle, rinfo, req2)
        req = req2.memoryRequirements
        if dedicated is None:
            dedicated = bool(handle_types) and (
                need_dedicated or bool(dreq.requiresDedicatedAllocation)
                or bool(dreq.prefersDedicatedAllocation))
        self.dedicated = dedicated
        auto_type = memory_type_index is None
        bar = dev.bar_type(size) if handle_types else None
        if memory_type_index is None:
            memory_type_index = dev.memory_type(req.memoryTypeBits, host_visible, size)
            if host_visible is None and bar is not None \
                    and not dev.info.memory_types[memory_type_index][0] & MEM_HOST_VISIBLE:
                memory_type_index = bar  # CPU-mapped device memory (see bar_type)
        elif not req.memoryTypeBits & (1 << memory_type_index) and memory_type_index != bar:
            raise InvalidArgumentError(
                f"memory type {memory_type_index} cannot back this buffer (allowed types: "
                f"{req.memoryTypeBits:#x}); was the memory exported by another device?")
        self.bar = not req.memoryTypeBits & (1 << memory_type_index)
        self.memory_type_index = memory_type_index
        self.property_flags = dev.info.memory_types[memory_type_index][0]
        self.allocation_size = int(req.size)
        # vkAllocateMemory chain: [import|export] -> device-address flag -> [dedicated]
        chain: Any = ffi.NULL
        keep = []
        if dedicated:
            chain = ffi.new("VkMemoryDedicatedAllocateInfo*", {
                "sType": vk.VK_STRUCTURE_TYPE_MEMORY_DEDICATED_ALLOCATE_INFO,
                "buffer": self.buffer})
            keep.append(chain)
        chain = ffi.new("VkMemoryAllocateFlagsInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_FLAGS_INFO, "pNext": chain,
            "flags": vk.MEMORY_ALLOCATE_DEVICE_ADDRESS_BIT})
        keep.append(chain)
        if import_fd is not None:
            chain = ffi.new("VkImportMemoryFdInfoKHR*", {
                "sType": vk.VK_STRUCTURE_TYPE_IMPORT_MEMORY_FD_INFO_KHR, "pNext": chain,
                "handleType": HANDLE_OPAQUE_FD, "fd": import_fd})
        elif handle_types:
            chain = ffi.new("VkExportMemoryAllocateInfo*", {
                "sType": vk.VK_STRUCTURE_TYPE_EXPORT_MEMORY_ALLOCATE_INFO, "pNext": chain,
                "handleTypes": handle_types})
        keep.append(chain)
        ainfo = ffi.new("VkMemoryAllocateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, "pNext": chain,
            "allocationSize": req.size, "memoryTypeIndex": memory_type_index})
        out = ffi.new("VkDeviceMemory*")
        res = lib.vkAllocateMemory(dev.handle, ainfo, ffi.NULL, out)
        if (res == vk.VK_ERROR_OUT_OF_DEVICE_MEMORY and auto_type and host_visible is None
                and self.property_flags & MEM_HOST_VISIBLE):
            # The device-local, host-visible heap (a PCIe BAR) is full: plain device memory.
            memory_type_index = dev.memory_type(req.memoryTypeBits, False, size)
            self.memory_type_index = ainfo.memoryTypeIndex = memory_type_index
            self.property_flags = dev.info.memory_types[memory_type_index][0]
            self.bar = False
            res = lib.vkAllocateMemory(dev.handle, ainfo, ffi.NULL, out)
        if res != 0:
            what = "import of an opaque fd" if import_fd is not None else f"{size}-byte allocation"
            raise GpuError(f"vkAllocateMemory ({what} on {dev.info.name}) failed: "
                           f"{vk.result_name(res)}", res)
        self.memory = out[0]
        check(lib.vkBindBufferMemory(dev.handle, self.buffer, self.memory, 0),
              "vkBindBufferMemory")
        # The package's vkGetBufferDeviceAddress wrapper returns its info struct, not the
        # address: call the raw cffi function.
        ainfo2 = ffi.new("VkBufferDeviceAddressInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_BUFFER_DEVICE_ADDRESS_INFO, "buffer": self.buffer})
        self.device_address = int(lib.vkGetBufferDeviceAddress(dev.handle, ainfo2))
        if not self.device_address:
            raise GpuError("vkGetBufferDeviceAddress returned 0")
        self._map_now()

    def _map_now(self) -> None:
        dev = self.device
        vk = dev._vk
        flags = self.property_flags
        if not flags & MEM_HOST_VISIBLE:
            self.map_reason = (
                f"memory type {self.memory_type_index} of {dev.info.name} is not host-visible"
                " (no DEVICE_LOCAL|HOST_VISIBLE type, e.g. NVIDIA without resizable BAR "
                "exposed to Vulkan): use write/read/copy through the staging buffer")
            return
        if not flags & MEM_HOST_COHERENT:
            self.map_reason = (f"memory type {self.memory_type_index} is host-visible but "
                               "not coherent; vkshmem maps only coherent memory")
            return
        pp = vk.ffi.new("void**")
        res = vk.lib.vkMapMemory(dev.handle, self.memory, 0, vk.WHOLE_SIZE, 0, pp)
        if res != 0:
            self.map_reason = f"vkMapMemory failed: {vk.result_name(res)}"
            return
        self._ptr = vk.ffi.cast("char*", pp[0])
        self.host_address = int(vk.ffi.cast("uintptr_t", pp[0]))
        self._fbuf = vk.ffi.buffer(self._ptr, self.size)
        self._fbuf_refs = sys.getrefcount(self._fbuf)

    # -- use --------------------------------------------------------------------------------

    @property
    def host_visible(self) -> bool:
        return self._fbuf is not None

    @property
    def host_cached(self) -> bool:
        """Whether CPU reads of the mapping are cached (fast); device memory behind a PCIe BAR
        is write-combined: stores run at GB/s, loads at tens of MB/s."""
        return bool(self.property_flags & MEM_HOST_CACHED)

    def map(self) -> memoryview | None:
        """A writable memoryview of the whole allocation when its memory is host-visible and
        coherent; None otherwise (:attr:`map_reason` says why). While it or anything made from
        it (numpy arrays, slices) is alive, :meth:`free` refuses with BufferError."""
        if self.memory is None:
            raise GpuError("the GPU memory was freed")
        # A fresh memoryview each time: each holds its own reference to the exporter, and so
        # does everything derived from it, which is how free() knows views are alive (a
        # memoryview's release() does not: numpy arrays share its managed buffer).
        return memoryview(self._fbuf) if self._fbuf is not None else None

    def views_alive(self) -> bool:
        """Whether views from :meth:`map` (or arrays made from them) still exist."""
        return self._fbuf is not None and sys.getrefcount(self._fbuf) > self._fbuf_refs

    def export_fd(self) -> int:
        """A new opaque fd of this allocation (vkGetMemoryFdKHR); the caller owns it."""
        return self._get_fd(HANDLE_OPAQUE_FD)

    def export_dmabuf(self) -> int:
        """A new dma-buf fd (only where the driver has VK_EXT_external_memory_dma_buf)."""
        if not self.handle_types & HANDLE_DMA_BUF:
            raise FeatureNotAvailableError(
                f"{self.device.info.name} ({self.device.driver}) cannot export dma-bufs "
                "(no VK_EXT_external_memory_dma_buf): use the opaque fd")
        return self._get_fd(HANDLE_DMA_BUF)

    def _get_fd(self, handle_type: int) -> int:
        dev = self.device
        vk = dev._vk
        if self.memory is None:
            raise GpuError("the GPU memory was freed")
        if not self.exportable or not self.handle_types & handle_type:
            raise InvalidArgumentError("this GPU memory was not allocated exportable")
        info = vk.ffi.new("VkMemoryGetFdInfoKHR*", {
            "sType": vk.VK_STRUCTURE_TYPE_MEMORY_GET_FD_INFO_KHR, "memory": self.memory,
            "handleType": handle_type})
        fd = vk.ffi.new("int*", -1)
        check(dev._get_memory_fd(dev.handle, info, fd), "vkGetMemoryFdKHR")
        return int(fd[0])

    def export_info(self) -> ExportInfo:
        """The parameters an importer must repeat (pass with the fd)."""
        return ExportInfo(self.size, self.allocation_size, self.memory_type_index,
                          self.dedicated, self.device.info.device_uuid,
                          self.device.info.driver_uuid)

    def write(self, offset: int, src: Any, *, timeout: float | None = None) -> None:
        self.device.write(self, offset, src, timeout=timeout)

    def read(self, offset: int, dst: Any, *, timeout: float | None = None) -> None:
        self.device.read(self, offset, dst, timeout=timeout)

    def check_range(self, offset: int, nbytes: int, what: str = "access") -> None:
        if self.memory is None:
            raise GpuError("the GPU memory was freed")
        if offset < 0 or nbytes < 0 or offset + nbytes > self.size:
            raise InvalidArgumentError(
                f"{what} of {nbytes} bytes at offset {offset} is outside the {self.size}-byte "
                "GPU allocation")

    def __repr__(self) -> str:
        kind = "imported" if self.imported else ("exportable" if self.exportable else "local")
        return (f"<GpuMemory {kind} {self.size} B at 0x{self.device_address:x} type "
                f"{self.memory_type_index}{' mapped' if self._fbuf is not None else ''}>")

    # -- teardown ---------------------------------------------------------------------------

    def free(self) -> None:
        """Free the memory and its buffer. Raises BufferError (and frees nothing) while a
        view from :meth:`map`, or a numpy array made from one, is alive."""
        if self.views_alive():
            extra = sys.getrefcount(self._fbuf) - self._fbuf_refs
            raise BufferError(f"{self!r} is still viewed ({extra} views or arrays from "
                              "map()); drop them first")
        self._fbuf = None
        self._destroy()
        self.device._unregister(self)

    def _destroy(self) -> None:
        dev = self.device
        vk = dev._vk
        lib, null = vk.lib, vk.ffi.NULL
        if dev.handle is None:
            return
        if self._ptr is not None:
            lib.vkUnmapMemory(dev.handle, self.memory)
            self._ptr = None
            self.host_address = None
        if self.buffer is not None:
            lib.vkDestroyBuffer(dev.handle, self.buffer, null)
            self.buffer = None
        if self.memory is not None:
            lib.vkFreeMemory(dev.handle, self.memory, null)
            self.memory = None
