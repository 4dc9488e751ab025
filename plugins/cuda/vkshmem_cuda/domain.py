"""The ``cuda`` memory domain: a PE's symmetric GPU heap as a CUDA VMM allocation.

:class:`CudaDomain` implements :class:`~vkshmem.core.domains.contract.MemoryDomain`: the segment is
``VKSHMEM_CUDA_SYMMETRIC_SIZE`` (default ``VKSHMEM_GPU_SYMMETRIC_SIZE``) bytes rounded up to the
allocation granularity on this PE's GPU (``VKSHMEM_CUDA_DEVICE``, else local rank modulo
GPUs), exported as a POSIX fd. Every PE of the node imports it (``group`` is the node: a VMM
allocation maps onto any GPU that can reach the owner's, over NVLink or PCIe peer access); an
import the driver refuses (no peer access) makes the core route that pair through the domain
proxy. Copies are ``cuMemcpy*Async`` plus a wait, one native call each; AMOs a one-thread kernel;
small copies and AMOs go to the service kernel (:mod:`.service`) where it runs, and small
copies are CPU stores and loads where Vulkan maps the heaps on the CPU (:mod:`.cpumap`);
reductions of mapped peers one kernel reading every member's source where it lives
(:mod:`.reductions`; otherwise the core gathers and reduces on the host). Where the driver
exports one, the heap's dma-buf fd is offered to transports (``SegmentInfo.dmabuf_fd``) for
RDMA NICs. ``stream=`` calls enqueue on the user's CUDA stream through :mod:`.streams`
(``stream_ops``).
"""

from __future__ import annotations

import logging
import os
import struct
from typing import Any

import numpy as np

from vkshmem.plugin import (
    KDL_CUDA,
    AmoOp,
    ConfigError,
    DomainContext,
    DomainExport,
    DomainSpec,
    InvalidArgumentError,
    MemoryDomain,
    SegmentInfo,
    address_of,
    gpu_settings,
)

from .array import CudaArray, PeerView
from .cpumap import CpuMaps
from .devapi import DeviceContext, vulkan_kernels
from .driver import CudaError, Device, Mapping, device_count
from .pairreduce import PairReduce, Plan
from .reducer import Reducer
from .reductions import Reductions
from .service import Service, service_mode
from .service_kernel import BOX_BYTES
from .streams import MAX_MEMBERS, CudaStreamOps, CudaStreams

__all__ = ["CudaDomain"]

log = logging.getLogger("vkshmem")

ENV_DEVICE = "VKSHMEM_CUDA_DEVICE"
ENV_SIZE = "VKSHMEM_CUDA_SYMMETRIC_SIZE"
_META = struct.Struct("<Q16s")  # allocation size (segment + control granule), owner's GPU UUID


def _env_int(name: str) -> int | None:
    text = os.environ.get(name, "").strip()
    if not text:
        return None
    try:
        from vkshmem.plugin import parse_size

        return parse_size(text) if name == ENV_SIZE else int(text)
    except ValueError:
        raise ConfigError(name, f"bad value {text!r}") from None


