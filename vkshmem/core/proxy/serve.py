"""The serving side of the domain proxy (see :mod:`vkshmem.core.proxy.protocol` for the protocol
and the mailbox): one thread per PE and domain that answers peers' requests on this PE's
segment.

Each **round** takes every request pending in any sender's slots (in sequence order per sender),
starts their device copies without waiting (puts: ``write_nbi`` from the request's payload area;
gets: ``read_nbi`` into it, or straight into the sender's answer area where the sender's host heap
is mapped here, see ``DomainProxy.direct``; both lie in host memory the GPU domain imports, so each
is one DMA), submits them together (``flush``), sends the previous round's answers while the device
works, then waits once (``quiet``). A round's answers go out at the start of the next round, or at
once when no further request is pending, so a stream of pieces keeps the device and the transport
busy at the same time while a lone request is answered without delay. Copies within a round that
touch overlapping bytes (one of them writing) are ordered by a ``quiet`` between them; an AMO waits
for the round's copies first, then runs at once (it is not batched: its value is its answer).

Polling is native: one C call (``vk_proxy_due`` in the core's ``_native`` helper, GIL
released) scans every sender's bells and lists the requests due in sequence order; for
``_SPIN`` seconds after the last request it spins in there until one is due (pausing, then
yielding the core), after that the thread sleeps with a growing pause (20 µs doubling to
1 ms) between scans, so a request after a quiet spell waits at most about a millisecond.
Rounds run in C where the domain offers its operations in C and every sender of the round is
on this node or reached by a transport with a data path in C (:mod:`vkshmem.core.proxy.native`);
the rest in Python.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

import numpy as np

from .._native import ffi, lib
from ..transports.contract import AmoOp
from ..transports.endpoints import Endpoints
from .mailbox import AMO, GET, HDR, HEAD, PUT, RESP, U64
from .native import NativeRounds

if TYPE_CHECKING:
    from .protocol import DomainProxy

__all__ = ["ProxyServer"]

log = logging.getLogger("vkshmem")

_SPIN = 2e-3  # seconds of native spinning on the bells after the last request
_SPIN_NS = 100_000  # one native spin call (then re-check the stop flag)
_MAX_SLEEP = 1e-3

#: a request answered: (sender, slot, seq, status, value, payload bytes, bytes to send: the
#: payload is already in the sender's response area when it is 0)
Answer = tuple[int, int, int, int, int, int, int]


class ProxyServer:
    """The serving thread of one :class:`DomainProxy` (started on creation)."""

    def __init__(self, proxy: DomainProxy) -> None:
        self.proxy = proxy
        lay = proxy.layout
        self.n, self.depth = lay.n, lay.depth
        self._next = np.ones(self.n, np.uint64)  # the seq due from each sender
        self._due = np.zeros(3 * self.n * self.depth, np.uint64)  # (sender, slot, seq) found
        self._ready: list[Answer] = []
        self._eps = Endpoints(proxy.rt)
        #: rounds in C, where the domain offers its operations in C
        self.native = NativeRounds.make(proxy, self._eps, self._next, self._due)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop,
                                        name=f"vkshmem-{proxy.heap.name}-proxy", daemon=True)
        self._thread.start()

    # -- the loop ------------------------------------------------------------------------------

    def _loop(self) -> None:
        proxy = self.proxy
        bells = ffi.cast("uint64_t *", proxy.address)  # the bells open the mailbox
        nxt = ffi.cast("uint64_t *", ffi.from_buffer(self._next))
        due = ffi.cast("uint64_t *", ffi.from_buffer(self._due))
        n, d, most = self.n, self.depth, self.n * self.depth
        native = self.native
        last = time.monotonic()
        pause = 0.0
        try:
            while not self._stop.is_set():
                spin = not self._ready and time.monotonic() - last < _SPIN
                if native is not None and not self._ready:
                    found = native.serve(_SPIN_NS if spin else 0)
                    if found > 0:  # served in C
                        native.count(proxy.stats)
                        last, pause = time.monotonic(), 0.0
                        continue
                    found = -found  # (0: none due) the Python round serves these
                else:
                    found = lib.vk_proxy_due(bells, nxt, n, d, due, most,
                                             _SPIN_NS if spin else 0)
                if found:
                    self._round(found)
                    last, pause = time.monotonic(), 0.0
                elif self._ready:
                    self._answer()
                elif not spin:
                    pause = min(_MAX_SLEEP, pause * 2 or 20e-6)
                    self._stop.wait(pause)
        except BaseException as exc:  # not a transport's error (those fail only their sender)
            log.error("%s proxy of PE %d: serving failed: %s", proxy.heap.name, proxy.me, exc)
            proxy.failure = exc

    def _round(self, found: int) -> None:
        """Serve the ``found`` requests the native scan listed in ``_due``."""
        due = self._due[:3 * found].tolist()
        todo = [(due[i], due[i + 1], due[i + 2]) for i in range(0, len(due), 3)]
        dom = self.proxy.heap.domain
        ranges: list[tuple[int, int, bool]] = []
        answers = [self._start(s, j, seq, ranges) for s, j, seq in todo]
        failed: Exception | None = None
        try:
            dom.flush()
        except Exception as exc:
            failed = exc
        self._answer()  # the previous round's, while the device works on this one
        try:
            dom.quiet()
        except Exception as exc:
            failed = failed or exc
        if failed is not None:
            answers = [self._fail(s, j, seq, failed) for s, j, seq, *_ in answers]
        self._ready = answers
        stats = self.proxy.stats
        stats["rounds"] += 1
        stats["max_round"] = max(stats["max_round"], found)

    # -- one request ---------------------------------------------------------------------------

    def _order(self, ranges: list[tuple[int, int, bool]], lo: int, n: int, write: bool) -> None:
        """Complete the round's copies so far when ``[lo, lo + n)`` overlaps one of them and
        either writes (batched copies have no order among themselves)."""
        hi = lo + n
        if any(a < hi and lo < b and (write or w) for a, b, w in ranges):
            self.proxy.heap.domain.quiet()
            ranges.clear()
        ranges.append((lo, hi, write))

    def _start(self, s: int, j: int, seq: int, ranges: list[tuple[int, int, bool]]) -> Answer:
        proxy = self.proxy
        heap = proxy.heap
        dom, mem = heap.domain, heap.local
        at = proxy.layout.request(s, j)
        op, width, offset, nbytes, operand, compare, echo = HDR.unpack_from(proxy.mem, at)
        try:
            if echo != seq:
                raise proxy.error(f"request {echo} found where {seq} was due")
            if nbytes > proxy.chunk:
                raise proxy.error(f"request of {nbytes} bytes exceeds the proxy chunk")
            payload = proxy.mem[at + HEAD:at + HEAD + nbytes]
            kind = op & 0xFF
            if kind == PUT:
                dom.check_range(offset, nbytes, f"{heap.name} proxy put")
                self._order(ranges, offset, nbytes, True)
                dom.write_nbi(mem, offset, payload)
                return (s, j, seq, 0, 0, 0, 0)
            if kind == GET:
                dom.check_range(offset, nbytes, f"{heap.name} proxy get")
                self._order(ranges, offset, nbytes, False)
                there = proxy._area(s, j, True, nbytes)  # the sender's answer area, mapped
                if there is not None:
                    dom.read_nbi(mem, offset, there)
                    proxy.stats["direct"] += 1
                    return (s, j, seq, 0, 0, nbytes, 0)
                dom.read_nbi(mem, offset, payload)
                return (s, j, seq, 0, 0, nbytes, nbytes)
            if kind == AMO:
                if ranges:
                    dom.quiet()
                    ranges.clear()
                value = heap.amo_on(mem, offset, AmoOp(op >> 8), width, operand, compare)
                return (s, j, seq, 0, value, 0, 0)
            raise proxy.error(f"unknown proxy request {op}")
        except Exception as exc:
            return self._fail(s, j, seq, exc)

    def _fail(self, s: int, j: int, seq: int, exc: BaseException) -> Answer:
        """An error answer: the text goes in the request's payload area."""
        proxy = self.proxy
        at = proxy.layout.request(s, j) + HEAD
        text = f"{type(exc).__name__}: {exc}".encode()[:500]
        proxy.mem[at:at + len(text)] = text
        return (s, j, seq, 1, 0, len(text), len(text))

    def _answer(self) -> None:
        """Send the answers of the last round: header and payload in one put, fence, seq."""
        ready, self._ready = self._ready, []
        proxy = self.proxy
        lay, me, base, mem = proxy.layout, proxy.me, proxy.base, proxy.mem
        for s, j, seq, status, value, n, sent in ready:
            at = lay.request(s, j)
            RESP.pack_into(mem, at, value, status, n)
            t = self._eps[s]
            try:
                t.put(s, 0, base + lay.response(me, j), mem[at:at + HEAD + sent])
                t.fence()
                t.put(s, 0, base + lay.answer(me, j), memoryview(U64.pack(seq)))
            except Exception as exc:  # that sender times out (naming this PE); serve the others
                log.error("%s proxy of PE %d: answering PE %d failed: %s", proxy.heap.name,
                          me, s, exc)

    # -- teardown ------------------------------------------------------------------------------

    def stop(self) -> bool:
        """Stop serving (peers' requests are no longer answered); whether the thread ended."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        return not self._thread.is_alive()

    def close(self) -> bool:
        """Stop, then release the thread's endpoints; False (nothing released) if it is stuck
        in a transport call."""
        if not self.stop():
            return False
        self._eps.close()
        return True
