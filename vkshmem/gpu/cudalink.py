"""Links of the Vulkan domain to same-node peers on other GPUs, through CUDA (NVIDIA).

Vulkan memory cannot be imported on another GPU, and CUDA's import of it is not mapped for
peer GPUs either: copies between two GPUs' imported heaps are staged through the host (37.7
GB/s) and a kernel's stores into the other GPU's imported heap fault
(``tests/gpu/vulkan_cuda_peer_probe.py``). But a process may hold a context on the peer's
GPU and import the peer's heap *there* (the opaque fd the core passes, as for same-device
peers), and a CUDA VMM allocation maps on both GPUs. So a :class:`CudaLink`
(a :class:`~vkshmem.core.domain.DomainLink`, route ``link+proxy``) moves:

* host bytes: one copy in the peer GPU's context (``cuMemcpyHtoD``/``DtoH``; the core's host
  heap is pinned for every context);
* device bytes: in pieces through a bounce buffer mapped on both GPUs
  (``VKSHMEM_GPU_LINK_PIECE``; four pieces in flight): for a put this GPU's copy engine copies
  a piece across the link (NVLink where there is one) into a slot on the peer's GPU and the
  peer GPU's copies it into the heap, events ordering the two streams; a get runs the other
  way, through a slot on this PE's GPU (both directions write across the link). The whole
  copy is one C call with the GIL released (``csrc/cudalink.c``).

AMOs stay with the domain proxy (the peer's own AMO path, atomic with its shaders). Every
call is complete when it returns. Contexts on other GPUs, their streams, events and bounce
buffers are made at a link's first use (:class:`RemoteGpu`, one per GPU, shared by the links
to its PEs) and released at close; each bounce holds four of the largest pieces (128 MiB on
each GPU per linked GPU by default), a context costs the peer's GPU a few hundred MiB more. Measured
on 2 x H200 through the API (``benchmarks/multi_gpu.py``): 236 / 323 / 348 GB/s put at 16 /
64 / 256 MiB (with 16 MiB pieces at most; CUDA's own peer copy 326 / 375 / 391), against 38
GB/s through the domain proxy.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from vkshmem.core.domain import DomainLink

from . import _cuda
from .cudaheap import device_by_uuid, map_handle
from .errors import GpuError

if TYPE_CHECKING:
    from vkshmem.core.transport import AmoOp

    from .cudacopy import CudaCopier
    from .cudaview import CudaView

__all__ = ["CudaLink", "LinkHub", "RemoteGpu", "address_of", "piece_size"]

log = logging.getLogger("vkshmem")

SLOTS = 4  #: pieces in flight
PIECE_MIN, PIECE_MAX = 2 << 20, 32 << 20
_DISABLE_TIMING = 2  # CU_EVENT_DISABLE_TIMING


def address_of(buf: Any) -> int:
    """The address of a contiguous host buffer (read-only ones included)."""
    return int(np.frombuffer(buf, np.uint8).__array_interface__["data"][0])


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


class LinkHub:
    """The links of one Vulkan domain: this GPU's side (the heap as CUDA sees it, a stream and
    events of its own) and a :class:`RemoteGpu` per other GPU, made at first use."""

    def __init__(self, view: CudaView, piece: int, spin_ns: int) -> None:
        self.view = view
        self.cu = view.cu
        self.ordinal = view.ordinal
        self.piece = piece
        self.spin_ns = spin_ns
        self._lib = _cuda.lib
        if self._lib.vkc_load() != 0:
            raise GpuError("a CUDA link: could not load "
                           f"{_cuda.ffi.string(self._lib.vkc_missing()).decode()}")
        self._lock = threading.Lock()
        #: one device copy at a time (this side's stream and events are shared by the links)
        self.copy_lock = threading.Lock()
        self._remotes: dict[int, RemoteGpu] = {}
        cu = self.cu
        with self.on(view.context):
            self.stream = self.check(
                cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate")
            self.local_events = self.events(SLOTS)
        self.stream_ptr = int(self.stream)
        self.ctx_ptr = int(view.context)

    def check(self, res: Any, what: str) -> Any:
        return self.view.check(res, what, GpuError, "a CUDA link to another GPU")

    @contextlib.contextmanager
    def on(self, ctx: Any) -> Iterator[None]:
        """Make ``ctx`` current for the block, then the caller's context again (the
        application's CUDA libraries take the current context for their device)."""
        cu = self.cu
        prev = self.check(cu.cuCtxGetCurrent(), "cuCtxGetCurrent")
        self.check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        try:
            yield
        finally:
            cu.cuCtxSetCurrent(prev)

    def events(self, n: int) -> tuple[Any, list[Any]]:
        """``n`` events of the current context: (a C array of their handles, the handles)."""
        evs = [self.check(self.cu.cuEventCreate(_DISABLE_TIMING), "cuEventCreate")
               for _ in range(n)]
        return _cuda.ffi.new("uintptr_t[]", [int(e) for e in evs]), evs

    def ordinal_of(self, uuid_hex: str) -> int:
        """The CUDA device whose UUID the peer's Vulkan device has (its export group)."""
        found = device_by_uuid(self.cu, bytes.fromhex(uuid_hex), self.check)
        if found is None:
            raise GpuError(f"a CUDA link: no CUDA device has the peer's GPU UUID {uuid_hex}")
        return found[0]

    def remote(self, ordinal: int) -> RemoteGpu:
        with self._lock:
            got = self._remotes.get(ordinal)
            if got is None:
                got = self._remotes[ordinal] = RemoteGpu(self, ordinal)
            return got

    def done(self, res: int, what: str) -> None:
        if res:
            _e, name = self.cu.cuGetErrorName(self.cu.CUresult(res))
            raise GpuError(f"{what} through a CUDA link failed: "
                           f"{name.decode() if isinstance(name, bytes) else res} "
                           "(VKSHMEM_GPU_CUDA_LINK=0 sends puts and gets between GPUs through "
                           "the domain proxy)")

    def close(self) -> None:
        with self._lock:
            remotes, self._remotes = list(self._remotes.values()), {}
        for r in remotes:
            r.close()
        with self.on(self.view.context):
            for ev in self.local_events[1]:
                self.cu.cuEventDestroy(ev)
            self.cu.cuStreamDestroy(self.stream)


