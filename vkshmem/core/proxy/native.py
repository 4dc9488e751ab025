"""The domain proxy's native rounds: the serving thread's work in C.

Where the memory domain offers its operations in C (:meth:`MemoryDomain.native_ops
<vkshmem.core.domains.contract.MemoryDomain.native_ops>`: the Vulkan domain on NVIDIA through CUDA
or on
a CPU driver through its mapping, the ``cuda`` domain), one call into the core's helper
(``vk_proxy_serve`` in ``csrc/proxy_round.c``, GIL released) finds the requests due, starts
their copies, waits once and answers every one: by stores into the sender's mailbox where the
shm path maps it here, else through the serving thread's endpoint of the sender's transport
where that has a data path in C (:meth:`Transport.native_ops
<vkshmem.core.transports.contract.Transport.native_ops>`: hostproxy, UCX, OFI). A round with any
request
it cannot serve (a sender reached through a transport without one, an AMO the domain does not
offer in C) is left to the Python round (:mod:`vkshmem.core.proxy.serve`), which sees the
same list of requests. ``VKSHMEM_GPU_NATIVE=0`` turns the native rounds off with the rest of
the native GPU path.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import numpy as np

from .._native import ffi, lib
from ..hostalloc import HOST_SEG

if TYPE_CHECKING:
    from ..transports.endpoints import Endpoints
    from .protocol import DomainProxy

__all__ = ["DomainOps", "NativeRounds"]

log = logging.getLogger("vkshmem")


class DomainOps:
    """The domain's operations in C on this PE's segment (``struct vk_domain_ops``, filled once
    by :meth:`MemoryDomain.native_ops <vkshmem.core.domains.contract.MemoryDomain.native_ops>`),
    shared by the serving thread's native rounds and the sending side, which reads device
    pieces through the CPU mapping they describe (``mapped``, up to ``read_max`` bytes) instead
    of staging them by a device copy where the domain says the CPU reads it at memory speed."""

    def __init__(self, proxy: DomainProxy) -> None:
        self.ops = ffi.new("struct vk_domain_ops *")
        self.offered = False
        #: the segment through the CPU mapping, and the largest read through it (0: none)
        self.view: memoryview | None = None
        self.read_max = 0
        if not proxy.rt.config.gpu_native:
            return
        try:
            self.offered = bool(proxy.heap.domain.native_ops(
                int(ffi.cast("uintptr_t", self.ops))))
        except Exception as exc:  # e.g. the AMO kernel does not compile: the Python rounds
            log.info("PE %d: the %s proxy serves in Python: %s", proxy.me, proxy.heap.name, exc)
            return
        ops = self.ops
        if self.offered and ops.mapped != ffi.NULL and ops.read_max and ops.size:
            self.view = memoryview(ffi.buffer(ops.mapped, ops.size)).cast("B")
            self.read_max = int(ops.read_max)

    def readable(self, offset: int, nbytes: int) -> memoryview | None:
        """The CPU's view of ``nbytes`` of the segment at ``offset`` where reads through the
        mapping take that size (else None: a device copy stages them)."""
        if self.view is None or nbytes > self.read_max or offset + nbytes > self.view.nbytes:
            return None
        return self.view[offset:offset + nbytes]


class NativeRounds:
    """The state of ``vk_proxy_serve`` for one proxy (``struct vk_proxy`` and the buffers it
    points to), sharing the Python round's sequence numbers and list of requests due."""

    def __init__(self, proxy: DomainProxy, eps: Endpoints, nxt: np.ndarray,
                 due: np.ndarray) -> None:
        lay, n, depth = proxy.layout, proxy.n, proxy.depth
        peers, routes = [0] * n, [0] * n
        for s in range(n):
            if s == proxy.me:
                continue
            if proxy.rt.peer_buffer(s, HOST_SEG) is not None:
                peers[s] = int(lib.vk_peer_base(HOST_SEG, s)) + proxy.base
            else:
                routes[s] = eps[s].native_ops()
        self._ops = proxy.dops.ops
        p = self._p = ffi.new("struct vk_proxy *")
        self._keep = [ffi.new("uint64_t[]", 4 * n * depth), ffi.new("uint64_t[]", 3 * n * depth),
                      ffi.new("uint8_t *[]", [ffi.cast("uint8_t *", a) for a in peers]),
                      ffi.new("struct vk_native_ops *[]",
                              [ffi.cast("struct vk_native_ops *", a) for a in routes]),
                      ffi.new("uint8_t[]", [int(b is not None) for b in proxy.direct]),
                      ffi.from_buffer(nxt), ffi.from_buffer(due)]
        p.answer, p.ranges, p.peer, p.route, p.direct = self._keep[:5]
        p.next = ffi.cast("uint64_t *", self._keep[5])
        p.due = ffi.cast("uint64_t *", self._keep[6])
        p.bells = ffi.cast("uint64_t *", proxy.address)
        p.dom = self._ops
        p.base = proxy.base
        p.answers, p.blocks, p.area, p.chunk = lay.answers, lay.blocks, lay.area, proxy.chunk
        p.n, p.depth, p.me = n, depth, proxy.me
        #: whether any sender can be served here at all
        self.useful = any(peers) or any(routes)
        self._name, self._me = proxy.heap.name, proxy.me
        #: rounds, direct pieces, mapped sends already counted in the proxy's stats
        self._seen = (0, 0, 0)

    @classmethod
    def make(cls, proxy: DomainProxy, eps: Endpoints, nxt: np.ndarray,
             due: np.ndarray) -> NativeRounds | None:
        """The native rounds of ``proxy`` (answering through the serving thread's endpoints
        ``eps``), or None where no sender's mailbox is mapped here and no transport reaches
        one in C, the domain offers no C operations, or ``VKSHMEM_GPU_NATIVE=0``."""
        if not proxy.dops.offered:
            return None
        rounds = cls(proxy, eps, nxt, due)
        return rounds if rounds.useful else None

    def serve(self, spin_ns: int) -> int:
        """One round: the number of requests served here (0: none due within ``spin_ns``), or
        minus the number due that the Python round must serve (listed in ``due``)."""
        return int(lib.vk_proxy_serve(self._p, spin_ns))

    def count(self, stats: dict[str, Any]) -> None:
        """Add the rounds served here since the last call to the proxy's counters."""
        p = self._p
        seen = (int(p.rounds), int(p.direct_pieces), int(p.mapped_sends))
        for key, now, before in zip(("rounds", "direct", "mapped"), seen, self._seen,
                                    strict=True):
            stats[key] += now - before
        stats["max_round"] = max(stats["max_round"], int(p.max_round))
        self._seen = seen
        if p.answer_errors:  # that sender times out, naming this PE
            log.error("%s proxy of PE %d: %d answers could not be sent", self._name, self._me,
                      int(p.answer_errors))
            p.answer_errors = 0
