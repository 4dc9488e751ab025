"""The runtime of one PE: bootstrap, heap, transports, routes, barrier, collective allocation.

:func:`start` builds the process-wide :class:`Runtime` (collective over the job); the public
API (:mod:`vkshmem.shmem`) reads :data:`current`. Start-up order:

1. config and plugins; bootstrap; all-gather of node identity, heap size and pid; the
   liveness channel (:mod:`vkshmem.core.liveness.channel`: failure detection);
2. host heap segment; shm mappings of same-node peers (fd passing);
3. transports for the rails (only if some peer needs one), registration, all-gather of their
   addresses and remote keys, connect, and one route per peer;
4. the internal symmetric area (barrier counters, allocation check slots); a barrier.

Segments: 0 is the host heap, 1 the internal area, then one per installed memory domain
(plugins of ``vkshmem.domains``, in name order); a domain's segment is made when the domain is
first used (:meth:`MemoryDomains.domain <vkshmem.core.domains.registry.MemoryDomains.domain>`,
collective), never at start-up.

The runtime is composed of parts, each a plain class given what it reads of the runtime
(:class:`~vkshmem.core.basics.RuntimeBasics` and the like, small protocols): ``routing``
(:class:`~vkshmem.core.transports.rails.TransportRoutes`: the shm path, transports, rails,
per-PE routes, stripes), ``domains`` (:class:`~vkshmem.core.domains.registry.MemoryDomains`:
the installed domains and their open heaps) and ``host``
(:class:`~vkshmem.core.hostalloc.HostHeap`: the host heap segment, its allocator and collective
allocation). Who this PE is, ordering and synchronisation, and the teams stay the runtime's.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import socket
import sys
from typing import Any

from ._native import lib
from .bootstrap.base import Bootstrap
from .bootstrap.select import open_bootstrap
from .config import Config
from .config import load as load_config
from .domains.contract import DomainSpec
from .domains.heap import DomainHeap
from .domains.registry import MemoryDomains
from .errors import (
    BootstrapError,
    ConfigError,
    VkshmemError,
)
from .fast import configure as configure_fast
from .fast import reset as reset_fast
from .fast import set_world as set_fast_world
from .heap import HostSegment
from .hostalloc import HOST_SEG, HostHeap
from .liveness.channel import open_liveness
from .plugins.loader import Registry, load_plugins
from .teams import INTERNAL_SEG, TeamState
from .transports.rails import Route, TransportRoutes
from .wait import Waiter

__all__ = ["HOST_SEG", "Route", "Runtime", "current", "start", "stop"]

log = logging.getLogger("vkshmem")


current: Runtime | None = None
#: seconds a failing PE whose failure report ends the job at once (mpi) first leaves the
#: others to raise PeerFailedError themselves
_NOTICE = 1.0
_hook_installed = False


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


#: what each PE's start-up blob holds: its keys and their types
_INFO_FIELDS: dict[str, type] = {"node": str, "heap": int, "pid": int, "domains": list}


def _read_info(pe: int, blob: bytes) -> dict[str, Any]:
    """PE ``pe``'s all-gathered start-up blob, checked: a JSON object with every field of
    :data:`_INFO_FIELDS` of its type (BootstrapError naming the PE and what is wrong)."""
    def bad(what: str) -> BootstrapError:
        return BootstrapError(f"PE {pe} sent a malformed start-up record ({what}); does every "
                              "PE run the same version of vkshmem?")

    try:
        info = json.loads(blob)
    except (ValueError, TypeError) as exc:  # not UTF-8, not JSON
        raise bad(f"not JSON: {exc}") from None
    if not isinstance(info, dict):
        raise bad(f"a JSON {type(info).__name__}, not an object")
    for key, kind in _INFO_FIELDS.items():
        if key not in info:
            raise bad(f"no {key!r}")
        value = info[key]
        if not isinstance(value, kind) or isinstance(value, bool):
            raise bad(f"{key!r} is a {type(value).__name__}, not a {kind.__name__}")
    if info["pid"] <= 0:
        raise bad(f"'pid' is {info['pid']}")
    if info["heap"] < 0:
        raise bad(f"'heap' is {info['heap']}")
    if not all(isinstance(d, str) for d in info["domains"]):
        raise bad("'domains' is not a list of names")
    return info


class Runtime:
    """Everything one PE holds while vkshmem is initialised: who it is in the job, its parts
    (``routing``: :class:`~vkshmem.core.transports.rails.TransportRoutes`; ``domains``:
    :class:`~vkshmem.core.domains.registry.MemoryDomains`; ``host``:
    :class:`~vkshmem.core.hostalloc.HostHeap`), the internal area, the teams and the waiter."""

    routing: TransportRoutes
    host: HostHeap

    def __init__(self, config: Config) -> None:
        self.config = config
        self.closed = False
        self.failed = False
        logging.getLogger("vkshmem").setLevel(config.log_level.upper())
        self.registry: Registry = load_plugins(config)
        self.bootstrap: Bootstrap = open_bootstrap(config, self.registry.bootstraps, os.environ)
        self.my_pe = self.bootstrap.rank
        self.n_pes = self.bootstrap.size
        self.domains = MemoryDomains(self, self._open_domain_heap)
        self.segments: dict[int, HostSegment] = {}
        try:
            self._start()
        except BaseException:
            self._teardown()
            raise

    # -- start-up ----------------------------------------------------------------------------

    def _start(self) -> None:
        cfg = self.config
        me = {"node": _node_id(), "heap": cfg.symmetric_size, "pid": os.getpid(),
              "domains": [d.name for d in self.domains.specs]}
        infos = [_read_info(pe, blob) for pe, blob in
                 enumerate(self.bootstrap.allgather(json.dumps(me).encode()))]
        sizes = {i["heap"] for i in infos}
        if len(sizes) > 1:
            raise ConfigError("VKSHMEM_SYMMETRIC_SIZE",
                              f"PEs disagree on the heap size ({sorted(sizes)}); set the same "
                              "value for every PE")
        for pe, i in enumerate(infos):
            if i["domains"] != me["domains"]:
                raise ConfigError("VKSHMEM_PLUGINS_ALLOW",
                                  f"PE {pe} has the memory domains {i['domains']}, PE "
                                  f"{self.my_pe} has {me['domains']}: install the same domain "
                                  "plugins for every PE (or filter them alike with "
                                  "VKSHMEM_PLUGINS_ALLOW/VKSHMEM_PLUGINS_DENY)")
        #: each PE's process id (fd passing admits only these processes)
        self.pids: list[int] = [i["pid"] for i in infos]
        self.node_ids = [i["node"] for i in infos]
        my_node = self.node_ids[self.my_pe]
        self.node_pes = [pe for pe, n in enumerate(self.node_ids) if n == my_node]
        self.local_rank = self.node_pes.index(self.my_pe)
        self.liveness = open_liveness(self.bootstrap, self.node_ids, cfg.failure_timeout,
                                      cfg.bootstrap_timeout)

        if lib.vk_table_init(self.n_pes, len(self.domains.seg_heaps)) != 0:
            raise MemoryError("cannot allocate the peer table")
        host = HostSegment(HOST_SEG, cfg.symmetric_size, f"vkshmem-heap-pe{self.my_pe}",
                           cfg.host_pin)
        self.segments[HOST_SEG] = host
        self.teams_max = cfg.teams_max
        self.slot_bytes = cfg.team_scratch
        self.internal = HostSegment(INTERNAL_SEG, self.teams_max * self.slot_bytes,
                                    f"vkshmem-internal-pe{self.my_pe}", cfg.host_pin)
        self.segments[INTERNAL_SEG] = self.internal
        for seg in self.segments.values():
            lib.vk_set_local(seg.seg_id, seg.address, seg.size)
        self.host = HostHeap(self, host)

        self.routing = TransportRoutes(self, self.liveness.address)
        self.routing.open(self.segments)
        self.waiter = Waiter(cfg.wait_timeout, self.routing.transports, self.liveness)
        if not cfg.check_collectives:  # the compiled collectives would skip the check
            configure_fast(self)  # before the teams: their native parts belong to it
        # TEAM_WORLD and TEAM_SHARED own slots 0 and 1 on every PE.
        self.free_slots = ((1 << self.teams_max) - 1) & ~0b11
        self.world = TeamState(self, range(self.n_pes), 0, None)
        # TEAM_SHARED: the PEs whose memory ptr() reaches (OpenSHMEM's definition): the
        # node's PEs on the shm path, only this PE without it
        self.shared = TeamState(self, self.node_pes if cfg.shm else [self.my_pe], 1,
                                self.world)
        set_fast_world(self)
        self.world.reset_slot()
        self.shared.reset_slot()
        self.bootstrap.barrier()

    def _open_domain_heap(self, spec: DomainSpec, seg: int) -> DomainHeap:
        """Collective: open domain ``spec``'s heap on segment ``seg`` (for ``domains``)."""
        return DomainHeap(self, spec, seg)

    # -- ordering and synchronisation ---------------------------------------------------------

    def quiet(self) -> None:
        """Remote completion of every operation this PE issued, on every transport and in
        every open memory domain (its batched non-blocking operations)."""
        lib.vk_fence()
        for t in self.routing.transports:
            t.quiet()
        for heap in self.domains.nbi_heaps:
            heap.quiet()

    def fence(self) -> None:
        """Order earlier operations to each PE before later ones (quiet where an operation to
        a PE may have taken another rail, or the transport has no native fence)."""
        lib.vk_fence()
        routing = self.routing
        several = len(routing.rails) > 1
        for t in routing.transports:
            if t.spec.native_fence and not several:
                t.fence()
            else:
                t.quiet()
        for heap in self.domains.nbi_heaps:
            heap.fence()

    def sync_all(self) -> None:
        """Collective: barrier over every PE (does not complete earlier puts)."""
        self.world.sync()

    def barrier_all(self) -> None:
        """Collective: quiet, then sync_all (then GPU validation errors, once every PE is
        past the barrier, so raising on one PE leaves none of the others waiting)."""
        self.quiet()
        self.sync_all()
        for heap in self.domains.seg_heaps:
            if heap is not None:
                heap.domain.check_errors()

    def peer_buffer(self, pe: int, seg: int) -> Any:
        """Memory of ``pe``'s segment ``seg`` mapped here, if loads/stores reach it (this PE,
        or a PE of this node while the shm path is on), else None."""
        routing = self.routing
        if routing.route_transport[pe] is not routing.shm and pe != self.my_pe:
            return None  # this PE's own memory is always reachable (shmem_ptr)
        heap = self.domains.seg_heaps[seg]
        if heap is not None:  # a domain's segment, imported here or not
            mem = heap.direct[pe]
            return None if mem is None else heap.domain.host_view(mem)
        if pe == self.my_pe:
            return self.segments[seg].buffer
        return routing.shm.peer_buffer(pe, seg)

    # -- shutdown ---------------------------------------------------------------------------

    def close(self) -> None:
        """Collective (unless this PE or another failed): quiet, barrier, release
        everything."""
        if self.closed:
            return
        try:
            lv = getattr(self, "liveness", None)
            if not self.failed and not (lv is not None and lv.any):
                self.quiet()
                self.sync_all()
                self.bootstrap.barrier()
        finally:
            error = self._teardown()
        if error is not None and not self.failed:
            raise error

    def _teardown(self) -> BaseException | None:
        """Release everything; returns the first closing error of a domain (e.g. a failed
        device-initiated request, validation errors)."""
        self.closed = True
        reset_fast()  # every fast path takes its Python path, which sees no runtime
        lv = getattr(self, "liveness", None)
        if lv is not None:  # first: a clean goodbye, before this PE stops serving peers
            lv.close(clean=not self.failed and not lv.any)
        error = None
        heaps = self.domains.open_heaps()
        for heap in heaps:  # no more serving; the proxies' endpoints go with the transports
            failure = heap.stop_threads()
            if failure is not None:
                log.error("PE %d: the %s domain failed: %s", self.my_pe, heap.name, failure)
                error = error or failure
        routing = getattr(self, "routing", None)
        if routing is not None:
            routing.close_transports()
        for heap in heaps:
            try:
                heap.close()
            except Exception as exc:
                log.error("PE %d closing the %s domain: %s", self.my_pe, heap.name, exc)
                error = error or exc
        if routing is not None:
            routing.shm.close()
        for seg in self.segments.values():
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
    global _hook_installed
    if not _hook_installed:  # once per process: a re-initialised runtime reuses it
        _install_failure_hook()
        atexit.register(stop)
        _hook_installed = True
    return rt


