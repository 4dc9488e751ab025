"""GPU-initiated communication wired to the runtime: user kernels whose requests reach peers.

:class:`Initiator` belongs to a PE's GPU domain and is made on the first
:func:`vkshmem.shmem.gpu_kernel`: :meth:`Initiator.for_vulkan` for the
:class:`~vkshmem.gpu.domain.vulkan.VulkanDomain`, :meth:`Initiator.for_fd` for a GPU heap
another API allocated and exports as an opaque fd (the ``cuda`` domain's VMM heap, which
Vulkan imports as device-local memory, so the same kernels run on it). It holds:

- a **launch queue**: kernels are submitted to a second queue of the domain's device, so the
  work the host does for their requests (staged copies, shader AMOs, on the first queue) runs
  beside them and never waits behind the kernel that waits for it (on one queue it would,
  until the kernel's bounded wait gave up). Where the device has a single queue (lavapipe),
  kernels run on a second Vulkan device on the same GPU into which this PE's heap is
  imported;
- a request :class:`~vkshmem.gpu.initiated.ring.Ring` in memory of the launch device that a
  running kernel sees the host's writes to (``alloc_mapped``);
- a :class:`~vkshmem.gpu.initiated.ringservice.RingService` whose handler performs each
  request with the runtime: GPU-heap targets through the domain's heap (imported memory of
  same-device peers, the domain proxy for the others:
  :class:`~vkshmem.core.domains.heap.DomainHeap`), host-heap targets through the PE's
  transports (own endpoints, so the service thread never shares the application's), and
  completes it.

Requests address symmetric offsets in the kernels' own segment numbering (0 the host heap,
1 this GPU heap, whatever segment id the runtime gave the domain), so a kernel uses the
numbers :func:`vkshmem.shmem.offset_of` gives (``DeviceArray.offset`` for GPU arrays).
"""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING

from vkshmem.core.errors import FeatureNotAvailableError, InvalidArgumentError
from vkshmem.core.transports.contract import AmoOp, Transport
from vkshmem.core.transports.endpoints import Endpoints

from ..env import settings
from ..errors import GpuError
from ..vk.device import VulkanDevice
from ..vk.instance import list_devices
from ..vk.memory import ExportInfo, exportable_memory_types
from .launch import UserKernel
from .ring import Descriptor, Ring, RingOp, SignalOp
from .ringservice import RingService

if TYPE_CHECKING:
    from vkshmem.core.domains.heap import DomainHeap
    from vkshmem.core.runtime import Runtime

    from ..domain.vulkan import VulkanDomain
    from ..vk.memory import GpuMemory

__all__ = ["Initiator"]

log = logging.getLogger("vkshmem")

RING_CAPACITY = 1024
#: passes a shader wait may spin on a GPU (a pass costs ~1-30 µs there: seconds in all)
GPU_SPIN_LIMIT = 1 << 20
_HOST, _GPU = 0, 1


