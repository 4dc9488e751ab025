"""The CUDA driver API through ``cuda-bindings`` (``cuda.bindings.driver``), as this plugin uses
it: results checked into :class:`CudaError`, VMM allocations exported and imported as POSIX
fds, synchronous copies, and a one-thread kernel for AMOs (compiled by NVRTC at first use).

Every function makes the domain's context current first: the core's proxy thread and the
application's thread both call into the domain.
"""

from __future__ import annotations

import ctypes
import os
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from vkshmem.core.errors import FeatureNotAvailableError, VkshmemError

__all__ = ["CudaError", "Device", "Mapping", "check", "device_count", "host_address"]


class CudaError(VkshmemError):
    """A CUDA driver call failed; ``result`` is its CUresult."""

    def __init__(self, message: str, result: Any = None) -> None:
        self.result = result
        super().__init__(message)


def _cu() -> Any:
    try:
        from cuda.bindings import driver
    except ImportError as exc:
        raise FeatureNotAvailableError(
            f"the cuda domain needs cuda-bindings (pip install cuda-bindings): {exc}") from None
    return driver


def check(res: Any, what: str) -> Any:
    """``res`` is the binding's tuple (CUresult, values...): the values, or CudaError."""
    cu = _cu()
    err, *values = res if isinstance(res, tuple) else (res,)
    if err != cu.CUresult.CUDA_SUCCESS:
        _e, name = cu.cuGetErrorName(err)
        raise CudaError(f"{what} failed: {name.decode() if isinstance(name, bytes) else err}",
                        err)
    return values[0] if len(values) == 1 else values


def device_count() -> int:
    """GPUs the CUDA driver sees (0 without the binding, the driver or a GPU)."""
    try:
        cu = _cu()
        if cu.cuInit(0)[0] != cu.CUresult.CUDA_SUCCESS:
            return 0
        err, n = cu.cuDeviceGetCount()
        return int(n) if err == cu.CUresult.CUDA_SUCCESS else 0
    except Exception:  # the binding raises its own errors when libcuda.so is missing
        return 0


def host_address(buf: Any) -> int:
    """The address of a host buffer (read-only ones included)."""
    return int(np.frombuffer(buf, np.uint8).ctypes.data) if memoryview(buf).nbytes else 0


@dataclass
class Mapping:
    """A VMM allocation mapped at ``va`` (this PE's own, or a peer's imported one)."""

    va: int
    size: int
    handle: Any
    own: bool


_AMO_SOURCE = r"""
typedef unsigned long long u64;
extern "C" __global__ void vkshmem_amo(u64 addr, int op, int width, u64 operand, u64 compare,
                                       u64 *out) {
    u64 old = 0;
    if (width == 8) {
        u64 *p = (u64 *)addr;
        switch (op) {
        case 0: old = atomicAdd(p, 0ull); break;                 /* FETCH */
        case 1: case 2: old = atomicExch(p, operand); break;    /* SET, SWAP */
        case 3: old = atomicCAS(p, compare, operand); break;    /* CSWAP */
        case 4: old = atomicAdd(p, operand); break;
        case 5: old = atomicAnd(p, operand); break;
        case 6: old = atomicOr(p, operand); break;
        case 7: old = atomicXor(p, operand); break;
        }
    } else {
        unsigned *p = (unsigned *)addr;
        unsigned v = (unsigned)operand, c = (unsigned)compare;
        switch (op) {
        case 0: old = atomicAdd(p, 0u); break;
        case 1: case 2: old = atomicExch(p, v); break;
        case 3: old = atomicCAS(p, c, v); break;
        case 4: old = atomicAdd(p, v); break;
        case 5: old = atomicAnd(p, v); break;
        case 6: old = atomicOr(p, v); break;
        case 7: old = atomicXor(p, v); break;
        }
    }
    *out = old;
}
"""