class CudaLink(DomainLink):
    """The link to one peer's heap on another GPU (see the module docstring), made at first
    use: a heap that is CUDA's (``vmm``) mapped on this GPU where it can be (then every copy is
    one, in this GPU's context: :attr:`direct`; and AMOs are the kernel of ``amo()``, the
    domain's CUDA copier, on the mapped word), else imported in that GPU's context. Owns
    ``fd`` from the start (closed on failure). Raises GpuError when CUDA fails."""

    def __init__(self, hub: LinkHub, fd: int, size: int, dedicated: bool, uuid_hex: str,
                 check_range: Any, vmm: bool = False,
                 amo: Callable[[], CudaCopier | None] | None = None) -> None:
        self.hub = hub
        self.size = size
        self._fd, self._dedicated, self._vmm = fd, dedicated, vmm
        try:
            self._ordinal = hub.ordinal_of(uuid_hex)
        except BaseException:
            os.close(fd)
            raise
        self._check_range = check_range
        self._remote: RemoteGpu | None = None
        self._ext: Any = None
        self._ptr = 0
        self._lock = threading.Lock()
        self.calls = 0  #: operations carried (tests read it)
        #: the peer's heap is mapped on this GPU: one copy per operation, no bounce
        self.direct = False
        self._copier: CudaCopier | None = None
        if vmm:
            try:
                with self._lock:
                    self._map_here()
                # AMOs by the CUDA kernel of this PE's heap on the mapped word (NVLink atomics)
                self._copier = amo() if self.direct and amo is not None else None
            except BaseException:
                self.close()  # the fd, or the mapping that took it
                raise
            self.amos = self._copier is not None

    def _peer(self) -> tuple[RemoteGpu | None, int]:
        if self._ptr:
            return self._remote, self._ptr
        with self._lock:
            if not self._ptr:
                if self._fd < 0:
                    raise GpuError("a CUDA link used after close")
                if self._vmm and self._map_here():
                    return None, self._ptr
                remote = self.hub.remote(self._ordinal)
                with self.hub.on(remote.ctx):
                    self._ext, self._ptr = self._import()
                self._remote = remote
        return self._remote, self._ptr

    def _map_here(self) -> bool:
        """Map the peer's VMM heap on this GPU (its fd stays for the fallback); False (logged)
        where this GPU cannot reach that one's memory (no NVLink or PCIe peer access)."""
        hub = self.hub
        try:
            with hub.on(hub.view.context):
                self._ext, self._ptr = hub.view.import_fd(os.dup(self._fd), self.size, False,
                                                          vmm=True)
        except BufferError as exc:
            log.info("a CUDA link from GPU %d cannot map GPU %d's heap (%s): its copies go "
                     "through a bounce buffer", hub.ordinal, self._ordinal, exc)
            return False
        os.close(self._fd)
        self._fd = -1
        self.direct = True
        return True

    def _import(self) -> tuple[Any, int]:
        """The peer's heap imported in its GPU's context (current): CUDA owns the fd then."""
        cu, check = self.hub.cu, self.hub.check
        desc = cu.CUDA_EXTERNAL_MEMORY_HANDLE_DESC()
        desc.type = cu.CUexternalMemoryHandleType.CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD
        desc.handle.fd = self._fd
        desc.size = self.size
        desc.flags = cu.CUDA_EXTERNAL_MEMORY_DEDICATED if self._dedicated else 0
        ext = check(cu.cuImportExternalMemory(desc),
                    f"cuImportExternalMemory of the peer's heap on GPU {self._ordinal}")
        self._fd = -1
        buf = cu.CUDA_EXTERNAL_MEMORY_BUFFER_DESC()
        buf.offset, buf.size, buf.flags = 0, self.size, 0
        try:
            return ext, int(check(cu.cuExternalMemoryGetMappedBuffer(ext, buf),
                                  "cuExternalMemoryGetMappedBuffer"))
        except BaseException:
            cu.cuDestroyExternalMemory(ext)
            raise

    def _host(self, kind: int, offset: int, buf: memoryview, what: str) -> None:
        n = buf.nbytes
        self._check_range(offset, n, what)
        if n == 0:
            return
        remote, ptr = self._peer()
        address = address_of(buf)
        dst, src = (ptr + offset, address) if kind == 1 else (address, ptr + offset)
        hub = self.hub
        if remote is None:
            with hub.copy_lock:
                res = hub._lib.vkc_link_host(kind, hub.ctx_ptr, hub.stream_ptr, dst, src, n,
                                             hub.spin_ns)
        else:
            with remote.lock:
                res = hub._lib.vkc_link_host(kind, remote.ctx_ptr, remote.stream_ptr, dst,
                                             src, n, hub.spin_ns)
        self.hub.done(res, what)
        self.calls += 1

    def put(self, offset: int, src: memoryview) -> None:
        self._host(1, offset, src, "a put of host bytes")

    def get(self, offset: int, dst: memoryview) -> None:
        self._host(2, offset, dst, "a get into host bytes")

    def _device(self, to_peer: bool, offset: int, local_off: int, nbytes: int) -> None:
        what = "a put between GPUs" if to_peer else "a get between GPUs"
        self._check_range(offset, nbytes, what)
        self._check_range(local_off, nbytes, what)
        if nbytes == 0:
            return
        hub = self.hub
        remote, ptr = self._peer()
        local = hub.view.pointer + local_off
        if remote is None:  # mapped here: one copy across the link
            dst, src = (ptr + offset, local) if to_peer else (local, ptr + offset)
            with hub.copy_lock:
                res = hub._lib.vkc_link_host(0, hub.ctx_ptr, hub.stream_ptr, dst, src, nbytes,
                                             hub.spin_ns)
            hub.done(res, what)
            self.calls += 1
            return
        piece = piece_size(hub.piece, nbytes)
        here = (hub.ctx_ptr, hub.stream_ptr, hub.local_events[0])
        there = (remote.ctx_ptr, remote.stream_ptr, remote.events[0])
        # stage 1 writes across the link into a slot on the other GPU, stage 2 copies it out
        # there: a put starts here, a get on the peer's GPU
        (ctx1, s1, ev1), (ctx2, s2, ev2) = (here, there) if to_peer else (there, here)
        dst, src = (ptr + offset, local) if to_peer else (local, ptr + offset)
        with hub.copy_lock:
            bounce = remote.bounce_address(remote.ordinal if to_peer else hub.ordinal)
            res = hub._lib.vkc_link_copy(ctx1, s1, ctx2, s2, dst, src, nbytes, bounce, piece,
                                         SLOTS, ev1, ev2, hub.spin_ns)
        hub.done(res, what)
        self.calls += 1

    def amo(self, offset: int, op: AmoOp, width: int, operand: int, compare: int) -> int:
        """An AMO on the peer's word across the link (see :attr:`amos`)."""
        assert self._copier is not None and self._ptr
        old = self._copier.amo_at(self._ptr + offset, int(op), width, operand, compare)
        self.calls += 1
        return old

    def put_device(self, offset: int, src_off: int, nbytes: int) -> None:
        self._device(True, offset, src_off, nbytes)

    def get_device(self, offset: int, dst_off: int, nbytes: int) -> None:
        self._device(False, offset, dst_off, nbytes)

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
            if self._ptr and self._remote is None:
                with self.hub.on(self.hub.view.context):
                    self.hub.view.release(self._ext, self._ptr)
            elif self._ptr:
                cu = self.hub.cu
                with self.hub.on(self._remote.ctx):
                    cu.cuMemFree(self._ptr)
                    cu.cuDestroyExternalMemory(self._ext)
            self._ptr, self._ext = 0, None
