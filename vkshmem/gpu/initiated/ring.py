"""Host view of the GPU-initiated request ring (the layout of ``shaders/vkshmem.glsl``).

Shaders enqueue 64-byte request descriptors (put, get, AMO, signal, put-with-signal, fence,
quiet) into a ring in host-visible memory; the PE's host proxy drains it in ticket order,
performs each request through a transport, writes fetched values to the request's result
address, and advances ``done``, which shaders wait on. This module is the Python reference of
that drain (the production drain will live in the native proxy thread): it parses descriptors,
advances ``tail``, writes results and completions. ``shaders/README.md`` documents the layout.

Header (256 bytes; each counter on its own 64-byte line)::

    0   u32 magic 0x474E5256 ("VRNG")   4 u32 version (2)
    8   u32 capacity (power of two)     12 u32 descriptor size (64)
    16  u64 peers  device address of the peer table: u64 per PE, the base of that PE's GPU
                   heap on this device (0: not mapped here; the ring carries requests to it)
    24  u64 sync   offset of the device-sync block in the GPU heap (0: none)
    32  u32 direct flags: bit 0 (DIRECT_ALL) every PE is mapped, bit 1 (DIRECT_SHARED)
                   other PEs' kernels share this GPU and never run at once with this PE's
    36  u32 spin limit: passes a shader wait may spin (0: its compile-time VKS_SPIN_ITERATIONS)
    40  u32 kernel error: VKS_KERR_* bits a kernel set (KERNEL_ERRORS), cleared when read
    64  u64 head   next ticket; producers claim tickets with compare-and-swap
    128 u64 tail   next ticket the host consumes (written by the host only)
    192 u64 done   requests completed, in ticket order (written by the host only); bit 63
                   (DONE_FAILED) poisons the ring: the host failed a request, every shader
                   wait returns false at once
    256 descriptors[capacity]

Descriptor (64 bytes, slot = ticket % capacity)::

    0 u32 op   4 u32 pe   8 u64 dst   16 u64 src   24 u64 nbytes   32 u64 value
    40 u64 aux   48 u64 result   56 u32 flags   60 u32 seq (= uint32(ticket + 1), stored last)

:class:`~vkshmem.gpu.initiated.ringservice.RingService` drains a ring on a background thread.

The host reads ``seq`` before the body; on x86-64 (TSO) loads are not reordered with each
other, so a matching ``seq`` means the body is complete. ``tail`` and ``done`` are aligned
8-byte stores, atomic on the architectures vkshmem runs on.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vkshmem.core.errors import InvalidArgumentError
from vkshmem.core.transports.contract import AmoOp

from ..errors import GpuError

if TYPE_CHECKING:
    from ..vk.device import VulkanDevice
    from ..vk.memory import GpuMemory

__all__ = ["DESC_SIZE", "DONE_FAILED", "HEADER_SIZE", "RING_MAGIC", "Descriptor", "Ring",
           "RingOp", "SignalOp"]

RING_MAGIC = 0x474E5256
RING_VERSION = 2
HEADER_SIZE = 256
DESC_SIZE = 64
OFF_PEERS = 16
OFF_SYNC = 24
OFF_DIRECT_FLAGS = 32
OFF_SPIN_LIMIT = 36
OFF_KERNEL_ERROR = 40
#: ``direct flags`` bit 1: other PEs' kernels share this GPU and never run at the same time
DIRECT_SHARED = 2
#: what each ``kernel error`` bit means (``VKS_KERR_*`` in vkshmem_ring.glsl)
KERNEL_ERRORS = {
    1: "vks_barrier_all was called on a GPU whose other PEs' kernels (other processes' "
       "contexts) never run at the same time as this PE's, so the barrier cannot complete: run "
       "one PE per GPU for kernels that synchronise with each other",
    2: "a kernel's wait gave up on a GPU shared by several PEs: a kernel cannot wait for "
       "another PE's kernel there (the driver runs other processes' kernels only after it "
       "ends); run one PE per GPU, or wait on the host",
}
#: ``direct flags`` bit 0: every PE's GPU heap is mapped here (fence/quiet skip the ring)
DIRECT_ALL = 1
OFF_HEAD = 64
OFF_TAIL = 128
OFF_DONE = 192
#: Bit 63 of ``done``: the ring is poisoned (``VKS_DONE_FAILED`` in vkshmem.glsl).
DONE_FAILED = 1 << 63

_HEADER = struct.Struct("<IIII")
_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")
_DESC = struct.Struct("<IIQQQQQQII")
assert _DESC.size == DESC_SIZE


class RingOp(enum.IntEnum):
    """Request kinds (``VKS_OP_*`` in vkshmem.glsl)."""

    NOP = 0
    PUT = 1
    GET = 2
    AMO = 3
    SIGNAL = 4
    PUT_SIGNAL = 5
    FENCE = 6
    QUIET = 7


class SignalOp(enum.IntEnum):
    """Signal updates (``VKS_SIGNAL_*``)."""

    SET = 0
    ADD = 1


@dataclass(frozen=True)
class Descriptor:
    """One request as the host sees it."""

    ticket: int
    op: RingOp | int
    pe: int
    dst: int
    src: int
    nbytes: int
    value: int
    aux: int
    result: int
    flags: int

    @property
    def dst_seg(self) -> int:
        return self.flags & 0xF

    @property
    def src_seg(self) -> int:
        return (self.flags >> 4) & 0xF

    @property
    def amo_op(self) -> AmoOp:
        return AmoOp((self.flags >> 8) & 0xF)

    @property
    def width(self) -> int:
        return (self.flags >> 12) & 0xF

    @property
    def signal_op(self) -> SignalOp:
        return SignalOp((self.flags >> 16) & 0x3)

    @property
    def compare(self) -> int:
        """CSWAP's compare value (``aux``)."""
        return self.aux

    @property
    def signal_offset(self) -> int:
        """PUT_SIGNAL's signal word offset (``aux``); SIGNAL's is ``dst``."""
        return self.aux if self.op == RingOp.PUT_SIGNAL else self.dst


