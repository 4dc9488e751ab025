"""Stream-ordered operations of the Vulkan domain: :class:`VulkanStreamOps` (the core's
:class:`~vkshmem.core.domains.stream.StreamOps`) on a :class:`~vkshmem.gpu.stream.Stream`, and
:class:`DomainStreams`, the domain's table of them.

A stream of the domain runs on the device its kernels run on (the launch device of the
domain's :class:`~vkshmem.gpu.initiated.initiator.Initiator`: the domain's own device where it
has a second queue; on lavapipe, which has one, a second device on the same GPU into which
this PE's heap and its same-device peers' heaps are imported). The core's memory handles (the
domain's segment and its imports of peers' segments) are translated to that device's; a peer
that device does not map is not reached on the stream (the call falls back).

Enqueued: copies between GPU arrays of this PE and mapped peers (``vkCmdCopyBuffer``), to and
from the symmetric host heap where the device imported it, the non-fetching AMOs (``amo.comp``,
after the copy for put_signal: stream order puts the data first), waits on this PE's words
(``stream_wait.comp``, bounded), quiet/fence (the stream waits for the domain's batched copies
without the host waiting where the stream shares the domain's device; otherwise the host
completes them). Not enqueued (the core synchronizes the stream and blocks): barriers and
collectives (:meth:`VulkanStreamOps.barrier` returns False), and everything above with a peer
the stream's device does not map.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from vkshmem.core.domains.stream import StreamOps
from vkshmem.core.errors import FeatureNotAvailableError, InvalidArgumentError
from vkshmem.core.transports.contract import AmoOp

from ..errors import GpuError
from ..stream import Stream

if TYPE_CHECKING:
    from ..vk.device import VulkanDevice
    from .vulkan import VulkanDomain

__all__ = ["DomainStreams", "VulkanStreamOps"]


class DomainStreams:
    """The Vulkan domain's streams: made by :meth:`new`, their operations by :meth:`ops`."""

    def __init__(self, domain: VulkanDomain) -> None:
        self.domain = domain
        cfg = domain.ctx.config
        #: seconds a wait on a stream spins (VKSHMEM_WAIT_TIMEOUT, else VKSHMEM_GPU_TIMEOUT)
        self.wait_timeout = float(cfg.wait_timeout or cfg.gpu_timeout)
        self._ops: dict[Stream, VulkanStreamOps] = {}
        self._host_registered: set[int] = set()

    def device(self) -> VulkanDevice:
        """The device the domain's streams run on (its kernels' launch device)."""
        return self.domain.get_initiator().device

    def new(self, name: str | None = None) -> Stream:
        """A stream on :meth:`device` (see :func:`vkshmem.shmem.gpu_stream`)."""
        for old in [st for st in self._ops if st.closed]:
            del self._ops[old]
        n = len(self._ops)
        s = Stream(self.device(), name=name or f"PE {self.domain.my_pe} stream {n}",
                   wait_timeout=self.wait_timeout)
        self.ops(s)
        return s

    def ops(self, stream: Any) -> VulkanStreamOps | None:
        """The operations on ``stream``: a :class:`Stream` of the domain's device or launch
        device, open; None for anything else (the core falls back)."""
        if not isinstance(stream, Stream):
            return None
        if stream.closed:
            raise InvalidArgumentError(f"stream=: {stream!r} is closed")
        try:
            return self._ops[stream]
        except KeyError:
            pass
        dom = self.domain
        init = dom.initiator
        if stream.device is not dom.device and (init is None or stream.device is not init.device):
            return None
        ops = self._ops[stream] = VulkanStreamOps(self, stream)
        return ops

    def map_host(self, device: VulkanDevice) -> bool:
        """Import the host heap into ``device`` (once) where the domain imported it."""
        dom = self.domain
        host = dom.ctx.host_heap
        if not dom.host_imported or host is None:
            return False
        if device is dom.device or id(device) in self._host_registered:
            return True
        try:
            device.register_host(host.address, host.size)
        except (GpuError, FeatureNotAvailableError):
            return False
        self._host_registered.add(id(device))
        return True

    def check(self) -> None:
        """Raise a recorded wait timeout of any of the domain's streams (once)."""
        for ops in list(self._ops.values()):
            ops.check()

    def close(self) -> BaseException | None:
        """Close the domain's streams (before its memory goes); returns a recorded wait
        timeout not yet raised, or a close's failure."""
        failure = self.failure()
        for stream in list(self._ops):
            try:
                stream.close()
            except Exception as exc:
                failure = failure or exc
        self._ops.clear()
        return failure

    def failure(self) -> BaseException | None:
        """:meth:`check`'s error, returned instead of raised."""
        try:
            self.check()
        except Exception as exc:
            return exc
        return None


