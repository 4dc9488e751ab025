"""The runtime of one PE: bootstrap, heap, transports, routes, barrier, collective allocation.

:func:`start` builds the process-wide :class:`Runtime` (collective over the job); the public
API (:mod:`vkshmem.shmem`) reads :data:`current`. Start-up order:

1. config and plugins; bootstrap; all-gather of node identity, heap size and pid;
2. host heap segment; shm mappings of same-node peers (fd passing);
3. transports for the rails (only if some peer needs one), registration, all-gather of their
   addresses and remote keys, connect, and one route per peer;
4. the internal symmetric area (barrier counters, allocation check slots); a barrier.
"""

from __future__ import annotations

import atexit
import ctypes
import json
import logging
import os
import secrets
import socket
import struct
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ._native import lib
from .bootstrap.base import Bootstrap
from .bootstrap.select import open_bootstrap
from .config import Config, RailSpec
from .config import load as load_config
from .errors import ConfigError, InvalidArgumentError, TransportError, VkshmemError
from .fdshare import exchange_fds
from .heap import Allocator, HostSegment
from .plugins import Registry, load_plugins
from .shm import ShmTransport
from .teams import INTERNAL_SEG, TeamState
from .transport import PeerInfo, Transport, TransportContext, TransportSpec
from .wait import Waiter

__all__ = ["HOST_SEG", "Route", "Runtime", "current", "start", "stop"]

log = logging.getLogger("vkshmem")

HOST_SEG = 0
_N_SEGS = 3  # 0 host heap, 1 the GPU heap (vkshmem.gpu.domain), 2 internal (team slots)
_CHECK = struct.Struct("<QQQQ")  # seq, kind+nbytes, align, offset

current: Runtime | None = None


@dataclass
class Route:
    """How traffic to one PE travels."""

    pe: int
    transport: Transport
    name: str
    rail: int | None  # None for the shm path
    stripes: list[Transport] = field(default_factory=list)  # >1: large transfers split


@dataclass
class _Rail:
    index: int
    spec: RailSpec | None  # None: automatic choice among candidates
    transports: list[Transport] = field(default_factory=list)


def _node_id() -> str:
    """Host identity: hostname, boot id and network namespace (netns "hosts" differ)."""
    parts = [socket.gethostname()]
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            parts.append(f.read().strip()[:8])
        parts.append(str(os.stat("/proc/self/ns/net").st_ino))
    except OSError:
        pass
    return ":".join(parts)


