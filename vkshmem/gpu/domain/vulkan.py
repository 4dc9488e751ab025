"""The ``vulkan`` memory domain: a PE's symmetric GPU segment in exportable Vulkan memory.

It registers itself through the entry-point group ``vkshmem.domains`` (see
:mod:`vkshmem.gpu.plugin`) exactly as a third party's domain would; the core opens it on the
first allocation with ``domain='gpu'`` (or ``'vulkan'``), so a job that never asks for GPU
memory never opens a Vulkan device. This module implements the
:class:`~vkshmem.core.domains.contract.MemoryDomain` contract:

- the segment: ``VKSHMEM_GPU_SYMMETRIC_SIZE`` bytes of exportable memory on this PE's device
  (``VKSHMEM_GPU_DEVICE``, else local rank modulo GPUs; where a vendor's accelerator supplies
  it, its allocation imported into Vulkan), exported as an opaque fd; peers on the same node
  and device (``group`` = the device UUID) import it, peers on other GPUs of the node link to
  it where the accelerator can (its ``link_group``);
- local operations: staged or mapped copies (``VKSHMEM_GPU_MAPPED``; their non-blocking
  forms in :mod:`.nbi`), AMOs by a shader (or, on
  CPU drivers such as lavapipe, the core's CPU atomics on the mapping, which are atomic with
  the shader atomics there and 50x faster), reductions by ``reduce.comp``;
- arrays: :class:`~vkshmem.gpu.array.DeviceArray`;
- a vendor's accelerations (:mod:`vkshmem.gpu.accel`: vkshmem-cuda's on NVIDIA), attached
  through :class:`~vkshmem.gpu.accel.DomainAccelerator` (Vulkan-only without one);
- GPU-initiated communication (:meth:`VulkanDomain.get_initiator`), streams
  (:meth:`VulkanDomain.gpu_stream`, ``stream_ops``: :mod:`.streams`) and validation-layer
  errors (``check_errors``).
"""

from __future__ import annotations

import ctypes
import logging
import os
from typing import TYPE_CHECKING, Any

import numpy as np

from vkshmem.core._native import ffi as _core_ffi
from vkshmem.core._native import lib as _core
from vkshmem.core.domains.contract import DomainContext, DomainExport, DomainSpec, MemoryDomain
from vkshmem.core.errors import FeatureNotAvailableError
from vkshmem.core.transports.contract import AmoOp, SegmentInfo
from vkshmem.plugin import address_of

from ..accel import DomainAccelerator, attach_accelerator
from ..array import DeviceArray
from ..env import settings
from ..errors import GpuError
from ..vk.device import VulkanDevice
from ..vk.kernels import reduce_unsupported
from ..vk.memory import ExportInfo, GpuMemory
from .nbi import NbiForms
from .segment import GpuSegment, open_segment
from .streams import DomainStreams, VulkanStreamOps

if TYPE_CHECKING:
    from ..accel import HeapMemory
    from ..initiated.initiator import Initiator
    from ..stream import Stream

__all__ = ["VulkanDomain", "address_of"]

log = logging.getLogger("vkshmem")


