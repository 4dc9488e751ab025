"""Device-side sources and destinations of a domain heap's puts and gets (a mixin of
:class:`~vkshmem.core.domains.heap.DomainHeap`).

``put_device``/``get_device`` move bytes between this PE's segment and a peer's: one device
copy where the peer's segment is imported here (route ``direct``), the domain's link to it
(route ``link+proxy``), through the domain proxy's
pipeline (route ``proxy``), else piece by piece through host staging and the transport that
registers the peer's memory. Their ``_nbi`` forms let the domain batch direct copies, and the
proxy keep its requests in flight, until ``quiet``.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from ..proxy.protocol import DomainProxy
    from ..runtime import Runtime
    from .contract import MemoryDomain

__all__ = ["DeviceTransfers"]


class DeviceTransfers:
    """The device-transfer half of :class:`~vkshmem.core.domains.heap.DomainHeap` (which sets
    the attributes declared here)."""

    rt: Runtime
    domain: MemoryDomain
    local: Any
    seg_id: int
    direct: list[Any]
    links: list[Any]
    carrier: list[Any]
    proxy: DomainProxy | None
    _staging: threading.local

    if TYPE_CHECKING:  # DomainHeap's host-side put/get
        def put(self, pe: int, seg: int, offset: int, src: memoryview) -> None: ...

        def get(self, pe: int, seg: int, offset: int, dst: memoryview) -> None: ...

    def put_device(self, pe: int, offset: int, src_off: int, nbytes: int) -> None:
        """Bytes of this PE's segment at ``src_off`` into ``pe``'s segment at ``offset``."""
        mem = self.direct[pe]
        if mem is not None:
            self.domain.copy(mem, offset, self.local, src_off, nbytes)
            return
        if (link := self.links[pe]) is not None:
            link.put_device(offset, src_off, nbytes)
            return
        if self.carrier[pe] is None and self.proxy is not None:  # pipelined by the proxy
            self.proxy.put_device(pe, offset, src_off, nbytes)
            return
        for lo, piece in self._pieces(nbytes):
            self.domain.read(self.local, src_off + lo, piece)
            self.put(pe, self.seg_id, offset + lo, piece)

    def get_device(self, pe: int, offset: int, dst_off: int, nbytes: int) -> None:
        """Bytes of ``pe``'s segment at ``offset`` into this PE's segment at ``dst_off``."""
        mem = self.direct[pe]
        if mem is not None:
            self.domain.copy(self.local, dst_off, mem, offset, nbytes)
            return
        if (link := self.links[pe]) is not None:
            link.get_device(offset, dst_off, nbytes)
            return
        if self.carrier[pe] is None and self.proxy is not None:
            self.proxy.get_device(pe, offset, dst_off, nbytes)
            return
        for lo, piece in self._pieces(nbytes):
            self.get(pe, self.seg_id, offset + lo, piece)
            self.domain.write(self.local, dst_off + lo, piece)

    def put_device_nbi(self, pe: int, offset: int, src_off: int, nbytes: int) -> None:
        """Start :meth:`put_device` (completed by :meth:`quiet` where the domain batches)."""
        mem = self.direct[pe]
        if mem is not None:
            self.domain.copy_nbi(mem, offset, self.local, src_off, nbytes)
        elif self.links[pe] is None and self.carrier[pe] is None and self.proxy is not None:
            self.proxy.put_device(pe, offset, src_off, nbytes, nbi=True)  # DEPTH in flight
        else:
            self.put_device(pe, offset, src_off, nbytes)

    def get_device_nbi(self, pe: int, offset: int, dst_off: int, nbytes: int) -> None:
        """Start :meth:`get_device` (completed by :meth:`quiet` where the domain batches)."""
        mem = self.direct[pe]
        if mem is not None:
            self.domain.copy_nbi(self.local, dst_off, mem, offset, nbytes)
        elif self.links[pe] is None and self.carrier[pe] is None and self.proxy is not None:
            self.proxy.get_device(pe, offset, dst_off, nbytes, nbi=True)
        else:
            self.get_device(pe, offset, dst_off, nbytes)

    def _pieces(self, nbytes: int) -> Any:
        """Host staging pieces of a device transfer to or from a peer whose memory a transport
        registers (the proxy's piece size): the proxy's staging area in the host heap
        (imported by a GPU domain: the device copies are single DMAs) when no other thread
        holds it, else a per-thread buffer, reused."""
        proxy = self.proxy
        if proxy is not None and proxy.stage.nbytes and proxy.stage_lock.acquire(blocking=False):
            try:
                chunk = proxy.chunk
                for lo in range(0, nbytes, chunk):
                    yield lo, proxy.stage[:min(chunk, nbytes - lo)]
            finally:
                proxy.stage_lock.release()
            return
        chunk = proxy.chunk if proxy is not None else \
            (self.rt.config.gpu_proxy_chunk or 4 << 20)
        tmp = getattr(self._staging, "buf", None)
        if tmp is None or tmp.nbytes < min(nbytes, chunk):
            tmp = self._staging.buf = memoryview(np.empty(min(nbytes, chunk), np.uint8))
        for lo in range(0, nbytes, chunk):
            yield lo, tmp[:min(chunk, nbytes - lo)]