def result_width(desc: Descriptor) -> int:
    """Bytes of the fetched value written to ``desc.result``: the AMO's width (4 or 8), else 8."""
    return desc.width if desc.op == RingOp.AMO and desc.width in (4, 8) else 8


def flags(dst_seg: int = 1, src_seg: int = 1, amo_op: int = 0, width: int = 0,
          signal_op: int = 0) -> int:
    """The ``flags`` word (``vks_flags`` in vkshmem.glsl)."""
    return ((dst_seg & 0xF) | (src_seg & 0xF) << 4 | (amo_op & 0xF) << 8 | (width & 0xF) << 12
            | (signal_op & 0x3) << 16)


class Ring:
    """A request ring in host-visible memory ``buffer`` at device address ``device_address``.

    :meth:`create` allocates and initialises one on a device; ``Ring(view, address)`` attaches
    to an initialised one. Single consumer: one thread drains a ring.
    """

    def __init__(self, buffer: memoryview, device_address: int = 0, *,
                 memory: GpuMemory | None = None) -> None:
        self.buf = buffer
        self.device_address = device_address
        self.memory = memory
        magic, version, cap, dsize = _HEADER.unpack_from(buffer, 0)
        if magic != RING_MAGIC or version != RING_VERSION or dsize != DESC_SIZE:
            raise InvalidArgumentError("not an initialised vkshmem request ring")
        self.capacity = cap
        if len(buffer) < self.nbytes_for(cap):
            raise InvalidArgumentError("ring buffer shorter than its capacity says")

    @staticmethod
    def nbytes_for(capacity: int) -> int:
        return HEADER_SIZE + capacity * DESC_SIZE

    @staticmethod
    def initialize(buffer: memoryview, capacity: int) -> None:
        """Write an empty ring's header into ``buffer`` (and clear its descriptors)."""
        if capacity <= 0 or capacity & (capacity - 1):
            raise InvalidArgumentError(f"ring capacity must be a power of two, got {capacity}")
        n = Ring.nbytes_for(capacity)
        if len(buffer) < n:
            raise InvalidArgumentError(f"a ring of {capacity} needs {n} bytes")
        buffer[:n] = bytes(n)
        _HEADER.pack_into(buffer, 0, RING_MAGIC, RING_VERSION, capacity, DESC_SIZE)

    @classmethod
    def create(cls, device: VulkanDevice, capacity: int = 1024) -> Ring:
        """Allocate a ring on ``device`` in :meth:`VulkanDevice.alloc_mapped` memory (where a
        running shader sees the host's ``tail``/``done``); free it with :meth:`close`."""
        mem = device.alloc_mapped(cls.nbytes_for(capacity))
        view = mem.map()
        if view is None:  # pragma: no cover - host_visible=True always maps
            mem.free()
            raise GpuError(f"ring memory is not mappable: {mem.map_reason}")
        cls.initialize(view, capacity)
        return cls(view, mem.device_address, memory=mem)

    def take_kernel_error(self) -> str | None:
        """What a kernel reported through the ring header (``VKS_KERR_*``), cleared; None when
        nothing."""
        bits = _U32.unpack_from(self.buf, OFF_KERNEL_ERROR)[0]
        if not bits:
            return None
        _U32.pack_into(self.buf, OFF_KERNEL_ERROR, 0)
        return "; ".join(text for bit, text in KERNEL_ERRORS.items() if bits & bit) or \
            f"kernel error bits {bits:#x}"

    def set_direct(self, peers: int, sync_off: int, all_mapped: bool,
                   spin_limit: int = 0, shared: bool = False) -> None:
        """Where kernels find the direct path (before any kernel runs): ``peers`` the device
        address of the peer table, ``sync_off`` the device-sync block's heap offset,
        ``all_mapped`` whether every PE is in the table; ``spin_limit`` the passes a shader
        wait may spin (0: the shader's own ``VKS_SPIN_ITERATIONS``); ``shared`` whether other
        PEs' kernels share this GPU without running at the same time as this PE's."""
        _U64.pack_into(self.buf, OFF_PEERS, peers)
        _U64.pack_into(self.buf, OFF_SYNC, sync_off)
        _U32.pack_into(self.buf, OFF_DIRECT_FLAGS, (DIRECT_ALL if all_mapped else 0)
                       | (DIRECT_SHARED if shared else 0))
        _U32.pack_into(self.buf, OFF_SPIN_LIMIT, spin_limit)

    # -- counters ---------------------------------------------------------------------------

    @property
    def head(self) -> int:
        return _U64.unpack_from(self.buf, OFF_HEAD)[0]

    @property
    def tail(self) -> int:
        return _U64.unpack_from(self.buf, OFF_TAIL)[0]

    @property
    def done(self) -> int:
        """Requests completed (without the :data:`DONE_FAILED` bit)."""
        return _U64.unpack_from(self.buf, OFF_DONE)[0] & ~DONE_FAILED

    @property
    def failed(self) -> bool:
        """Whether the ring was poisoned (:meth:`fail`)."""
        return bool(_U64.unpack_from(self.buf, OFF_DONE)[0] & DONE_FAILED)

    def fail(self) -> None:
        """Poison the ring: set :data:`DONE_FAILED` in ``done``, so that every shader wait on
        it (``vks_wait``, ``vks_quiet``, fetching AMOs) returns false at once instead of
        spinning, and a producer facing a full ring gives up. Irreversible except by
        :meth:`reset`."""
        raw = _U64.unpack_from(self.buf, OFF_DONE)[0]
        _U64.pack_into(self.buf, OFF_DONE, raw | DONE_FAILED)

    def reset(self) -> None:
        """Empty the ring and clear a failure (only while no shader uses it)."""
        Ring.initialize(self.buf, self.capacity)

    # -- consuming --------------------------------------------------------------------------

    def poll(self, limit: int | None = None) -> list[Descriptor]:
        """Every published descriptor from ``tail`` on (at most ``limit``); advances
        ``tail`` past them, freeing their slots for producers."""
        buf = self.buf
        tail = self.tail
        mask = self.capacity - 1
        out: list[Descriptor] = []
        while limit is None or len(out) < limit:
            off = HEADER_SIZE + (tail & mask) * DESC_SIZE
            if _U32.unpack_from(buf, off + 60)[0] != (tail + 1) & 0xFFFFFFFF:
                break
            op, pe, dst, src, nbytes, value, aux, result, fl, _seq = _DESC.unpack_from(buf, off)
            try:
                kind: RingOp | int = RingOp(op)
            except ValueError:
                kind = op
            out.append(Descriptor(tail, kind, pe, dst, src, nbytes, value, aux, result, fl))
            tail += 1
        if out:
            _U64.pack_into(buf, OFF_TAIL, tail)
        return out

    def complete(self, count: int = 1) -> int:
        """Mark the next ``count`` consumed requests complete (``done += count``)."""
        if self.failed:
            raise GpuError("the request ring was poisoned by a failed request (Ring.fail); "
                           "reset it before reuse")
        done = self.done + count
        if done > self.tail:
            raise InvalidArgumentError(f"cannot complete {count}: only {self.tail - self.done} "
                                       "requests were consumed and not yet completed")
        _U64.pack_into(self.buf, OFF_DONE, done)
        return done

    def write_result(self, desc: Descriptor, value: int, device: VulkanDevice,
                     width: int = 8, *, allow_staged: bool = True) -> None:
        """Write a fetched ``value`` to ``desc.result`` (a device address of ``device``):
        through the mapping when that memory is host-visible, else by a staging copy (which
        must not be waited on by a dispatch still running on the same queue: it runs only
        after that dispatch; ``allow_staged=False`` refuses instead). A shader waiting for the
        value during its dispatch sees it only in :meth:`VulkanDevice.alloc_mapped` memory."""
        if not desc.result:
            return
        mem, off = device.resolve_address(desc.result)
        data = (value & ((1 << (8 * width)) - 1)).to_bytes(width, "little")
        view = mem.map()
        if view is not None:
            mem.check_range(off, width, "ring result")
            view[off:off + width] = data
        elif allow_staged:
            device.write(mem, off, data)
        else:
            raise InvalidArgumentError(
                f"result address 0x{desc.result:x} of request #{desc.ticket} is in memory the "
                "host cannot map; a running shader would not see the value (put results in "
                "VulkanDevice.alloc_mapped memory, e.g. a UserKernel's scratch)")

    def drain(self, handler: Callable[[Descriptor], int | None],
              device: VulkanDevice | None = None, limit: int | None = None) -> int:
        """Consume published requests in order: ``handler(desc)`` performs one and returns a
        fetched value (or None); the value goes to ``desc.result``; then it is completed.
        Returns how many were handled."""
        descs = self.poll(limit)
        for d in descs:
            value = handler(d)
            if value is not None and d.result:
                if device is None:
                    raise InvalidArgumentError("a device is needed to write results")
                self.write_result(d, value, device, result_width(d))
            self.complete(1)
        return len(descs)

    def close(self) -> None:
        """Free the ring's memory when :meth:`create` made it."""
        if self.memory is not None:
            self.buf = memoryview(b"")
            self.memory.free()
            self.memory = None
