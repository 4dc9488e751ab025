"""The Vulkan domain's heap from CUDA's virtual memory management, on NVIDIA.

Vulkan memory cannot be mapped by another GPU, nor can CUDA's import of it
(``tests/gpu/vulkan_cuda_peer_probe.py``); a CUDA VMM allocation can. So where CUDA is usable
(``VKSHMEM_GPU_CUDA_HEAP``) the heap is a :class:`VmmHeap`: ``cuMemCreate`` on the GPU whose
UUID the Vulkan device has, with POSIX-fd handles, mapped on that GPU, and imported into Vulkan
as an opaque fd (device-local; the CPU-mapped BAR type where the domain takes it). Vulkan's
shaders and copies and CUDA's copies and kernels then work on the same bytes, and the fds
handed to peers are CUDA's: a same-GPU peer imports one into Vulkan as before, a peer on
another GPU maps it there (``cuMemImportFromShareableHandle`` + ``cuMemMap`` +
``cuMemSetAccess``) and copies across NVLink in one step.

Measured on 2 x H100 (driver 580, ``tests/gpu/vmm_heap_probe.py``): Vulkan imports such an
fd into the device-local and the BAR type, each side sees the other's writes (and the CPU's,
through the mapping), a Vulkan copy on it moves what one on Vulkan's own memory moves (1068
against 1112 GB/s), and the other GPU copies into and out of it at 389 / 390 GB/s at 256 MiB,
what a copy between two CUDA allocations moves.
"""

from __future__ import annotations

from typing import Any

from vkshmem.plugin import GpuError

__all__ = ["VmmHeap", "device_by_uuid", "map_handle", "posix_fd_type"]


def posix_fd_type(cu: Any) -> Any:
    """CUDA's POSIX-fd shareable handle type."""
    return cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR


def device_by_uuid(cu: Any, uuid: bytes, check: Any) -> tuple[int, Any] | None:
    """The CUDA device with this UUID (a Vulkan device's ``device_uuid``): (ordinal,
    ``CUdevice``), or None where CUDA lists none. ``check(result, what)`` raises."""
    for ordinal in range(check(cu.cuDeviceGetCount(), "cuDeviceGetCount")):
        dev = check(cu.cuDeviceGet(ordinal), "cuDeviceGet")
        if bytes(check(cu.cuDeviceGetUuid(dev), "cuDeviceGetUuid").bytes) == bytes(uuid):
            return ordinal, dev
    return None


def map_handle(cu: Any, handle: Any, size: int, ordinals: tuple[int, ...],
               check: Any) -> int:
    """Reserve ``size`` bytes of address space, map the allocation ``handle`` there and let the
    GPUs ``ordinals`` read and write it: the address. ``check(result, what)`` raises."""
    va = int(check(cu.cuMemAddressReserve(size, 0, 0, 0), "cuMemAddressReserve"))
    try:
        check(cu.cuMemMap(va, size, 0, handle, 0), "cuMemMap")
        descs = []
        for ordinal in ordinals:
            d = cu.CUmemAccessDesc()
            d.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
            d.location.id = ordinal
            d.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
            descs.append(d)
        try:
            check(cu.cuMemSetAccess(va, size, descs, len(descs)),
                  f"cuMemSetAccess for GPU {', '.join(map(str, ordinals))}")
        except BaseException:
            cu.cuMemUnmap(va, size)
            raise
    except BaseException:
        cu.cuMemAddressFree(va, size)
        raise
    return va


