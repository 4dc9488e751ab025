"""One asynchronous dispatch of a user kernel (:class:`Launch`, returned by
:meth:`UserKernel.dispatch <vkshmem.gpu.initiated.launch.UserKernel.dispatch>`): on its own
command buffer and fence, or on a :class:`~vkshmem.gpu.stream.Stream` (then its timeline
value)."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from ..vk._vk import check

if TYPE_CHECKING:
    from ..stream import Stream
    from ..vk.submit import Slot
    from .launch import UserKernel

__all__ = ["Launch"]

_VK_SUCCESS = 0
_VK_NOT_READY = 1


class Launch:
    """One asynchronous dispatch of a :class:`UserKernel` (see :meth:`UserKernel.dispatch`).

    Its command buffer is reused by later dispatches once the launch is known to be finished
    (:meth:`wait` returned, or :meth:`done` said True).
    """

    def __init__(self, kernel: UserKernel, slot: Slot | None,
                 groups: tuple[int, int, int]) -> None:
        self.kernel = kernel
        self.groups = groups
        self._slot: Slot | None = slot
        self._lock = threading.Lock()
        #: a launch on a stream: the stream and the timeline value its dispatch signals
        self._stream: Stream | None = None
        self._value = 0

    def _stream_done(self, wait: bool, timeout: float | None) -> bool:
        stream = self._stream
        assert stream is not None
        tl = stream._timeline
        if tl is not None:
            if wait:
                tl.wait(self._value, timeout)
            elif tl.counter() < self._value:
                return False
        self._stream = None
        with self.kernel._lock:
            self.kernel._in_flight.discard(self)
        self.kernel.finished()
        return True

    def done(self) -> bool:
        """Whether the GPU finished the dispatch (never waits: False while another thread is
        in :meth:`wait`)."""
        if self._stream is not None:
            return self._stream_done(False, None)
        if not self._lock.acquire(blocking=False):
            return False
        try:
            slot = self._slot
            if slot is None:
                return True
            dev = self.kernel.device
            dev.check_open()
            res = dev._vk.lib.vkGetFenceStatus(dev.handle, slot.fence)
            if res == _VK_NOT_READY:
                return False
            if res != _VK_SUCCESS:
                check(res, f"vkGetFenceStatus ({slot.name})")
            slot.wait(0)  # signalled: resets the fence
            self._release()
        finally:
            self._lock.release()
        self.kernel.finished()
        return True

    def wait(self, timeout: float | None = None) -> None:
        """Wait for the dispatch (``timeout`` seconds, default the device's
        ``VKSHMEM_GPU_TIMEOUT``). :class:`GpuTimeoutError` when it is still running then: the
        work stays in flight and the launch can be waited on again. A launch on a stream
        waits for its dispatch (and the stream's work before it), not for the stream."""
        if self._stream is not None:
            self._stream_done(True, timeout)
            return
        with self._lock:
            slot = self._slot
            if slot is None:
                return
            self.kernel.device.check_open()
            slot.wait(timeout)
            self._release()
        self.kernel.finished()

    def _release(self) -> None:
        slot, self._slot = self._slot, None
        if slot is not None:
            self.kernel._release(self, slot)

    def __repr__(self) -> str:
        state = "done" if self._slot is None and self._stream is None else "in flight"
        return f"<Launch of {self.kernel.name} {self.groups}: {state}>"