class Initiator:
    """The launch device, request ring and ring service of one PE (see the module doc)."""

    def __init__(self, rt: Runtime, seg_id: int, device: VulkanDevice, own_device: bool,
                 make_heap: Callable[[VulkanDevice], GpuMemory]) -> None:
        heap = rt.domains.heap_of(seg_id)
        assert heap is not None, "the GPU domain's heap is open before its initiator"
        #: the domain's routes to every peer's GPU heap (imported, proxy)
        self.domain = heap
        self.rt = rt
        self.kernels: list[UserKernel] = []
        self._eps: Endpoints | None = None
        self.service: RingService | None = None
        self.ring: Ring | None = None
        self.heap: GpuMemory | None = None
        self.device = device
        #: the launch device is this initiator's own (closed with it), holding an import
        self.own_device = own_device
        #: validation-layer errors of the launch device already handled (refused imports)
        self._seen_errors = 0
        #: peers' heaps imported into the launch device (where it is not the domain's)
        self._peer_imports: list[GpuMemory] = []
        self.peer_table: GpuMemory | None = None
        #: per PE, its GPU heap as the launch device maps it (this PE's included; streams
        #: translate the domain's handles with it)
        self.peer_memory: dict[int, GpuMemory] = {}
        try:
            self.heap = make_heap(device)
            self.ring = Ring.create(self.device, RING_CAPACITY)
            self._direct_path(heap)
            self._eps = Endpoints(rt)  # made here, on the application's thread
            self.service = RingService(self.ring, self._handle, self.device,
                                       name=f"vkshmem-gpu-ring-pe{rt.my_pe}")
        except BaseException:
            self.close(check=False)
            raise

    def _direct_path(self, heap: DomainHeap) -> None:
        """The peer table kernels store into directly: per PE, the device address of its GPU
        heap on the launch device (this PE's own; same-device peers' imports, made on the
        launch device when it is not the domain's), 0 where the ring must carry requests."""
        n, me = self.rt.n_pes, self.rt.my_pe
        assert self.heap is not None and self.ring is not None
        bases = [0] * n
        bases[me] = self.heap.device_address
        self.peer_memory[me] = self.heap
        exports = getattr(heap.domain, "peer_exports", {})
        for pe in range(n):
            mem = heap.direct[pe]
            if pe == me or mem is None:
                continue
            if not self.own_device:
                bases[pe] = getattr(mem, "device_address", 0)
                if bases[pe]:
                    self.peer_memory[pe] = mem
            elif pe in exports:
                imported = self._import_peer(pe, *exports[pe])
                if imported is not None:
                    self._peer_imports.append(imported)
                    self.peer_memory[pe] = imported
                    bases[pe] = imported.device_address
        self.peer_table = self.device.alloc_mapped(8 * n)
        view = self.peer_table.map()
        assert view is not None
        view[:] = struct.pack(f"<{n}Q", *bases)
        del view
        # On a GPU a wait may last as long as a host or another GPU takes to write the word:
        # give it seconds. A CPU driver (lavapipe) keeps the shader's compile-time bound,
        # within its loop budget.
        spin = 0 if self.device.info.is_cpu else GPU_SPIN_LIMIT
        # other PEs' kernels on this GPU (their heaps are imports of the same device): on a
        # GPU the driver runs other processes' kernels only when this one's end (seen on the
        # H100), so kernels must not wait for each other; a CPU driver runs them at once
        shared = not self.device.info.is_cpu and any(bases[pe] for pe in range(n) if pe != me)
        self.ring.set_direct(self.peer_table.device_address, heap.device_sync_off,
                             all(bases), spin, shared)
        #: whether other PEs' kernels share this GPU and never run at once with this PE's
        self.shared_gpu = shared
        #: which PEs kernels reach by direct loads and stores
        self.direct_pes = [pe for pe in range(n) if bases[pe]]

    def _import_peer(self, pe: int, fd: int, info: ExportInfo) -> GpuMemory | None:
        """PE ``pe``'s heap imported into the launch device (None: it stays behind the ring).
        Tried three times: lavapipe now and then refuses an import that works the next time
        (VK_ERROR_INVALID_EXTERNAL_HANDLE, seen at 4 PEs on a loaded 2-core machine)."""
        for attempt in range(3):
            try:
                return self.device.import_fd(os.dup(fd), info.size,
                                             memory_type_index=info.memory_type_index,
                                             dedicated=info.dedicated, take_ownership=True)
            except Exception as exc:
                # the validation layer reported the refused import: handled here, not an error
                self._seen_errors = len(self.device.validation_errors) \
                    if self.device.validation else 0
                if attempt == 2:
                    log.warning("PE %d: kernels reach PE %d through the request ring: its "
                                "heap does not import into the launch device: %s",
                                self.rt.my_pe, pe, exc)
        return None

    @classmethod
    def for_vulkan(cls, vk: VulkanDomain, rt: Runtime) -> Initiator:
        """Kernels of the Vulkan domain ``vk``: on a second queue of its device where it has
        one; else on a second device on the same GPU that imports the heap (lavapipe has one
        queue)."""
        if vk.device.queue_count >= 2:
            return cls(rt, vk.seg_id, vk.device, False, lambda _dev: vk.memory)
        seg = vk.segment
        assert seg is not None
        info = seg.export_info()
        fd = seg.fd
        return cls(rt, vk.seg_id, cls._launch_device(rt, vk.device.info.index), True,
                   lambda dev: dev.import_fd(os.dup(fd), info.size,
                                             memory_type_index=info.memory_type_index,
                                             dedicated=info.dedicated, take_ownership=True))

    @classmethod
    def for_fd(cls, rt: Runtime, seg_id: int, device_uuid: bytes, fd: int,
               size: int) -> Initiator:
        """Kernels on another API's GPU heap (a CUDA VMM allocation): the Vulkan device
        whose UUID is ``device_uuid`` imports the opaque fd ``fd`` (a duplicate is taken;
        device-local memory, not a dedicated allocation) of ``size`` bytes. Raises
        FeatureNotAvailableError where no Vulkan device has that UUID."""
        infos = list_devices()
        match = [d for d in infos if bytes(d.device_uuid) == bytes(device_uuid)]
        if not match:
            raise FeatureNotAvailableError(
                f"no Vulkan device has the GPU heap's device UUID {bytes(device_uuid).hex()} "
                f"(Vulkan lists {', '.join(d.name for d in infos) or 'none'}): kernels need "
                "the GPU's Vulkan driver")

        def make_heap(dev: VulkanDevice) -> GpuMemory:
            mtype = dev.memory_type(exportable_memory_types(dev), False, size)
            return dev.import_fd(os.dup(fd), size, memory_type_index=mtype, dedicated=False,
                                 take_ownership=True)

        return cls(rt, seg_id, cls._launch_device(rt, match[0].index), True, make_heap)

    @staticmethod
    def _launch_device(rt: Runtime, index: int) -> VulkanDevice:
        return VulkanDevice(index, settings().validation, local_rank=rt.local_rank,
                            timeout=rt.config.gpu_timeout, staging_size=64 << 10)

    # -- kernels ---------------------------------------------------------------------------

    def kernel(self, spirv: str | os.PathLike[str] | bytes, *, name: str | None = None,
               entry: str = "main", scratch_bytes: int = 4096) -> UserKernel:
        """A user kernel on the launch device with this PE's heap, ring and numbers in its
        push header (see :class:`~vkshmem.gpu.initiated.launch.UserKernel`)."""
        k = UserKernel(self.device, spirv, name=name, entry=entry, heap=self.heap,
                       ring=self.ring, my_pe=self.rt.my_pe, n_pes=self.rt.n_pes,
                       scratch_bytes=scratch_bytes)
        k.after_launch = self._kernel_error
        self.kernels.append(k)
        return k

    def _kernel_error(self) -> None:
        """Raise what a finished kernel reported through the ring header (VKS_KERR_*)."""
        text = self.ring.take_kernel_error() if self.ring is not None else None
        if text is not None:
            raise GpuError(f"PE {self.rt.my_pe}: {text}")

    def check(self) -> None:
        """Raise the ring service's recorded failure, if a request failed."""
        if self.service is not None:
            self.service.check()

    # -- the handler -------------------------------------------------------------------------

    def _ep(self, pe: int) -> Transport:
        assert self._eps is not None
        return self._eps[pe]

    def _eps_all(self) -> list[Transport]:
        return self._eps.all if self._eps is not None else []

    def _handle(self, d: Descriptor) -> int | None:
        op = d.op
        if op == RingOp.NOP:
            return None
        if op in (RingOp.FENCE, RingOp.QUIET):
            # GPU-heap requests complete when handled; host-heap puts may be in flight on a
            # transport: complete them (a fence where the transport orders natively)
            for ep in self._eps_all():
                if op == RingOp.FENCE and ep.spec.native_fence:
                    ep.fence()
                else:
                    ep.quiet()
            return None
        if not 0 <= d.pe < self.rt.n_pes:
            raise InvalidArgumentError(f"GPU request {op!r} names PE {d.pe}; the job has "
                                       f"{self.rt.n_pes}")
        if op == RingOp.PUT:
            self._put(d.pe, d.dst_seg, d.dst, d.src_seg, d.src, d.nbytes)
            return None
        if op == RingOp.GET:
            self._get(d.pe, d.src_seg, d.src, d.dst_seg, d.dst, d.nbytes)
            return None
        if op == RingOp.AMO:
            return self._amo(d.pe, d.dst_seg, d.dst, d.amo_op, d.width, d.value, d.compare)
        if op in (RingOp.SIGNAL, RingOp.PUT_SIGNAL):
            if op == RingOp.PUT_SIGNAL:
                self._put(d.pe, d.dst_seg, d.dst, d.src_seg, d.src, d.nbytes)
                if d.dst_seg == _HOST:
                    self._ep(d.pe).quiet()  # the data are delivered before the signal
            amo = AmoOp.SET if d.signal_op == SignalOp.SET else AmoOp.ADD
            self._amo(d.pe, d.dst_seg, d.signal_offset, amo, 8, d.value, 0)
            return None
        raise InvalidArgumentError(f"unknown GPU request {op!r}")

    def _range(self, seg: int, off: int, n: int) -> None:
        """Reject a kernel's request that runs outside this PE's segment (no truncation)."""
        size = self.domain.size if seg == _GPU else self.rt.host.segment.size
        if seg not in (_HOST, _GPU) or off < 0 or n < 0 or off + n > size:
            raise InvalidArgumentError(f"GPU request: {n} bytes at offset {off} of segment "
                                       f"{seg} are outside it ({size} bytes)")

    def _src_bytes(self, seg: int, off: int, n: int) -> memoryview:
        self._range(seg, off, n)
        if seg == _GPU:
            tmp = memoryview(bytearray(n))
            self.domain.read_local(off, tmp)
            return tmp
        return self.rt.host.segment.buffer[off:off + n]

    def _put(self, pe: int, dseg: int, doff: int, sseg: int, soff: int, n: int) -> None:
        self._range(sseg, soff, n)
        self._range(dseg, doff, n)
        dom = self.domain
        if sseg == _GPU and dseg == _GPU:
            dom.transfers.put_device(pe, doff, soff, n)
        elif dseg == _GPU:
            dom.put(pe, dom.seg_id, doff, self._src_bytes(sseg, soff, n))
        else:
            self._ep(pe).put(pe, _HOST, doff, self._src_bytes(sseg, soff, n))

    def _get(self, pe: int, sseg: int, soff: int, dseg: int, doff: int, n: int) -> None:
        self._range(sseg, soff, n)
        self._range(dseg, doff, n)
        dom = self.domain
        if sseg == _GPU and dseg == _GPU:
            dom.transfers.get_device(pe, soff, doff, n)
            return
        tmp = memoryview(bytearray(n))
        if sseg == _GPU:
            dom.get(pe, dom.seg_id, soff, tmp)
        else:
            self._ep(pe).get(pe, _HOST, soff, tmp)
        if dseg == _GPU:
            dom.write_local(doff, tmp)
        else:
            self.rt.host.segment.buffer[doff:doff + n] = tmp

    def _amo(self, pe: int, seg: int, off: int, op: AmoOp, width: int, value: int,
             compare: int) -> int:
        if seg == _GPU:
            return self.domain.amo(pe, self.domain.seg_id, off, op, width, value, compare)
        return self._ep(pe).amo(pe, _HOST, off, op, width, value, compare, True)

    # -- teardown ------------------------------------------------------------------------------

    def close(self, check: bool = True) -> None:
        """Stop the service, close the kernels, the ring, the imported heap and the launch
        device; then raise a request failure (``check``)."""
        error: BaseException | None = None
        for stream in list(self.device.streams):  # before the memory their work reads
            try:
                stream.close()
            except Exception as exc:
                error = error or exc
        if self.service is not None:
            try:
                self.service.stop()
            except Exception as exc:
                error = exc
            self.service = None
        for k in self.kernels:
            try:
                k.close()
            except Exception as exc:
                log.warning("closing kernel %s: %s", k.name, exc)
        self.kernels.clear()
        if self._eps is not None:
            self._eps.close()
            self._eps = None
        if self.ring is not None:
            self.ring.close()
            self.ring = None
        if self.peer_table is not None:
            self.peer_table.free()
            self.peer_table = None
        for mem in self._peer_imports:
            mem.free()
        self._peer_imports.clear()
        self.peer_memory.clear()
        if self.heap is not None and self.own_device:
            self.heap.free()
        self.heap = None
        errors: list[str] = []
        if self.own_device:
            self.device.close()
            errors = self.device.validation_errors[self._seen_errors:] \
                if self.device.validation else []
        if check and error is not None:
            raise error
        if check and errors:
            from ..errors import GpuError
            raise GpuError("Vulkan validation errors on the launch device (VKSHMEM_GPU_"
                           "VALIDATION=1): " + " | ".join(errors[:5]))

    def stop(self) -> BaseException | None:
        """:meth:`close`, returning the failure it would raise instead of raising it."""
        try:
            self.close()
        except Exception as exc:
            return exc
        return None

    def __repr__(self) -> str:
        return f"<Initiator PE {self.rt.my_pe} on {self.device.name}>"
