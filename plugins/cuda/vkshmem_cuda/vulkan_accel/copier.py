"""Copies and AMOs of the Vulkan heap through CUDA, on NVIDIA GPUs.

A Vulkan queue submission costs 12-13 µs on an H100 before any byte moves and the driver's
DMA of imported host memory tops out near 50 GB/s, where CUDA's ``cudaMemcpyAsync`` costs
about 8 µs and moves 55 GB/s from the same registered memory (``tests/gpu/dispatch_probe.py``,
``tests/gpu/hostcopy_probe.py``, ``tests/gpu/hugepage_probe.py``). Where ``cuda-bindings`` is
installed and CUDA sees the Vulkan device (same UUID), :class:`CudaCopier` runs the Vulkan
domain's blocking copies of ``VKSHMEM_GPU_CUDA_COPY`` bytes or more there: this PE's heap as
CUDA imports it (:class:`~.view.CudaView`), each same-device peer's heap
imported from a duplicate of the fd the core passed (``cuImportExternalMemory``, made at the
first copy that needs it), and the core's host heap registered (``cuMemHostRegister``), as
are other host ranges the domain imports (peers' proxy mailboxes, :meth:`add_host`). Its
AMOs are a one-thread CUDA kernel (:mod:`~vkshmem_cuda.kernels`, compiled by NVRTC at the
first AMO; atomic with the Vulkan shaders' atomics on the same word, both being the GPU's)
whose old value comes back through mapped pinned memory: a launch instead of a Vulkan
submission. Each copy or AMO is one call into C (``vkshmem_cuda._ops``, see
``csrc/cudacalls.c``), GIL released, which spins ``VKSHMEM_GPU_SPIN_US`` before blocking. The
Vulkan path stays for everything else: smaller copies, non-blocking ones (batched on the Vulkan
queue, completed by ``quiet``), shaders, other vendors, and AMOs where NVRTC is missing.

Ordering: every copy and AMO here is complete when it returns, and vkshmem's Vulkan work is
complete when its call returns (or at ``quiet``), so either API's later work sees the other's
bytes, as with the DLPack view.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from vkshmem.plugin import FeatureNotAvailableError, GpuError

from .. import _ops
from ..native import NativeDomain
from ..service_kernel import CudaService

if TYPE_CHECKING:
    from .view import CudaView

__all__ = ["CudaCopier"]

_PORTABLE = 1  # CU_MEMHOSTREGISTER_PORTABLE

log = logging.getLogger("vkshmem")


class CudaCopier:
    """CUDA copies between this PE's Vulkan heap, its same-device peers' heaps and host
    memory (see the module docstring). Raises GpuError when a CUDA call fails."""

    def __init__(self, view: CudaView, hosts: list[tuple[int, int]],
                 spin_us: float = 200.0) -> None:
        self.view = view
        cu = self._cu = view.cu
        self._lock = threading.Lock()
        self.copies = 0  # how many copies went through CUDA (tests read it)
        self.amos = 0  # and how many AMOs
        view.make_current()
        self._ffi, self._lib = _ops.ffi, _ops.lib
        self._copy_c = self._lib.vkc_copy  # bound once: the hot path's call
        self._started = False  # start() was used: sync() waits on the stream from then on
        if self._lib.vkc_load() != 0:
            raise GpuError(f"a copy through CUDA: could not load "
                           f"{self._ffi.string(self._lib.vkc_missing()).decode()}")
        self._stream = self._check(cu.cuStreamCreate(
            cu.CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate")
        self._ctx_ptr, self._stream_ptr = int(view.context), int(self._stream)
        self._spin_ns = int(spin_us * 1000)  # VKSHMEM_GPU_SPIN_US
        # the AMO kernel (made at the first AMO; False: it cannot be) and its result words
        # in mapped pinned memory (old value, then the sequence number the kernel stores)
        self._amo_fn: int | bool = 0
        self._amo_lock = threading.Lock()
        self._amo_seq = 0
        self._amo_host = 0
        self._amo_dev = 0
        self._amo_out = self._ffi.new("uint64_t *")
        #: the service kernel for AMOs (see :meth:`use_service`; None: not decided yet,
        #: False: not used) and whether the caller's Vulkan device has work in flight
        self._svc: CudaService | bool | None = False
        self._svc_mode = "off"
        self._svc_timeout = 0.0
        self._svc_idle_ns = 0
        self._svc_box: tuple[int, int] | None = None
        self._vulkan_busy: Callable[[], bool] = bool
        #: the domain proxy's native rounds, made on request
        self._native: NativeDomain | None = None
        #: host ranges registered for DMA, (address, size): the host heap first
        self._hosts: list[tuple[int, int]] = []
        for address, size in hosts:
            self.add_host(address, size)
        #: same-device peers: GpuMemory -> (fd duplicate, size, dedicated, vmm) until imported,
        #: then (external memory, pointer)
        self._pending: dict[Any, tuple[int, int, bool, bool]] = {}
        self._peers: dict[Any, tuple[Any, int]] = {}
        #: CUDA's address of every memory known so far (this PE's heap, imported peers')
        self._ptrs: dict[Any, int] = {view.memory: view.pointer}

    def _check(self, res: Any, what: str) -> Any:
        return self.view.check(res, what, GpuError, "a copy through CUDA")

    def add_peer(self, mem: Any, fd: int, size: int, dedicated: bool, vmm: bool) -> None:
        """Remember a peer's heap (``fd`` is a duplicate, owned here from now on; ``vmm``:
        CUDA's fd of a VMM allocation, else Vulkan's)."""
        with self._lock:
            self._pending[mem] = (fd, size, dedicated, vmm)

    def drop_peer(self, mem: Any) -> None:
        """Forget a peer's heap (before the Vulkan import of it is freed)."""
        with self._lock:
            pending = self._pending.pop(mem, None)
            if pending is not None:
                os.close(pending[0])
            got = self._peers.pop(mem, None)
            self._ptrs.pop(mem, None)
        if got is not None:
            self.view.release(*got)

    def pointer(self, mem: Any) -> int:
        """CUDA's address of ``mem`` (this PE's heap or a known peer's), 0 if none."""
        if mem is self.view.memory:
            return self.view.pointer
        got = self._peers.get(mem)
        if got is not None:
            return got[1]
        with self._lock:
            pending = self._pending.pop(mem, None)
            if pending is None:
                return 0
            fd, size, dedicated, vmm = pending
            try:
                ext, ptr = self.view.import_fd(fd, size, dedicated, vmm)
            except BufferError as exc:
                raise GpuError(f"a copy through CUDA: {exc}") from None
            self._peers[mem] = (ext, ptr)
            self._ptrs[mem] = ptr
            return ptr

    def copy(self, dst: Any, dst_offset: int, src: Any, src_offset: int, nbytes: int) -> bool:
        """Device to device between two memories of this GPU (this PE's heap, same-device
        peers'), complete on return; False (nothing done) where CUDA has no address for one.
        The Vulkan domain's hot path: lookups, bounds and the C call, nothing else."""
        ptrs = self._ptrs
        dptr = ptrs.get(dst) or self.pointer(dst)
        sptr = ptrs.get(src) or self.pointer(src)
        if not (dptr and sptr):
            return False
        if dst_offset < 0 or src_offset < 0 or dst_offset + nbytes > dst.size or \
                src_offset + nbytes > src.size:
            dst.check_range(dst_offset, nbytes, "GPU copy")
            src.check_range(src_offset, nbytes, "GPU copy")
        res = self._copy_c(0, self._ctx_ptr, self._stream_ptr, dptr + dst_offset,
                           sptr + src_offset, nbytes, self._spin_ns)
        if res:
            self._done(res, "cuMemcpyDtoD")
        self.copies += 1
        return True

    def _done(self, res: int, what: str) -> None:
        if res:
            cu = self._cu
            _e, name = cu.cuGetErrorName(cu.CUresult(res))
            raise GpuError(f"{what} through CUDA failed: "
                           f"{name.decode() if isinstance(name, bytes) else res}")

    def _blocking(self, kind: int, dst: int, src: int, nbytes: int, what: str) -> None:
        self._done(self._copy_c(kind, self._ctx_ptr, self._stream_ptr, dst, src, nbytes,
                                self._spin_ns), what)
        self.copies += 1

    def d2d(self, dst: int, src: int, nbytes: int) -> None:
        """Device to device (CUDA addresses), complete on return."""
        self._blocking(0, dst, src, nbytes, "cuMemcpyDtoD")

    def h2d(self, dst: int, host: int, nbytes: int) -> None:
        """Host address ``host`` to device ``dst``, complete on return."""
        self._blocking(1, dst, host, nbytes, "cuMemcpyHtoD")

    def d2h(self, host: int, src: int, nbytes: int) -> None:
        """Device ``src`` to host address ``host``, complete on return."""
        self._blocking(2, host, src, nbytes, "cuMemcpyDtoH")

    def add_host(self, address: int, size: int) -> bool:
        """Register ``size`` bytes of host memory at ``address`` (page-aligned, mapped until
        :meth:`close`) for DMA; False where CUDA refuses (copies of it then stay pageable:
        CUDA stages them, still one call)."""
        if size <= 0:
            return False
        self.view.make_current()
        try:
            # PORTABLE: pinned for every context of this process, the CUDA links' contexts on
            # other GPUs (link.py) among them
            self._check(self._cu.cuMemHostRegister(address, size, _PORTABLE),
                        "cuMemHostRegister")
        except GpuError as exc:
            log.info("host memory at 0x%x (%d bytes) stays pageable for CUDA: %s", address,
                     size, exc)
            return False
        self._hosts.append((address, size))
        return True

    def pinned(self, host: int, nbytes: int) -> bool:
        """Whether ``nbytes`` at host address ``host`` lie in a registered host range (an
        asynchronous copy from or to them is a DMA that needs no staging)."""
        for lo, size in self._hosts:
            if lo <= host and host + nbytes <= lo + size:
                return True
        return False

    def start(self, kind: int, dst: int, src: int, nbytes: int) -> None:
        """Issue a copy on the stream without waiting (kind 0 device to device, 1 host to
        device, 2 device to host; CUDA and host addresses): :meth:`sync` completes it."""
        self._done(self._copy_c(kind, self._ctx_ptr, self._stream_ptr, dst, src, nbytes, -1),
                   "cuMemcpyAsync")
        self._started = True
        self.copies += 1

    def sync(self) -> None:
        """Wait for every copy :meth:`start` issued, on any thread (the stream is shared: a
        wait may also cover another thread's copies, never fewer than this thread's)."""
        if self._started:
            self._done(self._lib.vkc_sync(self._ctx_ptr, self._stream_ptr, self._spin_ns),
                       "cuStreamSynchronize")

    def can_amo(self) -> bool:
        """Whether AMOs can run here (the kernel compiles: NVRTC is installed); decided once."""
        if self._amo_fn is False:
            return False
        if self._amo_fn:
            return True
        with self._amo_lock:
            if not self._amo_fn:
                self._amo_fn = self._make_amo()
        return self._amo_fn is not False

    def _make_amo(self) -> int | bool:
        from ..kernels import AMO_NAME, AMO_SOURCE, compile_kernel

        cu = self._cu
        self.view.make_current()
        try:
            fn = int(compile_kernel(cu, self._check_cu, self.view.device, AMO_SOURCE, AMO_NAME,
                                    GpuError))
        except (FeatureNotAvailableError, GpuError) as exc:
            log.info("GPU AMOs stay on Vulkan: %s", exc)
            return False
        self._amo_host = int(self._check(cu.cuMemHostAlloc(64, 2), "cuMemHostAlloc"))
        self._amo_dev = int(self._check(cu.cuMemHostGetDevicePointer(self._amo_host, 0),
                                        "cuMemHostGetDevicePointer"))
        return fn

    def _check_cu(self, res: Any, what: str) -> Any:
        return self.view.check(res, what, GpuError, "an AMO through CUDA")

    def amo(self, mem: Any, offset: int, op: int, width: int, operand: int,
            compare: int) -> int | None:
        """The AMO ``op`` (AmoOp number) on the ``width``-byte word at ``offset`` of ``mem``:
        the old value (needs :meth:`can_amo`); None (nothing done) where CUDA has no address
        for ``mem``."""
        ptr = self._ptrs.get(mem) or self.pointer(mem)
        if not ptr:
            return None
        if offset < 0 or offset + width > mem.size:
            mem.check_range(offset, width, "GPU AMO")
        return self.amo_at(ptr + offset, op, width, operand, compare)

    def use_service(self, mode: str, idle_us: float, timeout: float,
                    vulkan_busy: Callable[[], bool],
                    request_box: tuple[int, int] | None = None) -> None:
        """AMOs through the service kernel (:mod:`~vkshmem_cuda.service_kernel`; it ends after
        ``idle_us`` without one) where ``mode`` (``VKSHMEM_GPU_CUDA_SERVICE``) is ``on``, or
        ``auto`` and this PE has no peer on its GPU (made at the first AMO), and only while
        ``vulkan_busy()`` says the caller's Vulkan device has no work in flight: the GPU
        time-slices this CUDA context against the Vulkan device, so a resident kernel would
        hold that work up (a Vulkan kernel waiting for its own AMO included). The caller parks
        the kernel (:meth:`park`) at each Vulkan submission. ``request_box``: see
        :class:`~vkshmem_cuda.service_kernel.CudaService`."""
        self._svc_mode, self._svc_timeout, self._vulkan_busy = mode, timeout, vulkan_busy
        self._svc_box = request_box
        self._svc_idle_ns = int(idle_us * 1000)
        self._svc = None if mode != "off" else False

    def _service(self) -> CudaService | bool:
        """Make the service kernel at the first AMO that may use it (False: it is not used)."""
        with self._lock:  # the proxy thread runs AMOs too
            if self._svc is not None:
                return self._svc
            alone = not (self._pending or self._peers)
            svc: CudaService | bool = False
            if self._svc_mode == "on" or alone:
                try:
                    svc = CudaService(self._cu, self.view.device, self.view.context,
                                      self._spin_ns, self._svc_timeout, self._svc_idle_ns,
                                      GpuError, "VKSHMEM_GPU_CUDA_SERVICE=off avoids the service",
                                      self._svc_box)
                except (FeatureNotAvailableError, GpuError) as exc:
                    log.info("GPU AMOs are CUDA launches: %s", exc)
            self._svc = svc
            return svc

    @property
    def service(self) -> CudaService | None:
        """The service kernel AMOs use when the Vulkan device is idle (None: launches)."""
        return self._svc if isinstance(self._svc, CudaService) else None

    def park(self) -> None:
        """End the service kernel where it is resident (the caller submitted Vulkan work)."""
        svc = self._svc
        if isinstance(svc, CudaService):
            svc.park()

    def amo_at(self, addr: int, op: int, width: int, operand: int, compare: int) -> int:
        """:meth:`amo` on the word at CUDA address ``addr`` (this GPU's memory, or a peer
        GPU's mapped here: a CUDA link's); the old value."""
        svc = self._svc
        if svc is not False and not self._vulkan_busy():
            if svc is None:
                svc = self._service()
            if isinstance(svc, CudaService) and not svc.broken:
                old = svc.amo(addr, op, width, operand, compare)
                self.amos += 1
                return old
        with self._amo_lock:  # the result words: the proxy thread also calls
            self._amo_seq += 1
            self._done(self._lib.vkc_amo(self._ctx_ptr, self._stream_ptr, int(self._amo_fn),
                                         addr, op, width, operand, compare, self._amo_dev,
                                         self._amo_host, self._amo_seq, self._amo_out,
                                         self._spin_ns), "an AMO kernel")
            self.amos += 1
            return int(self._amo_out[0])

    def native_ops(self, address: int, size: int, mapped: int, write_max: int,
                   read_max: int, amo: bool) -> None:
        """Fill the core's ``struct vk_domain_ops`` at ``address`` for the domain proxy's
        native rounds (:class:`~vkshmem_cuda.native.NativeDomain`, made once, released by
        :meth:`close`): the segment's ``size``, its CPU mapping (0: none) with the sizes
        copied through it, and AMOs through CUDA where ``amo`` (else they stay in Python)."""
        self.view.make_current()
        if self._native is None:
            fn = int(self._amo_fn) if amo and self.can_amo() else 0
            self._native = NativeDomain(self._cu, self._ffi, self._lib, self._check,
                                        self._ctx_ptr, self.view.pointer, self._spin_ns, fn)
        self._native.fill(address, size, mapped, write_max, read_max)

    def close(self) -> None:
        """Release the service kernel, the peers' imports, the host registration and the
        stream (idempotent)."""
        if isinstance(self._svc, CudaService):
            self._svc.close()
        self._svc = False
        for mem in list(self._pending) + list(self._peers):
            self.drop_peer(mem)
        cu = self._cu
        self.view.make_current()
        if self._native is not None:
            self._native.close()
            self._native = None
        if self._amo_host:
            cu.cuMemFreeHost(self._amo_host)
            self._amo_host = 0
        for address, _size in self._hosts:
            cu.cuMemHostUnregister(address)
        self._hosts.clear()
        if self._stream is not None:
            cu.cuStreamDestroy(self._stream)
            self._stream = None
