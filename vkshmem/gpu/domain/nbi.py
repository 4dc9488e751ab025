"""The Vulkan domain's non-blocking forms (``write_nbi``, ``read_nbi``, ``copy_nbi``) and their
completion (``quiet``, ``flush``): mapped memory is written at once, copies from and to imported
host memory are batched on the device's queue (:mod:`vkshmem.gpu.vk.batch`), and where the
vendor's accelerator takes the size they are issued on its stream (vkshmem-cuda: CUDA's).
:class:`NbiForms` is a part of :class:`~vkshmem.gpu.domain.vulkan.VulkanDomain`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vkshmem.plugin import address_of

if TYPE_CHECKING:
    from ..accel import DomainAccelerator
    from ..vk.device import VulkanDevice
    from ..vk.memory import GpuMemory
    from .streams import DomainStreams

__all__ = ["NbiForms"]


class NbiForms:
    """The non-blocking forms of :class:`~vkshmem.gpu.domain.vulkan.VulkanDomain`."""

    if TYPE_CHECKING:
        mapped: bool
        bar_write_max: int
        bar_read_max: int
        accel: DomainAccelerator
        device: VulkanDevice
        streams: DomainStreams

        def write(self, mem: GpuMemory, offset: int, src: Any) -> None: ...
        def read(self, mem: GpuMemory, offset: int, dst: Any) -> None: ...
        def copy(self, dst: GpuMemory, dst_offset: int, src: GpuMemory, src_offset: int,
                 nbytes: int) -> None: ...

    def write_nbi(self, mem: GpuMemory, offset: int, src: Any) -> None:
        """:meth:`write`, batched (completed by :meth:`quiet`) where it would be a GPU copy
        from imported host memory (a symmetric host array); where the accelerator takes the
        size, issued on its stream instead (vkshmem-cuda: CUDA's)."""
        n = memoryview(src).nbytes
        if self.mapped and mem.host_visible and (mem.host_cached or n <= self.bar_write_max):
            self.write(mem, offset, src)
        elif not self._accel_start(1, mem, offset, address_of(src), n):
            self.device.write_nbi(mem, offset, src)

    def read_nbi(self, mem: GpuMemory, offset: int, dst: Any) -> None:
        """:meth:`read`, batched where it would be a GPU copy into imported host memory (or
        on the accelerator's stream where it takes the size)."""
        n = memoryview(dst).nbytes
        if self.mapped and mem.host_visible and (mem.host_cached or n <= self.bar_read_max):
            self.read(mem, offset, dst)
        elif not self._accel_start(2, mem, offset, address_of(dst), n):
            self.device.read_nbi(mem, offset, dst)

    def _accel_start(self, kind: int, mem: GpuMemory, offset: int, host: int, n: int) -> bool:
        """Issue a host<->device copy on the accelerator's stream (kind 1: to ``mem``, 2:
        from it) where its copier is in use for that size and ``host`` is in the registered
        host heap; False (nothing issued) otherwise."""
        copier = self.accel.copier(n)
        if copier is None or not copier.pinned(host, n):
            return False
        ptr = copier.pointer(mem)
        if not ptr:
            return False
        mem.check_range(offset, n, "GPU copy")
        if kind == 1:
            copier.start(1, ptr + offset, host, n)
        else:
            copier.start(2, host, ptr + offset, n)
        return True

    def copy_nbi(self, dst: GpuMemory, dst_offset: int, src: GpuMemory, src_offset: int,
                 nbytes: int) -> None:
        """:meth:`copy`, batched where it is a copy-engine copy (see
        :meth:`VulkanDevice.copy_nbi <vkshmem.gpu.vk.device.VulkanDevice.copy_nbi>`)."""
        if self.mapped and dst.host_address and src.host_address and (
                src.host_cached or nbytes <= self.bar_read_max):
            self.copy(dst, dst_offset, src, src_offset, nbytes)
        else:
            self.device.copy_nbi(dst, dst_offset, src, src_offset, nbytes)

    def quiet(self) -> None:
        """Complete the batched copies, on the accelerator's stream and on Vulkan's queue
        (VKSHMEM_GPU_TIMEOUT bounds the Vulkan wait)."""
        self.accel.sync()
        self.device.quiet_nbi()
        self.streams.check()  # a stream's wait that timed out raises here too

    def flush(self) -> None:
        """Submit the batched copies without waiting for them."""
        self.device.flush_nbi()
