"""Host <-> device and device <-> device copies: one DMA from imported host memory, or through
a persistent staging buffer.

Host memory the device imported (:class:`~vkshmem.gpu.vk.hostimport.HostImport`: the core's host
heap, registered once with :meth:`Transfer.register_host`) is copied with one
``vkCmdCopyBuffer``, no staging. Everything else is staged (importing an arbitrary buffer for
one copy was no faster on an H100: 2.9 against 8.6 GB/s at 1 MiB, equal from 16 MiB, as
pinning it costs what the memcpy into staging does):

:class:`Transfer` owns one host-visible, coherent buffer (``VKSHMEM_GPU_STAGING_SIZE``, split
into two halves) and a command buffer + fence per half. A write copies a chunk into one half
and submits its ``vkCmdCopyBuffer`` while the next chunk fills the other half; a read keeps
two chunks in flight and copies each out as its fence signals. Structs are prebuilt: a copy
re-records its command buffer (begin, barrier, copy, barrier, end: raw cffi calls, about a
microsecond each) with the region fields set in place, never while it is in flight. Every wait
has a timeout.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from vkshmem.core.errors import FeatureNotAvailableError, InvalidArgumentError

from ..errors import GpuError
from .hostimport import HostImport
from .submit import Slot

if TYPE_CHECKING:
    from .logical import LogicalDevice
    from .memory import GpuMemory

__all__ = ["Transfer", "bytes_view"]

_MIN_STAGING = 64 << 10


def bytes_view(obj: Any, writable: bool) -> memoryview:
    try:
        mv = memoryview(obj)
    except TypeError:
        raise InvalidArgumentError(
            f"expected a buffer (bytes, bytearray, memoryview, numpy array), got "
            f"{type(obj).__name__}") from None
    if not mv.c_contiguous:
        raise InvalidArgumentError("the buffer must be C-contiguous")
    if writable and mv.readonly:
        raise InvalidArgumentError("the destination buffer is read-only")
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    return mv


class Transfer:
    """Staged copies for one :class:`~vkshmem.gpu.vk.device.VulkanDevice` (see module doc)."""

    def __init__(self, device: LogicalDevice, staging_size: int) -> None:
        vk = device._vk
        ffi = vk.ffi
        self.device = device
        staging_size = max(_MIN_STAGING, (staging_size + 127) & ~127)
        self.half = staging_size // 2
        self.staging: GpuMemory | None = None
        self.slots: list[Slot] = []
        self._aux: Slot | None = None
        self.staging = device.alloc(staging_size, exportable=False, host_visible=True)
        if self.staging._ptr is None:
            raise GpuError(f"the staging buffer could not be mapped: {self.staging.map_reason}")
        self._ptr = self.staging._ptr
        self.slots = [Slot(device, "staging copy 0"), Slot(device, "staging copy 1")]
        self._aux = Slot(device, "device copy")
        self._regions = ffi.new("VkBufferCopy[]", 2)
        # Held for a whole operation (the staging halves and the slots are ours); the
        # device lock only around recording and submission, never while waiting.
        self._lock = threading.Lock()
        self._lib = vk.lib
        self._memmove = ffi.memmove
        self._ffi = ffi
        #: host ranges imported for good (the host heap)
        self.host_imports: list[HostImport] = []

    def register_host(self, address: int, size: int) -> HostImport:
        """Import ``size`` bytes of host memory at ``address`` for good: copies from and to it
        are one DMA each (raises GpuError when the driver refuses; the range must stay mapped
        until :meth:`close`)."""
        imp = HostImport(self.device, address, size)
        self.host_imports.append(imp)
        return imp

    def host_range(self, view: memoryview) -> tuple[HostImport | None, int]:
        """``(import, offset)`` for copying ``view`` by DMA, or ``(None, 0)`` to stage it."""
        if not self.host_imports:
            return None, 0
        n = view.nbytes
        address = int(self._ffi.cast("uintptr_t", self._ffi.from_buffer(view)))
        for imp in self.host_imports:
            off = imp.offset_of(address, n)
            if off >= 0:
                return imp, off
        return None, 0

    def _record_copy(self, slot: Slot, dst: Any, dst_off: int, src: Any, src_off: int,
                     n: int, region: int = 0) -> None:
        r = self._regions[region]
        r.srcOffset = src_off
        r.dstOffset = dst_off
        r.size = n
        self._lib.vkCmdCopyBuffer(slot.cmd, src, dst, 1, self._regions + region)

    def write(self, mem: GpuMemory, offset: int, src: Any, timeout: float | None) -> None:
        view = bytes_view(src, writable=False)
        n = view.nbytes
        mem.check_range(offset, n, "write")
        if n == 0:
            return
        imp, at = self.host_range(view)
        if imp is not None:
            self.copy(mem, offset, imp, at, n, timeout)  # type: ignore[arg-type]
            return
        dev = self.device
        staging = self.staging
        assert staging is not None
        half = self.half
        with self._lock:
            dev.check_open()
            pos = 0
            i = 0
            try:
                while pos < n:
                    k = min(half, n - pos)
                    slot = self.slots[i & 1]
                    slot.wait(timeout)  # its previous chunk must be out of the staging half
                    base = (i & 1) * half
                    self._memmove(self._ptr + base, view[pos:pos + k], k)
                    with dev.lock:
                        slot.copy(mem.buffer, offset + pos, staging.buffer, base, k, timeout)
                    pos += k
                    i += 1
            finally:
                for slot in self.slots:
                    slot.wait(timeout)

    @staticmethod
    def _mapped(mem: GpuMemory) -> Any:
        if mem._ptr is None:
            raise FeatureNotAvailableError(f"direct access needs mapped memory: "
                                           f"{mem.map_reason or 'the memory was freed'}")
        return mem._ptr

    def write_direct(self, mem: GpuMemory, offset: int, src: Any) -> None:
        view = bytes_view(src, writable=False)
        mem.check_range(offset, view.nbytes, "write")
        self._memmove(self._mapped(mem) + offset, view, view.nbytes)

    def read_direct(self, mem: GpuMemory, offset: int, dst: Any) -> None:
        view = bytes_view(dst, writable=True)
        mem.check_range(offset, view.nbytes, "read")
        self._memmove(view, self._mapped(mem) + offset, view.nbytes)

    def read(self, mem: GpuMemory, offset: int, dst: Any, timeout: float | None) -> None:
        view = bytes_view(dst, writable=True)
        n = view.nbytes
        mem.check_range(offset, n, "read")
        if n == 0:
            return
        imp, at = self.host_range(view)
        if imp is not None:
            self.copy(imp, at, mem, offset, n, timeout)  # type: ignore[arg-type]
            return
        dev = self.device
        staging = self.staging
        assert staging is not None
        half = self.half
        chunks = [(p, min(half, n - p)) for p in range(0, n, half)]

        def issue(j: int) -> None:
            p, k = chunks[j]
            slot = self.slots[j & 1]
            slot.wait(timeout)
            with dev.lock:
                slot.copy(staging.buffer, (j & 1) * half, mem.buffer, offset + p, k, timeout)

        with self._lock:
            dev.check_open()
            try:
                for j in range(min(2, len(chunks))):
                    issue(j)
                for j, (p, k) in enumerate(chunks):
                    slot = self.slots[j & 1]
                    slot.wait(timeout)
                    self._memmove(view[p:p + k], self._ptr + (j & 1) * half, k)
                    if j + 2 < len(chunks):
                        issue(j + 2)
            finally:
                for slot in self.slots:
                    slot.wait(timeout)

    def copy(self, dst: GpuMemory, dst_off: int, src: GpuMemory, src_off: int, n: int,
             timeout: float | None) -> None:
        dst.check_range(dst_off, n, "copy destination")
        src.check_range(src_off, n, "copy source")
        if n == 0 or (dst is src and dst_off == src_off):
            return
        dev = self.device
        with self._lock:
            dev.check_open()
            overlap = dst.memory == src.memory and dst_off < src_off + n and src_off < dst_off + n
            if not overlap:
                slot = self._aux
                assert slot is not None
                slot.wait(timeout)
                with dev.lock:
                    slot.copy(dst.buffer, dst_off, src.buffer, src_off, n, timeout)
                slot.wait(timeout)
                return
            # memmove: bounce each chunk through the staging buffer, walking away from the
            # overlap (forwards when the destination is lower, else backwards).
            staging = self.staging
            assert staging is not None
            half = self.half
            starts = list(range(0, n, half))
            if dst_off > src_off:
                starts.reverse()
            slot = self.slots[0]
            for p in starts:
                k = min(half, n - p)
                slot.wait(timeout)
                with dev.lock:
                    slot.begin(timeout)
                    self._record_copy(slot, staging.buffer, 0, src.buffer, src_off + p, k, 0)
                    slot.barrier()
                    self._record_copy(slot, dst.buffer, dst_off + p, staging.buffer, 0, k, 1)
                    slot.end()
                    slot.submit()
                slot.wait(timeout)

    def close(self) -> None:
        self._lock.acquire(timeout=self.device.timeout)
        for imp in self.host_imports:
            imp.close()
        self.host_imports = []
        for slot in [*self.slots, self._aux]:
            if slot is not None:
                slot.close()
        self.slots = []
        self._aux = None
        if self.staging is not None:
            self.staging.free()
            self.staging = None
