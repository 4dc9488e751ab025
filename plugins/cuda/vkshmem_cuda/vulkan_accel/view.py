"""The Vulkan heap seen by CUDA, for DLPack and ``__cuda_array_interface__`` on NVIDIA.

NVIDIA's CUDA driver imports a Vulkan opaque fd of memory on the same GPU
(``cuImportExternalMemory`` with ``CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD``, the device
matched by UUID) and maps it as a CUDA device pointer (``cuExternalMemoryGetMappedBuffer``).
:class:`CudaView` does that once for this PE's heap, on the first ``__dlpack__`` of a
:class:`~vkshmem.gpu.array.DeviceArray`, through ``cuda-bindings`` (``pip install
cuda-bindings``); then ``torch.from_dlpack(a)``, ``cupy.from_dlpack(a)`` and
``cupy.asarray(a)`` view the array without a copy, and ``shmem.from_dlpack`` finds such
tensors in the heap again.

Synchronisation: vkshmem's own GPU operations are complete when they return (or at ``quiet``
for batched non-blocking ones), so CUDA work issued afterwards sees their data; synchronize
your CUDA streams before vkshmem reads what CUDA wrote.

Elsewhere (no NVIDIA driver, no ``cuda-bindings``, a device CUDA does not list, a driver that
refuses the import) the export raises ``BufferError`` saying why.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from vkshmem.plugin import GpuMemory

from ..vmm import device_by_uuid, map_handle, posix_fd_type

if TYPE_CHECKING:
    from ..vmm import VmmHeap

__all__ = ["CudaView"]


class CudaView:
    """``memory`` (exportable Vulkan memory) mapped into CUDA on the device whose UUID is
    ``device_uuid``: ``pointer`` (a CUDA device address of byte 0), ``ordinal`` (the CUDA
    device), ``size``; where the memory is CUDA's own (``vmm``), its mapping. Raises
    BufferError where it cannot be made."""

    def __init__(self, memory: GpuMemory, device_uuid: bytes,
                 vmm: VmmHeap | None = None) -> None:
        try:
            from cuda.bindings import driver as cu
        except ImportError as exc:
            raise BufferError("viewing the Vulkan heap from CUDA needs cuda-bindings (pip "
                              f"install cuda-bindings): {exc}") from None
        self._cu = cu
        self.memory = memory
        self.pointer = 0
        self._own = False
        self.size = memory.allocation_size
        self._ext: Any = None
        self._ctx: Any = None
        self._dev: Any = None
        self.check(cu.cuInit(0), "cuInit")
        found = device_by_uuid(cu, device_uuid, self.check)
        if found is None:
            raise BufferError(f"no CUDA device has the Vulkan device's UUID "
                              f"{bytes(device_uuid).hex()}")
        self.ordinal, self._dev = found
        self._ctx = self.check(cu.cuDevicePrimaryCtxRetain(self._dev),
                                "cuDevicePrimaryCtxRetain")
        self._own = vmm is None  # the pointer is this view's import (else the heap's own)
        try:
            self.make_current()
            if vmm is not None:
                self.pointer = vmm.va
            else:
                self._ext, self.pointer = self.import_fd(memory.export_fd(), self.size,
                                                         memory.dedicated)
        except BaseException:
            self.close()
            raise

    @property
    def cu(self) -> Any:
        """The ``cuda.bindings.driver`` module."""
        return self._cu

    @property
    def context(self) -> Any:
        """The device's primary context (``CUcontext``; ``int()`` of it is the handle)."""
        return self._ctx

    @property
    def device(self) -> Any:
        """The CUDA device (``CUdevice``)."""
        return self._dev

    def make_current(self) -> None:
        """Make the device's primary context current on the calling thread."""
        self.check(self._cu.cuCtxSetCurrent(self._ctx), "cuCtxSetCurrent")

    def import_fd(self, fd: int, size: int, dedicated: bool, vmm: bool = False
                  ) -> tuple[Any, int]:
        """Import an opaque fd of Vulkan memory on this device (CUDA owns ``fd`` once this
        succeeds; closed here when it fails), or with ``vmm`` map CUDA's fd of a VMM
        allocation (on any GPU this one reaches: NVLink, PCIe peer access; closed here):
        (a handle for :meth:`release`, the CUDA address)."""
        cu = self._cu
        if vmm:
            try:
                self.make_current()
                handle = self.check(cu.cuMemImportFromShareableHandle(fd, posix_fd_type(cu)),
                                    "cuMemImportFromShareableHandle")
            finally:
                os.close(fd)
            try:
                va = map_handle(cu, handle, size, (self.ordinal,), self.check)
            except BaseException:
                cu.cuMemRelease(handle)
                raise
            return (handle, size), va
        self.make_current()
        desc = cu.CUDA_EXTERNAL_MEMORY_HANDLE_DESC()
        desc.type = cu.CUexternalMemoryHandleType.CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD
        desc.handle.fd = fd
        desc.size = size
        desc.flags = cu.CUDA_EXTERNAL_MEMORY_DEDICATED if dedicated else 0
        try:
            ext = self.check(cu.cuImportExternalMemory(desc), "cuImportExternalMemory")
        except BufferError:
            os.close(fd)
            raise
        buf = cu.CUDA_EXTERNAL_MEMORY_BUFFER_DESC()
        buf.offset = 0
        buf.size = size
        buf.flags = 0
        try:
            ptr = int(self.check(cu.cuExternalMemoryGetMappedBuffer(ext, buf),
                                  "cuExternalMemoryGetMappedBuffer"))
        except BaseException:
            cu.cuDestroyExternalMemory(ext)
            raise
        return ext, ptr

    def release(self, handle: Any, pointer: int) -> None:
        """Undo :meth:`import_fd` (``handle`` and ``pointer`` are what it returned)."""
        cu = self._cu
        self.make_current()
        if isinstance(handle, tuple):  # a VMM mapping
            cu.cuMemUnmap(pointer, handle[1])
            cu.cuMemAddressFree(pointer, handle[1])
            cu.cuMemRelease(handle[0])
        else:
            cu.cuMemFree(pointer)
            cu.cuDestroyExternalMemory(handle)

    def check(self, res: Any, what: str, error: type[Exception] = BufferError,
              doing: str = "viewing the Vulkan heap from CUDA") -> Any:
        """``res`` is a cuda-bindings result tuple: its values, or ``error`` naming the call."""
        cu = self._cu
        err, *values = res if isinstance(res, tuple) else (res,)
        if err != cu.CUresult.CUDA_SUCCESS:
            _e, name = cu.cuGetErrorName(err)
            raise error(f"{doing}: {what} failed: "
                        f"{name.decode() if isinstance(name, bytes) else err}")
        return values[0] if len(values) == 1 else values

    def close(self) -> None:
        """Unmap and release the import and the context (idempotent)."""
        cu = self._cu
        if self._ctx is not None:
            cu.cuCtxSetCurrent(self._ctx)
        if self.pointer and self._own:
            cu.cuMemFree(self.pointer)
        self.pointer = 0
        if self._ext is not None:
            cu.cuDestroyExternalMemory(self._ext)
            self._ext = None
        if self._ctx is not None:
            cu.cuDevicePrimaryCtxRelease(self._dev)
            self._ctx = None
