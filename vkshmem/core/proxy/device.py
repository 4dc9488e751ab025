"""The domain proxy's sending side for transfers from and to this PE's own segment (a mixin of
:class:`~vkshmem.core.proxy.protocol.DomainProxy`, whose docstring describes the protocol): device
pieces staged through host memory (or copied by DMA straight into a same-node peer's mailbox)
while the previous ones travel, and answers copied in by the device."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .mailbox import GET, HEAD, PUT, fill

if TYPE_CHECKING:
    from ..domains.heap import DomainHeap
    from .native import DomainOps

__all__ = ["Done", "ProxyDeviceTransfers"]

log = logging.getLogger("vkshmem")

#: what runs on an answer: ``done(payload, value)``
Done = Callable[[memoryview, int], Any]


class ProxyDeviceTransfers:
    """``put_device``/``get_device`` of :class:`~vkshmem.core.proxy.protocol.DomainProxy` (which
    provides the attributes and the request primitives named here)."""

    heap: DomainHeap
    me: int
    depth: int
    direct: list[memoryview | None]
    stats: dict[str, int]
    _stages: list[memoryview]
    _send_lock: threading.Lock
    _issued: list[int]
    _done: list[int]
    _landing: set[tuple[int, int]]
    _begin: Callable[[int], None]
    _pieces: Callable[[int], list[tuple[int, int]]]
    _issue: Callable[..., None]
    _complete: Callable[[int], Any]
    _finish: Callable[[int], Any]
    _abandon: Callable[[int], None]
    _settle: Callable[[], None]
    _area: Callable[[int, int, bool, int], memoryview | None]
    dops: DomainOps

    def _fill(self, pe: int, j: int, src: memoryview) -> bool:
        """Copy ``src`` into slot ``j``'s request area of ``pe``'s mailbox where that is
        mapped here (:func:`~vkshmem.core.proxy.mailbox.fill`); False where it is not (the
        transport then sends it)."""
        area = self._area(pe, j, False, src.nbytes)
        if area is None:
            return False
        self.stats["streamed"] += fill(area, src)
        return True

    def put_device(self, pe: int, offset: int, src_off: int, nbytes: int,
                   nbi: bool = False) -> None:
        """Bytes of this PE's segment at ``src_off`` into ``pe``'s segment at ``offset``: each
        piece copied by the device into host staging while the previous one travels.
        ``nbi``: return once every piece is sent (complete at :meth:`quiet`)."""
        dom, mem = self.heap.domain, self.heap.local
        stages = self._stages
        with self._send_lock:
            self._begin(pe)
            if self.direct[pe] is not None:
                self._put_direct(pe, offset, src_off, nbytes, nbi)
                return
            pieces = self._pieces(nbytes)
            if self.dops.readable(src_off, pieces[0][1]) is not None:
                self._put_mapped(pe, offset, src_off, pieces, nbi)
                return
            try:
                for k, (lo, n) in enumerate(pieces):
                    if k == 0:  # into the host heap: one DMA where the domain imported it
                        dom.read_nbi(mem, src_off, stages[0][HEAD:HEAD + n])
                    dom.quiet()  # piece k is staged
                    if k + 1 < len(pieces):
                        lo1, n1 = pieces[k + 1]
                        dom.read_nbi(mem, src_off + lo1, stages[(k + 1) % 2][HEAD:HEAD + n1])
                        dom.flush()
                    self._issue(pe, PUT, offset + lo, n, body=stages[k % 2], nbi=nbi)
            except BaseException:
                self._abandon(pe)
                raise
            if not nbi:
                self._finish(pe)

    def _put_mapped(self, pe: int, offset: int, src_off: int, pieces: list[tuple[int, int]],
                    nbi: bool) -> None:
        """:meth:`put_device` where the CPU reads the segment through its mapping at memory
        speed (a CPU driver's, or an integrated GPU's cached memory): the transport sends each
        piece straight from the mapping, no staging copy. Under the send lock."""
        readable = self.dops.readable
        try:
            for lo, n in pieces:
                view = readable(src_off + lo, n)
                assert view is not None
                self._issue(pe, PUT, offset + lo, n, payload=view, nbi=nbi)
                self.stats["mapped"] += 1
        except BaseException:
            self._abandon(pe)
            raise
        if not nbi:
            self._finish(pe)

    def _put_direct(self, pe: int, offset: int, src_off: int, nbytes: int, nbi: bool) -> None:
        """:meth:`put_device` to a peer mapped here: each piece copied by the device straight
        into the request area of ``pe``'s mailbox (once its slot is free), then announced by
        a header-only request; ``pe``'s device copies piece k in while this one copies k+1
        out. Under the send lock."""
        dom, mem = self.heap.domain, self.heap.local
        try:
            for lo, n in self._pieces(nbytes):
                seq = self._issued[pe] + 1
                while seq - self._done[pe] > self.depth:
                    self._complete(pe)
                area = self._area(pe, (seq - 1) % self.depth, False, n)
                assert area is not None
                view = self.dops.readable(src_off + lo, n)
                if view is not None:  # a CPU copy through the mapping
                    self.stats["streamed"] += fill(area, view)
                else:
                    dom.read_nbi(mem, src_off + lo, area)
                    dom.quiet()
                self.stats["direct"] += 1
                self._issue(pe, PUT, offset + lo, n, nbi=nbi)
        except BaseException:
            self._abandon(pe)
            raise
        if not nbi:
            self._finish(pe)

    def get_device(self, pe: int, offset: int, dst_off: int, nbytes: int,
                   nbi: bool = False) -> None:
        """Bytes of ``pe``'s segment at ``offset`` into this PE's segment at ``dst_off``: each
        answer copied in by the device (from the mailbox, no staging) while the next pieces
        are on their way. ``nbi``: return once every piece is asked for (filled by
        :meth:`quiet`)."""
        dom, mem, landing = self.heap.domain, self.heap.local, self._landing

        def land(lo: int, j: int) -> Done:
            def run(view: memoryview, value: int) -> None:
                landing.add((pe, j))
                dom.write_nbi(mem, dst_off + lo, view)
                dom.flush()
            return run

        with self._send_lock:
            self._begin(pe)
            try:
                for lo, n in self._pieces(nbytes):
                    j = self._issued[pe] % self.depth  # the slot this request takes
                    self._issue(pe, GET, offset + lo, n, done=land(lo, j), nbi=nbi)
                if not nbi:
                    self._finish(pe)
                    self._settle()
            except BaseException:
                self._abandon(pe)
                try:
                    self._settle()
                except Exception as exc:
                    log.debug("PE %d: completing copies after a failed get: %s", self.me, exc)
                raise