class Runtime:
    """Everything one PE holds while vkshmem is initialised."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.closed = False
        self.failed = False
        logging.getLogger("vkshmem").setLevel(config.log_level.upper())
        self.registry: Registry = load_plugins(config)
        self.bootstrap: Bootstrap = open_bootstrap(config, self.registry.bootstraps, os.environ)
        self.my_pe = self.bootstrap.rank
        self.n_pes = self.bootstrap.size
        self.transports: list[Transport] = []
        self.rails: list[_Rail] = []
        self.gpu: Any = None  # the GPU domain (vkshmem.gpu.domain.GpuDomain), made on demand
        self._auto_domain: str | None = None
        try:
            self._start()
        except BaseException:
            self._teardown()
            raise

    # -- start-up ----------------------------------------------------------------------------

    def _start(self) -> None:
        cfg = self.config
        me = {"node": _node_id(), "heap": cfg.symmetric_size, "pid": os.getpid(),
              "token": secrets.token_hex(8)}
        infos = [json.loads(b) for b in self.bootstrap.allgather(json.dumps(me).encode())]
        sizes = {i["heap"] for i in infos}
        if len(sizes) > 1:
            raise ConfigError("VKSHMEM_SYMMETRIC_SIZE",
                              f"PEs disagree on the heap size ({sorted(sizes)}); set the same "
                              "value for every PE")
        self.token = infos[0]["token"]
        self.node_ids = [i["node"] for i in infos]
        my_node = self.node_ids[self.my_pe]
        self.node_pes = [pe for pe, n in enumerate(self.node_ids) if n == my_node]
        self.local_rank = self.node_pes.index(self.my_pe)

        if lib.vk_table_init(self.n_pes, _N_SEGS) != 0:
            raise MemoryError("cannot allocate the peer table")
        self.host = HostSegment(HOST_SEG, cfg.symmetric_size, f"vkshmem-heap-pe{self.my_pe}",
                                cfg.host_pin)
        self.teams_max = cfg.teams_max
        self.slot_bytes = cfg.team_scratch
        self.internal = HostSegment(INTERNAL_SEG, self.teams_max * self.slot_bytes,
                                    f"vkshmem-internal-pe{self.my_pe}", cfg.host_pin)
        self.segments = {HOST_SEG: self.host, INTERNAL_SEG: self.internal}
        for seg in self.segments.values():
            lib.vk_set_local(seg.seg_id, seg.address, seg.size)
        self.heap = Allocator(self.host.size, "host", "VKSHMEM_SYMMETRIC_SIZE")

        self.shm = ShmTransport(self.my_pe)
        for seg in self.segments.values():
            self.shm.register(seg.info())
        if cfg.shm:
            peers = [pe for pe in self.node_pes if pe != self.my_pe]
            segs = list(self.segments.values())
            got = exchange_fds(self.token, self.my_pe, peers, [s.fd for s in segs],
                               self.bootstrap.barrier, cfg.bootstrap_timeout)
            for pe, fds in got.items():
                for seg, fd in zip(segs, fds, strict=True):
                    self.shm.attach(pe, seg.seg_id, fd, seg.size)

        self._open_rails()
        self._route()
        self.waiter = Waiter(cfg.wait_timeout, self.transports)
        # TEAM_WORLD and TEAM_SHARED own slots 0 and 1 on every PE.
        self.free_slots = ((1 << self.teams_max) - 1) & ~0b11
        self.world = TeamState(self, range(self.n_pes), 0, None)
        self.shared = TeamState(self, self.node_pes, 1, self.world)
        self.world.reset_slot()
        self.shared.reset_slot()
        self._alloc_seq = 0
        self._check_buf = bytearray(_CHECK.size)
        self.bootstrap.barrier()

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
                rail = _Rail(rs.index, rs)
                t = self._open(specs[rs.transport], rs.index, dict(rs.options), named=True)
                rail.transports.append(t)  # type: ignore[arg-type]
                self.rails.append(rail)
        else:
            rail = _Rail(0, None)
            named = bool(cfg.transports)
            for spec in candidates:
                t = self._open(spec, 0, {}, named)
                if t is not None:
                    rail.transports.append(t)
            self.rails.append(rail)

    def _route(self) -> None:
        """Exchange transport addresses and keys; choose one transport per peer."""
        mine: dict[str, dict[str, str]] = {}
        for t in self.transports:
            rkeys = {str(s.seg_id): t.register(s.info()).hex() for s in self.segments.values()}
            key = f"{t.spec.name}@{self._rail_of(t)}"
            mine[key] = {"addr": t.address().hex(), **{f"rkey{k}": v for k, v in rkeys.items()}}
        blobs = self.bootstrap.allgather(json.dumps(mine).encode())
        tables = [json.loads(b) for b in blobs]
        my_node = self.node_ids[self.my_pe]
        self.routes: list[Route] = []
        for t in self.transports:
            key = f"{t.spec.name}@{self._rail_of(t)}"
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
        #: per PE, the transports a large transfer is split over (None: no striping)
        self.stripes = [r.stripes if len(r.stripes) > 1 else None for r in self.routes]
        self.stripe_threshold = self.config.stripe_threshold
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

    def _rail_of(self, t: Transport) -> int:
        for rail in self.rails:
            if any(x is t for x in rail.transports):
                return rail.index
        return -1

    def _peer(self, pe: int, entry: dict[str, str] | None, my_node: str) -> PeerInfo:
        rkeys = {}
        if entry:
            rkeys = {int(k[4:]): bytes.fromhex(v) for k, v in entry.items()
                     if k.startswith("rkey")}
        return PeerInfo(pe=pe, node_id=self.node_ids[pe],
                        same_node=self.node_ids[pe] == my_node,
                        address=bytes.fromhex(entry["addr"]) if entry else None, rkeys=rkeys)

    # -- ordering and synchronisation ---------------------------------------------------------

    def quiet(self) -> None:
        """Remote completion of every operation this PE issued, on every transport."""
        lib.vk_fence()
        for t in self.transports:
            t.quiet()

    def fence(self) -> None:
        """Order earlier operations to each PE before later ones (quiet where an operation to
        a PE may have taken another rail, or the transport has no native fence)."""
        lib.vk_fence()
        several = len(self.rails) > 1
        for t in self.transports:
            if t.spec.native_fence and not several:
                t.fence()
            else:
                t.quiet()

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

    def sync_all(self) -> None:
        """Collective: barrier over every PE (does not complete earlier puts)."""
        self.world.sync()

    def barrier_all(self) -> None:
        """Collective: quiet, then sync_all (then GPU validation errors, once every PE is
        past the barrier, so raising on one PE leaves none of the others waiting)."""
        self.quiet()
        self.sync_all()
        if self.gpu is not None:
            self.gpu.check_validation()

    # -- the GPU domain ---------------------------------------------------------------------

    def gpu_domain(self) -> Any:
        """Collective the first time: the GPU domain (segment 1), opened on first use."""
        if self.gpu is None:
            from ..gpu.domain import GpuDomain
            self.gpu = GpuDomain(self)
        return self.gpu

    def auto_domain(self) -> str:
        """Collective the first time: what ``domain='auto'`` means in this job — ``'gpu'`` when
        every PE's Vulkan device is a GPU (not a CPU driver such as lavapipe), else ``'host'``."""
        if self._auto_domain is None:
            if self.gpu is not None:
                ok = not self.gpu.device.info.is_cpu
            else:
                try:
                    from ..gpu.instance import list_devices
                    devices = list_devices()
                    pick = self.config.gpu_device
                    ok = any(not d.is_cpu for d in devices) if pick is None else (
                        pick < len(devices) and not devices[pick].is_cpu)
                except Exception as exc:  # no loader, driver or binding: host memory
                    log.info("domain='auto': no Vulkan GPU (%s)", exc)
                    ok = False
            votes = self.bootstrap.allgather(b"1" if ok else b"0")
            self._auto_domain = "gpu" if all(v == b"1" for v in votes) else "host"
        return self._auto_domain

    # -- collective allocation ----------------------------------------------------------------

    def alloc(self, nbytes: int, align: int, clear: bool,
              fill: Callable[[memoryview], None] | None = None) -> int:
        """Collective: allocate ``nbytes`` on the host heap. It is zero-filled when ``clear``,
        or handed to ``fill``, before the closing barrier, so peers never see it unready."""
        off = self.heap.alloc(nbytes, align)
        if clear:
            ctypes.memset(self.host.address + off, 0, self.heap.block_size(off))
        elif fill is not None:
            fill(self.host.buffer[off:off + nbytes])
        self._collective_check(1, nbytes, align, off)
        return off

    def peer_buffer(self, pe: int, seg: int) -> Any:
        """Memory of ``pe``'s segment ``seg`` mapped here, if loads/stores reach it (the shm
        path is on and ``pe`` is on this node), else None."""
        if self.route_transport[pe] is not self.shm:
            return None
        if pe == self.my_pe:
            return self.segments[seg].buffer
        return self.shm.peer_buffer(pe, seg)

    def free(self, off: int) -> None:
        """Collective: release the allocation at ``off`` after every PE arrived."""
        if off not in self.heap.used:
            raise InvalidArgumentError(
                f"free: offset {off} is not the start of a live symmetric allocation (double "
                "free, or a slice instead of the allocated array?)")
        self.quiet()
        self._collective_check(2, self.heap.block_size(off), 0, off)
        self.heap.free(off)

    def realloc(self, off: int, nbytes: int, align: int) -> int:
        """Collective: resize the allocation at ``off``; contents kept up to the smaller size."""
        self.quiet()
        self.sync_all()  # nobody may still be writing the old block
        old = self.heap.block_size(off)
        if self.heap.can_grow(off, nbytes) and off % max(align, 1) == 0:
            self.heap.resize(off, nbytes)
            new = off
        else:
            new = self.heap.alloc(nbytes, align)
            n = min(old, nbytes)
            self.host.buffer[new:new + n] = self.host.buffer[off:off + n]
            self.heap.free(off)
        self._collective_check(3, nbytes, align, new)
        return new

    def _collective_check(self, kind: int, nbytes: int, align: int, off: int) -> None:
        """Barrier that also proves every PE made the same allocation call (cheaply: each PE
        compares its call with its right neighbour's, so any difference is seen somewhere)."""
        self._alloc_seq += 1
        seq = self._alloc_seq
        slot = self.world.check_offset + (seq % 2) * _CHECK.size
        record = (seq, (kind << 56) | nbytes, align, off)
        _CHECK.pack_into(self.internal.buffer, slot, *record)
        self.sync_all()
        if self.n_pes == 1:
            return
        right = (self.my_pe + 1) % self.n_pes
        view = memoryview(self._check_buf)
        self.route_transport[right].get(right, INTERNAL_SEG, slot, view)
        theirs = _CHECK.unpack(self._check_buf)
        if theirs != record:
            names = {1: "alloc", 2: "free", 3: "realloc", 4: "gpu alloc", 5: "gpu free"}

            def say(r: tuple[int, ...]) -> str:
                return (f"call #{r[0]} = {names.get(r[1] >> 56, '?')}({r[1] & (2**56 - 1)} "
                        f"bytes, align {r[2]}) at offset {r[3]}")

            raise InvalidArgumentError(
                f"symmetric allocation mismatch: PE {self.my_pe} made {say(record)} but PE "
                f"{right} made {say(theirs)}; every PE must make the same collective "
                "allocation calls in the same order")

    # -- shutdown ---------------------------------------------------------------------------

    def close(self) -> None:
        """Collective (unless this PE failed): quiet, barrier, release everything."""
        if self.closed:
            return
        try:
            if not self.failed:
                self.quiet()
                self.sync_all()
                self.bootstrap.barrier()
        finally:
            error = self._teardown()
        if error is not None and not self.failed:
            raise error

    def _teardown(self) -> BaseException | None:
        """Release everything; returns the GPU domain's closing error (validation errors)."""
        self.closed = True
        error = None
        gpu = getattr(self, "gpu", None)
        if gpu is not None:  # no more serving; the proxy's endpoints go with the transports
            error = gpu.stop_threads()
            if error is not None:
                log.error("PE %d: GPU-initiated requests failed: %s", self.my_pe, error)
        for t in getattr(self, "transports", []):
            try:
                t.close()
            except Exception as exc:  # keep releasing the rest
                log.warning("closing transport %s: %s", t.spec.name, exc)
        if gpu is not None:
            try:
                gpu.close()
            except Exception as exc:
                log.error("PE %d closing the GPU domain: %s", self.my_pe, exc)
                error = error or exc
        if hasattr(self, "shm"):
            self.shm.close()
        for seg in getattr(self, "segments", {}).values():
            seg.close()
        self.bootstrap.close()
        return error


