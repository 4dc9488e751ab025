"""A memory domain opened in a job: its segment, its allocator and its route to every peer.

:class:`DomainHeap` wraps a plugin's :class:`~vkshmem.core.domains.contract.MemoryDomain` (the
runtime's ``domains`` makes one, collectively, on the domain's first use:
:meth:`MemoryDomains.domain <vkshmem.core.domains.registry.MemoryDomains.domain>`). Start-up:

1. the factory creates this PE's segment; every PE all-gathers ``export().meta`` and the
   segment size (which must agree);
2. same-node peers of one ``group`` (e.g. the same GPU) with the shm path on pass their fds
   over Unix sockets and ``import_peer`` each other's segments: operations on them are the
   domain's local copies and atomics on the very same memory (route ``direct``); peers of
   one ``link_group`` but another group get a :class:`~vkshmem.core.domains.contract.DomainLink`
   instead (route ``link+proxy``: puts and gets through it, AMOs through the proxy; route
   ``link`` where it carries AMOs too), see
   :mod:`~vkshmem.core.domains.peers`;
3. for any other peer, a transport of the peer's route that carries puts and gets on the
   segment's memory kind (:meth:`Transport.carries`) registers the segment and carries them
   (route: the transport's name; :mod:`~vkshmem.core.domains.carriers`); where it does
   not carry AMOs on that kind (e.g. UCX on CUDA memory), the peer's AMOs go through the
   proxy (route ``<transport>+proxy``), after a quiet of that transport so that they still
   follow this PE's earlier puts to the peer;
4. every other peer is reached through the :class:`~vkshmem.core.proxy.protocol.DomainProxy`
   (route ``proxy``): started on every PE if any PE needs it.

To the API it looks like a transport for its segment (``put/get/amo`` by ``(pe, offset)``),
plus device-side sources and destinations (its ``transfers``:
:class:`~vkshmem.core.domains.xfer.DeviceTransfers`, ``put_device``/``get_device``).
Operations on direct and proxy routes complete before they return; those on transports
complete at ``quiet`` like host operations.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from .._native import lib
from ..errors import ConfigError, InvalidArgumentError, WaitTimeoutError
from ..heap import Allocator
from ..transports.contract import AmoOp, SegmentInfo
from .carriers import carriers
from .contract import DomainContext, DomainLink, DomainSpec, MemoryDomain
from .peers import import_peers
from .xfer import DeviceTransfers

if TYPE_CHECKING:
    from ..proxy.protocol import DomainProxy
    from ..runtime import Runtime

__all__ = ["SCRATCH_BYTES", "DomainHeap"]

#: seconds a wait on memory the CPU cannot watch reads back to back before it sleeps
_POLL_SPIN = 0.002

log = logging.getLogger("vkshmem")

#: scratch of the collectives on a domain's memory, per team slot
SCRATCH_BYTES = 256 << 10
#: Bytes of every domain heap reserved for kernels' cross-PE synchronisation (the device
#: barrier's generation and round counters: 64 words; vkshmem.glsl's vks_barrier_all).
DEVICE_SYNC_BYTES = 512


class DomainHeap:
    """One domain's symmetric heap on this PE and its routes (collective to make)."""

    def __init__(self, rt: Runtime, spec: DomainSpec, seg_id: int) -> None:
        self.rt = rt
        self.spec = spec
        self.name = spec.name
        self.seg_id = seg_id
        self.my_pe = rt.my_pe
        self.closed = False
        self.proxy: DomainProxy | None = None
        self.peers: dict[int, Any] = {}
        self.info: SegmentInfo | None = None
        cfg = rt.config
        #: device-side sources and destinations of puts and gets
        self.transfers = DeviceTransfers(self, cfg.gpu_proxy_chunk or 4 << 20)
        ctx = DomainContext(my_pe=rt.my_pe, n_pes=rt.n_pes, local_rank=rt.local_rank,
                            node_id=rt.node_ids[rt.my_pe], seg_id=seg_id, config=cfg,
                            allgather=rt.bootstrap.allgather, barrier=rt.bootstrap.barrier,
                            amo_function=int(lib.vk_amo_address()),
                            host_heap=rt.host.segment.info(), runtime=rt)
        self.domain: MemoryDomain = spec.factory(ctx)
        try:
            self._start()
        except BaseException:
            try:
                self.close()
            except Exception as exc:  # the start-up error is the one to report
                log.warning("PE %d: closing the %s domain after a failed start: %s",
                            self.my_pe, self.name, exc)
            raise

    # -- start-up ------------------------------------------------------------------------------

    def _start(self) -> None:
        rt, dom = self.rt, self.domain
        self.size = size = dom.size
        self.local = dom.local
        self.heap = Allocator(size, self.name,
                              self.spec.size_variable or f"the {self.name} domain's heap size")
        # Collective scratch, one slot per team slot: the first allocation of a fresh
        # allocator, so the same offset on every PE.
        self.scratch_bytes = SCRATCH_BYTES
        if rt.teams_max * SCRATCH_BYTES * 2 > size:
            raise ConfigError("VKSHMEM_TEAMS_MAX",
                              f"the {self.name} heap of {size} bytes cannot hold the "
                              f"collectives' scratch ({rt.teams_max} teams x {SCRATCH_BYTES} "
                              "bytes) and leave as much again for arrays; raise the domain's "
                              "heap size or lower VKSHMEM_TEAMS_MAX")
        self.scratch_off = self.heap.alloc(rt.teams_max * SCRATCH_BYTES)
        #: words kernels synchronise on across PEs (device-side barrier counters): the same
        #: offset on every PE, zeroed before any PE can signal into it (the barrier below)
        self.device_sync_off = self.heap.alloc(DEVICE_SYNC_BYTES)
        dom.zero(self.device_sync_off, DEVICE_SYNC_BYTES)
        export = dom.export()
        me = {"size": size, "group": export.group, "link": export.link_group,
              "meta": export.meta.hex()}
        infos = [json.loads(b) for b in rt.bootstrap.allgather(json.dumps(me).encode())]
        sizes = {i["size"] for i in infos}
        if len(sizes) > 1:
            raise ConfigError(self.name, f"PEs disagree on the {self.name} heap size "
                              f"({sorted(sizes)}); give every PE the same value")
        self._import(infos, export.fds)
        self.info = dom.describe()
        assert self.info is not None
        #: per PE, the transport carrying this domain (its puts and gets) to it, or None; and
        #: the transport carrying its AMOs to it, or None (direct, link, proxy)
        self.carrier, self.amo_carrier = carriers(rt, self.name, self.seg_id, self.info,
                                                  self.direct, self.links)
        self.route_names = [self._route_name(pe) for pe in range(rt.n_pes)]
        #: every PE's routes (row: that PE's view), so decisions that must agree can
        views = rt.bootstrap.allgather(",".join(self.route_names).encode())
        self.all_routes = [v.decode().split(",") for v in views]
        self._maps_all: dict[tuple[int, ...], bool] = {}
        if any(r == "proxy" or r.endswith("+proxy") for row in self.all_routes for r in row):
            from ..proxy.protocol import DomainProxy
            self.proxy = DomainProxy(self)
        rt.bootstrap.barrier()
        log.info("PE %d domain %s (segment %d): %d bytes; routes %s", self.my_pe, self.name,
                 self.seg_id, size, ", ".join(f"{pe}:{r}" for pe, r in
                                              enumerate(self.route_names)))

    def _import(self, infos: list[dict[str, Any]], fds: list[int]) -> None:
        """Same-node peers import or link each other's segments (:mod:`.peers`)."""
        self.peers, links = import_peers(self.rt, self.domain, self.name, self.seg_id, infos,
                                         fds)
        self.peers[self.my_pe] = self.local
        n = self.rt.n_pes
        #: per PE, its segment imported here, or None
        self.direct: list[Any] = [self.peers.get(pe) for pe in range(n)]
        #: per PE, the domain's link to its segment, or None
        self.links: list[DomainLink | None] = [links.get(pe) for pe in range(n)]

    def _route_name(self, pe: int) -> str:
        if self.direct[pe] is not None:
            return "direct"
        if (link := self.links[pe]) is not None:
            return "link" if link.amos else "link+proxy"
        carrier = self.carrier[pe]
        if carrier is None:
            return "proxy"
        return carrier.spec.name + ("" if self.amo_carrier[pe] is carrier else "+proxy")

    # -- the transport-shaped interface ----------------------------------------------------------

    def put(self, pe: int, seg: int, offset: int, src: memoryview) -> None:
        """Host bytes into ``pe``'s segment."""
        mem = self.direct[pe]
        if mem is not None:
            self.domain.write(mem, offset, src)
        elif (link := self.links[pe]) is not None:
            link.put(offset, src)
        elif (t := self.carrier[pe]) is not None:
            t.put(pe, self.seg_id, offset, src)
        else:
            self._proxy().put(pe, offset, src)

    def put_nbi(self, pe: int, seg: int, offset: int, src: memoryview) -> None:
        """Start a put of host bytes (batched by the domain where it can; :meth:`quiet`)."""
        mem = self.direct[pe]
        if mem is not None:
            self.domain.write_nbi(mem, offset, src)
        else:
            self.put(pe, seg, offset, src)

    def get(self, pe: int, seg: int, offset: int, dst: memoryview) -> None:
        """``pe``'s segment into host bytes."""
        mem = self.direct[pe]
        if mem is not None:
            self.domain.read(mem, offset, dst)
        elif (link := self.links[pe]) is not None:
            link.get(offset, dst)
        elif (t := self.carrier[pe]) is not None:
            t.get(pe, self.seg_id, offset, dst)
        else:
            self._proxy().get(pe, offset, dst)

    def get_nbi(self, pe: int, seg: int, offset: int, dst: memoryview) -> None:
        """Start a get into host bytes (filled by :meth:`quiet` where the domain batches)."""
        mem = self.direct[pe]
        if mem is not None:
            self.domain.read_nbi(mem, offset, dst)
        else:
            self.get(pe, seg, offset, dst)

    def amo(self, pe: int, seg: int, offset: int, op: AmoOp, width: int, operand: int,
            compare: int, fetch: bool = True) -> int:
        """An AMO on ``pe``'s word (atomic with the device's atomics on it)."""
        mem = self.direct[pe]
        if mem is not None:
            return self.amo_on(mem, offset, op, width, operand, compare)
        if (link := self.links[pe]) is not None and link.amos:
            self._check_amo(offset, width)
            return link.amo(offset, op, width, operand, compare)
        if (t := self.amo_carrier[pe]) is not None:
            return t.amo(pe, self.seg_id, offset, op, width, operand, compare, fetch)
        if (t := self.carrier[pe]) is not None:
            t.quiet()  # its puts to pe land before the proxy applies the AMO
        return self._proxy().amo(pe, offset, op, width, operand, compare)

    def amo_on(self, mem: Any, offset: int, op: AmoOp, width: int, operand: int,
               compare: int) -> int:
        """An AMO on memory handle ``mem`` (checked: aligned 4- or 8-byte word in range)."""
        self._check_amo(offset, width)
        return self.domain.amo(mem, offset, op, width, operand, compare)

    def _check_amo(self, offset: int, width: int) -> None:
        if offset < 0 or offset + width > self.size:
            self.domain.check_range(offset, width, f"{self.name} AMO")
        if width not in (4, 8) or offset % width:
            raise InvalidArgumentError(f"AMOs take aligned 4- or 8-byte words; got {width} "
                                       f"bytes at offset {offset}")

    def quiet(self) -> None:
        """Complete the domain's batched non-blocking operations and the proxy's transfers
        in flight (transports are quieted by the runtime)."""
        if self.proxy is not None:
            self.proxy.quiet()
        self.domain.quiet()

    def fence(self) -> None:
        """Order by completing them (a later operation may take another path, the CPU's
        stores through a mapping among them)."""
        self.quiet()

    def _proxy(self) -> DomainProxy:
        if self.proxy is None:  # pragma: no cover - routes are proxy only with a proxy
            raise InvalidArgumentError(f"no proxy: this peer's {self.name} heap is unreachable")
        return self.proxy

    # -- this PE's memory -----------------------------------------------------------------------

    def write_local(self, offset: int, src: memoryview) -> None:
        """Host bytes into this PE's segment."""
        self.domain.write(self.local, offset, src)

    def read_local(self, offset: int, dst: memoryview) -> None:
        """This PE's segment into host bytes."""
        self.domain.read(self.local, offset, dst)

    def copy_local(self, dst_off: int, src_off: int, nbytes: int) -> None:
        """Within this PE's segment."""
        self.domain.copy(self.local, dst_off, self.local, src_off, nbytes)

    def zero(self, offset: int, nbytes: int) -> None:
        """Zero ``nbytes`` of this PE's segment."""
        self.domain.check_range(offset, nbytes, "zero")
        self.domain.zero(offset, nbytes)

    def watch_address(self, offset: int) -> int:
        """See :meth:`MemoryDomain.watch_address`."""
        return self.domain.watch_address(offset)

    def wait(self, pred: Callable[[], object], offset: int, snapshot: memoryview,
             what: str) -> None:
        """Return once ``pred()`` is true, re-reading ``snapshot.nbytes`` bytes of this PE's
        segment at ``offset`` into ``snapshot`` (what ``pred`` looks at) between tries; honours
        ``VKSHMEM_WAIT_TIMEOUT``. Memory the CPU may watch is spun on natively instead.

        Reads back to back for the first ``_POLL_SPIN`` seconds (a peer's answer usually
        comes within µs: a sleep costs the scheduler's wake-up, 60-1000 µs), then sleeps
        between reads, 20 µs doubling to 1 ms."""
        n = snapshot.nbytes
        addr = self.watch_address(offset)
        if addr:
            self.rt.waiter.wait(pred, addr, n, what)
            return
        timeout = self.rt.config.wait_timeout
        now = time.monotonic()
        deadline = now + timeout if timeout else None
        spin_until = now + _POLL_SPIN
        pause = 0.0
        while True:
            self.read_local(offset, snapshot)
            if pred():
                return
            now = time.monotonic()
            if deadline is not None and now > deadline:
                raise WaitTimeoutError(f"{what} did not happen within {timeout:g} s "
                                       "(VKSHMEM_WAIT_TIMEOUT; 0 waits for ever)")
            if now > spin_until:
                pause = min(1e-3, pause * 2 or 20e-6)
                time.sleep(pause)

    def reduce(self, dst_off: int, src_off: int, count: int, op: str, dtype: np.dtype) -> bool:
        """See :meth:`MemoryDomain.reduce`."""
        return self.domain.reduce(dst_off, src_off, count, op, dtype)

    def maps_all(self, pes: Any) -> bool:
        """Whether every PE of ``pes`` maps the segments of all of them (routes ``direct``):
        the same answer on each of them. Kept per member list (the routes do not change)."""
        key = tuple(pes)
        found = self._maps_all.get(key)
        if found is None:
            found = self._maps_all[key] = all(self.all_routes[p][q] == "direct"
                                              for p in pes for q in pes)
        return found

    def reduce_from(self, dst_off: int, pes: Any, src_off: int, count: int, op: str,
                    dtype: np.dtype) -> None:
        """``dst[i] = op over pes' src[i]`` read where they are (see
        :meth:`MemoryDomain.reduce_from`); every PE of ``pes`` must be mapped here."""
        sources = [(self.local if pe == self.my_pe else self.direct[pe], src_off) for pe in pes]
        self.domain.reduce_from(dst_off, sources, count, op, dtype)

    # -- collective allocation -------------------------------------------------------------------

    def alloc(self, nbytes: int, align: int, clear: bool,
              fill: Callable[[int], None] | None = None) -> int:
        """Collective: ``nbytes`` of the heap, zeroed when ``clear`` or handed to ``fill``
        (called with the offset) before the closing barrier."""
        off = self.heap.alloc(nbytes, align)
        try:
            if clear:
                self.zero(off, self.heap.block_size(off))
            elif fill is not None:
                fill(off)
        except BaseException:
            self.heap.free(off)
            raise
        self.rt.host.collective_check("alloc", nbytes, align, off, self.seg_id)
        return off

    def free(self, off: int) -> None:
        """Collective: release the allocation at ``off``."""
        if off not in self.heap.used:
            raise InvalidArgumentError(
                f"free: {self.name} offset {off} is not the start of a live symmetric "
                "allocation (double free, or a slice instead of the allocated array?)")
        self.rt.quiet()
        self.rt.host.collective_check("free", self.heap.block_size(off), 0, off, self.seg_id)
        self.heap.free(off)

    # -- teardown -----------------------------------------------------------------------------

    def stop_threads(self) -> BaseException | None:
        """Stop serving: the domain's own threads first, then the proxy (peers' requests).
        Returns a failure the domain recorded, if any."""
        error = self.domain.stop_threads()
        if self.proxy is not None:
            self.proxy.stop()
        return error

    def close(self) -> None:
        """Stop the proxy, release imported segments and the domain (errors propagate)."""
        if self.closed:
            return
        self.closed = True
        failure = self.stop_threads()
        if self.proxy is not None:
            self.proxy.close()
        for link in getattr(self, "links", ()):
            if link is not None:
                link.close()
        self.links = []
        for pe, mem in list(self.peers.items()):
            if pe != self.my_pe:
                try:
                    self.domain.release_peer(mem)
                except BufferError as exc:
                    log.warning("PE %d: imported %s segment of PE %d still viewed: %s",
                                self.my_pe, self.name, pe, exc)
        self.peers.clear()
        self.info = None  # type: ignore[assignment]  # its buffer views the segment
        self.domain.close()
        if failure is not None:
            raise failure
