"""A symmetric GPU segment: exportable device memory in the shape the core's transports see.

The lead's runtime makes one per PE for the ``gpu`` domain (segment id 1). ``info()`` gives
the :class:`~vkshmem.core.transport.SegmentInfo` a transport registers: ``kind`` is
``"opaque_fd"`` (``"dmabuf"`` when the device can export one, see ``dmabuf_fd``), ``fd`` an
exported fd the segment owns, ``address`` the host address of the mapping (0 when the memory
is not host-visible) and ``buffer`` the mapped bytes (empty when not host-visible: such a
segment is reached through :meth:`VulkanDevice.write`/``read``/``copy`` or shaders).
With a :class:`~vkshmem.gpu.cudaheap.VmmHeap` (NVIDIA) the memory is CUDA's, imported into
Vulkan, and ``fd`` is CUDA's export of it (an opaque fd to Vulkan).
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING

from vkshmem.core.transport import SegmentInfo

if TYPE_CHECKING:
    from .cudaheap import VmmHeap
    from .device import VulkanDevice
    from .memory import ExportInfo, GpuMemory

__all__ = ["GpuSegment"]


class GpuSegment:
    """``size`` bytes of exportable memory on ``device`` with an exported opaque fd: Vulkan's
    own, or all of ``vmm`` (which the caller keeps and closes after this segment)."""

    def __init__(self, device: VulkanDevice, seg_id: int, size: int,
                 vmm: VmmHeap | None = None) -> None:
        self.device = device
        self.seg_id = seg_id
        self.size = size
        self.vmm = vmm
        self.dmabuf_fd = -1
        if vmm is not None:
            self.memory: GpuMemory = device.import_fd(vmm.export_fd(), vmm.size,
                                                      dedicated=False, take_ownership=True)
        else:
            self.memory = device.alloc_exportable(size)
        try:
            self.fd = vmm.export_fd() if vmm is not None else self.memory.export_fd()
            if device.has_dma_buf and vmm is None:
                self.dmabuf_fd = self.memory.export_dmabuf()
        except BaseException:
            self.memory.free()
            raise
        self.kind = "opaque_fd"

    @property
    def device_address(self) -> int:
        return self.memory.device_address

    def export_info(self) -> ExportInfo:
        """What a same-device peer passes to ``import_fd`` with :attr:`fd`."""
        return dataclasses.replace(self.memory.export_info(), vmm=self.vmm is not None)

    def info(self) -> SegmentInfo:
        view = self.memory.map()
        return SegmentInfo(self.seg_id, self.kind, self.memory.host_address or 0, self.size,
                           self.fd, view if view is not None else memoryview(b""),
                           dmabuf_fd=self.dmabuf_fd)

    def close(self) -> None:
        """Close the exported fds and free the memory (raises BufferError while arrays still
        view the mapping)."""
        if self.fd < 0:
            return
        self.memory.free()
        os.close(self.fd)
        self.fd = -1
        if self.dmabuf_fd >= 0:
            os.close(self.dmabuf_fd)
            self.dmabuf_fd = -1