class VulkanDomain(NbiForms, MemoryDomain):
    """The Vulkan GPU segment of one PE (see the module docstring)."""

    error_type = GpuError

    def __init__(self, spec: DomainSpec, ctx: DomainContext) -> None:
        cfg = ctx.config
        own = settings()  # the domain's variables (VKSHMEM_GPU_*, see env.py)
        self.spec = spec
        self.ctx = ctx
        self.seg_id = ctx.seg_id
        self.my_pe = ctx.my_pe
        self.closed = False
        self.initiator: Initiator | None = None
        #: the domain's streams (vkshmem.gpu.Stream) and their operations
        self.streams = DomainStreams(self)
        self.segment: GpuSegment | None = None
        #: same-device peers' heap fds (a duplicate each) and export infos, kept where kernels
        #: run on a launch device of their own, which imports them for direct access
        self.peer_exports: dict[int, tuple[int, ExportInfo]] = {}
        #: the vendor's accelerator of this domain (attached once the device is open)
        self.accel = DomainAccelerator()
        self._seen_errors = 0
        #: use CPU mappings of host-visible GPU memory for copies, waits and zeroing
        self.mapped = own.mapped
        self.device = VulkanDevice(own.device, own.validation,
                                   local_rank=ctx.local_rank, timeout=cfg.gpu_timeout,
                                   staging_size=own.staging_size)
        self.device.spin_wait = own.spin_us * 1e-6
        #: CPU access to write-combined (BAR) mappings only up to these sizes: stores are
        #: fast, loads crawl
        self.bar_write_max = own.bar_write_max
        self.bar_read_max = own.bar_read_max
        #: the heap's memory where the accelerator supplies it (vkshmem-cuda: a CUDA VMM heap)
        self.vmm: HeapMemory | None = None
        try:
            self.size = own.symmetric_size
            self.accel = attach_accelerator(self, self.device, cfg)
            self.segment, refused = open_segment(self.device, self.seg_id, self.size,
                                                 self.accel.make_heap, self.my_pe)
            self.vmm = self.segment.vmm
            if refused:  # the validation layer saw Vulkan refuse CUDA's fd: handled
                self._seen_errors = len(self.device.validation_errors)
        except BaseException:
            self.close(check=False)
            raise
        self.memory: GpuMemory = self.segment.memory
        self.local = self.memory
        #: the host heap imported into the device: CPU<->GPU copies between symmetric arrays
        #: are one DMA (VK_EXT_external_memory_host), no staging
        self.host_imported = False
        host = ctx.host_heap
        if host is not None and own.host_import and self.device.has_memory_host:
            try:
                self.device.register_host(host.address, host.size)
                self.host_imported = True
            except (GpuError, FeatureNotAvailableError) as exc:
                log.info("PE %d: the host heap stays unimported on %s: %s", self.my_pe,
                         self.device.name, exc)
        self.cpu_atomics = self.device.info.is_cpu and own.mapped

    def dlpack_range(self) -> tuple[int, int, int, int] | None:
        return self.accel.dlpack_range()

    def link_peer(self, pe: int, fds: list[int], meta: bytes, group: str | None) -> Any:
        """A link to ``pe``'s heap on another GPU, where the accelerator makes one (the
        core's ``link_group`` route)."""
        return self.accel.link_peer(pe, fds, meta, group)

    # -- the segment -------------------------------------------------------------------------

    def export(self) -> DomainExport:
        dev, seg = self.device, self.segment
        assert seg is not None
        group = dev.uuid.hex() if dev.has_external_memory_fd else None
        link = self.accel.link_group() if group is not None else None
        return DomainExport([seg.fd], seg.export_info().pack(), group, link)

    def import_peer(self, pe: int, fds: list[int], meta: bytes) -> GpuMemory:
        info = ExportInfo.unpack(meta)
        dup = self.accel.dup_peer_fd(fds[0])
        if self.device.queue_count < 2:  # kernels run on a device of their own: keep the fd
            self.peer_exports[pe] = (os.dup(fds[0]), info)
        try:
            mem = self.device.import_fd(fds[0], info.size,
                                        memory_type_index=info.memory_type_index,
                                        dedicated=info.dedicated, take_ownership=True)
        except Exception:
            if dup >= 0:
                os.close(dup)
            # the validation layer reported the failed call: handled by the core, not an error
            self._seen_errors = len(self.device.validation_errors)
            raise
        if dup >= 0:
            self.accel.keep_peer(mem, dup, info)
        return mem

    def release_peer(self, handle: Any) -> None:
        self.accel.drop_peer(handle)
        handle.free()

    def _close_peer_exports(self) -> None:
        exports, self.peer_exports = self.peer_exports, {}
        for fd, _info in exports.values():
            os.close(fd)

    def describe(self) -> SegmentInfo:
        assert self.segment is not None
        return self.segment.info()

    # -- local memory (own or imported) ---------------------------------------------------------

    def check_range(self, offset: int, nbytes: int, what: str) -> None:
        self.memory.check_range(offset, nbytes, what)

    def native_ops(self, address: int) -> bool:
        """The proxy's native rounds on this heap: on a CPU driver with cached mapped memory,
        copies through the mapping and CPU atomics (the core's generic ops); where the
        accelerator has them (vkshmem-cuda: CUDA's copies and AMO kernel, small copies through
        the BAR mapping, as :meth:`write_nbi` does) its; elsewhere none (the Python round)."""
        mem = self.memory
        if self.cpu_atomics and mem.host_address and mem.host_cached:
            _core.vk_mapped_domain_ops(_core_ffi.cast("struct vk_domain_ops *", address),
                                       mem.host_address, self.size)
            return True
        return self.accel.native_ops(address)

    def register_host(self, address: int, size: int) -> bool:
        """Import host memory mapped here (a same-node peer's proxy mailbox) into the device,
        and register it with the accelerator (CUDA, where its copier runs): copies to and from
        it are one DMA. False where the driver cannot (copies of it are then staged)."""
        if not self.host_imported:
            return False
        try:
            self.device.register_host(address, size)
        except (GpuError, FeatureNotAvailableError) as exc:
            log.info("PE %d: host memory at 0x%x stays unimported on %s: %s", self.my_pe,
                     address, self.device.name, exc)
            return False
        self.accel.pin_host(address, size)
        return True

    def write(self, mem: GpuMemory, offset: int, src: Any) -> None:
        """Copy host bytes into ``mem``: CPU stores through the mapping where there is one
        (up to ``VKSHMEM_GPU_BAR_WRITE_MAX`` bytes for write-combined device memory), else a
        GPU copy (the accelerator's, where it takes the size: vkshmem-cuda's from
        ``VKSHMEM_GPU_CUDA_COPY`` bytes)."""
        n = memoryview(src).nbytes
        copier = self.accel.copier(n)
        if copier is not None and (ptr := copier.pointer(mem)):
            mem.check_range(offset, n, "GPU write")
            copier.h2d(ptr + offset, address_of(src), n)
            return
        if self.mapped and mem.host_visible:
            if mem.host_cached:
                self.device.write(mem, offset, src, direct=True)
                return
            if memoryview(src).nbytes <= self.bar_write_max:
                self.device.write(mem, offset, src, direct=True)
                _core.vk_fence()  # drain the write-combining buffers before what follows
                return
        self.device.write(mem, offset, src)

    def read(self, mem: GpuMemory, offset: int, dst: Any) -> None:
        """Copy ``mem`` bytes into a host buffer: CPU loads through a cached mapping, or a
        write-combined one up to ``VKSHMEM_GPU_BAR_READ_MAX`` bytes; else a GPU copy."""
        n = memoryview(dst).nbytes
        copier = self.accel.copier(n)
        if copier is not None and (ptr := copier.pointer(mem)):
            mem.check_range(offset, n, "GPU read")
            copier.d2h(address_of(dst), ptr + offset, n)
            return
        direct = self.mapped and mem.host_visible and (mem.host_cached or n <= self.bar_read_max)
        self.device.read(mem, offset, dst, direct=direct)

    def copy(self, dst: GpuMemory, dst_offset: int, src: GpuMemory, src_offset: int,
             nbytes: int) -> None:
        """Device-to-device copy (both mapped: a memmove; through the accelerator where it
        takes the size, for disjoint ranges)."""
        copier = self.accel.copier(nbytes)
        if copier is not None and (
                dst is not src or dst_offset + nbytes <= src_offset
                or src_offset + nbytes <= dst_offset) and \
                copier.copy(dst, dst_offset, src, src_offset, nbytes):
            return
        if self.mapped and dst.host_address and src.host_address and (
                src.host_cached or nbytes <= self.bar_read_max):
            dst.check_range(dst_offset, nbytes, "GPU copy")
            src.check_range(src_offset, nbytes, "GPU copy")
            ctypes.memmove(dst.host_address + dst_offset, src.host_address + src_offset,
                           nbytes)
            if not dst.host_cached:
                _core.vk_fence()  # drain the write-combining buffers
        else:
            self.device.copy(dst, dst_offset, src, src_offset, nbytes)

    def amo(self, mem: GpuMemory, offset: int, op: AmoOp, width: int, operand: int,
            compare: int) -> int:
        """One AMO on ``mem``, atomic with shader atomics on the word; the old value."""
        if self.cpu_atomics and mem.host_address:
            return int(_core.vk_amo(mem.host_address + offset, int(op), width, operand,
                                    compare))
        copier = self.accel.amo_copier()
        if copier is not None:
            old = copier.amo(mem, offset, int(op), width, operand, compare)
            if old is not None:
                return old
        return self.device.amo(mem, offset, op, width, operand, compare)

    def zero(self, offset: int, nbytes: int) -> None:
        mem = self.memory
        if self.mapped and mem.host_address and (mem.host_cached
                                                 or nbytes <= self.bar_write_max):
            ctypes.memset(mem.host_address + offset, 0, nbytes)
            _core.vk_fence()
            return
        super().zero(offset, nbytes)

    def watch_address(self, offset: int) -> int:
        """Host address at ``offset`` if waits may spin on the mapping (host-visible memory
        and ``VKSHMEM_GPU_MAPPED=1``), else 0."""
        addr = self.memory.host_address
        return addr + offset if addr and self.mapped else 0

    def host_view(self, mem: GpuMemory) -> memoryview | None:
        """A CPU view of ``mem`` where the device maps it (else None)."""
        return mem.map()

    def no_view_reason(self) -> str:
        return self.memory.map_reason or "the GPU heap is not mapped"

    def reduce(self, dst_offset: int, src_offset: int, count: int, op: str,
               dtype: np.dtype) -> bool:
        """``reduce.comp`` when the device has the features ``dtype`` needs."""
        if reduce_unsupported(self.device.info, dtype, op) is not None:
            return False
        mem = self.memory
        self.device.reduce(mem, dst_offset, mem, src_offset, count, op, dtype)
        return True

    def make_array(self, offset: int, shape: tuple[int, ...], dtype: np.dtype) -> DeviceArray:
        return DeviceArray(self, offset, shape, dtype)

    # -- GPU-initiated communication -------------------------------------------------------------

    def get_initiator(self) -> Initiator:
        """The launch device, request ring and ring service (made on first use, not
        collective)."""
        if self.initiator is None:
            from ..initiated.initiator import Initiator
            self.initiator = Initiator.for_vulkan(self, self.ctx.runtime)
        return self.initiator

    def gpu_stream(self, name: str | None = None) -> Stream:
        """A :class:`~vkshmem.gpu.stream.Stream` on the device kernels run on (not
        collective; opens the initiator, as the first kernel does)."""
        return self.streams.new(name)

    def stream_ops(self, stream: Any) -> VulkanStreamOps | None:
        """The operations on ``stream`` when it is a Stream of this domain's devices."""
        return self.streams.ops(stream)

    # -- errors and teardown ---------------------------------------------------------------------

    def stop_threads(self) -> BaseException | None:
        """Close the streams, stop the ring service (kernels' requests); return a stream
        wait's timeout or the service's failure, if one was recorded."""
        failed = self.streams.close()
        init, self.initiator = self.initiator, None
        stopped = init.stop() if init is not None else None
        return failed or stopped

    def check_errors(self) -> None:
        """Raise a stream wait's timeout, or GpuError for validation-layer errors reported
        since the last check."""
        self.streams.check()
        if not self.device.validation:
            return
        errors = self.device.validation_errors
        if len(errors) > self._seen_errors:
            new = errors[self._seen_errors:]
            self._seen_errors = len(errors)
            raise GpuError(f"Vulkan validation errors on PE {self.my_pe} "
                           f"(VKSHMEM_GPU_VALIDATION=1): " + " | ".join(new[:5]))

    def close(self, check: bool = True) -> None:
        """Release the segment and the device; then raise validation errors if there were
        any (``check``)."""
        if self.closed:
            return
        self.closed = True
        failure = self.stop_threads()
        self.accel.close()
        self._close_peer_exports()
        if self.segment is not None:
            try:
                self.segment.close()
            except BufferError as exc:
                log.warning("PE %d: the GPU heap is still viewed by arrays (to_numpy(zero_copy"
                            "=True)); it is released with the device: %s", self.my_pe, exc)
        try:
            self.device.close()  # the layer reports leaks during close: read errors after it
        finally:
            if self.vmm is not None:  # after Vulkan's import of it
                self.vmm.close()
                self.vmm = None
        errors = self.device.validation_errors[self._seen_errors:] \
            if self.device.validation else []
        if check and failure is not None:
            raise failure
        if check and errors:
            raise GpuError(f"Vulkan validation errors on PE {self.my_pe} "
                           f"(VKSHMEM_GPU_VALIDATION=1): " + " | ".join(errors[:5]))
