"""The bounce path of the Vulkan domain's CUDA links (:mod:`.link`), for a
peer heap that this GPU cannot map: a Vulkan heap (``VKSHMEM_GPU_CUDA_HEAP=0``), or GPUs
without peer access to each other's memory.

A process may hold a context on the peer's GPU and import the peer's heap *there* (the opaque
fd the core passes), and a CUDA VMM allocation maps on both GPUs. So the link moves host bytes
by one copy in the peer GPU's context (the core's host heap is pinned for every context) and
device bytes in pieces through a bounce buffer mapped on both GPUs (``VKSHMEM_GPU_LINK_PIECE``;
four pieces in flight): for a put this GPU's copy engine copies a piece across the link into a
slot on the peer's GPU and the peer GPU's copies it into the heap, events ordering the two
streams; a get runs the other way, through a slot on this PE's GPU (both directions write
across the link). The whole copy is one C call with the GIL released (``csrc/cudalink.c``).
A :class:`RemoteGpu` (its context, stream, events and bounce buffers) is made per other GPU at
a link's first use and released at close; each bounce holds four of the largest pieces (128 MiB
on each GPU per linked GPU by default), a context costs the peer's GPU a few hundred MiB more.
Measured on 2 x H100 (``benchmarks/multi_gpu.py``): 221 / 316 / 357 GB/s put at 16 / 64 / 256
MiB, against 38 through the domain proxy.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from ..vmm import map_handle

if TYPE_CHECKING:
    from .hub import LinkHub

__all__ = ["PIECE_MAX", "PIECE_MIN", "SLOTS", "RemoteGpu", "piece_size"]

SLOTS = 4  #: pieces in flight
PIECE_MIN, PIECE_MAX = 2 << 20, 32 << 20


def piece_size(configured: int, nbytes: int) -> int:
    """The piece of a device copy of ``nbytes``: ``configured`` (at least 4 KiB), else a
    quarter of the copy in 2 MiB steps, 2-32 MiB (2 x H200, 256 MiB put / get: 32 MiB pieces
    358 / 347 GB/s, 16 MiB 349 / 336, 64 MiB 361 / 348; 64 MiB: 16 MiB pieces 321 / 306,
    32 MiB 320 / 309, 64 MiB 298 / 294)."""
    if configured:
        return max(4096, configured)
    quarter = -(-nbytes // SLOTS)
    return max(PIECE_MIN, min(PIECE_MAX, -(-quarter // PIECE_MIN) * PIECE_MIN))


class RemoteGpu:
    """This process's hold on another GPU of the node: its primary context, a stream, events,
    and two bounce buffers mapped on both GPUs (made at first use): one on that GPU, which
    puts fill across the link, one on this PE's GPU, which gets fill (a copy engine writing
    across NVLink moves ~5 % more than one reading across it)."""

    def __init__(self, hub: LinkHub, ordinal: int) -> None:
        self.hub = hub
        cu = self.cu = hub.cu
        self.ordinal = ordinal
        self.lock = threading.Lock()  # host copies on its stream, one at a time
        self._dev = hub.check(cu.cuDeviceGet(ordinal), "cuDeviceGet")
        self.ctx = hub.check(cu.cuDevicePrimaryCtxRetain(self._dev), "cuDevicePrimaryCtxRetain")
        self.ctx_ptr = int(self.ctx)
        with hub.on(self.ctx):
            self.stream = hub.check(
                cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate")
            self.events = hub.events(SLOTS)  # of this context
        self.stream_ptr = int(self.stream)
        #: the bounce buffers by the GPU they live on: (address, handle, size)
        self._bounces: dict[int, tuple[int, Any, int]] = {}

    def bounce_address(self, on: int) -> int:
        """The bounce buffer on GPU ``on`` (this one or the PE's own): SLOTS of the largest
        piece, mapped on both GPUs."""
        got = self._bounces.get(on)
        if got is None:
            ctx = self.ctx if on == self.ordinal else self.hub.view.context
            with self.hub.on(ctx):
                got = self._bounces[on] = self._make_bounce(on)
        return got[0]

    def _make_bounce(self, on: int) -> tuple[int, Any, int]:
        cu, check = self.cu, self.hub.check
        prop = cu.CUmemAllocationProp()
        prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        prop.location.id = on
        gran = int(check(cu.cuMemGetAllocationGranularity(
            prop, cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM),
            "cuMemGetAllocationGranularity"))
        size = -(-SLOTS * max(PIECE_MAX, self.hub.piece) // gran) * gran
        handle = check(cu.cuMemCreate(size, prop, 0),
                       f"cuMemCreate({size}) on GPU {on} (a CUDA link's bounce buffer: four "
                       "pieces of VKSHMEM_GPU_LINK_PIECE, or of 32 MiB)")
        try:
            va = map_handle(cu, handle, size, (self.hub.ordinal, self.ordinal), check)
        except BaseException:
            cu.cuMemRelease(handle)
            raise
        return va, handle, size

    def close(self) -> None:
        cu = self.cu
        with self.hub.on(self.ctx):
            for va, handle, size in self._bounces.values():
                cu.cuMemUnmap(va, size)
                cu.cuMemAddressFree(va, size)
                cu.cuMemRelease(handle)
            self._bounces.clear()
            for ev in self.events[1]:
                cu.cuEventDestroy(ev)
            cu.cuStreamDestroy(self.stream)
        cu.cuDevicePrimaryCtxRelease(self._dev)
