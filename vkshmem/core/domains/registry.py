"""The memory domains of a :class:`~vkshmem.core.runtime.Runtime` (its ``domains`` part): what
``domain=`` names, and the heaps of the domains opened so far (collectively, on first use).

Segments: 0 is the host heap, 1 the internal area, then one per installed domain plugin in name
order (``specs``); ``seg_heaps`` maps a segment to its open
:class:`~vkshmem.core.domains.heap.DomainHeap`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from .._native import ffi, lib
from ..errors import ConfigError, FeatureNotAvailableError, InvalidArgumentError
from ..teams import INTERNAL_SEG
from .contract import DomainArray, DomainSpec, MemoryDomain
from .heap import DomainHeap

if TYPE_CHECKING:
    from ..basics import RuntimeBasics

__all__ = ["FIRST_DOMAIN_SEG", "MemoryDomains"]

log = logging.getLogger("vkshmem")

#: the segment of the first domain plugin (0 is the host heap, then the internal area)
FIRST_DOMAIN_SEG = INTERNAL_SEG + 1


class MemoryDomains:
    """The installed memory domains of a runtime and the heaps opened so far (the runtime's
    ``domains``). ``open_heap(spec, seg)`` opens a domain's heap on segment ``seg``
    (collective: the runtime builds a :class:`~vkshmem.core.domains.heap.DomainHeap`)."""

    def __init__(self, owner: RuntimeBasics,
                 open_heap: Callable[[DomainSpec, int], DomainHeap]) -> None:
        self.config = owner.config
        self.bootstrap = owner.bootstrap
        self.my_pe = owner.my_pe
        self._open_heap = open_heap
        #: installed memory domains in segment order (segments 2, 3, ...)
        self.specs: list[DomainSpec] = sorted(owner.registry.domains.values(),
                                              key=lambda s: s.name)
        #: per segment id, the open domain heap (None: host, internal, or not opened yet)
        self.seg_heaps: list[DomainHeap | None] = [None] * (FIRST_DOMAIN_SEG + len(self.specs))
        #: the open heap of each name asked (a domain's name, ``'gpu'``, ``'auto'``)
        self.heaps: dict[str, DomainHeap] = {}
        #: the open heap of each open domain object (what a domain's array points to)
        self.domain_heaps: dict[object, DomainHeap] = {}
        #: open heaps whose domain has its own quiet (non-blocking operations to complete)
        self.nbi_heaps: list[DomainHeap] = []
        self._resolved: dict[str, str] = {}

    def open_heaps(self) -> list[DomainHeap]:
        """The open domain heaps, in segment order."""
        return [h for h in self.seg_heaps if h is not None]

    def heap_of_array(self, a: DomainArray, what: str) -> DomainHeap:
        """The open heap ``a`` belongs to, or an error when that heap is gone (an earlier
        ``init``)."""
        heap = self.domain_heaps.get(a.domain)
        if heap is None:
            raise InvalidArgumentError(f"{what}: this {type(a).__name__} belongs to a "
                                       f"{a.domain.spec.name} heap that was released "
                                       "(finalize); allocate it again")
        return heap

    def resolve_domain(self, name: str) -> str:
        """The domain ``name`` means: ``'host'``, or an installed domain's name. ``'gpu'`` is
        ``VKSHMEM_GPU_PROVIDER`` when set, else the highest-priority domain of the gpu family
        that can open on every PE (its ``available`` probe); ``'auto'`` is the highest-priority
        one whose ``accelerator`` probe is true on every PE (a real GPU, not a CPU emulation
        such as lavapipe), else ``'host'``. Collective the first time ``'gpu'`` or ``'auto'``
        is asked."""
        if name == "host":
            return name
        got = self._resolved.get(name)
        if got is not None:
            return got
        specs = {s.name: s for s in self.specs}
        if name in specs:
            return name
        gpus = sorted((s for s in self.specs if s.family == "gpu"),
                      key=lambda s: (-s.priority, s.name))
        if name not in ("gpu", "auto"):
            installed = ", ".join(["host", *specs, "gpu", "auto"])
            raise InvalidArgumentError(f"unknown memory domain {name!r}: use one of {installed}")
        provider = self.config.gpu_provider
        if provider != "auto":
            if provider not in (s.name for s in gpus):
                raise ConfigError("VKSHMEM_GPU_PROVIDER",
                                  f"{provider!r} is not an installed GPU memory domain "
                                  f"(installed: {', '.join(s.name for s in gpus) or 'none'})")
            gpus = [specs[provider]]
        probe = "accelerator" if name == "auto" else "available"
        mine = [self._probe(s, probe) for s in gpus]
        votes = [json.loads(b) for b in self.bootstrap.allgather(json.dumps(mine).encode())]
        usable = [s for i, s in enumerate(gpus) if all(v[i] for v in votes)]
        if usable:
            got = usable[0].name
        elif name == "auto":
            got = "host"
        else:
            raise FeatureNotAvailableError(
                "domain='gpu': no GPU memory domain can open on every PE (installed: "
                f"{', '.join(s.name for s in gpus) or 'none'}; install vkshmem[gpu] for the "
                "Vulkan domain; see VKSHMEM_GPU_PROVIDER and VKSHMEM_PLUGINS_ALLOW/DENY)")
        self._resolved[name] = got
        return got

    def _probe(self, spec: DomainSpec, which: str) -> bool:
        """A spec's ``available``/``accelerator`` probe on this PE (a probe that raises says
        no: a broken plugin must not take the job down)."""
        fn = getattr(spec, which)
        if fn is None:
            return which == "available"
        try:
            return bool(fn(self.config))
        except Exception as exc:
            log.info("domain %s: %s probe failed: %s", spec.name, which, exc)
            return False

    def domain(self, name: str) -> DomainHeap:
        """Collective the first time: the open heap of domain ``name`` (see
        :meth:`resolve_domain`; not ``'host'``)."""
        heap = self.heaps.get(name)
        if heap is not None:
            return heap
        real = self.resolve_domain(name)
        heap = self.heaps.get(real)
        if heap is None:
            if real == "host":
                raise InvalidArgumentError("the host heap is not a domain plugin")
            index = [s.name for s in self.specs].index(real)
            seg = FIRST_DOMAIN_SEG + index
            heap = self._open_heap(self.specs[index], seg)
            self.seg_heaps[seg] = heap
            self.heaps[real] = heap
            self.domain_heaps[heap.domain] = heap
            # it may batch *_nbi ops, or its proxy keep device transfers in flight
            if type(heap.domain).quiet is not MemoryDomain.quiet or heap.proxy is not None:
                self.nbi_heaps.append(heap)
            if heap.info is not None and heap.info.kind == "host" and heap.info.address:
                self._map_host_domain(heap)
        self.heaps[name] = heap
        return heap

    def _map_host_domain(self, heap: DomainHeap) -> None:
        """A domain of CPU-addressable memory joins the native address table, so numpy arrays
        over it take the host paths; imported peers' segments become shm peers."""
        info = heap.info
        assert info is not None
        lib.vk_set_local(info.seg_id, info.address, info.size)
        lib.vk_set_peer(info.seg_id, self.my_pe, info.address)
        for pe, mem in heap.peers.items():
            view = heap.domain.host_view(mem)
            if pe != self.my_pe and view is not None:
                cdata = ffi.from_buffer(view)
                lib.vk_set_peer(info.seg_id, pe, int(ffi.cast("uintptr_t", cdata)))
                ffi.release(cdata)

    def heap_of(self, seg: int) -> DomainHeap | None:
        """The open domain heap of segment ``seg`` (None for the host heap and internal area)."""
        return self.seg_heaps[seg]
