"""A Vulkan device opened for vkshmem, with its engines: the one object the GPU layer hangs off.

:class:`VulkanDevice` is the :class:`~vkshmem.gpu.vk.logical.LogicalDevice` (instance, physical
device, compute queue, command pools; memory: :meth:`~VulkanDevice.alloc_exportable`,
:meth:`~VulkanDevice.import_fd`) with copies (:meth:`~VulkanDevice.write`,
:meth:`~VulkanDevice.read`, :meth:`~VulkanDevice.copy`), shader work (:meth:`~VulkanDevice.amo`,
:meth:`~VulkanDevice.reduce`, :meth:`~VulkanDevice.pipeline`) and command buffers
(:meth:`~VulkanDevice.slot`). Which physical device it opens: :mod:`vkshmem.gpu.vk.instance`.

Threads: every method may be called from any thread. Each engine (the staging copies, each
pipeline, the AMO kernels) has its own lock held for a whole operation; the device lock is held
only while recording and submitting, never while waiting for the GPU, and every wait has a
timeout (:mod:`vkshmem.gpu.vk.submit`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ..env import DEFAULT_STAGING, ENV_STAGING, env_size
from ..errors import GpuError
from .batch import CopyBatch
from .copy import Transfer, bytes_view
from .hostimport import HostImport
from .kernels import Kernels
from .logical import LogicalDevice
from .memory import GpuMemory, exportable_memory_types
from .physical import MEM_DEVICE_LOCAL, MEM_HOST_COHERENT, MEM_HOST_VISIBLE
from .pipeline import ComputePipeline, load_spirv
from .submit import Slot

if TYPE_CHECKING:
    from ..stream import Stream

#: device copies of at least this many bytes run as a shader (H100: the copy engine is ahead
#: at 1 MiB, 39 vs 32 GB/s; the shader at 16 MiB, 391 vs 262, and at 64 MiB, 714 vs 367)
SHADER_COPY_MIN = 1 << 20

__all__ = ["VulkanDevice"]


class VulkanDevice(LogicalDevice):
    """One Vulkan logical device with a compute queue, for one PE, and its engines.

    ``validation=True`` loads the Khronos validation layer and records its warnings and errors
    (:attr:`validation_messages`, :attr:`validation_errors`), including leak reports at
    :meth:`close`. ``staging_size`` (default ``VKSHMEM_GPU_STAGING_SIZE`` or 8 MiB) is the
    persistent host-visible buffer that :meth:`write`/:meth:`read` go through, in two halves
    so that filling one overlaps the GPU's copy of the other.
    """

    def __init__(self, index: int | None = None, validation: bool = False, *,
                 local_rank: int = 0, timeout: float | None = None,
                 staging_size: int | None = None) -> None:
        self._pipelines: dict[str, ComputePipeline] = {}
        self._transfer: Transfer | None = None
        self._batch: CopyBatch | None = None
        self._kernels: Kernels | None = None
        self._exportable_types: int | None = None
        #: the open :class:`~vkshmem.gpu.stream.Stream` objects of this device: a stream lives
        #: until it is closed or the device closes (first)
        self.streams: set[Stream] = set()
        super().__init__(index, validation, local_rank=local_rank, timeout=timeout)
        #: device copies of at least this many bytes run as copy.comp (:meth:`shader_copies`):
        #: SHADER_COPY_MIN on GPUs, never on CPU drivers (their copy engine is a memcpy, their
        #: shaders slow)
        self.shader_copy_min = 1 << 62 if self.info.is_cpu else SHADER_COPY_MIN
        try:
            size = staging_size if staging_size is not None else env_size(ENV_STAGING,
                                                                           DEFAULT_STAGING)
            self._transfer = Transfer(self, size)
        except BaseException:
            self.close()
            raise

    # -- properties -------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def vendor(self) -> str:
        return self.info.vendor

    @property
    def driver(self) -> str:
        return f"{self.info.driver_name} {self.info.driver_info}".strip()

    @property
    def uuid(self) -> bytes:
        """The 16-byte device UUID (peers must match it to import each other's memory)."""
        return self.info.device_uuid

    @property
    def has_external_memory_fd(self) -> bool:
        return self.info.external_memory_fd

    @property
    def has_dma_buf(self) -> bool:
        return self.info.dma_buf

    @property
    def has_buffer_device_address(self) -> bool:
        return self.info.buffer_device_address

    @property
    def has_int64_atomics(self) -> bool:
        return self.info.int64_atomics

    @property
    def has_device_local_host_visible(self) -> bool:
        return self.info.device_local_host_visible

    @property
    def can_map_exportable(self) -> bool:
        """Whether exportable memory (a symmetric segment) can be device-local and mapped:
        True on lavapipe; False on an H100 (driver 580), whose DEVICE_LOCAL|HOST_VISIBLE type
        is not offered for exportable buffers, so its segments are reached by staging copies
        and shaders only."""
        if self._exportable_types is None:
            self._exportable_types = exportable_memory_types(self)
        want = MEM_DEVICE_LOCAL | MEM_HOST_VISIBLE | MEM_HOST_COHERENT
        return any(self.info.memory_types[i][0] & want == want
                   for i in range(len(self.info.memory_types))
                   if self._exportable_types & (1 << i))

    @property
    def validation_messages(self) -> list[tuple[str, str, str]]:
        """(severity, message id, text) of every validation warning and error so far."""
        return list(self._messenger.messages) if self._messenger else []

    @property
    def validation_errors(self) -> list[str]:
        """Validation-layer errors so far (empty without ``validation=True``)."""
        return self._messenger.errors if self._messenger else []

    def __repr__(self) -> str:
        return f"<VulkanDevice {self.info.index}: {self.info.name} ({self.driver})>"

    # -- copies (see copy.py) ---------------------------------------------------------------

    @property
    def transfer(self) -> Transfer:
        if self._transfer is None:
            raise GpuError("the device is closed")
        return self._transfer

    def write(self, mem: GpuMemory, offset: int, src: Any, *, timeout: float | None = None,
              direct: bool = False) -> None:
        """Copy the bytes of ``src`` (any contiguous buffer) into ``mem`` at ``offset``
        through the staging buffer, ordered after all GPU work submitted before it.
        ``direct=True`` copies through the mapping instead (host-visible memory only; not
        ordered with GPU work in flight; ~100x faster for small data on lavapipe)."""
        if direct:
            self.transfer.write_direct(mem, offset, src)
        else:
            self.transfer.write(mem, offset, src, timeout)

    def read(self, mem: GpuMemory, offset: int, dst: Any, *, timeout: float | None = None,
             direct: bool = False) -> None:
        """Fill ``dst`` (a writable contiguous buffer) from ``mem`` at ``offset`` (``direct``
        as in :meth:`write`)."""
        if direct:
            self.transfer.read_direct(mem, offset, dst)
        else:
            self.transfer.read(mem, offset, dst, timeout)

    def register_host(self, address: int, size: int) -> HostImport:
        """Import ``size`` bytes of host memory at ``address`` for good (it must stay mapped
        until the device closes): copies from and to it are one DMA each. Raises GpuError or
        FeatureNotAvailableError where the driver cannot."""
        return self.transfer.register_host(address, size)

    def copy(self, dst: GpuMemory, dst_offset: int, src: GpuMemory, src_offset: int,
             nbytes: int, *, timeout: float | None = None) -> None:
        """Device-to-device copy (either side may be imported peer memory); overlapping
        ranges of one allocation are copied as memmove does. From ``SHADER_COPY_MIN`` bytes,
        disjoint copies between GPU allocations run as a compute shader (copy.comp), which
        moves about twice what the copy engine does on an H100 (not on CPU drivers, where the
        copy engine is a memcpy and shaders are slow)."""
        if self.shader_copies(dst, dst_offset, src, src_offset, nbytes):
            self.kernels.shader_copy(dst, dst_offset, src, src_offset, nbytes, timeout=timeout)
            return
        self.transfer.copy(dst, dst_offset, src, src_offset, nbytes, timeout)

    def shader_copies(self, dst: Any, dst_offset: int, src: Any, src_offset: int,
                      nbytes: int) -> bool:
        """Whether a device copy of ``nbytes`` runs as copy.comp rather than on the copy
        engine: from :attr:`shader_copy_min` bytes, between disjoint ranges of GPU allocations
        (blocking copies, batched ones and a :class:`~vkshmem.gpu.stream.Stream`'s alike)."""
        return (nbytes >= self.shader_copy_min and isinstance(dst, GpuMemory)
                and isinstance(src, GpuMemory) and (
                    dst.memory != src.memory or dst_offset + nbytes <= src_offset
                    or src_offset + nbytes <= dst_offset))

    # -- non-blocking copies (see batch.py) -------------------------------------------------

    def copy_nbi(self, dst: GpuMemory | HostImport, dst_offset: int,
                 src: GpuMemory | HostImport, src_offset: int, nbytes: int, *,
                 timeout: float | None = None) -> None:
        """Start a copy that :meth:`quiet_nbi` completes (batched with other such copies into
        one submission). Overlapping ranges and shader-sized copies between GPU allocations
        (see :meth:`copy`) are done at once instead."""
        dst.check_range(dst_offset, nbytes, "copy destination")
        src.check_range(src_offset, nbytes, "copy source")
        if nbytes == 0:
            return
        if (dst.memory == src.memory and dst_offset < src_offset + nbytes
                and src_offset < dst_offset + nbytes) or self.shader_copies(
                    dst, dst_offset, src, src_offset, nbytes):
            self.copy(dst, dst_offset, src, src_offset, nbytes,  # type: ignore[arg-type]
                      timeout=timeout)
            return
        batch = self._batch
        if batch is None:
            self.check_open()
            with self.lock:
                if self._batch is None:
                    self._batch = CopyBatch(self)
                batch = self._batch
        batch.add(dst.buffer, dst_offset, src.buffer, src_offset, nbytes, timeout)

    def write_nbi(self, mem: GpuMemory, offset: int, src: Any, *,
                  timeout: float | None = None) -> None:
        """Start copying host bytes into ``mem``: batched (:meth:`copy_nbi`) when ``src`` lies
        in imported host memory (:meth:`register_host`), else :meth:`write` (complete on
        return)."""
        view = bytes_view(src, writable=False)
        imp, at = self.transfer.host_range(view)
        if imp is None:
            self.write(mem, offset, view, timeout=timeout)
        else:
            self.copy_nbi(mem, offset, imp, at, view.nbytes, timeout=timeout)

    def read_nbi(self, mem: GpuMemory, offset: int, dst: Any, *,
                 timeout: float | None = None) -> None:
        """Start copying ``mem`` into host bytes ``dst``: batched when ``dst`` lies in imported
        host memory, else :meth:`read` (complete on return)."""
        view = bytes_view(dst, writable=True)
        imp, at = self.transfer.host_range(view)
        if imp is None:
            self.read(mem, offset, view, timeout=timeout)
        else:
            self.copy_nbi(imp, at, mem, offset, view.nbytes, timeout=timeout)

    def flush_nbi(self, timeout: float | None = None) -> None:
        """Submit the copies :meth:`copy_nbi` batched so far without waiting for them
        (:meth:`quiet_nbi` still completes them)."""
        if self._batch is not None:
            self._batch.flush(timeout)

    def quiet_nbi(self, timeout: float | None = None) -> None:
        """Complete every copy started by :meth:`copy_nbi` (GpuTimeoutError after
        ``timeout``)."""
        if self._batch is not None:
            self._batch.quiet(timeout)

    # -- shaders (see pipeline.py, kernels.py) -----------------------------------------------

    def pipeline(self, name: str) -> ComputePipeline:
        """The compute pipeline of the shipped shader ``name`` (e.g. ``"amo_u64"``), cached."""
        with self.lock:
            pipe = self._pipelines.get(name)
            if pipe is None:
                pipe = ComputePipeline(self, load_spirv(name), name=name)
                self._pipelines[name] = pipe
            return pipe

    @property
    def kernels(self) -> Kernels:
        with self.lock:
            if self._kernels is None:
                self._kernels = Kernels(self, self.pipeline)
            return self._kernels

    def amo(self, mem: GpuMemory, offset: int, op: int, width: int, operand: int = 0,
            compare: int = 0, *, timeout: float | None = None) -> int:
        """Apply one AMO (:class:`~vkshmem.core.transports.contract.AmoOp`) to the ``width``-byte
        word at
        ``offset`` of ``mem`` with a shader atomic; returns the old value (unsigned)."""
        return self.kernels.amo(mem, offset, op, width, operand, compare, timeout=timeout)

    def reduce(self, dst: GpuMemory, dst_offset: int, src: GpuMemory, src_offset: int,
               count: int, op: str, dtype: Any, *, timeout: float | None = None) -> None:
        """In place ``dst[i] = op(dst[i], src[i])`` for ``count`` elements of ``dtype``."""
        self.kernels.reduce(dst, dst_offset, src, src_offset, count, op, dtype,
                            timeout=timeout)

    # -- command buffers and fences ---------------------------------------------------------

    def slot(self, name: str, launch: bool = False) -> Slot:
        """A command buffer with its own fence (see :class:`Slot`), submitted to the first
        queue, or with ``launch`` to the launch queue of user kernels."""
        return Slot(self, name, launch)

    # -- teardown ---------------------------------------------------------------------------

    def close(self) -> None:
        """Free every pipeline, allocation, command buffer and the device and instance.

        Waits (up to the timeout) for work in flight; memory whose :meth:`GpuMemory.map` view
        is still exported (numpy arrays on it) cannot be unmapped safely, so it and the device
        are left alive with a warning rather than freed under those arrays."""
        if self._closed:
            return
        for stream in list(self.streams):
            try:
                stream.close()
            except Exception as exc:  # its work outlived the timeout: the device goes anyway
                logging.getLogger("vkshmem.gpu").warning("closing %r: %s", stream, exc)
        with self.lock:
            if self._batch is not None:
                self._batch.close()
                self._batch = None
            if self._kernels is not None:
                self._kernels.close()
                self._kernels = None
            for pipe in list(self._pipelines.values()):
                pipe.close()
            self._pipelines.clear()
            if self._transfer is not None:
                self._transfer.close()
                self._transfer = None
            super().close()

    def __enter__(self) -> VulkanDevice:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
