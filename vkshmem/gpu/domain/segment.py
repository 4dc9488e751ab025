"""A symmetric GPU segment: exportable device memory in the shape the core's transports see.

The lead's runtime makes one per PE for the ``gpu`` domain (segment id 1). ``info()`` gives
the :class:`~vkshmem.core.transports.contract.SegmentInfo` a transport registers: ``kind`` is
``"opaque_fd"`` (``"dmabuf"`` when the device can export one, see ``dmabuf_fd``), ``fd`` an
exported fd the segment owns, ``address`` the host address of the mapping (0 when the memory
is not host-visible) and ``buffer`` the mapped bytes (empty when not host-visible: such a
segment is reached through :meth:`VulkanDevice.write`/``read``/``copy`` or shaders).
With a heap from a vendor's accelerator (:meth:`DomainAccelerator.make_heap
<vkshmem.gpu.accel.DomainAccelerator.make_heap>`; vkshmem-cuda's CUDA VMM allocation on NVIDIA)
the memory is the vendor's, imported into Vulkan, and ``fd`` is its export (an opaque fd to
Vulkan); such a segment exports no dma-buf (NVIDIA's Vulkan driver has none either), and holds
:data:`CONTROL_BYTES` past the symmetric bytes for the PE's own use (the accelerator's: the
CUDA service kernel's request box, the two-GPU all-reduce's flag words).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from vkshmem.core._native import lib as _core
from vkshmem.core.transports.contract import SegmentInfo

from ..errors import GpuError

if TYPE_CHECKING:
    from ..accel import HeapMemory
    from ..vk.device import VulkanDevice
    from ..vk.memory import ExportInfo, GpuMemory

__all__ = ["CONTROL_BYTES", "CONTROL_SLOT", "CONTROL_WORDS", "GpuSegment", "open_segment"]

log = logging.getLogger("vkshmem")

#: bytes an accelerator's heap holds past its symmetric ones (for CUDA's: within its rounding
#: of the allocation to its 2 MiB granularity, or one granule more for a size that is a
#: multiple of it), zeroed when it is made: vkshmem-cuda's service kernel's request box from
#: 0, and from :data:`CONTROL_WORDS` the words its two-GPU all-reduce's partners write
#: (``vkshmem_cuda.vulkan_accel.pair``), ``CONTROL_SLOT`` bytes per writing PE
CONTROL_BYTES = 8192
CONTROL_WORDS = 4608
CONTROL_SLOT = 16


class GpuSegment:
    """``size`` bytes of exportable memory on ``device`` with an exported opaque fd: Vulkan's
    own, or all of ``vmm`` (an accelerator's heap, which the caller keeps and closes after
    this segment)."""

    def __init__(self, device: VulkanDevice, seg_id: int, size: int,
                 vmm: HeapMemory | None = None) -> None:
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


def open_segment(device: VulkanDevice, seg_id: int, size: int,
                 make_heap: Callable[[int], HeapMemory | None],
                 pe: int) -> tuple[GpuSegment, bool]:
    """PE ``pe``'s heap on ``device``: an accelerator's memory imported into Vulkan where
    ``make_heap`` supplies it (:meth:`DomainAccelerator.make_heap
    <vkshmem.gpu.accel.DomainAccelerator.make_heap>`: vkshmem-cuda's on NVIDIA; the segment's
    ``vmm``, which the caller closes after the segment), else Vulkan's; on the CPU-mapped BAR
    type where the device takes it and CPU and GPU see each other's writes through it. Also
    whether Vulkan refused the accelerator's fd (logged; the heap is Vulkan's then)."""
    vmm = None
    try:
        vmm = make_heap(size + CONTROL_BYTES)
        if vmm is not None:
            vmm.zero(size, CONTROL_BYTES)  # before any peer can write its words there
    except Exception as exc:  # the accelerator's failure (e.g. no driver library): Vulkan's
        log.info("PE %d: the GPU heap is Vulkan's: %s", pe, exc)
        if vmm is not None:
            vmm.close()
            vmm = None
    refused = False
    try:
        try:
            seg = GpuSegment(device, seg_id, size, vmm)
        except GpuError as exc:
            if vmm is None:
                raise
            log.warning("PE %d: %s did not import the GPU heap from %s (%s); Vulkan "
                        "allocates it (%s)", pe, device.name,
                        getattr(vmm, "origin", "its accelerator"), exc,
                        getattr(vmm, "skip_hint", "see vkshmem info"))
            vmm.close()
            vmm, refused = None, True
            seg = GpuSegment(device, seg_id, size)
        if seg.memory.bar and not _bar_works(device, seg.memory):
            log.warning("PE %d: %s maps exportable device memory but CPU and GPU do not see "
                        "each other's writes through it; using unmapped memory "
                        "(VKSHMEM_GPU_BAR=0 skips the attempt)", pe, device.name)
            seg.close()
            device.bar_exports = False
            seg = GpuSegment(device, seg_id, size, vmm)
    except BaseException:
        if vmm is not None:
            vmm.close()
        raise
    return seg, refused


def _bar_works(device: VulkanDevice, mem: GpuMemory) -> bool:
    """Whether CPU stores through the mapping of ``mem`` reach the GPU and GPU copies reach
    the CPU's loads (memory bound outside its buffer's memoryTypeBits)."""
    a, b = os.urandom(64), os.urandom(64)
    seen_gpu, seen_cpu = bytearray(64), bytearray(64)
    device.write(mem, 0, a, direct=True)
    _core.vk_fence()  # drain the write-combining buffers
    device.read(mem, 0, seen_gpu)  # by a GPU copy
    device.write(mem, 64, b)  # by a GPU copy
    device.read(mem, 64, seen_cpu, direct=True)
    device.write(mem, 0, bytes(128))
    return bytes(seen_gpu) == a and bytes(seen_cpu) == b
