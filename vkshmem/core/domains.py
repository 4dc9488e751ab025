"""The memory domains of a :class:`~vkshmem.core.runtime.Runtime`: what ``domain=`` names, and
the heaps of the domains opened so far (collectively, on first use).

Segments: 0 is the host heap, 1 the internal area, then one per installed domain plugin in name
order (``domain_specs``); ``seg_heaps`` maps a segment to its open
:class:`~vkshmem.core.domainheap.DomainHeap`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._native import ffi, lib
from .domain import DomainSpec
from .domainheap import DomainHeap
from .errors import FeatureNotAvailableError, InvalidArgumentError
from .teams import INTERNAL_SEG

if TYPE_CHECKING:
    from .bootstrap.base import Bootstrap
    from .config import Config

__all__ = ["FIRST_DOMAIN_SEG", "MemoryDomains"]

#: the segment of the first domain plugin (0 is the host heap, then the internal area)
FIRST_DOMAIN_SEG = INTERNAL_SEG + 1


class MemoryDomains:
    """Part of the runtime (kept in its own file; the attributes below are set by it)."""

    config: Config
    bootstrap: Bootstrap
    my_pe: int
    domain_specs: list[DomainSpec]
    seg_heaps: list[DomainHeap | None]
    heaps: dict[str, DomainHeap]
    domain_heaps: dict[object, DomainHeap]
    _resolved: dict[str, str]

    def resolve_domain(self, name: str) -> str:
        """The domain ``name`` means: ``'host'``, or an installed domain's name. ``'gpu'`` is
        the highest-priority installed domain of the gpu family; ``'auto'`` is that domain when
        every PE has a real accelerator for it (not a CPU emulation such as lavapipe), else
        ``'host'`` (collective the first time ``'auto'`` is asked)."""
        if name == "host":
            return name
        got = self._resolved.get(name)
        if got is not None:
            return got
        specs = {s.name: s for s in self.domain_specs}
        if name in specs:
            return name
        gpus = sorted((s for s in self.domain_specs if s.family == "gpu"),
                      key=lambda s: (-s.priority, s.name))
        installed = ", ".join(["host", *specs]) + (", gpu, auto" if gpus else ", auto")
        if name == "gpu":
            if not gpus:
                raise FeatureNotAvailableError(
                    "domain='gpu': no GPU memory domain is installed or allowed (install "
                    "vkshmem[gpu] for the Vulkan domain; see VKSHMEM_PLUGINS_ALLOW/DENY)")
            got = gpus[0].name
        elif name == "auto":
            spec = gpus[0] if gpus else None
            ok = spec is not None and spec.accelerator is not None \
                and spec.accelerator(self.config)
            votes = self.bootstrap.allgather(b"1" if ok else b"0")
            got = spec.name if spec and all(v == b"1" for v in votes) else "host"
        else:
            raise InvalidArgumentError(f"unknown memory domain {name!r}: use one of {installed}")
        self._resolved[name] = got
        return got

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
            index = [s.name for s in self.domain_specs].index(real)
            seg = FIRST_DOMAIN_SEG + index
            heap = DomainHeap(self, self.domain_specs[index], seg)
            self.seg_heaps[seg] = heap
            self.heaps[real] = heap
            self.domain_heaps[heap.domain] = heap
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
