"""The host heap of a :class:`~vkshmem.core.runtime.Runtime` (its ``host`` part): the segment,
its allocator, collective ``alloc``/``free``/``realloc`` and the check that every PE made the
same call.

The check is a barrier that also compares each PE's call with its right neighbour's (a record
in the internal segment), so a PE that allocated differently is named instead of corrupting
the symmetric layout.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from ._native import lib
from .errors import InvalidArgumentError
from .heap import Allocator
from .teams import INTERNAL_SEG

if TYPE_CHECKING:
    from .heap import HostSegment
    from .teams import TeamState
    from .transports.contract import Transport

__all__ = ["CHECK_RECORD", "HOST_SEG", "HostHeap", "HostHeapOwner"]

HOST_SEG = 0
#: the record compared by the allocation check: seq, kind + nbytes, align, offset
CHECK_RECORD = struct.Struct("<QQQQ")
_CHECK_OPS = ("?", "alloc", "free", "realloc")  # kind = segment * 4 + index


class _Routes(Protocol):
    route_transport: list[Transport]  # each PE's transport


class _Domains(Protocol):
    seg_heaps: list[Any]  # per segment, its open domain heap (naming a mismatch's segment)


class HostHeapOwner(Protocol):
    """What the host heap reads of its runtime (the check's barrier, slots and neighbour)."""

    my_pe: int
    n_pes: int
    internal: HostSegment
    world: TeamState
    routing: _Routes
    domains: _Domains

    def quiet(self) -> None: ...

    def sync_all(self) -> None: ...


class HostHeap:
    """The host heap's segment, allocator and collective allocation (see module doc)."""

    def __init__(self, owner: HostHeapOwner, segment: HostSegment) -> None:
        self._owner = owner
        self.segment = segment
        self.allocator = Allocator(segment.size, "host", "VKSHMEM_SYMMETRIC_SIZE")
        # RMA, AMOs and collectives refuse host-heap memory outside live allocations (freed)
        if lib.vk_track(HOST_SEG) == 0:
            self.allocator.on_change = \
                lambda off, n, live: lib.vk_mark_live(HOST_SEG, off, n, live)
        self._alloc_seq = 0
        self._check_buf = bytearray(CHECK_RECORD.size)

    def alloc(self, nbytes: int, align: int, clear: bool,
              fill: Callable[[memoryview], None] | None = None) -> int:
        """Collective: allocate ``nbytes`` on the host heap. It is zero-filled when ``clear``,
        or handed to ``fill``, before the closing barrier, so peers never see it unready."""
        off = self.allocator.alloc(nbytes, align)
        if clear:
            ctypes.memset(self.segment.address + off, 0, self.allocator.block_size(off))
        elif fill is not None:
            fill(self.segment.buffer[off:off + nbytes])
        self.collective_check("alloc", nbytes, align, off)
        return off

    def free(self, off: int) -> None:
        """Collective: release the allocation at ``off`` after every PE arrived."""
        if off not in self.allocator.used:
            raise InvalidArgumentError(
                f"free: offset {off} is not the start of a live symmetric allocation (double "
                "free, or a slice instead of the allocated array?)")
        self._owner.quiet()
        self.collective_check("free", self.allocator.block_size(off), 0, off)
        self.allocator.free(off)

    def realloc(self, off: int, nbytes: int, align: int) -> int:
        """Collective: resize the allocation at ``off``; contents kept up to the smaller size."""
        self._owner.quiet()
        self._owner.sync_all()  # nobody may still be writing the old block
        old = self.allocator.block_size(off)
        if self.allocator.can_grow(off, nbytes) and off % max(align, 1) == 0:
            self.allocator.resize(off, nbytes)
            new = off
        else:
            new = self.allocator.alloc(nbytes, align)
            n = min(old, nbytes)
            self.segment.buffer[new:new + n] = self.segment.buffer[off:off + n]
            self.allocator.free(off)
        self.collective_check("realloc", nbytes, align, new)
        return new

    def collective_check(self, op: str, nbytes: int, align: int, off: int,
                         seg: int = HOST_SEG) -> None:
        """Barrier that also proves every PE made the same allocation call ``op``
        (``'alloc'``, ``'free'`` or ``'realloc'``) on segment ``seg`` cheaply: each PE
        compares its call with its right neighbour's, so any difference is seen somewhere."""
        owner = self._owner
        kind = seg * 4 + _CHECK_OPS.index(op)
        self._alloc_seq += 1
        seq = self._alloc_seq
        slot = owner.world.check_offset + (seq % 2) * CHECK_RECORD.size
        record = (seq, (kind << 56) | nbytes, align, off)
        CHECK_RECORD.pack_into(owner.internal.buffer, slot, *record)
        owner.sync_all()
        if owner.n_pes == 1:
            return
        right = (owner.my_pe + 1) % owner.n_pes
        view = memoryview(self._check_buf)
        owner.routing.route_transport[right].get(right, INTERNAL_SEG, slot, view)
        theirs = CHECK_RECORD.unpack(self._check_buf)
        if theirs != record:
            def name(k: int) -> str:
                seg, op = divmod(k, 4)
                heaps = owner.domains.seg_heaps
                heap = heaps[seg] if seg < len(heaps) else None
                where = "" if seg == HOST_SEG else f"{heap.name if heap else seg} "
                return where + (_CHECK_OPS[op] if op else "?")

            def say(r: tuple[int, ...]) -> str:
                return (f"call #{r[0]} = {name(r[1] >> 56)}({r[1] & (2**56 - 1)} "
                        f"bytes, align {r[2]}) at offset {r[3]}")

            raise InvalidArgumentError(
                f"symmetric allocation mismatch: PE {owner.my_pe} made {say(record)} but PE "
                f"{right} made {say(theirs)}; every PE must make the same collective "
                "allocation calls in the same order")