class CudaDomain(Reductions, MemoryDomain):
    """This PE's CUDA VMM segment (see the module docstring)."""

    error_type = CudaError

    def __init__(self, spec: DomainSpec, ctx: DomainContext) -> None:
        self.spec = spec
        self.seg_id = ctx.seg_id
        self.my_pe = ctx.my_pe
        self.closed = False
        pick = _env_int(ENV_DEVICE)
        n = device_count()
        ordinal = pick if pick is not None else ctx.local_rank % max(n, 1)
        self.device = Device(ordinal)
        self.reducer = Reducer(self.device)  #: the reduce kernels (reduce_from)
        #: the service kernel for small operations (see .service): decided at first use,
        #: once the peers on this node are known (None: not decided; False: not used)
        self._svc: Service | bool | None = None if service_mode() != "off" else False
        self._node_pes = (sum(1 for node in ctx.runtime.node_ids if node == ctx.node_id)
                          if ctx.runtime is not None else 0)
        self._gpu_peers = 0  # node peers imported, and how many of them share this GPU
        self._gpu_shared = False
        self._timeout = ctx.config.gpu_timeout
        #: stream-ordered operations (:mod:`.streams`), made at the first ``stream=``
        self._streams: CudaStreams | None = None
        self._wait_timeout = ctx.config.wait_timeout or self._timeout
        self._runtime = ctx.runtime
        #: kernels' launch device, request ring and ring service (get_initiator), or None
        self.initiator: Any = None
        #: the CUDA device API's context (device_context), or None
        self._devctx: Any = None
        size = _env_int(ENV_SIZE) or gpu_settings().symmetric_size
        self.size = self.device.round_up(size)
        try:
            #: the heaps' CPU mappings through Vulkan (see .cpumap), or None (a bad
            #: VKSHMEM_CUDA_CPU_MAP raises here, before anything is allocated)
            self._maps = CpuMaps.open(self.my_pe, self._timeout)
            # one more granule past the segment: the control words (the pair all-reduce's
            # flag word per partner PE), mapped by the peers with the rest, never in the heap
            self.local, self.fd = self.device.create(self.size + self.device.granularity)
            self.local.pe = self.my_pe
            self.device.zero(self.local.va + self.size, self.device.granularity)
        except BaseException:
            self.device.close()
            raise
        #: the service's request box at the end of the control granule (its CPU mapping's)
        self._box = (self.local.size - BOX_BYTES) // 128 * 128
        #: the largest CPU store and load through the mappings, how many operations they
        #: carried (tests), and their copy function
        self._wmax = self._rmax = self.mapped_calls = 0
        self._bar: Any = None
        if self._maps is not None:
            if self._maps.map_own(self.device, self.local, self.fd, self._box):
                self._bar = self._maps.bar_copy
                self._wmax = gpu_settings().bar_write_max
                self._rmax = gpu_settings().bar_read_max
            else:
                self._maps.close()
                self._maps = None
        #: the two-GPU all-reduce (made on first use)
        self._pair: PairReduce | None = None
        self._pair_plans: dict[tuple[Any, ...], Plan] = {}  # see reduce_from
        #: a dma-buf fd of the heap (RDMA NICs register it: SegmentInfo.dmabuf_fd), or -1
        self.dmabuf_fd = -1
        try:
            self.dmabuf_fd = self.device.export_dmabuf(self.local)
        except Exception as exc:  # older driver, no kernel support: NICs cannot register it
            log.info("PE %d: the CUDA heap has no dma-buf fd: %s", self.my_pe, exc)
        #: the core's host heap pinned for DMA (VKSHMEM_GPU_HOST_IMPORT): CPU<->GPU copies
        #: between symmetric arrays go at the PCIe rate
        self.host_pinned = 0
        host = ctx.host_heap
        if host is not None and gpu_settings().host_import:
            try:
                self.device.register_host(host.address, host.size)
                self.host_pinned = host.address
            except CudaError as exc:
                log.info("PE %d: the host heap stays unpinned for CUDA: %s", self.my_pe, exc)

    def native_ops(self, address: int) -> bool:
        """The proxy's native rounds on this heap: CUDA copies and the AMO kernel in C."""
        self.device.native_ops(address, self.local.va, self.size)
        return True

    def register_host(self, address: int, size: int) -> bool:
        """Pin host memory mapped here (a same-node peer's proxy mailbox) for DMA: the proxy's
        pieces then go between this GPU and that memory with no CPU copy."""
        if not self.host_pinned:  # VKSHMEM_GPU_HOST_IMPORT=0, or pinning failed
            return False
        try:
            self.device.register_host(address, size)
        except CudaError as exc:
            log.info("PE %d: host memory at 0x%x stays unpinned for CUDA: %s", self.my_pe,
                     address, exc)
            return False
        return True

    # -- the segment -------------------------------------------------------------------------

    def export(self) -> DomainExport:
        return DomainExport([self.fd], _META.pack(self.local.size, self.device.uuid),
                            group="node")

    def import_peer(self, pe: int, fds: list[int], meta: bytes) -> Mapping:
        size, uuid = _META.unpack(meta)  # the allocation's size: the segment, control words
        dup = os.dup(fds[0]) if self._maps is not None else -1
        try:
            mapping = self.device.import_fd(fds[0], size)
        except BaseException:
            if dup >= 0:
                os.close(dup)
            raise
        mapping.remote_gpu = uuid != self.device.uuid
        mapping.pe = pe
        if self._maps is not None:
            self._maps.map(mapping, dup, uuid)  # takes dup
        self._gpu_peers += 1
        self._gpu_shared |= not mapping.remote_gpu
        return mapping

    @property
    def service(self) -> Service | None:
        """The service kernel this domain's small operations use (None: the stream paths)."""
        return self._service()

    def _service(self) -> Service | None:
        """The service kernel where it is wanted: ``on``, or ``auto`` where this PE is known
        to be the only one on its GPU (every other PE of the node mapped, none on this GPU)."""
        svc = self._svc
        if svc is None:
            alone = (self._node_pes > 0 and self._gpu_peers == self._node_pes - 1
                     and not self._gpu_shared)
            box = self.local.cpu and (self.local.cpu + self._box, self.local.va + self._box)
            svc = self._svc = (Service(self.device, self._timeout, box or None)
                               if service_mode() == "on" or alone else False)
        if svc is False or svc.broken:
            return None
        return svc

    def release_peer(self, handle: Any) -> None:
        if self._maps is not None:
            self._maps.unmap(handle)
        self.device.release(handle)

    def describe(self) -> SegmentInfo:
        return SegmentInfo(self.seg_id, "cuda_va", self.local.va, self.size, self.fd,
                           memoryview(b""), dmabuf_fd=self.dmabuf_fd)

    # -- local operations ----------------------------------------------------------------------

    def check_range(self, offset: int, nbytes: int, what: str) -> None:
        if offset < 0 or nbytes < 0 or offset + nbytes > self.size:
            raise InvalidArgumentError(f"{what}: {nbytes} bytes at offset {offset} are outside "
                                       f"the {self.size}-byte CUDA heap")

    def watch_address(self, offset: int) -> int:
        """Where Vulkan maps this PE's heap on the CPU (see .cpumap), the address of
        ``offset`` there: waits on GPU words spin on it (uncached loads across PCIe, ~1 µs
        each, which see the peers' CPU stores and every GPU write) instead of polling copies."""
        cpu = self.local.cpu
        return cpu + offset if cpu else 0

    def write(self, mem: Mapping, offset: int, src: Any) -> None:
        n = memoryview(src).nbytes
        self.check_range(offset, n, "CUDA write")
        if not n:
            return
        if n <= self._wmax and mem.cpu:  # CPU stores, read back
            self._bar(mem.cpu + offset, address_of(src), n, 1)
            self.mapped_calls += 1
            return
        svc = self._service() if n <= Service.max_bytes else None
        if svc is not None:
            svc.write(mem.va + offset, address_of(src), n)
        else:
            self.device.htod(mem.va + offset, src, n)

    def read(self, mem: Mapping, offset: int, dst: Any) -> None:
        n = memoryview(dst).nbytes
        self.check_range(offset, n, "CUDA read")
        if not n:
            return
        if n <= self._rmax and mem.cpu:  # CPU loads across PCIe
            self._bar(address_of(dst), mem.cpu + offset, n, 0)
            self.mapped_calls += 1
            return
        svc = self._service() if n <= Service.max_bytes else None
        if svc is not None:
            svc.read(address_of(dst), mem.va + offset, n)
        else:
            self.device.dtoh(dst, mem.va + offset, n)

    def copy(self, dst: Mapping, dst_offset: int, src: Mapping, src_offset: int,
             nbytes: int) -> None:
        self.check_range(dst_offset, nbytes, "CUDA copy")
        self.check_range(src_offset, nbytes, "CUDA copy")
        if 0 < nbytes <= self._rmax and dst.cpu and src.cpu:  # a CPU copy, read back
            self._bar(dst.cpu + dst_offset, src.cpu + src_offset, nbytes, 1)
            self.mapped_calls += 1
            return
        svc = self._service() if 0 < nbytes <= Service.max_bytes else None
        if svc is not None:
            svc.copy(dst.va + dst_offset, src.va + src_offset, nbytes)
        elif nbytes:
            self.device.dtod(dst.va + dst_offset, src.va + src_offset, nbytes)

    # Non-blocking forms: issued on the domain's stream, completed by quiet (a stream
    # synchronize); host memory that is not pinned takes the blocking path.

    def write_nbi(self, mem: Mapping, offset: int, src: Any) -> None:
        n = memoryview(src).nbytes
        self.check_range(offset, n, "CUDA write")
        if n and not self.device.copy_async(1, mem.va + offset, address_of(src), n):
            self.device.htod(mem.va + offset, src, n)

    def read_nbi(self, mem: Mapping, offset: int, dst: Any) -> None:
        n = memoryview(dst).nbytes
        self.check_range(offset, n, "CUDA read")
        if n and not self.device.copy_async(2, address_of(dst), mem.va + offset, n):
            self.device.dtoh(dst, mem.va + offset, n)

    def copy_nbi(self, dst: Mapping, dst_offset: int, src: Mapping, src_offset: int,
                 nbytes: int) -> None:
        self.check_range(dst_offset, nbytes, "CUDA copy")
        self.check_range(src_offset, nbytes, "CUDA copy")
        if nbytes:
            self.device.copy_async(0, dst.va + dst_offset, src.va + src_offset, nbytes)

    def quiet(self) -> None:
        self.device.sync()
        if self._streams is not None:  # a stream's wait that timed out raises here too
            self._streams.check()

    # -- stream-ordered operations (see .streams) -----------------------------------------------

    def stream_ops(self, stream: Any) -> CudaStreamOps | None:
        """The operations enqueued on CUDA stream ``stream`` (None: not a CUDA stream)."""
        s = self._streams
        if s is None:
            s = self._streams = CudaStreams(self, self._wait_timeout, self._timeout)
        return s.ops(stream)

    def barrier_words(self, slot: int, members: int) -> int:
        """Offset, from an allocation's start, of the stream barriers' counters of family
        ``slot`` (one word per member, in the control granule past the pair all-reduce's
        slots), or -1 where they do not fit before the service's box."""
        off = self.size + (64 << 10) + slot * MAX_MEMBERS * 8
        return off if members <= MAX_MEMBERS and off + MAX_MEMBERS * 8 <= self._box else -1

    def check_errors(self) -> None:
        if self._streams is not None:
            self._streams.check()

    def amo(self, mem: Mapping, offset: int, op: AmoOp, width: int, operand: int,
            compare: int) -> int:
        svc = self._service()
        if svc is not None:
            return svc.amo(mem.va + offset, int(op), width, operand, compare)
        return self.device.amo(mem.va + offset, int(op), width, operand, compare)

    def zero(self, offset: int, nbytes: int) -> None:
        if nbytes:
            self.device.zero(self.local.va + offset, nbytes)


    def device_view(self, mem: Mapping, offset: int, shape: tuple[int, ...],
                    dtype: np.dtype) -> PeerView:
        """A view of ``mem`` (a peer's heap mapped on this GPU) that CUDA libraries take."""
        return PeerView(mem.va + offset, shape, dtype, self.device.ordinal)

    def dlpack_range(self) -> tuple[int, int, int, int]:
        return (KDL_CUDA, self.device.ordinal, self.local.va, self.size)

    def no_view_reason(self) -> str:
        return "CUDA device memory has no CPU mapping (use cupy.asarray(a) on the GPU)"

    def make_array(self, offset: int, shape: tuple[int, ...], dtype: np.dtype) -> CudaArray:
        return CudaArray(self, offset, shape, dtype)

    # -- GPU-initiated communication -------------------------------------------------------------

    def get_initiator(self) -> Any:
        """Vulkan kernels on this heap (:func:`vkshmem.shmem.gpu_kernel`; see
        :func:`.devapi.vulkan_kernels`). Made on first use, not collective."""
        if self.initiator is None:
            self.initiator = vulkan_kernels(self._runtime, self.seg_id, self.device, self.fd,
                                            self.local.size)
        return self.initiator

    def device_context(self) -> int:
        """Device address of the ``vks_ctx`` CUDA kernels pass to the device API
        (``include/vkshmem_device.cuh``; :mod:`.devapi`): every PE's heap as mapped here.
        Made on first use; local."""
        if self._devctx is None:
            self._devctx = DeviceContext.of_heap(self._runtime, self.seg_id, self.device,
                                                 self.size, self.my_pe)
        return self._devctx.address

    def stop_threads(self) -> BaseException | None:
        """Stop the kernels' ring service and release the Vulkan import (before the heap);
        return its recorded failure, if any."""
        init, self.initiator = self.initiator, None
        failed = init.stop() if init is not None else None
        if failed is None and self._streams is not None:  # a stream's wait timed out
            failed = self._streams.failure()
        return failed

    # -- teardown ---------------------------------------------------------------------------------

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self.stop_threads()  # normally done by the core already
            if self._devctx is not None:
                self._devctx.close()
                self._devctx = None
            if isinstance(self._svc, Service):
                self._svc.close()
            if self._streams is not None:
                self._streams.close()
            self._pair_plans.clear()
            if self._pair is not None:
                self._pair.close()
            for address, _size in list(self.device.pinned):  # the host heap, peers' mailboxes
                self.device.unregister_host(address)
            if self._maps is not None:  # the Vulkan imports before CUDA's allocation
                self._maps.close()
            self.device.release(self.local)
        finally:
            os.close(self.fd)
            if self.dmabuf_fd >= 0:
                os.close(self.dmabuf_fd)
            self.device.close()
