"""In-order submission on a timeline semaphore: the queue half of a
:class:`~vkshmem.gpu.stream.Stream`.

A :class:`Timeline` owns a command pool on a queue family of one device and a Vulkan 1.2
timeline semaphore. Each submission waits for the value the previous one signals and signals
the next, so the GPU runs them one after the other in submission order, on whichever queue
they went to, with no host wait in between (the semaphore's wait is an execution and memory
dependency: a submission sees every write of the ones before it). Command buffers are
recycled once the semaphore's counter reached their value (no fences); at most
:data:`MAX_IN_FLIGHT` are in flight, a submission beyond that first waits (bounded) for the
oldest. :meth:`Timeline.after_queue` makes the next submission wait also for everything
submitted so far to another queue (an empty batch there signals a second timeline semaphore:
a semaphore signal covers every command earlier in that queue's submission order).

Every host wait is bounded (the device's ``VKSHMEM_GPU_TIMEOUT`` or ``timeout=``) and raises
:class:`~vkshmem.gpu.errors.GpuTimeoutError` naming the variable.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import TYPE_CHECKING, Any

from vkshmem.core.errors import FeatureNotAvailableError

from ..env import ENV_TIMEOUT
from ..errors import GpuError, GpuTimeoutError
from ._vk import check

if TYPE_CHECKING:
    from .logical import LogicalDevice

__all__ = ["MAX_IN_FLIGHT", "Timeline"]

#: command buffers one timeline keeps in flight before a submission waits for the oldest
MAX_IN_FLIGHT = 64
_VK_TIMEOUT = 2


class Timeline:
    """Submissions to ``device``'s launch queue (``launch=True``, the queue user kernels run
    on) or first queue, ordered by a timeline semaphore (see the module doc). Thread-safe."""

    def __init__(self, device: LogicalDevice, name: str, launch: bool = True) -> None:
        device.check_open()
        if not device.info.timeline_semaphore:
            raise FeatureNotAvailableError(
                f"{device.info.name} has no timeline semaphores (Vulkan 1.2 timelineSemaphore): "
                "streams need them; call without stream= (or synchronize it yourself)")
        vk = device._vk
        ffi, lib = vk.ffi, vk.lib
        self.device = device
        self.name = name
        self.queue = device.launch_queue if launch else device.queue
        self._lib, self._ffi, self._null = lib, ffi, ffi.NULL
        self.lock = threading.RLock()
        self.pool: Any = None
        self.semaphore: Any = None
        self._aux: Any = None  # the other queue's semaphore (after_queue), made on first use
        self._aux_value = 0
        self._aux_pending = False
        #: the value the last submission signals (0: none yet)
        self.value = 0
        self._free: list[Any] = []
        self._busy: deque[tuple[int, Any]] = deque()
        #: command buffers allocated and not freed (for leak checks)
        self.allocated = 0
        pinfo = ffi.new("VkCommandPoolCreateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
            "flags": vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
            "queueFamilyIndex": device.launch_family if launch else device.queue_family})
        out = ffi.new("VkCommandPool*")
        check(lib.vkCreateCommandPool(device.handle, pinfo, ffi.NULL, out),
              f"vkCreateCommandPool ({name})")
        self.pool = out[0]
        try:
            self.semaphore = self._semaphore()
        except BaseException:
            self.close()
            raise
        self._alloc_info = ffi.new("VkCommandBufferAllocateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
            "commandPool": self.pool, "level": vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY,
            "commandBufferCount": 1})
        # the submission, prebuilt: wait [ours, the other queue's], signal ours
        self._waits = ffi.new("VkSemaphore[2]")
        self._wait_values = ffi.new("uint64_t[2]")
        stage = vk.VK_PIPELINE_STAGE_ALL_COMMANDS_BIT
        self._stages = ffi.new("VkPipelineStageFlags[2]", [stage, stage])
        self._signals = ffi.new("VkSemaphore[1]", [self.semaphore])
        self._signal_values = ffi.new("uint64_t[1]")
        self._cmds = ffi.new("VkCommandBuffer[1]")
        self._tinfo = ffi.new("VkTimelineSemaphoreSubmitInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_TIMELINE_SEMAPHORE_SUBMIT_INFO,
            "pWaitSemaphoreValues": self._wait_values, "signalSemaphoreValueCount": 1,
            "pSignalSemaphoreValues": self._signal_values})
        self._submit = ffi.new("VkSubmitInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_SUBMIT_INFO, "pNext": self._tinfo,
            "pWaitSemaphores": self._waits, "pWaitDstStageMask": self._stages,
            "commandBufferCount": 1, "pCommandBuffers": self._cmds,
            "signalSemaphoreCount": 1, "pSignalSemaphores": self._signals})

    def _semaphore(self) -> Any:
        vk = self.device._vk
        ffi = self._ffi
        tinfo = ffi.new("VkSemaphoreTypeCreateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_SEMAPHORE_TYPE_CREATE_INFO,
            "semaphoreType": vk.VK_SEMAPHORE_TYPE_TIMELINE, "initialValue": 0})
        sinfo = ffi.new("VkSemaphoreCreateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_SEMAPHORE_CREATE_INFO, "pNext": tinfo})
        out = ffi.new("VkSemaphore*")
        check(self._lib.vkCreateSemaphore(self.device.handle, sinfo, ffi.NULL, out),
              f"vkCreateSemaphore ({self.name})")
        return out[0]

    # -- state ------------------------------------------------------------------------------

    def counter(self) -> int:
        """The semaphore's value now: every submission up to it has finished."""
        out = self._ffi.new("uint64_t*")
        check(self._lib.vkGetSemaphoreCounterValue(self.device.handle, self.semaphore, out),
              f"vkGetSemaphoreCounterValue ({self.name})")
        return int(out[0])

    def done(self) -> bool:
        """Whether the GPU finished everything submitted so far (never waits)."""
        with self.lock:
            return self.value == 0 or self.counter() >= self.value

    def wait(self, value: int | None = None, timeout: float | None = None) -> None:
        """Wait (host) until submission ``value`` (default: the last) finished;
        GpuTimeoutError after ``timeout`` seconds (default ``VKSHMEM_GPU_TIMEOUT``)."""
        target = self.value if value is None else value
        if target > 0:
            self._wait(self.semaphore, target, timeout)
            with self.lock:
                self._reap(self.counter())

    def _wait(self, semaphore: Any, value: int, timeout: float | None) -> None:
        dev = self.device
        vk = dev._vk
        ffi = self._ffi
        t = dev.timeout if timeout is None else timeout
        sems = ffi.new("VkSemaphore[1]", [semaphore])
        values = ffi.new("uint64_t[1]", [value])
        info = ffi.new("VkSemaphoreWaitInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_SEMAPHORE_WAIT_INFO, "semaphoreCount": 1,
            "pSemaphores": sems, "pValues": values})
        res = self._lib.vkWaitSemaphores(dev.handle, info, int(max(t, 0.0) * 1e9))
        if res == _VK_TIMEOUT:
            raise GpuTimeoutError(
                f"{self.name}: its work did not finish within {t:g} s on {dev.info.name} "
                f"({ENV_TIMEOUT} bounds the wait; the work stays queued)")
        check(res, f"vkWaitSemaphores ({self.name})")

    @property
    def in_flight(self) -> int:
        """Command buffers submitted and not yet known to be finished."""
        return len(self._busy)

    # -- recording and submission -----------------------------------------------------------

    def _reap(self, reached: int) -> None:
        busy = self._busy
        while busy and busy[0][0] <= reached:
            self._free.append(busy.popleft()[1])

    def acquire(self, timeout: float | None = None) -> Any:
        """A command buffer to record into (the caller holds :attr:`lock` until it
        :meth:`submit` or :meth:`release` it): a finished one, else a new one, else (at
        :data:`MAX_IN_FLIGHT`) the oldest once it finished."""
        if self.pool is None:
            raise GpuError(f"{self.name} is closed")
        if self._busy:
            self._reap(self.counter())
        if not self._free:
            if len(self._busy) >= MAX_IN_FLIGHT:
                self.wait(self._busy[0][0], timeout)
            else:
                out = self._ffi.new("VkCommandBuffer[1]")
                with self.device.lock:
                    check(self._lib.vkAllocateCommandBuffers(self.device.handle,
                                                             self._alloc_info, out),
                          f"vkAllocateCommandBuffers ({self.name})")
                self.allocated += 1
                self._free.append(out[0])
        return self._free.pop()

    def release(self, cmd: Any) -> None:
        """Give back a command buffer that was not submitted (recording failed)."""
        self._lib.vkResetCommandBuffer(cmd, 0)
        self._free.append(cmd)

    def after_queue(self) -> None:
        """Make the next submission wait also for the work submitted so far to the device's
        first queue (``device.queue``) without the host waiting: an empty batch there
        signals the other semaphore (the caller holds :attr:`lock`)."""
        dev = self.device
        vk = dev._vk
        ffi = self._ffi
        if self._aux is None:
            self._aux = self._semaphore()
        self._aux_value += 1
        sems = ffi.new("VkSemaphore[1]", [self._aux])
        vals = ffi.new("uint64_t[1]", [self._aux_value])
        tinfo = ffi.new("VkTimelineSemaphoreSubmitInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_TIMELINE_SEMAPHORE_SUBMIT_INFO,
            "signalSemaphoreValueCount": 1, "pSignalSemaphoreValues": vals})
        info = ffi.new("VkSubmitInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_SUBMIT_INFO, "pNext": tinfo,
            "signalSemaphoreCount": 1, "pSignalSemaphores": sems})
        with dev.lock:
            dev.check_open()
            check(self._lib.vkQueueSubmit(dev.queue, 1, info, self._null),
                  f"vkQueueSubmit ({self.name}: after the device's queue)")
        self._aux_pending = True

    def submit(self, cmd: Any) -> int:
        """Submit ``cmd`` (ended) after everything submitted before; returns its value."""
        n = 0
        if self.value:
            self._waits[0] = self.semaphore
            self._wait_values[0] = self.value
            n = 1
        if self._aux_pending:
            self._waits[n] = self._aux
            self._wait_values[n] = self._aux_value
            n += 1
        value = self.value + 1
        self._submit.waitSemaphoreCount = n
        self._tinfo.waitSemaphoreValueCount = n
        self._signal_values[0] = value
        self._cmds[0] = cmd
        dev = self.device
        with dev.lock:
            dev.check_open()
            res = self._lib.vkQueueSubmit(self.queue, 1, self._submit, self._null)
        if res != 0:
            self.release(cmd)
            check(res, f"vkQueueSubmit ({self.name})")
        self._aux_pending = False
        self.value = value
        self._busy.append((value, cmd))
        return value

    # -- teardown ---------------------------------------------------------------------------

    def close(self, timeout: float | None = None) -> None:
        """Wait for the work in flight (bounded: GpuTimeoutError leaves everything alive),
        then free the command buffers, the pool and the semaphores."""
        with self.lock:
            if self.pool is None and self.semaphore is None:
                return
            dev = self.device
            if dev.handle is None:  # the device went first: its objects went with it
                self.pool = self.semaphore = self._aux = None
                return
            if self.semaphore is not None:
                self.wait(None, timeout)
            if self._aux is not None:  # an empty batch on the first queue may signal it
                self._wait(self._aux, self._aux_value, timeout)
            lib, null = self._lib, self._null
            if self.pool is not None:
                with dev.lock:
                    lib.vkDestroyCommandPool(dev.handle, self.pool, null)  # frees its buffers
                self.pool = None
            self.allocated = 0
            self._free.clear()
            self._busy.clear()
            for sem in (self.semaphore, self._aux):
                if sem is not None:
                    lib.vkDestroySemaphore(dev.handle, sem, null)
            self.semaphore = self._aux = None