class VulkanStreamOps(StreamOps):
    """The Vulkan domain's operations on one :class:`Stream` (see the module docstring)."""

    def __init__(self, streams: DomainStreams, stream: Stream) -> None:
        self.streams = streams
        self.stream = stream
        self.handle = stream.handle
        dom = streams.domain
        self._shared = stream.device is dom.device
        init = dom.initiator
        local = dom.memory if self._shared or init is None else init.heap
        self.local = local
        base = local.device_address if local is not None else 0
        me, size = dom.my_pe, dom.size
        stream.describe = lambda addr: (f"the signal at offset {addr - base} of PE {me}'s GPU "
                                        "heap" if 0 <= addr - base < size else None)

    def _mem(self, mem: Any) -> Any:
        """``mem`` (a handle of the domain's device) as the stream's device sees it, or None."""
        if self._shared:
            return mem
        dom = self.streams.domain
        if mem is dom.memory:
            return self.local
        init = dom.initiator
        if init is None:
            return None
        heap = dom.ctx.runtime.domains.heap_of(dom.seg_id)
        for pe, m in enumerate(heap.direct if heap is not None else ()):
            if m is mem:
                return init.peer_memory.get(pe)
        return None

    def reaches(self, mem: Any) -> bool:
        """Whether the stream's device maps ``mem`` (else the core falls back)."""
        return self._mem(mem) is not None

    def copy(self, dst: Any, dst_offset: int, src: Any, src_offset: int, nbytes: int) -> None:
        d, s = self._mem(dst), self._mem(src)
        if d is None or s is None:
            raise InvalidArgumentError("a stream copy between memory the stream's device does "
                                       "not map")
        self.stream.copy(d, dst_offset, s, src_offset, nbytes)

    def _host(self, view: memoryview) -> tuple[Any, int] | None:
        dev = self.stream.device
        if not self.streams.map_host(dev):
            return None
        imp, at = dev.transfer.host_range(view)
        return None if imp is None else (imp, at)

    def write(self, mem: Any, offset: int, src: memoryview) -> bool:
        m, h = self._mem(mem), self._host(src)
        if m is None or h is None:
            return False
        self.stream.copy(m, offset, h[0], h[1], src.nbytes)
        return True

    def read(self, mem: Any, offset: int, dst: memoryview) -> bool:
        m, h = self._mem(mem), self._host(dst)
        if m is None or h is None:
            return False
        self.stream.copy(h[0], h[1], m, offset, dst.nbytes)
        return True

    def amo(self, mem: Any, offset: int, op: AmoOp, width: int, operand: int) -> None:
        m = self._mem(mem)
        if m is None:
            raise InvalidArgumentError("a stream AMO on memory the stream's device does not map")
        self.stream.amo(m, offset, op, width, operand)

    @property
    def can_wait(self) -> bool:
        """Whether :meth:`wait` enqueues (the device has a shader clock and 64-bit atomics)."""
        return self.stream.can_wait and self.local is not None

    def wait(self, offset: int, cmp: int, value: int) -> None:
        self.stream.wait_word(self.local, offset, cmp, value, self.streams.wait_timeout)

    def barrier(self, members: Sequence[Any], index: int, slot: int) -> bool:
        """Not enqueued on a Vulkan stream: the core synchronizes it and blocks."""
        return False

    def can_reduce(self, op: str, dtype: Any, members: int) -> bool:
        return False

    def reduce(self, dst_offset: int, sources: Sequence[tuple[Any, int]], count: int, op: str,
               dtype: Any) -> None:
        raise InvalidArgumentError("reductions are not enqueued on a Vulkan stream")

    def after_domain(self) -> None:
        """quiet/fence(stream=): the domain's batched copies are submitted; where the stream
        runs on the domain's device, its next work waits for them on the GPU; otherwise (a
        launch device of its own) the host completes them first. The accelerator's copies
        (vkshmem-cuda's) are completed by the host."""
        dom = self.streams.domain
        dom.accel.sync()
        if self._shared:
            dom.device.flush_nbi()
            self.stream.after_device_queue()
        else:
            dom.device.quiet_nbi()

    def check(self) -> None:
        self.stream.check()

    def synchronize(self) -> None:
        self.stream.synchronize()
