"""Device-side sources and destinations of a domain heap's puts and gets (the ``transfers``
part of a :class:`~vkshmem.core.domains.heap.DomainHeap`).

``put_device``/``get_device`` move bytes between this PE's segment and a peer's: one device
copy where the peer's segment is imported here (route ``direct``), the domain's link to it
(route ``link+proxy``), through the domain proxy's
pipeline (route ``proxy``), else piece by piece through host staging and the transport that
registers the peer's memory. Their ``_nbi`` forms let the domain batch direct copies, and the
proxy keep its requests in flight, until ``quiet``.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    from ..proxy.protocol import DomainProxy
    from .contract import MemoryDomain

__all__ = ["DeviceTransfers", "TransferHeap"]


class TransferHeap(Protocol):
    """What the device transfers read of their heap (its segment, routes and host-side
    put/get), as the heap has them at each call (they change at start-up and close)."""

    domain: MemoryDomain
    local: Any
    seg_id: int
    #: per PE: its segment imported here, the domain's link to it, the transport carrying it
    direct: list[Any]
    links: list[Any]
    carrier: list[Any]
    proxy: DomainProxy | None

    def put(self, pe: int, seg: int, offset: int, src: memoryview) -> None: ...

    def get(self, pe: int, seg: int, offset: int, dst: memoryview) -> None: ...


class DeviceTransfers:
    """The device transfers of a domain heap (its ``transfers``; see module doc).
    ``chunk``: the host staging pieces' size where the heap has no proxy."""

    def __init__(self, heap: TransferHeap, chunk: int) -> None:
        self.heap = heap
        self.chunk = chunk
        self._staging = threading.local()  # _pieces' host buffer, per thread

    def put_device(self, pe: int, offset: int, src_off: int, nbytes: int) -> None:
        """Bytes of this PE's segment at ``src_off`` into ``pe``'s segment at ``offset``."""
        heap = self.heap
        mem = heap.direct[pe]
        if mem is not None:
            heap.domain.copy(mem, offset, heap.local, src_off, nbytes)
            return
        if (link := heap.links[pe]) is not None:
            link.put_device(offset, src_off, nbytes)
            return
        if heap.carrier[pe] is None and heap.proxy is not None:  # pipelined by the proxy
            heap.proxy.put_device(pe, offset, src_off, nbytes)
            return
        for lo, piece in self._pieces(nbytes):
            heap.domain.read(heap.local, src_off + lo, piece)
            heap.put(pe, heap.seg_id, offset + lo, piece)

    def get_device(self, pe: int, offset: int, dst_off: int, nbytes: int) -> None:
        """Bytes of ``pe``'s segment at ``offset`` into this PE's segment at ``dst_off``."""
        heap = self.heap
        mem = heap.direct[pe]
        if mem is not None:
            heap.domain.copy(heap.local, dst_off, mem, offset, nbytes)
            return
        if (link := heap.links[pe]) is not None:
            link.get_device(offset, dst_off, nbytes)
            return
        if heap.carrier[pe] is None and heap.proxy is not None:
            heap.proxy.get_device(pe, offset, dst_off, nbytes)
            return
        for lo, piece in self._pieces(nbytes):
            heap.get(pe, heap.seg_id, offset + lo, piece)
            heap.domain.write(heap.local, dst_off + lo, piece)

    def put_device_nbi(self, pe: int, offset: int, src_off: int, nbytes: int) -> None:
        """Start :meth:`put_device` (completed by the heap's ``quiet`` where the domain
        batches)."""
        heap = self.heap
        mem = heap.direct[pe]
        if mem is not None:
            heap.domain.copy_nbi(mem, offset, heap.local, src_off, nbytes)
        elif heap.links[pe] is None and heap.carrier[pe] is None and heap.proxy is not None:
            heap.proxy.put_device(pe, offset, src_off, nbytes, nbi=True)  # DEPTH in flight
        else:
            self.put_device(pe, offset, src_off, nbytes)

    def get_device_nbi(self, pe: int, offset: int, dst_off: int, nbytes: int) -> None:
        """Start :meth:`get_device` (completed by the heap's ``quiet`` where the domain
        batches)."""
        heap = self.heap
        mem = heap.direct[pe]
        if mem is not None:
            heap.domain.copy_nbi(heap.local, dst_off, mem, offset, nbytes)
        elif heap.links[pe] is None and heap.carrier[pe] is None and heap.proxy is not None:
            heap.proxy.get_device(pe, offset, dst_off, nbytes, nbi=True)
        else:
            self.get_device(pe, offset, dst_off, nbytes)

    def _pieces(self, nbytes: int) -> Any:
        """Host staging pieces of a device transfer to or from a peer whose memory a transport
        registers (the proxy's piece size): the proxy's staging area in the host heap
        (imported by a GPU domain: the device copies are single DMAs) when no other thread
        holds it, else a per-thread buffer, reused."""
        proxy = self.heap.proxy
        if proxy is not None and proxy.stage.nbytes and proxy.stage_lock.acquire(blocking=False):
            try:
                chunk = proxy.chunk
                for lo in range(0, nbytes, chunk):
                    yield lo, proxy.stage[:min(chunk, nbytes - lo)]
            finally:
                proxy.stage_lock.release()
            return
        chunk = proxy.chunk if proxy is not None else self.chunk
        tmp = getattr(self._staging, "buf", None)
        if tmp is None or tmp.nbytes < min(nbytes, chunk):
            tmp = self._staging.buf = memoryview(np.empty(min(nbytes, chunk), np.uint8))
        for lo in range(0, nbytes, chunk):
            yield lo, tmp[:min(chunk, nbytes - lo)]
