"""Transports, rails and routes: which transport carries traffic to each PE.

:class:`TransportRoutes` is the part of :class:`~vkshmem.core.runtime.Runtime` (its
``routing``) that maps same-node peers' segments for the core's ``shm`` path, opens the
transports of every rail (``VKSHMEM_TRANSPORTS``, ``VKSHMEM_RAIL<n>``), registers the runtime's
segments with them, all-gathers their addresses and remote keys, connects them and picks one
route per peer (the ``shm`` path for same-node peers while ``VKSHMEM_SHM=1``), plus the stripes
of large transfers over several rails.
"""

from __future__ import annotations

import json
import logging
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .._native import lib
from ..config import RailSpec
from ..errors import ConfigError, TransportError
from ..fdshare import exchange_fds
from .contract import PeerInfo, Transport, TransportContext, TransportSpec
from .shm import ShmTransport

if TYPE_CHECKING:
    from ..basics import RuntimeBasics
    from ..heap import HostSegment

__all__ = ["Rail", "Route", "TransportRoutes"]

log = logging.getLogger("vkshmem")


@dataclass
class Route:
    """How traffic to one PE travels."""

    pe: int
    transport: Transport
    name: str
    rail: int | None  # None for the shm path
    stripes: list[Transport] = field(default_factory=list)  # >1: large transfers split


@dataclass
class Rail:
    index: int
    spec: RailSpec | None  # None: automatic choice among candidates
    transports: list[Transport] = field(default_factory=list)



