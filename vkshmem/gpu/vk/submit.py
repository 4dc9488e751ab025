"""Command submission: :class:`Slot`, one command buffer with its own fence.

Every piece of GPU work (a staging copy, a dispatch, an AMO, a user kernel's launch) is
recorded into a slot and submitted to one of the device's queues. Threads: the device lock
(``device.lock``) is held only while recording and submitting (Vulkan requires external
synchronisation of the command pool and the queue), never while waiting for the GPU; each
engine that owns slots serialises their use with a lock of its own.
Every wait for the GPU has a timeout (``timeout=``, default ``VKSHMEM_GPU_TIMEOUT`` seconds)
and raises :class:`~vkshmem.gpu.errors.GpuTimeoutError` instead of hanging.

Barriers: a command buffer ends with a barrier making its writes visible to the host, and
starts with one ordering it after the work submitted earlier on the same queue only when some
of that work has not been waited for (``device.in_flight``; it costs ~5 us per submission on an
H100). Once the host has waited for a submission's fence its commands are complete, and writes
the host made before a submit are visible to it without a barrier (the implicit host-write
dependency of ``vkQueueSubmit``), so an idle queue needs no leading barrier.
"""

from __future__ import annotations

from time import perf_counter
from typing import TYPE_CHECKING, Any

from ..env import ENV_TIMEOUT
from ..errors import GpuError, GpuTimeoutError
from ._vk import check

if TYPE_CHECKING:
    from .logical import LogicalDevice

__all__ = ["Slot"]