class Device:
    """One GPU's primary context, its VMM allocations and the AMO kernel."""

    def __init__(self, ordinal: int) -> None:
        cu = self.cu = _cu()
        if device_count() == 0:
            raise FeatureNotAvailableError(
                "the cuda domain found no CUDA GPU (no NVIDIA driver, libcuda.so, or GPU on "
                "this machine); use domain='vulkan', or VKSHMEM_GPU_PROVIDER=vulkan")
        check(cu.cuInit(0), "cuInit")
        n = check(cu.cuDeviceGetCount(), "cuDeviceGetCount")
        if not 0 <= ordinal < n:
            raise FeatureNotAvailableError(f"CUDA device {ordinal} does not exist ({n} GPUs; "
                                           "VKSHMEM_CUDA_DEVICE picks one)")
        self.ordinal = ordinal
        self.dev = check(cu.cuDeviceGet(ordinal), "cuDeviceGet")
        self.ctx = check(cu.cuDevicePrimaryCtxRetain(self.dev), "cuDevicePrimaryCtxRetain")
        self.current()
        name = check(cu.cuDeviceGetName(256, self.dev), "cuDeviceGetName")
        self.name = name.split(b"\0", 1)[0].decode()
        self.uuid = bytes(check(cu.cuDeviceGetUuid(self.dev), "cuDeviceGetUuid").bytes)
        prop = cu.CUmemAllocationProp()
        prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        prop.location.id = ordinal
        prop.requestedHandleTypes = _FD(cu)
        self.prop = prop
        self.granularity = int(check(cu.cuMemGetAllocationGranularity(
            prop, cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
            "cuMemGetAllocationGranularity"))
        self._amo_fn: Any = None
        self._amo_out = 0
        #: this domain's stream (not the legacy default stream, which every thread shares)
        self.stream = check(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING),
                            "cuStreamCreate")
        self._amo_result = np.zeros(1, np.uint64)
        self._amo_lock = threading.Lock()  # the result buffer: the proxy thread also calls

    def current(self) -> None:
        """Make this device's primary context current on the calling thread."""
        check(self.cu.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")

    def round_up(self, size: int) -> int:
        g = self.granularity
        return -(-size // g) * g

    # -- VMM ---------------------------------------------------------------------------------

    def _map(self, handle: Any, size: int, own: bool) -> Mapping:
        cu = self.cu
        va = check(cu.cuMemAddressReserve(size, 0, 0, 0), "cuMemAddressReserve")
        try:
            check(cu.cuMemMap(va, size, 0, handle, 0), "cuMemMap")
            desc = cu.CUmemAccessDesc()
            desc.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
            desc.location.id = self.ordinal
            desc.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
            try:
                check(cu.cuMemSetAccess(va, size, [desc], 1),
                       f"cuMemSetAccess for GPU {self.ordinal}")
            except BaseException:
                cu.cuMemUnmap(va, size)
                raise
        except BaseException:
            cu.cuMemAddressFree(va, size)
            raise
        return Mapping(int(va), size, handle, own)

    def create(self, size: int) -> tuple[Mapping, int]:
        """A new allocation of ``size`` bytes (a multiple of the granularity) mapped here, and
        its exported POSIX fd (owned by the caller)."""
        self.current()
        cu = self.cu
        handle = check(cu.cuMemCreate(size, self.prop, 0), f"cuMemCreate({size})")
        try:
            fd = int(check(cu.cuMemExportToShareableHandle(handle, _FD(cu), 0),
                            "cuMemExportToShareableHandle"))
            try:
                mapping = self._map(handle, size, True)
            except BaseException:
                os.close(fd)
                raise
        except BaseException:
            cu.cuMemRelease(handle)
            raise
        return mapping, fd

    def import_fd(self, fd: int, size: int) -> Mapping:
        """Map another PE's allocation from its fd (closed here) on this GPU."""
        self.current()
        cu = self.cu
        try:
            handle = check(cu.cuMemImportFromShareableHandle(fd, _FD(cu)),
                            "cuMemImportFromShareableHandle")
        finally:
            os.close(fd)
        try:
            return self._map(handle, size, False)
        except BaseException:
            cu.cuMemRelease(handle)
            raise

    def export_dmabuf(self, m: Mapping) -> int:
        """A dma-buf fd of allocation ``m`` (owned by the caller), for RDMA NICs
        (``ibv_reg_dmabuf_mr``); CudaError where the driver or GPU cannot export one."""
        self.current()
        cu = self.cu
        supported = check(cu.cuDeviceGetAttribute(
            cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, self.dev),
            "cuDeviceGetAttribute(DMA_BUF_SUPPORTED)")
        if not supported:
            raise CudaError(f"GPU {self.ordinal} cannot export dma-buf fds (driver or kernel)")
        kind = cu.CUmemRangeHandleType.CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD
        return int(check(cu.cuMemGetHandleForAddressRange(m.va, m.size, kind, 0),
                         "cuMemGetHandleForAddressRange(DMA_BUF_FD)"))

    def release(self, m: Mapping) -> None:
        self.current()
        self.cu.cuMemUnmap(m.va, m.size)
        self.cu.cuMemAddressFree(m.va, m.size)
        self.cu.cuMemRelease(m.handle)

    # -- copies and atomics ----------------------------------------------------------------------

    # Every copy is an asynchronous copy on the device's own stream and a synchronize of that
    # stream (vkshmem's GPU operations are complete when they return): two calls, where the
    # synchronous cuMemcpy* forms cost about twice as much (and cuMemcpyHtoD/DtoD may return
    # before their data landed).

    def htod(self, dst: int, src: Any, nbytes: int) -> None:
        self.current()
        s = self.stream
        check(self.cu.cuMemcpyHtoDAsync(dst, host_address(src), nbytes, s), "cuMemcpyHtoD")
        check(self.cu.cuStreamSynchronize(s), "cuStreamSynchronize")

    def dtoh(self, dst: Any, src: int, nbytes: int) -> None:
        self.current()
        s = self.stream
        check(self.cu.cuMemcpyDtoHAsync(host_address(dst), src, nbytes, s), "cuMemcpyDtoH")
        check(self.cu.cuStreamSynchronize(s), "cuStreamSynchronize")

    def dtod(self, dst: int, src: int, nbytes: int) -> None:
        self.current()
        s = self.stream
        check(self.cu.cuMemcpyDtoDAsync(dst, src, nbytes, s), "cuMemcpyDtoD")
        check(self.cu.cuStreamSynchronize(s), "cuStreamSynchronize")

    def zero(self, dst: int, nbytes: int) -> None:
        self.current()
        s = self.stream
        check(self.cu.cuMemsetD8Async(dst, 0, nbytes, s), "cuMemsetD8")
        check(self.cu.cuStreamSynchronize(s), "cuStreamSynchronize")

    def register_host(self, address: int, size: int) -> None:
        """Pin host memory for DMA (copies between it and the GPU need no staging)."""
        self.current()
        check(self.cu.cuMemHostRegister(address, size, 0), "cuMemHostRegister")

    def unregister_host(self, address: int) -> None:
        self.current()
        self.cu.cuMemHostUnregister(address)

    def amo(self, addr: int, op: int, width: int, operand: int, compare: int) -> int:
        """One AMO by a one-thread kernel (atomic with every GPU atomic on the word)."""
        with self._amo_lock:
            return self._amo(addr, op, width, operand, compare)

    def _amo(self, addr: int, op: int, width: int, operand: int, compare: int) -> int:
        self.current()
        cu = self.cu
        if self._amo_fn is None:
            self._amo_fn = self._compile_amo()
            self._amo_out = int(check(cu.cuMemAlloc(8), "cuMemAlloc"))
        args = ((addr, op, width, operand, compare, self._amo_out),
                (ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_ulonglong,
                 ctypes.c_ulonglong, ctypes.c_void_p))
        s = self.stream
        check(cu.cuLaunchKernel(self._amo_fn, 1, 1, 1, 1, 1, 1, 0, s, args, 0), "AMO launch")
        out = self._amo_result
        check(cu.cuMemcpyDtoHAsync(out.ctypes.data, self._amo_out, 8, s), "AMO result")
        check(cu.cuStreamSynchronize(s), "cuStreamSynchronize")
        return int(out[0])

    def _compile_amo(self) -> Any:
        cu = self.cu
        try:
            from cuda.bindings import nvrtc
        except ImportError as exc:
            raise FeatureNotAvailableError(f"AMOs on CUDA memory need NVRTC: {exc}") from None
        attr = cu.CUdevice_attribute
        major = check(cu.cuDeviceGetAttribute(
            attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, self.dev), "compute capability")
        minor = check(cu.cuDeviceGetAttribute(
            attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, self.dev), "compute capability")
        err, prog = nvrtc.nvrtcCreateProgram(_AMO_SOURCE.encode(), b"vkshmem_amo.cu", 0, [], [])
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise FeatureNotAvailableError(f"NVRTC could not start ({err}): install "
                                           "nvidia-cuda-nvrtc for AMOs on CUDA memory")
        opts = [f"--gpu-architecture=compute_{major}{minor}".encode()]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            _e, n = nvrtc.nvrtcGetProgramLogSize(prog)
            log = b" " * n
            nvrtc.nvrtcGetProgramLog(prog, log)
            raise CudaError(f"NVRTC could not compile the AMO kernel: {log.decode()}", err)
        _e, n = nvrtc.nvrtcGetPTXSize(prog)
        ptx = b" " * n
        nvrtc.nvrtcGetPTX(prog, ptx)
        nvrtc.nvrtcDestroyProgram(prog)
        module = check(cu.cuModuleLoadData(ptx), "cuModuleLoadData (AMO kernel)")
        return check(cu.cuModuleGetFunction(module, b"vkshmem_amo"), "cuModuleGetFunction")

    def close(self) -> None:
        """Release the AMO scratch and the primary context (allocations are released by their
        owner first)."""
        cu = self.cu
        self.current()
        if self._amo_out:
            cu.cuMemFree(self._amo_out)
            self._amo_out = 0
        cu.cuStreamDestroy(self.stream)
        cu.cuDevicePrimaryCtxRelease(self.dev)


def _FD(cu: Any) -> Any:
    return cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