class TransportRoutes:
    """The transports, rails and per-peer routes of a :class:`~vkshmem.core.runtime.Runtime`
    (its ``routing``): built empty, then :meth:`open` ed (collective) once the runtime's
    segments exist. ``liveness_words``: the address of the liveness channel's words
    (transports that watch them; 0: none)."""

    def __init__(self, owner: RuntimeBasics, liveness_words: int = 0) -> None:
        self.config = owner.config
        self.registry = owner.registry
        self.bootstrap = owner.bootstrap
        self.my_pe = owner.my_pe
        self.n_pes = owner.n_pes
        self.node_ids = owner.node_ids
        self.node_pes = owner.node_pes
        self.pids = owner.pids
        self.liveness_words = liveness_words
        #: the core's same-node path (its mappings come with :meth:`open`)
        self.shm = ShmTransport(self.my_pe)
        #: every open transport, of every rail
        self.transports: list[Transport] = []
        self.rails: list[Rail] = []
        #: per PE, how traffic to it travels; its transport (set by :meth:`open`)
        self.routes: list[Route] = []
        self.route_transport: list[Transport] = []
        #: per PE, the transports a large transfer is split over (None: no striping)
        self.stripes: list[list[Transport] | None] = []
        self.stripe_threshold = self.config.stripe_threshold
        self.segments: dict[int, HostSegment] = {}

    def open(self, segments: dict[int, HostSegment]) -> None:
        """Collective: map same-node peers' ``segments`` (shm path, fd passing), open the
        rails' transports, register ``segments`` with them, exchange, connect, route."""
        cfg = self.config
        self.segments = segments
        for seg in segments.values():
            self.shm.register(seg.info())
        if cfg.shm:
            peers = [pe for pe in self.node_pes if pe != self.my_pe]
            segs = list(segments.values())
            got = exchange_fds(self.my_pe, {pe: self.pids[pe] for pe in peers},
                               [s.fd for s in segs], self.bootstrap.allgather,
                               self.bootstrap.barrier, cfg.bootstrap_timeout)
            for pe, fds in got.items():
                for seg, fd in zip(segs, fds, strict=True):
                    self.shm.attach(pe, seg.seg_id, fd, seg.size)
        self._open_rails()
        self._route()

    def close_transports(self) -> None:
        """Close every open transport (keeps closing after a failure, which it logs)."""
        for t in self.transports:
            try:
                t.close()
            except Exception as exc:  # keep releasing the rest
                log.warning("closing transport %s: %s", t.spec.name, exc)

    def _candidates(self) -> list[TransportSpec]:
        specs = self.registry.transports
        if self.config.transports:
            missing = [n for n in self.config.transports if n not in specs]
            if missing:
                raise ConfigError("VKSHMEM_TRANSPORTS",
                                  f"no installed plugin provides {', '.join(missing)} "
                                  f"(installed: {', '.join(sorted(specs)) or 'none'})")
            return [specs[n] for n in self.config.transports]
        return sorted(specs.values(), key=lambda s: -s.priority)

    def _context(self, rail: int, options: dict[str, str]) -> TransportContext:
        return TransportContext(
            my_pe=self.my_pe, n_pes=self.n_pes, rail=rail, options=options,
            node_id=self.node_ids[self.my_pe], host_address=self.bootstrap.host_address(),
            amo_function=int(lib.vk_amo_address()),
            secret=self.bootstrap.secret,
            liveness_words=self.liveness_words,
            shm=self.config.shm,
        )

    def _open(self, spec: TransportSpec, rail: int, options: dict[str, str],
              named: bool) -> Transport | None:
        try:
            t = spec.factory(self._context(rail, options))
        except Exception as exc:
            where = f"VKSHMEM_RAIL{rail}" if self.config.rails else "VKSHMEM_TRANSPORTS"
            msg = f"cannot open transport {spec.name!r} on rail {rail}: {exc}"
            if named:
                raise TransportError(spec.name, f"{msg} (named by {where})") from exc
            warnings.warn(msg + "; skipped", RuntimeWarning, stacklevel=2)
            return None
        self.transports.append(t)
        return t

    def _open_rails(self) -> None:
        cfg = self.config
        specs = self.registry.transports
        candidates = self._candidates()  # validates VKSHMEM_TRANSPORTS
        for rs in cfg.rails:
            if rs.transport not in specs:
                raise ConfigError(f"VKSHMEM_RAIL{rs.index}",
                                  f"no installed plugin provides transport {rs.transport!r} "
                                  f"(installed: {', '.join(sorted(specs)) or 'none'})")
            if cfg.transports and rs.transport not in cfg.transports:
                raise ConfigError(f"VKSHMEM_RAIL{rs.index}",
                                  f"{rs.transport!r} is not in VKSHMEM_TRANSPORTS")
        needed = not cfg.shm or len(self.node_pes) < self.n_pes
        if not needed:
            return  # every peer is reached by the shm path (decided alike on every PE)
        if cfg.rails:
            for rs in cfg.rails:
                rail = Rail(rs.index, rs)
                t = self._open(specs[rs.transport], rs.index, dict(rs.options), named=True)
                rail.transports.append(t)  # type: ignore[arg-type]
                self.rails.append(rail)
        else:
            rail = Rail(0, None)
            named = bool(cfg.transports)
            for spec in candidates:
                if not named and spec.available is not None and not spec.available():
                    continue  # e.g. no RDMA device here: not a candidate, and no warning
                t = self._open(spec, 0, {}, named)
                if t is not None:
                    rail.transports.append(t)
            self.rails.append(rail)

    def _route(self) -> None:
        """Exchange transport addresses and keys; choose one transport per peer."""
        mine: dict[str, dict[str, str]] = {}
        for t in self.transports:
            rkeys = {str(s.seg_id): t.register(s.info()).hex() for s in self.segments.values()}
            key = f"{t.spec.name}@{self.rail_of(t)}"
            mine[key] = {"addr": t.address().hex(), **{f"rkey{k}": v for k, v in rkeys.items()}}
        blobs = self.bootstrap.allgather(json.dumps(mine).encode())
        tables = [json.loads(b) for b in blobs]
        self._tables = tables
        self._later_rkeys: dict[tuple[str, int], dict[int, bytes]] = {}
        my_node = self.node_ids[self.my_pe]
        self.routes = []
        for t in self.transports:
            key = f"{t.spec.name}@{self.rail_of(t)}"
            t.connect({pe: self._peer(pe, tables[pe].get(key), my_node)
                       for pe in range(self.n_pes)})
        for pe in range(self.n_pes):
            same = self.node_ids[pe] == my_node
            if self.config.shm and same:
                self.routes.append(Route(pe, self.shm, "shm", None))
                continue
            rail = self.rails[pe % len(self.rails)]
            chosen = None
            for t in rail.transports:
                key = f"{t.spec.name}@{rail.index}"
                if t.reaches(self._peer(pe, tables[pe].get(key), my_node)):
                    chosen = t
                    break
            if chosen is None:
                tried = ", ".join(t.spec.name for t in rail.transports) or "none opened"
                raise TransportError(
                    "-", f"no transport on rail {rail.index} reaches PE {pe} "
                    f"(node {self.node_ids[pe]}; tried: {tried}). Check VKSHMEM_TRANSPORTS / "
                    f"VKSHMEM_RAIL{rail.index}, or VKSHMEM_SHM=1 for same-node peers")
            self.routes.append(Route(pe, chosen, chosen.spec.name, rail.index,
                                     self._stripes(pe, tables, my_node)))
        self.route_transport = [r.transport for r in self.routes]
        self.stripes = [r.stripes if len(r.stripes) > 1 else None for r in self.routes]
        log.info("PE %d routes: %s", self.my_pe,
                 ", ".join(f"{r.pe}:{r.name}" for r in self.routes))

    def _stripes(self, pe: int, tables: list[dict], my_node: str) -> list[Transport]:
        """One transport per configured rail that reaches ``pe`` (striping needs 2 or more)."""
        if len(self.rails) < 2:
            return []
        out = []
        for rail in self.rails:
            for t in rail.transports:
                if t.reaches(self._peer(pe, tables[pe].get(f"{t.spec.name}@{rail.index}"),
                                        my_node)):
                    out.append(t)
                    break
        return out

    def rail_of(self, t: Transport) -> int:
        """The rail index of transport ``t`` (-1 if it is on none)."""
        for rail in self.rails:
            if any(x is t for x in rail.transports):
                return rail.index
        return -1

    def peer_info(self, pe: int, t: Transport, rkeys: dict[int, bytes]) -> PeerInfo:
        """``pe`` as transport ``t`` knows it, with the keys of the segments registered at
        start-up plus ``rkeys`` (for ``connect`` again after a domain registered its
        segment: a transport may replace what it knew of ``pe``)."""
        key = f"{t.spec.name}@{self.rail_of(t)}"
        info = self._peer(pe, self._tables[pe].get(key), self.node_ids[self.my_pe])
        later = self._later_rkeys.setdefault((key, pe), {})
        later.update(rkeys)
        return PeerInfo(info.pe, info.node_id, info.same_node, info.address,
                        {**info.rkeys, **later})

    def _peer(self, pe: int, entry: dict[str, str] | None, my_node: str) -> PeerInfo:
        rkeys = {}
        if entry:
            rkeys = {int(k[4:]): bytes.fromhex(v) for k, v in entry.items()
                     if k.startswith("rkey")}
        return PeerInfo(pe=pe, node_id=self.node_ids[pe],
                        same_node=self.node_ids[pe] == my_node,
                        address=bytes.fromhex(entry["addr"]) if entry else None, rkeys=rkeys)

    def striped_put(self, pe: int, seg: int, offset: int, src: memoryview) -> None:
        """Put ``src`` split over every rail reaching ``pe``; returns remotely complete."""
        self._striped(pe, seg, offset, src, put=True)

    def striped_get(self, pe: int, seg: int, offset: int, dst: memoryview) -> None:
        """Get into ``dst`` split over every rail reaching ``pe``."""
        self._striped(pe, seg, offset, dst, put=False)

    def _striped(self, pe: int, seg: int, offset: int, buf: memoryview, put: bool) -> None:
        rails = self.stripes[pe]
        assert rails is not None
        n = buf.nbytes
        k = len(rails)
        share = -(-n // k)
        step = -(-share // 64) * 64  # pieces of about n/k bytes, 64-byte aligned
        used = []
        for i, t in enumerate(rails):
            lo = i * step
            if lo >= n:
                break
            piece = buf[lo:min(n, lo + step)]
            if put:
                t.put_nbi(pe, seg, offset + lo, piece)
            else:
                t.get_nbi(pe, seg, offset + lo, piece)
            used.append(t)
        for t in used:
            t.quiet()