class Slot:
    """A primary command buffer, its fence and a prebuilt submit: one unit of GPU work.

    Never re-recorded while in flight: :meth:`begin` first waits for the previous submission
    (recording an in-flight command buffer crashes lavapipe and is invalid Vulkan anyway).
    Its owner serialises its use (its own lock); ``device.lock`` is held from :meth:`begin`
    to :meth:`submit` (the command pool and the queue need external synchronisation), never
    during :meth:`wait`, so one thread's long dispatch does not block another's copies.
    """

    def __init__(self, device: LogicalDevice, name: str, launch: bool = False) -> None:
        vk = device._vk
        ffi, lib = vk.ffi, vk.lib
        self.device = device
        self.queue = device.launch_queue if launch else device.queue
        self.pool = device.launch_pool if launch else device.command_pool
        #: index of this slot's queue in ``device.in_flight``
        self.qi = 1 if launch and device.launch_queue != device.queue else 0
        self.name = name
        self.pending = False
        self.cmd: Any = None
        self.fence: Any = None
        info = ffi.new("VkCommandBufferAllocateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
            "commandPool": self.pool,
            "level": vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, "commandBufferCount": 1})
        self._cmds = ffi.new("VkCommandBuffer[]", 1)
        with device.lock:
            check(lib.vkAllocateCommandBuffers(device.handle, info, self._cmds),
                  "vkAllocateCommandBuffers")
        self.cmd = self._cmds[0]
        finfo = ffi.new("VkFenceCreateInfo*", {"sType": vk.VK_STRUCTURE_TYPE_FENCE_CREATE_INFO})
        self._fences = ffi.new("VkFence[]", 1)
        res = lib.vkCreateFence(device.handle, finfo, ffi.NULL, self._fences)
        if res != 0:
            lib.vkFreeCommandBuffers(device.handle, self.pool, 1, self._cmds)
            check(res, "vkCreateFence")
        self.fence = self._fences[0]
        self._submit = ffi.new("VkSubmitInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_SUBMIT_INFO,
            "commandBufferCount": 1, "pCommandBuffers": self._cmds})
        self._lib = lib
        # The native helper takes handles and prebuilt structs as integers.
        self._native = device.native
        self._addr = (int(ffi.cast("uintptr_t", self.cmd)),
                      int(ffi.cast("uintptr_t", self.queue)),
                      int(ffi.cast("uintptr_t", self._submit)),
                      int(ffi.cast("uintptr_t", self.fence)))
        self._regions = ffi.new("VkBufferCopy*")
        self._all_commands = vk.VK_PIPELINE_STAGE_ALL_COMMANDS_BIT
        self._host_stage = vk.VK_PIPELINE_STAGE_HOST_BIT
        self._null = ffi.NULL

    def begin(self, timeout: float | None = None, reusable: bool = False,
              lead: bool | None = None) -> Any:
        """Start recording (waiting for the previous submission first); returns the cmd.
        ``lead``: whether to start with the leading barrier; by default a reusable command
        buffer (submitted many times) gets it, and a one-time one only when its queue has
        work in flight (see the module doc): record and submit it in one hold of
        ``device.lock``."""
        dev = self.device
        if self.pending:
            self.wait(timeout)
        lib = self._lib
        check(lib.vkBeginCommandBuffer(
            self.cmd, dev._begin_info_reuse if reusable else dev._begin_info),
            "vkBeginCommandBuffer")
        if lead is None:
            lead = reusable or self.lead()
        if lead:
            lib.vkCmdPipelineBarrier(self.cmd, self._all_commands, self._all_commands, 0,
                                     1, dev._barrier_in, 0, self._null, 0, self._null)
        return self.cmd

    def lead(self) -> bool:
        """Whether a command buffer recorded now needs the leading barrier: work on its queue
        has not been waited for (the caller holds ``device.lock``)."""
        return self.device.in_flight[self.qi] > 0

    def barrier(self) -> None:
        """Order the commands recorded so far before the ones recorded next."""
        self._lib.vkCmdPipelineBarrier(self.cmd, self._all_commands, self._all_commands, 0,
                                       1, self.device._barrier_mid, 0, self._null, 0, self._null)

    def end(self) -> None:
        """Finish recording; the commands' writes become visible to the host at the fence."""
        lib = self._lib
        lib.vkCmdPipelineBarrier(self.cmd, self._all_commands, self._host_stage, 0,
                                 1, self.device._barrier_out, 0, self._null, 0, self._null)
        check(lib.vkEndCommandBuffer(self.cmd), "vkEndCommandBuffer")

    def submit(self) -> None:
        """Submit what was recorded (the caller holds ``device.lock``)."""
        if self.pending:
            raise GpuError(f"{self.name}: command buffer submitted twice while in flight")
        nat = self._native
        if nat is not None:
            _cmd, queue, info, fence = self._addr
            res = nat.lib.vks_submit(nat.dev, queue, info, fence)
        else:
            res = self._lib.vkQueueSubmit(self.queue, 1, self._submit, self.fence)
        check(res, f"vkQueueSubmit ({self.name})")
        self._submitted()

    def _submitted(self) -> None:
        self.pending = True
        dev = self.device
        dev.in_flight[self.qi] += 1
        if dev.on_submit is not None:
            dev.on_submit()

    def _done(self) -> None:
        self.pending = False
        with self.device.lock:
            self.device.in_flight[self.qi] -= 1

    def copy(self, dst: Any, dst_offset: int, src: Any, src_offset: int, nbytes: int,
             timeout: float | None = None) -> None:
        """Record one buffer-to-buffer copy (between the usual barriers) and submit it (the
        caller holds ``device.lock``); :meth:`wait` completes it. Natively, one C call."""
        if self.pending:
            self.wait(timeout)
        nat = self._native
        if nat is None:
            self.begin(timeout)
            r = self._regions
            r.srcOffset, r.dstOffset, r.size = src_offset, dst_offset, nbytes
            self._lib.vkCmdCopyBuffer(self.cmd, src, dst, 1, r)
            self.end()
            self.submit()
            return
        ffi = self.device._vk.ffi
        cmd, queue, info, fence = self._addr
        res = nat.lib.vks_copy(nat.dev, cmd, queue, info, fence,
                               int(ffi.cast("uintptr_t", dst)), dst_offset,
                               int(ffi.cast("uintptr_t", src)), src_offset, nbytes,
                               self.lead())
        check(res, f"copy ({self.name})")
        self._submitted()

    def dispatch(self, pipeline: int, layout: int, groups: Any, push: Any, n: int,
                 push_size: int, ordered: bool) -> None:
        """Natively record ``n`` dispatches of ``pipeline`` (handles as integers; ``groups``:
        3n uint32 and ``push``: n * ``push_size`` bytes, both buffers) between the usual
        barriers and submit them (the caller holds ``device.lock`` and checked the
        arguments)."""
        nat = self._native
        nffi = nat.ffi
        cmd, queue, info, fence = self._addr
        res = nat.lib.vks_dispatch(nat.dev, cmd, queue, info, fence, pipeline, layout, n,
                                   nffi.from_buffer("uint32_t[]", groups),
                                   nffi.from_buffer("uint8_t[]", push), push_size,
                                   self.lead(), ordered)
        check(res, f"dispatch ({self.name})")
        self._submitted()

    def copy_many(self, desc: Any, n: int) -> None:
        """Record ``n`` buffer copies (``desc``: 5n uint64 — dst buffer, dst offset, src buffer,
        src offset, size) between the usual barriers and submit them (the caller holds
        ``device.lock``). They may run concurrently."""
        nat = self._native
        if nat is None:
            ffi = self.device._vk.ffi
            self.begin()
            r = self._regions
            for k in range(n):
                dst, r.dstOffset, src, r.srcOffset, r.size = desc[5 * k:5 * k + 5]
                self._lib.vkCmdCopyBuffer(self.cmd, ffi.cast("VkBuffer", src),
                                          ffi.cast("VkBuffer", dst), 1, r)
            self.end()
            self.submit()
            return
        cmd, queue, info, fence = self._addr
        check(nat.lib.vks_copy_many(nat.dev, cmd, queue, info, fence, n,
                                    nat.ffi.from_buffer("uint64_t[]", desc), self.lead()),
              f"copies ({self.name})")
        self._submitted()

    def dispatch1(self, pipeline: int, layout: int, x: int, push: bytes) -> None:
        """Natively record one dispatch of ``x`` workgroups with ``push`` as push constants
        and submit it (as :meth:`dispatch`, for one)."""
        nat = self._native
        cmd, queue, info, fence = self._addr
        check(nat.lib.vks_dispatch1(nat.dev, cmd, queue, info, fence, pipeline, layout, x,
                                    push, len(push), self.lead()),
              f"dispatch ({self.name})")
        self._submitted()

    def wait(self, timeout: float | None = None) -> None:
        """Wait for the last submission (GpuTimeoutError after ``timeout``) and reset the
        fence; nothing to do when none is pending."""
        if not self.pending:
            return
        dev = self.device
        lib = self._lib
        t = dev.timeout if timeout is None else timeout
        nat = self._native
        if nat is not None:  # spin, then block, then reset: one C call without the GIL
            res = nat.lib.vks_wait(nat.dev, self._addr[3], int(min(dev.spin_wait, t) * 1e9),
                                   int(t * 1e9))
            if res == 2:  # VK_TIMEOUT
                raise GpuTimeoutError(
                    f"{self.name} did not finish within {t:g} s on {dev.info.name} (raise "
                    f"{ENV_TIMEOUT} or pass timeout=); the work is still in flight")
            check(res, f"vkWaitForFences ({self.name})")
            self._done()
            return
        # Poll briefly first: a blocking vkWaitForFences costs a thread wake-up (~50 us more
        # per round trip on lavapipe), while short work is often done within microseconds.
        handle = dev.handle
        fence = self.fence
        res = lib.vkGetFenceStatus(handle, fence)
        if res == 1 and dev.spin_wait > 0:  # VK_NOT_READY
            end = perf_counter() + min(dev.spin_wait, t)
            while res == 1 and perf_counter() < end:
                res = lib.vkGetFenceStatus(handle, fence)
        if res == 1:
            res = lib.vkWaitForFences(handle, 1, self._fences, 1, int(t * 1e9))
        if res == 2:  # VK_TIMEOUT
            raise GpuTimeoutError(
                f"{self.name} did not finish within {t:g} s on {dev.info.name} (raise "
                f"{ENV_TIMEOUT} or pass timeout=); the work is still in flight")
        check(res, f"vkWaitForFences ({self.name})")
        check(lib.vkResetFences(dev.handle, 1, self._fences), "vkResetFences")
        self._done()

    def close(self) -> None:
        """Wait for pending work (bounded) and free the command buffer and fence."""
        if self.fence is None:
            return
        dev = self.device
        if self.pending:
            self.wait()  # raises GpuTimeoutError rather than freeing in-flight objects
        self._lib.vkDestroyFence(dev.handle, self.fence, self._null)
        self._lib.vkFreeCommandBuffers(dev.handle, self.pool, 1, self._cmds)
        self.fence = None
        self.cmd = None