def stop() -> None:
    """Collective: finalise this PE (idempotent)."""
    global current
    rt, current = current, None
    if rt is not None:
        rt.close()


def _install_failure_hook() -> None:
    """An uncaught exception marks the running runtime failed (finalize then skips its
    barriers) and is reported to the launcher so it can name the PE and the error when it ends
    the job."""
    previous = sys.excepthook

    def hook(etype: type[BaseException], value: BaseException, tb: object) -> None:
        rt = current
        if rt is not None:
            rt.failed = True
        previous(etype, value, tb)  # type: ignore[arg-type]  # first: mpi's report aborts
        if rt is None:
            return
        # The other PEs' blocking calls raise PeerFailedError naming this PE; a launcher that
        # watches the job hears first, so it names this PE (not the first to notice) as the
        # cause; a report that ends the job at once (mpi) comes after a notice period.
        lv = getattr(rt, "liveness", None)
        text = f"{etype.__name__}: {value}"
        if lv is not None and rt.bootstrap.ends_job_on_failure:
            lv.report("raised " + text, linger=_NOTICE)
        try:
            rt.bootstrap.report_failure(text)
        except Exception:
            pass
        if lv is not None:
            lv.report("raised " + text)

    sys.excepthook = hook


def require() -> Runtime:
    """The running runtime, or a clear error if vkshmem is not initialised."""
    rt = current
    if rt is None:
        raise VkshmemError("vkshmem is not initialised: call shmem.init() first "
                           "(or set VKSHMEM_AUTO_INIT=1)")
    return rt