def start(config: Config | None = None) -> Runtime:
    """Collective: initialise this PE (idempotent: returns the running runtime)."""
    global current
    if current is not None and not current.closed:
        return current
    rt = Runtime(config or load_config())
    current = rt
    _install_failure_hook(rt)
    atexit.register(stop)
    return rt


def stop() -> None:
    """Collective: finalise this PE (idempotent)."""
    global current
    rt, current = current, None
    if rt is not None:
        rt.close()


def _install_failure_hook(rt: Runtime) -> None:
    """An uncaught exception marks this PE failed (finalize then skips its barriers) and is
    reported to the launcher so it can name the PE and the error when it ends the job."""
    previous = sys.excepthook

    def hook(etype: type[BaseException], value: BaseException, tb: object) -> None:
        rt.failed = True
        previous(etype, value, tb)  # type: ignore[arg-type]  # first: mpi's report aborts
        try:
            rt.bootstrap.report_failure(f"{etype.__name__}: {value}")
        except Exception:
            pass

    sys.excepthook = hook


def require() -> Runtime:
    """The running runtime, or a clear error if vkshmem is not initialised."""
    rt = current
    if rt is None:
        raise VkshmemError("vkshmem is not initialised: call shmem.init() first "
                           "(or set VKSHMEM_AUTO_INIT=1)")
    return rt

