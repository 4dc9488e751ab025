"""Batched non-blocking copies: ``put_nbi``/``get_nbi`` between GPU memory (and imported host
memory) of one device are recorded into one command buffer, submitted when it fills up or at
``quiet``, which waits for them.

A :class:`CopyBatch` collects copies (buffer handles, offsets, sizes) in a flat array; at
:data:`BATCH_MAX` entries, or when :meth:`CopyBatch.flush` is called, one native call records
them all (one ``vkCmdCopyBuffer`` each, no barrier between them: OpenSHMEM orders
non-blocking operations only at ``fence``/``quiet``) and submits them without waiting, on one
of two command buffers used in turn, so the next batch is recorded while the previous one
runs. :meth:`CopyBatch.quiet` submits what is left and waits for both (bounded by the
timeout). A submission while another is in flight starts with the barrier that orders it
after it (see :mod:`vkshmem.gpu.vk.submit`), so a blocking operation issued after a flushed batch
runs after it.
"""

from __future__ import annotations

import threading
from array import array
from typing import TYPE_CHECKING, Any

from .submit import Slot

if TYPE_CHECKING:
    from .logical import LogicalDevice

__all__ = ["BATCH_MAX", "CopyBatch"]

#: copies per command buffer
BATCH_MAX = 256


class CopyBatch:
    """The pending non-blocking copies of one device (see module doc); thread-safe."""

    def __init__(self, device: LogicalDevice) -> None:
        self.device = device
        self.slots = [Slot(device, "batched copies 0"), Slot(device, "batched copies 1")]
        self._next = 0
        self._desc = array("Q")
        self._lock = threading.Lock()
        self._cast = device._vk.ffi.cast

    @property
    def pending(self) -> int:
        """Copies recorded but not yet submitted."""
        return len(self._desc) // 5

    def add(self, dst: Any, dst_offset: int, src: Any, src_offset: int, nbytes: int,
            timeout: float | None = None) -> None:
        """Queue one copy between buffers ``dst`` and ``src`` (VkBuffer handles; ranges
        checked by the caller); submits the batch when it is full."""
        cast = self._cast
        with self._lock:
            self._desc.extend((int(cast("uintptr_t", dst)), dst_offset,
                               int(cast("uintptr_t", src)), src_offset, nbytes))
            if len(self._desc) >= 5 * BATCH_MAX:
                self._submit(timeout)

    def _submit(self, timeout: float | None) -> None:
        n = len(self._desc) // 5
        if not n:
            return
        slot = self.slots[self._next]
        slot.wait(timeout)  # its previous batch (submitted two flushes ago)
        dev = self.device
        with dev.lock:
            dev.check_open()
            slot.copy_many(self._desc, n)
        del self._desc[:]
        self._next ^= 1

    def flush(self, timeout: float | None = None) -> None:
        """Submit the pending copies (without waiting for them)."""
        with self._lock:
            self._submit(timeout)

    def quiet(self, timeout: float | None = None) -> None:
        """Submit the pending copies and wait until every batched copy is complete."""
        with self._lock:
            self._submit(timeout)
            for slot in self.slots:
                slot.wait(timeout)

    def close(self) -> None:
        """Complete what is pending (bounded), then free the command buffers."""
        try:
            self.quiet()
        finally:
            for slot in self.slots:
                slot.close()
            self.slots = []
