"""Vulkan streams: in-order GPU work that the host issues without waiting for it.

A :class:`Stream` is to the Vulkan domain what a CUDA stream is to the cuda domain: every piece
of work given to it (a copy, an AMO, a bounded wait on a word, a user kernel's dispatch) is
recorded into a command buffer and submitted to the device's launch queue (the queue user
kernels run on) at once, and the GPU runs the stream's submissions in the order they were
made: each waits for the timeline-semaphore value the previous one signals
(:class:`~vkshmem.gpu.vk.timeline.Timeline`). The host never waits except in
:meth:`Stream.synchronize` (bounded by ``VKSHMEM_GPU_TIMEOUT``); :meth:`Stream.query` asks.

Make one with :func:`vkshmem.shmem.gpu_stream` (a stream of the PE's GPU domain, on the device
its kernels run on) and pass it as ``stream=`` to the API's calls and to
``UserKernel.dispatch``; or ``Stream(device)`` on a :class:`~vkshmem.gpu.VulkanDevice` of your
own. Close it (or use ``with``): :meth:`Stream.close` waits for its work, then frees its
command buffers, semaphores and state.

**Waits** (:meth:`Stream.wait_word`) spin in a shader (``stream_wait.comp``) bounded by the
device's clock (``VK_KHR_shader_clock``; its rate is measured once per device): a wait that
times out records the failure in the stream's host-visible state and the stream goes on; the
failure is raised as :class:`~vkshmem.core.errors.WaitTimeoutError` by :meth:`Stream.check`,
which :meth:`Stream.synchronize` and every vkshmem call given the stream run.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from vkshmem.core.errors import FeatureNotAvailableError, InvalidArgumentError, WaitTimeoutError
from vkshmem.core.transports.contract import AmoOp

from .env import ENV_TIMEOUT
from .errors import GpuError
from .vk._vk import check
from .vk.clock import DESC_OFF, STATE, STATE_SIZE, WAIT_PUSH, clock_rate, cpu_pass_ticks
from .vk.timeline import Timeline

if TYPE_CHECKING:
    from .vk.device import VulkanDevice
    from .vk.memory import GpuMemory
    from .vk.pipeline import ComputePipeline

__all__ = ["Stream"]

_CMP = {1: "==", 2: "!=", 3: ">", 4: "<=", 5: "<", 6: ">="}
_NONFETCH = frozenset({AmoOp.SET, AmoOp.ADD, AmoOp.AND, AmoOp.OR, AmoOp.XOR})
_AMO_DESC = struct.Struct("<QQQQII8x")  # amo.comp's AmoDesc (48 bytes)
_AMO_PUSH = struct.Struct("<QI4x")
_CPU_PASSES = 50_000  # per spinner and dispatch: within lavapipe's loop budget
_GPU_PASSES = 0xFFFFFFFF  # on a GPU the clock ends a wait


class Stream:
    """An ordered queue of GPU work on one Vulkan device (see the module doc).

    ``wait_timeout``: seconds a :meth:`wait_word` spins before it gives up (default the
    device's ``VKSHMEM_GPU_TIMEOUT``). Thread-safe; work from several threads is ordered as
    the calls were made.
    """

    def __init__(self, device: VulkanDevice, *, name: str = "stream",
                 wait_timeout: float | None = None) -> None:
        device.check_open()
        self.device = device
        self.name = name
        self.wait_timeout = device.timeout if wait_timeout is None else wait_timeout
        #: names the words waits are on, for the timeout's message (address -> text)
        self.describe: Callable[[int], str] | None = None
        self._timeline: Timeline | None = Timeline(device, f"vkshmem stream {name!r}")
        self._state: GpuMemory | None = None
        self._view: memoryview | None = None
        self._closed = False
        try:
            self._state = device.alloc_mapped(STATE_SIZE)
            view = self._state.map()
            if view is None:  # pragma: no cover - alloc_mapped memory always maps
                raise GpuError(f"{name}: the state block is not mappable")
            view[:] = bytes(STATE_SIZE)
            self._view = view
        except BaseException:
            self.close()
            raise
        device.streams.add(self)

    # -- what it is ---------------------------------------------------------------------------

    @property
    def handle(self) -> int:
        """The timeline semaphore's handle, as an int (names the stream in messages)."""
        tl = self._timeline
        if tl is None or tl.semaphore is None:
            return 0
        return int(self.device._vk.ffi.cast("uintptr_t", tl.semaphore))

    @property
    def closed(self) -> bool:
        return self._closed

    def stats(self) -> dict[str, int]:
        """What the stream holds: ``command_buffers`` allocated, ``in_flight`` (submitted,
        not known finished), ``submitted`` (its timeline's value), ``semaphores``."""
        tl = self._timeline
        if tl is None:
            return {"command_buffers": 0, "in_flight": 0, "submitted": 0, "semaphores": 0}
        with tl.lock:
            return {"command_buffers": tl.allocated, "in_flight": tl.in_flight,
                    "submitted": tl.value,
                    "semaphores": (tl.semaphore is not None) + (tl._aux is not None)}

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{self.stats()['submitted']} submitted"
        return f"<vkshmem.gpu.Stream {self.name!r} on {self.device.info.name}: {state}>"

    # -- completion ---------------------------------------------------------------------------

    def query(self) -> bool:
        """Whether the GPU has run everything given to the stream (never waits)."""
        tl = self._timeline
        return tl is None or tl.done()

    def synchronize(self, timeout: float | None = None) -> None:
        """Wait (host) until the stream ran everything given to it, then raise a wait of it
        that timed out (:meth:`check`). GpuTimeoutError (a WaitTimeoutError) after ``timeout``
        seconds (default ``VKSHMEM_GPU_TIMEOUT``); the work stays queued."""
        tl = self._timeline
        if tl is not None:
            tl.wait(None, timeout)
        self.check()

    def check(self) -> None:
        """Raise WaitTimeoutError for a wait of this stream that gave up on the GPU (once);
        nothing otherwise. The failure is seen once the GPU recorded it."""
        view = self._view
        if view is None or not view[24]:
            return
        (_status, _start, _spent, failed, word, cmp, value, seen,
         waited) = STATE.unpack_from(view, 0)
        if failed:
            view[24:32] = bytes(8)  # raised once; later waits spin again
        del view  # the error's frame must not hold a view of the state (it is freed at close)
        if not failed:
            return
        where = self.describe(word) if self.describe is not None else None
        where = where or f"the word at device address 0x{word:x}"
        rate = clock_rate(self.device)
        # the spinner that gave up may read a clock behind the first one's start (another
        # thread's clock on a CPU driver): a negative difference, stored unsigned
        waited = waited if waited < 1 << 63 else 0
        raise WaitTimeoutError(
            f"a wait on {self.name}: {where} did not become {_CMP.get(cmp, '?')} {value} "
            f"within {self.wait_timeout:g} s (it held {seen}; waited {waited / rate:.3g} s; "
            f"VKSHMEM_WAIT_TIMEOUT, else {ENV_TIMEOUT}, bounds waits on a stream); the stream "
            "went on past the wait")

    # -- recording ----------------------------------------------------------------------------

    @contextmanager
    def record(self) -> Iterator[Any]:
        """Record into a command buffer of the stream and submit it on leaving the block
        (without waiting); yields the ``VkCommandBuffer``. The writes it makes are visible to
        the host once the stream is synchronized."""
        tl = self._timeline
        if tl is None:
            raise GpuError(f"{self.name} is closed")
        dev = self.device
        vk = dev._vk
        lib = vk.lib
        with tl.lock:
            dev.check_open()
            cmd = tl.acquire()
            try:
                check(lib.vkBeginCommandBuffer(cmd, dev._begin_info), "vkBeginCommandBuffer")
                yield cmd
                all_ = vk.VK_PIPELINE_STAGE_ALL_COMMANDS_BIT
                lib.vkCmdPipelineBarrier(cmd, all_, vk.VK_PIPELINE_STAGE_HOST_BIT, 0, 1,
                                         dev._barrier_out, 0, vk.ffi.NULL, 0, vk.ffi.NULL)
                check(lib.vkEndCommandBuffer(cmd), "vkEndCommandBuffer")
            except BaseException:
                tl.release(cmd)
                raise
            tl.submit(cmd)

    def barrier(self, cmd: Any) -> None:
        """Order what ``cmd`` recorded so far before what it records next."""
        dev = self.device
        vk = dev._vk
        all_ = vk.VK_PIPELINE_STAGE_ALL_COMMANDS_BIT
        vk.lib.vkCmdPipelineBarrier(cmd, all_, all_, 0, 1, dev._barrier_mid, 0, vk.ffi.NULL, 0,
                                    vk.ffi.NULL)

    def after_device_queue(self) -> None:
        """Order the stream's next work after everything submitted so far to the device's
        first queue (its blocking and batched copies), without the host waiting."""
        tl = self._timeline
        if tl is None:
            raise GpuError(f"{self.name} is closed")
        with tl.lock:
            tl.after_queue()

    # -- work ---------------------------------------------------------------------------------

    def copy(self, dst: Any, dst_offset: int, src: Any, src_offset: int, nbytes: int) -> None:
        """Copy ``nbytes`` between two buffers of the device (GpuMemory, imported peer memory,
        HostImport) with ``vkCmdCopyBuffer``, or as copy.comp where the device's blocking copy
        of those bytes would (:meth:`VulkanDevice.shader_copies`: large copies between GPU
        allocations); overlapping ranges of one allocation are copied as memmove does (in
        chunks the distance apart)."""
        dst.check_range(dst_offset, nbytes, "stream copy destination")
        src.check_range(src_offset, nbytes, "stream copy source")
        if nbytes == 0 or (dst is src and dst_offset == src_offset):
            return
        dev = self.device
        if dev.shader_copies(dst, dst_offset, src, src_offset, nbytes):
            pipe, items = dev.kernels.copy_plan(dst, dst_offset, src, src_offset, nbytes)
            with self.record() as cmd:
                for groups, push in items:  # disjoint: no barrier between them
                    pipe.record(_Cmd(cmd), groups, push)
            return
        ffi, lib = dev._vk.ffi, dev._vk.lib
        gap = abs(dst_offset - src_offset) if dst.memory == src.memory else nbytes
        step = min(nbytes, gap) if gap else nbytes
        starts = list(range(0, nbytes, step))
        if dst_offset > src_offset and gap < nbytes:
            starts.reverse()
        region = ffi.new("VkBufferCopy*")
        with self.record() as cmd:
            for k, pos in enumerate(starts):
                if k:
                    self.barrier(cmd)
                region.srcOffset, region.dstOffset = src_offset + pos, dst_offset + pos
                region.size = min(step, nbytes - pos)
                lib.vkCmdCopyBuffer(cmd, src.buffer, dst.buffer, 1, region)

    def amo(self, mem: Any, offset: int, op: AmoOp, width: int, operand: int) -> None:
        """A non-fetching AMO (SET, ADD, AND, OR, XOR) on the aligned ``width``-byte word at
        ``offset`` of ``mem`` by ``amo.comp``: the device's own atomic, atomic with every
        other vkshmem AMO on the word."""
        if op not in _NONFETCH:
            raise InvalidArgumentError(f"AMO {op!r} on a stream: only non-fetching AMOs are "
                                       "enqueued (call fetching AMOs without stream=)")
        if width not in (4, 8) or offset % width:
            raise InvalidArgumentError(f"a stream AMO takes an aligned 4- or 8-byte word, got "
                                       f"{width} bytes at offset {offset}")
        mem.check_range(offset, width, "stream AMO")
        dev = self.device
        if width == 8 and not dev.info.int64_atomics:
            raise FeatureNotAvailableError(
                f"{dev.info.name} has no 64-bit shader atomics (shaderBufferInt64Atomics)")
        state = self._state
        assert state is not None
        pipe = dev.pipeline("amo_u64" if width == 8 else "amo_u32")
        desc = _AMO_DESC.pack(mem.device_address + offset, operand & ((1 << 8 * width) - 1),
                              0, 0, int(op), width)
        ffi, lib = dev._vk.ffi, dev._vk.lib
        with self.record() as cmd:
            # the descriptor goes into the command buffer: nothing to keep alive meanwhile
            lib.vkCmdUpdateBuffer(cmd, state.buffer, DESC_OFF, len(desc),
                                  ffi.from_buffer(desc))
            self.barrier(cmd)
            pipe.record(_Cmd(cmd), 1, _AMO_PUSH.pack(state.device_address + DESC_OFF, 1))

    @property
    def can_wait(self) -> bool:
        """Whether :meth:`wait_word` runs on this device (a device-scope shader clock and
        64-bit atomics)."""
        info = self.device.info
        return info.device_clock and info.int64_atomics

    def wait_word(self, mem: Any, offset: int, cmp: int, value: int,
                  timeout: float | None = None) -> None:
        """Make the stream wait until the 64-bit word at ``offset`` of ``mem`` satisfies
        ``word cmp value`` (``cmp``: the CMP codes 1..6, unsigned), bounded on the GPU by
        ``timeout`` seconds (default :attr:`wait_timeout`; see the module doc). Work after
        it sees every write made before the word's update."""
        if cmp not in _CMP:
            raise InvalidArgumentError(f"unknown comparison {cmp!r} (CMP codes 1..6)")
        if offset % 8:
            raise InvalidArgumentError(f"a stream wait needs an 8-byte aligned word, got "
                                       f"offset {offset}")
        mem.check_range(offset, 8, "stream wait")
        if not self.can_wait:
            raise FeatureNotAvailableError(
                f"{self.device.info.name} lacks a device-scope shader clock (VK_KHR_shader_"
                "clock) or 64-bit atomics: waits on a stream need both")
        dev = self.device
        t = self.wait_timeout if timeout is None else timeout
        rate = clock_rate(dev)
        ticks = max(1, int(t * rate))
        cpu = dev.info.is_cpu
        pipe = dev.pipeline("stream_wait_cpu" if cpu else "stream_wait")
        chain = 1
        if cpu:  # enough dispatches to spin for the timeout (each returns at once when over)
            per = _CPU_PASSES * cpu_pass_ticks(dev)
            chain = max(1, min(256, int(ticks / max(per, 1.0) * 1.25) + 1))
        state = self._state
        assert state is not None
        ffi, lib = dev._vk.ffi, dev._vk.lib
        push = WAIT_PUSH.pack(mem.device_address + offset, value & (1 << 64) - 1,
                               state.device_address, ticks, cmp,
                               _CPU_PASSES if cpu else _GPU_PASSES, chain, 0)
        zero = bytes(24)
        with self.record() as cmd:
            lib.vkCmdUpdateBuffer(cmd, state.buffer, 0, len(zero), ffi.from_buffer(zero))
            for _ in range(chain):
                self.barrier(cmd)
                pipe.record(_Cmd(cmd), 1, push)

    def dispatch(self, pipeline: ComputePipeline, groups: tuple[int, int, int],
                 push: bytes) -> int:
        """One dispatch of ``pipeline`` (checked by the caller) on the stream; returns the
        stream's timeline value once it ran."""
        tl = self._timeline
        if tl is None:
            raise GpuError(f"{self.name} is closed")
        with tl.lock:
            with self.record() as cmd:
                pipeline.record(_Cmd(cmd), groups, push)
            return tl.value

    # -- teardown ---------------------------------------------------------------------------

    def close(self, timeout: float | None = None) -> None:
        """Wait for the stream's work (bounded: GpuTimeoutError leaves it open), then free
        its command buffers, semaphores and state. Idempotent."""
        if self._closed:
            return
        tl = self._timeline
        if tl is not None:
            tl.close(timeout)
            self._timeline = None
        self._closed = True
        self._view = None
        if self._state is not None:
            if self.device.handle is not None:
                self._state.free()
            self._state = None
        self.device.streams.discard(self)

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Cmd:
    """What :meth:`ComputePipeline.record` records into: a ``.cmd``."""

    __slots__ = ("cmd",)

    def __init__(self, cmd: Any) -> None:
        self.cmd = cmd
