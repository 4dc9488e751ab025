"""The CUDA driver API as this plugin uses it: set-up through ``cuda-bindings``
(``cuda.bindings.driver``; results checked into :class:`CudaError`, VMM allocations exported and
imported as POSIX fds), and the per-call operations (copies, the AMO kernel of :mod:`.kernels`)
through the native helper ``_ops``, one C call each; the reduce kernel is :mod:`.reducer`'s.

Every function makes the domain's context current first: the core's proxy thread and the
application's thread both call into the domain. ``VKSHMEM_CUDA_SPIN_US`` (default 100) is how
long an operation spins on its stream before blocking.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any

from vkshmem.plugin import ConfigError, FeatureNotAvailableError, VkshmemError, address_of

from ._ops import ffi as _ffi
from ._ops import lib as _lib
from .kernels import AMO_NAME, AMO_SOURCE, compile_kernel
from .native import NativeDomain
from .vmm import map_handle

__all__ = ["CudaError", "Device", "Mapping", "check", "device_count"]


#: pageable host buffers up to this size are copied through a pinned bounce buffer
STAGE_MAX = 256 << 10


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


@dataclass
class Mapping:
    """A VMM allocation mapped at ``va`` (this PE's own, or a peer's imported one)."""

    va: int
    size: int
    handle: Any
    own: bool
    remote_gpu: bool = False  #: a peer's, on another GPU (set by the domain's import)
    pe: int = -1  #: the PE whose heap it is (set by the domain)
    cpu: int = 0  #: the CPU address it is mapped at (:mod:`.cpumap`), or 0


class Device:
    """One GPU's primary context, its VMM allocations and the AMO kernel."""

    def __init__(self, ordinal: int) -> None:
        cu = self.cu = _cu()
        self.spin_ns = int(_spin_us() * 1000)
        if device_count() == 0:
            raise FeatureNotAvailableError(
                "the cuda domain found no CUDA GPU (no NVIDIA driver, libcuda.so, or GPU on "
                "this machine); use domain='vulkan', or VKSHMEM_GPU_PROVIDER=vulkan")
        if _lib.vkc_load() != 0:
            raise FeatureNotAvailableError(
                f"the cuda domain could not load {_ffi.string(_lib.vkc_missing()).decode()} "
                "from the NVIDIA driver (libcuda.so.1)")
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
        self.sms = int(check(cu.cuDeviceGetAttribute(
            cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, self.dev),
            "multiprocessor count"))
        self.ctx_ptr = int(self.ctx)
        self._amo_fn = 0
        #: the domain proxy's native rounds, made on request
        self._native: NativeDomain | None = None
        #: copies copy_async issued, and how many of them a finished sync waited for (the
        #: application's thread and the proxy's share the stream)
        self._issued = 0
        self._synced = 0
        self._seq = 0  # the AMO kernel's completion flag (see _ops_build.vkc_amo)
        self._amo_lock = threading.Lock()  # the result word: the proxy thread also calls
        self._amo_out = _ffi.new("uint64_t *")
        #: host memory ranges pinned for DMA (no bounce buffer needed), as (address, size)
        self.pinned: list[tuple[int, int]] = []
        #: this domain's stream (not the legacy default stream, which every thread shares)
        self.stream = check(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING),
                            "cuStreamCreate")
        self.stream_ptr = int(self.stream)
        # Pinned, device-mapped host memory: the bounce buffer, then the AMO's result word.
        self._host = int(check(cu.cuMemHostAlloc(STAGE_MAX + 64, 2), "cuMemHostAlloc"))
        self.bounce = self._host
        self._result_host = self._host + STAGE_MAX
        self._result_dev = int(check(cu.cuMemHostGetDevicePointer(self._result_host, 0),
                                     "cuMemHostGetDevicePointer"))

    def current(self) -> None:
        """Make this device's primary context current on the calling thread."""
        check(self.cu.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")

    def round_up(self, size: int) -> int:
        g = self.granularity
        return -(-size // g) * g

    # -- VMM ---------------------------------------------------------------------------------

    def _map(self, handle: Any, size: int, own: bool) -> Mapping:
        return Mapping(map_handle(self.cu, handle, size, (self.ordinal,), check), size, handle,
                       own)

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

    # -- copies, atomics, reductions -----------------------------------------------------------

    # Every operation is one call into the native helper (``_ops``): the async copy (or kernel
    # launch) on the device's own stream, then a spin-then-block wait for the stream (vkshmem's
    # GPU operations are complete when they return). Pageable host buffers up to
    # ``STAGE_MAX`` bytes go through a pinned bounce buffer.

    def _done(self, res: int, what: str) -> None:
        if res:
            _e, name = self.cu.cuGetErrorName(self.cu.CUresult(res))
            raise CudaError(f"{what} failed: {name.decode() if isinstance(name, bytes) else res}",
                            res)

    def _host_pinned(self, address: int, nbytes: int) -> bool:
        return any(lo <= address and address + nbytes <= lo + n for lo, n in self.pinned)

    def htod(self, dst: int, src: Any, nbytes: int) -> None:
        self._host_copy(True, dst, address_of(src), nbytes)

    def dtoh(self, dst: Any, src: int, nbytes: int) -> None:
        self._host_copy(False, src, address_of(dst), nbytes)

    def _host_copy(self, to_device: bool, dev: int, host: int, nbytes: int) -> None:
        dst, src = (dev, host) if to_device else (host, dev)
        if nbytes <= STAGE_MAX and not self._host_pinned(host, nbytes):
            res = _lib.vkc_copy_staged(int(to_device), self.ctx_ptr, self.stream_ptr, dst, src,
                                       nbytes, self.bounce, STAGE_MAX, self.spin_ns)
        else:
            res = _lib.vkc_copy(1 if to_device else 2, self.ctx_ptr, self.stream_ptr, dst, src,
                                nbytes, self.spin_ns)
        self._done(res, "cuMemcpyHtoD" if to_device else "cuMemcpyDtoH")

    def dtod(self, dst: int, src: int, nbytes: int) -> None:
        self._done(_lib.vkc_copy(0, self.ctx_ptr, self.stream_ptr, dst, src, nbytes,
                                 self.spin_ns), "cuMemcpyDtoD")

    def copy_async(self, kind: int, dst: int, src: int, nbytes: int) -> bool:
        """Issue a copy on the stream without waiting (kind 0 device to device, 1 host to
        device, 2 device to host); :meth:`sync` completes it. Host memory must be pinned
        (:meth:`register_host`): returns False, issuing nothing, when it is not."""
        host = src if kind == 1 else dst if kind == 2 else 0
        if kind and not self._host_pinned(host, nbytes):
            return False
        self._done(_lib.vkc_copy(kind, self.ctx_ptr, self.stream_ptr, dst, src, nbytes, -1),
                   "cuMemcpyAsync")
        self._issued += 1  # after the copy is on the stream: a sync that counts it covers it
        return True

    def copy_on(self, stream: int, dst: int, src: int, nbytes: int) -> None:
        """Issue a device-to-device copy on ``stream`` (the caller waits for it there)."""
        self._done(_lib.vkc_copy(0, self.ctx_ptr, stream, dst, src, nbytes, -1),
                   "cuMemcpyDtoDAsync")

    def sync(self) -> None:
        """Wait for every copy :meth:`copy_async` issued (spin, then block). Returns at once
        only when a *finished* wait covered them all: another thread's wait still in progress
        does not count (the proxy's thread shares the stream)."""
        target = self._issued
        if self._synced >= target:
            return
        self._done(_lib.vkc_sync(self.ctx_ptr, self.stream_ptr, self.spin_ns),
                   "cuStreamSynchronize")
        self._synced = max(self._synced, target)

    def zero(self, dst: int, nbytes: int) -> None:
        self._done(_lib.vkc_memset(self.ctx_ptr, self.stream_ptr, dst, nbytes, self.spin_ns),
                   "cuMemsetD8")

    def register_host(self, address: int, size: int) -> None:
        """Pin host memory for DMA (copies between it and the GPU need no staging)."""
        self.current()
        check(self.cu.cuMemHostRegister(address, size, 0), "cuMemHostRegister")
        self.pinned.append((address, size))

    def unregister_host(self, address: int) -> None:
        self.current()
        self.cu.cuMemHostUnregister(address)
        self.pinned = [p for p in self.pinned if p[0] != address]

    def amo(self, addr: int, op: int, width: int, operand: int, compare: int) -> int:
        """One AMO by a one-thread kernel (atomic with every GPU atomic on the word); the old
        value comes back through mapped pinned memory (no copy to wait for)."""
        with self._amo_lock:  # the result word: the proxy thread also calls
            if not self._amo_fn:
                self.current()
                self._amo_fn = int(compile_kernel(self.cu, check, self.dev, AMO_SOURCE,
                                                  AMO_NAME, CudaError))
            self._seq += 1
            self._done(_lib.vkc_amo(self.ctx_ptr, self.stream_ptr, self._amo_fn, addr, op,
                                    width, operand, compare, self._result_dev,
                                    self._result_host, self._seq, self._amo_out,
                                    self.spin_ns), "AMO")
            return int(self._amo_out[0])

    def native_ops(self, address: int, base: int, size: int) -> None:
        """Fill the core's ``struct vk_domain_ops`` at ``address`` for the domain proxy's
        native rounds on the segment at device address ``base`` (made once, released by
        :meth:`close`)."""
        self.current()
        if self._native is None:
            with self._amo_lock:
                if not self._amo_fn:
                    self._amo_fn = int(compile_kernel(self.cu, check, self.dev, AMO_SOURCE,
                                                      AMO_NAME, CudaError))
            self._native = NativeDomain(self.cu, _ffi, _lib, check, self.ctx_ptr, base,
                                        self.spin_ns, self._amo_fn)
        self._native.fill(address, size)

    def close(self) -> None:
        """Release the AMO scratch and the primary context (allocations are released by their
        owner first)."""
        cu = self.cu
        self.current()
        if self._host:
            cu.cuMemFreeHost(self._host)
            self._host = 0
        if self._native is not None:
            self._native.close()
            self._native = None
        cu.cuStreamDestroy(self.stream)
        cu.cuDevicePrimaryCtxRelease(self.dev)


def _spin_us() -> float:
    text = os.environ.get("VKSHMEM_CUDA_SPIN_US", "").strip()
    try:
        value = float(text) if text else 100.0
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise ConfigError("VKSHMEM_CUDA_SPIN_US", f"bad value {text!r}: microseconds >= 0")
    return value


def _FD(cu: Any) -> Any:
    return cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR


def env_choice(name: str) -> str:
    """The value of variable ``name``: ``auto`` (default, also when empty), ``on`` or ``off``,
    in any case; ConfigError naming it otherwise."""
    text = os.environ.get(name, "").strip().lower() or "auto"
    if text not in ("auto", "on", "off"):
        raise ConfigError(name, f"bad value {text!r}: auto, on or off")
    return text