class VmmHeap:
    """``size`` bytes (rounded up to CUDA's granularity: :attr:`size`) of VMM memory on the
    GPU whose UUID is ``device_uuid``, mapped at :attr:`va` there. GpuError saying why where
    it cannot be made (no cuda-bindings, no such GPU, out of memory)."""

    #: for the Vulkan domain's message where Vulkan refuses the import
    origin = "CUDA"
    skip_hint = "VKSHMEM_GPU_CUDA_HEAP=0 skips the attempt"

    def __init__(self, device_uuid: bytes, size: int) -> None:
        try:
            from cuda.bindings import driver as cu
        except ImportError as exc:
            raise GpuError(f"a CUDA heap needs cuda-bindings: {exc}") from None
        self.cu = cu
        self.va = 0
        self._handle: Any = None
        self._dev: Any = None
        self._check(cu.cuInit(0), "cuInit")
        found = device_by_uuid(cu, device_uuid, self._check)
        if found is None:
            raise GpuError(f"no CUDA device has the Vulkan device's UUID "
                           f"{bytes(device_uuid).hex()}")
        self.ordinal, self._dev = found
        self.ctx = self._check(cu.cuDevicePrimaryCtxRetain(self._dev),
                               "cuDevicePrimaryCtxRetain")
        try:
            self._make(size)
        except BaseException:
            self.close()
            raise

    def _check(self, res: Any, what: str) -> Any:
        cu = self.cu
        err, *values = res if isinstance(res, tuple) else (res,)
        if err != cu.CUresult.CUDA_SUCCESS:
            _e, name = cu.cuGetErrorName(err)
            raise GpuError(f"the GPU heap from CUDA: {what} failed: "
                           f"{name.decode() if isinstance(name, bytes) else err} "
                           "(VKSHMEM_GPU_CUDA_HEAP=0 allocates it from Vulkan)")
        return values[0] if len(values) == 1 else values

    def _make(self, size: int) -> None:
        cu, check = self.cu, self._check
        prev = check(cu.cuCtxGetCurrent(), "cuCtxGetCurrent")
        check(cu.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")
        try:
            prop = cu.CUmemAllocationProp()
            prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
            prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
            prop.location.id = self.ordinal
            prop.requestedHandleTypes = posix_fd_type(cu)
            gran = int(check(cu.cuMemGetAllocationGranularity(
                prop, cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
                "cuMemGetAllocationGranularity"))
            self.size = -(-size // gran) * gran
            self._handle = check(cu.cuMemCreate(self.size, prop, 0),
                                 f"cuMemCreate({self.size}) (VKSHMEM_GPU_SYMMETRIC_SIZE)")
            self.va = map_handle(cu, self._handle, self.size, (self.ordinal,), check)
        finally:
            cu.cuCtxSetCurrent(prev)

    def zero(self, offset: int, nbytes: int) -> None:
        """Zero ``nbytes`` at ``offset`` (CUDA does not promise a new allocation is zero),
        complete on return."""
        cu, check = self.cu, self._check
        prev = check(cu.cuCtxGetCurrent(), "cuCtxGetCurrent")
        check(cu.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")
        try:
            check(cu.cuMemsetD8(self.va + offset, 0, nbytes), "cuMemsetD8")
            check(cu.cuCtxSynchronize(), "cuCtxSynchronize")
        finally:
            cu.cuCtxSetCurrent(prev)

    def export_fd(self) -> int:
        """A new POSIX fd of the allocation (the caller owns it): Vulkan imports it as an
        opaque fd, CUDA in any process with ``cuMemImportFromShareableHandle``."""
        if self._handle is None:
            raise GpuError("the CUDA heap was released")
        return int(self._check(self.cu.cuMemExportToShareableHandle(
            self._handle, posix_fd_type(self.cu), 0), "cuMemExportToShareableHandle"))

    def close(self) -> None:
        """Unmap and release the allocation and the context (idempotent). Vulkan's imports
        keep the memory alive until they are freed too."""
        cu = self.cu
        if self.va or self._handle is not None:
            _e, prev = cu.cuCtxGetCurrent()
            cu.cuCtxSetCurrent(self.ctx)
            if self.va:
                cu.cuMemUnmap(self.va, self.size)
                cu.cuMemAddressFree(self.va, self.size)
                self.va = 0
            if self._handle is not None:
                cu.cuMemRelease(self._handle)
                self._handle = None
            cu.cuCtxSetCurrent(prev)
        if self._dev is not None:
            cu.cuDevicePrimaryCtxRelease(self._dev)
            self._dev = None

