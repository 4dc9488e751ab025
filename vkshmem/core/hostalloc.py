"""Collective allocation on the host heap (a mixin of :class:`~vkshmem.core.runtime.Runtime`):
``alloc``/``free``/``realloc`` and the check that every PE made the same call.

The check is a barrier that also compares each PE's call with its right neighbour's (a record
in the internal segment), so a PE that allocated differently is named instead of corrupting
the symmetric layout.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .errors import InvalidArgumentError
from .teams import INTERNAL_SEG

if TYPE_CHECKING:
    from .heap import Allocator, HostSegment
    from .teams import TeamState

__all__ = ["CHECK_RECORD", "HOST_SEG", "HostAllocation"]

HOST_SEG = 0
#: the record compared by the allocation check: seq, kind + nbytes, align, offset
CHECK_RECORD = struct.Struct("<QQQQ")
_CHECK_OPS = ("?", "alloc", "free", "realloc")  # kind = segment * 4 + index


class HostAllocation:
    """The host heap's collective allocation (see module doc); Runtime sets the attributes
    declared here."""

    heap: Allocator
    host: HostSegment
    internal: HostSegment
    world: TeamState
    n_pes: int
    my_pe: int
    seg_heaps: list[Any]
    route_transport: list[Any]  # each PE's transport
    _alloc_seq: int
    _check_buf: bytearray

    if TYPE_CHECKING:
        def quiet(self) -> None: ...

        def sync_all(self) -> None: ...

    def alloc(self, nbytes: int, align: int, clear: bool,
              fill: Callable[[memoryview], None] | None = None) -> int:
        """Collective: allocate ``nbytes`` on the host heap. It is zero-filled when ``clear``,
        or handed to ``fill``, before the closing barrier, so peers never see it unready."""
        off = self.heap.alloc(nbytes, align)
        if clear:
            ctypes.memset(self.host.address + off, 0, self.heap.block_size(off))
        elif fill is not None:
            fill(self.host.buffer[off:off + nbytes])
        self.collective_check("alloc", nbytes, align, off)
        return off

    def free(self, off: int) -> None:
        """Collective: release the allocation at ``off`` after every PE arrived."""
        if off not in self.heap.used:
            raise InvalidArgumentError(
                f"free: offset {off} is not the start of a live symmetric allocation (double "
                "free, or a slice instead of the allocated array?)")
        self.quiet()
        self.collective_check("free", self.heap.block_size(off), 0, off)
        self.heap.free(off)

    def realloc(self, off: int, nbytes: int, align: int) -> int:
        """Collective: resize the allocation at ``off``; contents kept up to the smaller size."""
        self.quiet()
        self.sync_all()  # nobody may still be writing the old block
        old = self.heap.block_size(off)
        if self.heap.can_grow(off, nbytes) and off % max(align, 1) == 0:
            self.heap.resize(off, nbytes)
            new = off
        else:
            new = self.heap.alloc(nbytes, align)
            n = min(old, nbytes)
            self.host.buffer[new:new + n] = self.host.buffer[off:off + n]
            self.heap.free(off)
        self.collective_check("realloc", nbytes, align, new)
        return new

    def collective_check(self, op: str, nbytes: int, align: int, off: int,
                         seg: int = HOST_SEG) -> None:
        """Barrier that also proves every PE made the same allocation call ``op``
        (``'alloc'``, ``'free'`` or ``'realloc'``) on segment ``seg`` cheaply: each PE
        compares its call with its right neighbour's, so any difference is seen somewhere."""
        kind = seg * 4 + _CHECK_OPS.index(op)
        self._alloc_seq += 1
        seq = self._alloc_seq
        slot = self.world.check_offset + (seq % 2) * CHECK_RECORD.size
        record = (seq, (kind << 56) | nbytes, align, off)
        CHECK_RECORD.pack_into(self.internal.buffer, slot, *record)
        self.sync_all()
        if self.n_pes == 1:
            return
        right = (self.my_pe + 1) % self.n_pes
        view = memoryview(self._check_buf)
        self.route_transport[right].get(right, INTERNAL_SEG, slot, view)
        theirs = CHECK_RECORD.unpack(self._check_buf)
        if theirs != record:
            def name(k: int) -> str:
                seg, op = divmod(k, 4)
                heap = self.seg_heaps[seg] if seg < len(self.seg_heaps) else None
                where = "" if seg == HOST_SEG else f"{heap.name if heap else seg} "
                return where + (_CHECK_OPS[op] if op else "?")

            def say(r: tuple[int, ...]) -> str:
                return (f"call #{r[0]} = {name(r[1] >> 56)}({r[1] & (2**56 - 1)} "
                        f"bytes, align {r[2]}) at offset {r[3]}")

            raise InvalidArgumentError(
                f"symmetric allocation mismatch: PE {self.my_pe} made {say(record)} but PE "
                f"{right} made {say(theirs)}; every PE must make the same collective "
                "allocation calls in the same order")
