"""The symmetric heap: one memfd-backed segment per PE and domain, carved deterministically.

:class:`HostSegment` owns the memory (a ``memfd`` so same-node peers can map it and NICs can
register it; optionally ``mlock``-ed). :class:`Allocator` hands out offsets; it is a pure
function of the sequence of calls, so the same collective allocations give the same offsets on
every PE. A symmetric address is ``(segment id, offset)``.
"""

from __future__ import annotations

import bisect
import ctypes
import mmap
import os
from collections.abc import Callable

from ._native import ffi
from .errors import HeapExhaustedError, InvalidArgumentError, VkshmemError
from .transports.contract import SegmentInfo

__all__ = ["MIN_ALIGN", "Allocator", "HostSegment"]

#: Every allocation starts on a multiple of this (a memcpy into an unaligned destination is
#: many times slower, and 64 B keeps distinct allocations off each other's cache lines).
MIN_ALIGN = 64


class HostSegment:
    """A memfd-backed shared mapping: one domain of one PE's symmetric heap."""

    kind = "host"

    def __init__(self, seg_id: int, size: int, name: str, pin: bool = False) -> None:
        if size <= 0:
            raise InvalidArgumentError(f"symmetric segment size must be positive, got {size}")
        self.seg_id = seg_id
        self.size = size
        self.fd = os.memfd_create(name, os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, size)
            self._map = mmap.mmap(self.fd, size, mmap.MAP_SHARED,
                                  mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError:
            os.close(self.fd)
            raise
        self.buffer = memoryview(self._map)
        cdata = ffi.from_buffer(self._map)
        self.address = int(ffi.cast("uintptr_t", cdata))
        ffi.release(cdata)
        if pin:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.mlock(ctypes.c_void_p(self.address), ctypes.c_size_t(size)) != 0:
                err = ctypes.get_errno()
                self.close()
                raise VkshmemError(
                    f"mlock of the {size}-byte host heap failed: {os.strerror(err)}; raise "
                    "RLIMIT_MEMLOCK (ulimit -l) or unset VKSHMEM_HOST_PIN"
                )

    def info(self) -> SegmentInfo:
        """The description transports register."""
        return SegmentInfo(self.seg_id, self.kind, self.address, self.size, self.fd, self.buffer)

    def close(self) -> None:
        """Unmap (when no array still views the memory) and close the memfd."""
        if self.fd < 0:
            return
        self.buffer.release()
        try:
            self._map.close()
        except BufferError:
            pass  # user arrays still view it; the mapping goes when they do or at exit
        os.close(self.fd)
        self.fd = -1


class Allocator:
    """Deterministic first-fit allocator of offsets in ``[0, size)`` with coalescing frees."""

    def __init__(self, size: int, domain: str, variable: str) -> None:
        self.size = size
        self.domain = domain
        self.variable = variable
        self._free_offs: list[int] = [0]  # sorted starts of free blocks
        self._free_len: dict[int, int] = {0: size}
        self.used: dict[int, int] = {}  # offset -> size of live allocations
        #: called with (offset, size, live) when a block becomes live or is freed (the runtime
        #: mirrors the host heap's live blocks natively, so RMA on freed memory is refused)
        self.on_change: Callable[[int, int, bool], object] | None = None

    def largest_free(self) -> int:
        """Size of the largest free block."""
        return max(self._free_len.values(), default=0)

    def free_bytes(self) -> int:
        """Total free bytes."""
        return sum(self._free_len.values())

    def alloc(self, nbytes: int, align: int = MIN_ALIGN) -> int:
        """Return the offset of a new block of ``nbytes`` (rounded up) aligned to ``align``."""
        if nbytes < 0:
            raise InvalidArgumentError(f"cannot allocate a negative size ({nbytes})")
        if align <= 0 or align & (align - 1):
            raise InvalidArgumentError(f"alignment must be a power of two, got {align}")
        align = max(align, MIN_ALIGN)
        need = max(MIN_ALIGN, -(-nbytes // MIN_ALIGN) * MIN_ALIGN)
        for start in self._free_offs:
            length = self._free_len[start]
            off = -(-start // align) * align
            if off + need <= start + length:
                self._take(start, length, off, need)
                return off
        raise HeapExhaustedError(self.domain, nbytes, self.largest_free(), self.variable)

    def _take(self, start: int, length: int, off: int, need: int) -> None:
        i = bisect.bisect_left(self._free_offs, start)
        del self._free_offs[i]
        del self._free_len[start]
        if off > start:  # the alignment gap stays free
            self._insert(start, off - start)
        end = off + need
        if end < start + length:
            self._insert(end, start + length - end)
        self.used[off] = need
        if self.on_change is not None:
            self.on_change(off, need, True)

    def _insert(self, start: int, length: int) -> None:
        bisect.insort(self._free_offs, start)
        self._free_len[start] = length

    def free(self, off: int) -> None:
        """Return the block starting at ``off``; merges with free neighbours."""
        try:
            length = self.used.pop(off)
        except KeyError:
            raise InvalidArgumentError(
                f"offset {off} of the {self.domain} heap is not the start of a live symmetric "
                "allocation (double free, or a view instead of the array that was allocated?)"
            ) from None
        if self.on_change is not None:
            self.on_change(off, length, False)
        i = bisect.bisect_left(self._free_offs, off)
        if i < len(self._free_offs) and self._free_offs[i] == off + length:  # merge right
            nxt = self._free_offs.pop(i)
            length += self._free_len.pop(nxt)
        if i > 0:  # merge left
            prev = self._free_offs[i - 1]
            if prev + self._free_len[prev] == off:
                self._free_len[prev] += length
                return
        self._insert(off, length)

    def block_size(self, off: int) -> int:
        """Size of the live block at ``off``."""
        return self.used[off]

    def can_grow(self, off: int, nbytes: int) -> bool:
        """Whether the block at ``off`` can grow in place to ``nbytes``."""
        need = max(MIN_ALIGN, -(-nbytes // MIN_ALIGN) * MIN_ALIGN)
        have = self.used[off]
        if need <= have:
            return True
        nxt = off + have
        return self._free_len.get(nxt, 0) >= need - have

    def resize(self, off: int, nbytes: int) -> None:
        """Grow or shrink the block at ``off`` in place (``can_grow`` must be True)."""
        need = max(MIN_ALIGN, -(-nbytes // MIN_ALIGN) * MIN_ALIGN)
        have = self.used[off]
        if need > have:
            nxt = off + have
            length = self._free_len[nxt]
            self._take(nxt, length, nxt, need - have)
            del self.used[nxt]
        elif need < have:
            self.used[off] = have
            self.free(off)  # give the whole block back, then take the head again
            start = self._containing_free(off)
            self._take(start, self._free_len[start], off, need)
            return
        self.used[off] = need

    def _containing_free(self, off: int) -> int:
        i = bisect.bisect_right(self._free_offs, off) - 1
        return self._free_offs[i]
