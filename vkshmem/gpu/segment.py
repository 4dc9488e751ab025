"""A symmetric GPU segment: exportable device memory in the shape the core's transports see.

The lead's runtime makes one per PE for the ``gpu`` domain (segment id 1). ``info()`` gives
the :class:`~vkshmem.core.transport.SegmentInfo` a transport registers: ``kind`` is
``"opaque_fd"`` (``"dmabuf"`` when the device can export one, see ``dmabuf_fd``), ``fd`` an
exported fd the segment owns, ``address`` the host address of the mapping (0 when the memory
is not host-visible) and ``buffer`` the mapped bytes (empty when not host-visible: such a
segment is reached through :meth:`VulkanDevice.write`/``read``/``copy`` or shaders).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from vkshmem.core.transport import SegmentInfo

if TYPE_CHECKING:
    from .device import VulkanDevice
    from .memory import ExportInfo, GpuMemory

__all__ = ["GpuSegment"]


class GpuSegment:
    """``size`` bytes of exportable memory on ``device`` with an exported opaque fd."""

    def __init__(self, device: VulkanDevice, seg_id: int, size: int) -> None:
        self.device = device
        self.seg_id = seg_id
        self.size = size
        self.memory: GpuMemory = device.alloc_exportable(size)
        self.dmabuf_fd = -1
        try:
            self.fd = self.memory.export_fd()
            if device.has_dma_buf:
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
        return self.memory.export_info()

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
