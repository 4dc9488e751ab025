"""The host side of GPU-initiated communication: a thread that drains a request ring.

A kernel (see :class:`~vkshmem.gpu.initiated.launch.UserKernel`) enqueues requests into a
:class:`~vkshmem.gpu.initiated.ring.Ring` through ``shaders/vkshmem.glsl``; a :class:`RingService`
consumes them in ticket order on a background thread, hands each to a **handler** that performs
it, writes the fetched value (if any) to the request's ``result`` address, and advances the
ring's ``done`` counter, which the kernel's ``vks_wait``/``vks_quiet`` return on.

Handler contract (``handler(desc) -> int | None``; ``desc`` a
:class:`~vkshmem.gpu.initiated.ring.Descriptor`; segments: 0 the host heap, 1 the GPU heap;
offsets are symmetric, i.e. the same on every PE; "this PE" is the PE whose kernel made the
request):

======================  =====================================================================
``desc.op``             what the handler does
======================  =====================================================================
``PUT``                 copy ``nbytes`` from this PE's segment ``src_seg`` at ``src`` to PE
                        ``pe``'s segment ``dst_seg`` at ``dst``
``GET``                 copy ``nbytes`` from PE ``pe``'s segment ``src_seg`` at ``src`` to
                        this PE's segment ``dst_seg`` at ``dst``
``AMO``                 apply ``amo_op`` (:class:`~vkshmem.core.transports.contract.AmoOp`) to the
                        ``width``-byte (4 or 8) word at ``dst`` of PE ``pe``'s segment
                        ``dst_seg``, operand ``value``, CSWAP's condition ``compare``
                        (``aux``); **return the old value** (written to ``result`` when
                        ``result`` is not 0)
``SIGNAL``              the uint64 at ``dst`` of PE ``pe``'s segment ``dst_seg``:
                        ``signal_op`` SET to ``value`` or ADD ``value`` (atomically)
``PUT_SIGNAL``          PUT as above, then, once its data are delivered, SIGNAL on the uint64
                        at ``signal_offset`` (``aux``) of PE ``pe``'s segment ``dst_seg``
``FENCE``               order: PUTs before it are delivered before later ones, per PE
``QUIET``               every earlier request is complete at its target
``NOP``                 nothing
======================  =====================================================================

A request is complete when the handler returns (and, when ``flush`` is given, after the
``flush()`` that the service calls once per batch before completing it: a handler may issue
non-blocking operations and pass the runtime's quiet as ``flush``). An exception from the
handler (or ``flush``) **poisons the ring** (:meth:`Ring.fail
<vkshmem.gpu.initiated.ring.Ring.fail>`):
every shader wait returns false at once instead of spinning, the service discards later
requests so producers never block, and :meth:`RingService.check`/:meth:`RingService.stop`
raise :class:`~vkshmem.gpu.errors.RingError` (its ``__cause__`` is the handler's exception).

The handler runs while the requesting kernel is still running on the device. Work that the
handler submits to that device's queue (staged copies, shader AMOs) runs only after the kernel
ends, so waiting for it deadlocks until the kernel's wait gives up: reach the kernel's own GPU
memory through a CPU mapping (host-visible memory, as on lavapipe) or another queue, and put
fetched values in memory a running kernel sees (:meth:`VulkanDevice.alloc_mapped
<vkshmem.gpu.vk.device.VulkanDevice.alloc_mapped>`, e.g. the kernel's scratch): a ``result``
elsewhere fails the request rather than deadlock.

Polling: the thread polls the ring, spinning (yielding the GIL) for ``spin`` seconds after the
last request, then sleeping with a doubling pause up to ``max_sleep`` (1 ms), so an idle
service costs ~1000 wake-ups a second and a busy one answers within microseconds.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from time import perf_counter
from typing import TYPE_CHECKING

from vkshmem.core.errors import InvalidArgumentError

from ..errors import GpuTimeoutError, RingError
from .ring import Descriptor, Ring, RingOp, result_width

if TYPE_CHECKING:
    from ..vk.device import VulkanDevice

__all__ = ["Handler", "RingService"]

log = logging.getLogger("vkshmem.gpu")

#: Performs one request; returns the fetched value (AMOs) or None.
Handler = Callable[[Descriptor], int | None]

_MIN_SLEEP = 20e-6
DEFAULT_STOP_TIMEOUT = 30.0


def describe(desc: Descriptor) -> str:
    """A request in words, for error messages."""
    op = desc.op.name if isinstance(desc.op, RingOp) else f"op {desc.op}"
    text = f"request #{desc.ticket} ({op} to PE {desc.pe}"
    if desc.op in (RingOp.PUT, RingOp.GET, RingOp.PUT_SIGNAL):
        text += (f", {desc.nbytes} bytes, seg {desc.src_seg} offset {desc.src} -> seg "
                 f"{desc.dst_seg} offset {desc.dst}")
    elif desc.op in (RingOp.AMO, RingOp.SIGNAL):
        text += f", seg {desc.dst_seg} offset {desc.dst}"
    return text + ")"


class RingService:
    """Drain ``ring`` on a background thread, performing each request with ``handler``.

    ``device`` is where ``result`` addresses live (default: the device of a ring made by
    :meth:`Ring.create`). ``flush``, when given, is called once per batch of at most ``batch``
    requests before they are completed (see the module doc). ``start=False`` leaves it to
    :meth:`start`. Usable as a context manager (stops on exit).

    ``handled`` counts completed requests, ``discarded`` those taken but never completed (the
    failed one, the rest of its batch, and every later one).
    """

    def __init__(self, ring: Ring, handler: Handler, device: VulkanDevice | None = None, *,
                 flush: Callable[[], None] | None = None, batch: int = 64,
                 spin: float = 50e-6, max_sleep: float = 1e-3,
                 name: str = "vkshmem-ring-service", start: bool = True) -> None:
        if batch < 1:
            raise InvalidArgumentError(f"batch must be at least 1, got {batch}")
        if spin < 0 or max_sleep <= 0:
            raise InvalidArgumentError("spin must be >= 0 and max_sleep > 0 seconds")
        self.ring = ring
        self.handler = handler
        self.device = device if device is not None else (
            ring.memory.device if ring.memory is not None else None)
        self.flush = flush
        self.batch = batch
        self.spin = spin
        self.max_sleep = max(max_sleep, _MIN_SLEEP)
        self.name = name
        self.handled = 0
        self.discarded = 0
        self._error: RingError | None = None
        self._current: Descriptor | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if start:
            self.start()

    # -- state ------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        """Whether the thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def error(self) -> RingError | None:
        """The failure recorded so far (None while every request succeeded)."""
        return self._error

    def check(self) -> None:
        """Raise the recorded :class:`RingError` if a request failed (the service keeps
        running, discarding requests, until :meth:`stop`)."""
        if self._error is not None:
            raise self._error

    # -- control ----------------------------------------------------------------------------

    def start(self) -> None:
        """Start the thread (once)."""
        if self._thread is not None:
            raise InvalidArgumentError(f"{self.name} was already started; make a new one")
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Serve what is already published, stop the thread and join it (``timeout``
        seconds, default 30: :class:`GpuTimeoutError` if the handler is still busy, the thread
        then stops once it returns; call again to join). Raises the recorded
        :class:`RingError` if a request failed."""
        self._stop.set()
        thread = self._thread
        if thread is not None:
            t = DEFAULT_STOP_TIMEOUT if timeout is None else timeout
            thread.join(t)
            if thread.is_alive():
                cur = self._current
                busy = f" on {describe(cur)}" if cur is not None else ""
                raise GpuTimeoutError(f"{self.name} did not stop within {t:g} s: its handler is "
                                      f"still busy{busy}")
        self.check()

    def __enter__(self) -> RingService:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.stop()
            return
        try:  # an exception is already on its way: do not replace it
            self.stop()
        except Exception as err:
            log.warning("%s: %s (while handling another exception)", self.name, err)

    # -- the thread -------------------------------------------------------------------------

    def _run(self) -> None:
        stop = self._stop
        sleep = _MIN_SLEEP
        last = perf_counter()
        while True:
            stopping = stop.is_set()
            n = self._serve_once()
            if stopping:
                break  # one last pass over what was published before stop()
            if n:
                last = perf_counter()
                sleep = _MIN_SLEEP
                continue
            if perf_counter() - last < self.spin:
                time.sleep(0)  # yield the GIL between polls
                continue
            stop.wait(sleep)
            sleep = min(2 * sleep, self.max_sleep)

    def _serve_once(self) -> int:
        """Handle one batch; returns how many requests were taken."""
        ring = self.ring
        descs = ring.poll(self.batch)
        if not descs:
            return 0
        if self._error is not None:  # poisoned: consume so producers never block
            self.discarded += len(descs)
            return len(descs)
        desc: Descriptor | None = None
        completed = 0
        try:
            for desc in descs:
                self._current = desc
                self._perform(desc)
                if self.flush is None:
                    self.handled += 1
                    ring.complete(1)
                    completed += 1
            if self.flush is not None:
                desc = None
                self.flush()
                self.handled += len(descs)
                ring.complete(len(descs))
        except BaseException as exc:  # recorded, raised by check() and stop()
            self.discarded += len(descs) - completed
            self._fail(exc, desc)
        finally:
            self._current = None
        return len(descs)

    def _perform(self, desc: Descriptor) -> None:
        if not isinstance(desc.op, RingOp):
            raise InvalidArgumentError(f"unknown request op {desc.op} (a corrupt descriptor, "
                                       "or a shader built against another vkshmem.glsl)")
        value = self.handler(desc)
        if value is not None and desc.result:
            if self.device is None:
                raise InvalidArgumentError("the ring service has no device to write results "
                                           "to (pass device=)")
            self.ring.write_result(desc, int(value), self.device, result_width(desc),
                                   allow_staged=False)

    def _fail(self, exc: BaseException, desc: Descriptor | None) -> None:
        what = describe(desc) if desc is not None else "flush of a batch of requests"
        err = RingError(f"{self.name}: {what} failed: {type(exc).__name__}: {exc}; the ring is "
                        "poisoned (waiting kernels fail), later requests are discarded")
        err.__cause__ = exc
        err.descriptor = desc
        if self._error is None:
            self._error = err
            log.error("%s", err)
        try:
            self.ring.fail()
        except Exception:  # pragma: no cover - a closed ring
            log.exception("%s: could not poison the ring", self.name)
        if not isinstance(exc, Exception):  # KeyboardInterrupt, SystemExit: do not swallow
            raise exc
