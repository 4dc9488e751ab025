"""Bulk copies of the Vulkan heap through CUDA's copy path, on NVIDIA GPUs.

A Vulkan queue submission costs 12-13 µs on an H100 before any byte moves and the driver's
DMA of imported host memory tops out near 50 GB/s, where CUDA's ``cudaMemcpyAsync`` costs
about 8 µs and moves 55 GB/s from the same registered memory (``tests/gpu/dispatch_probe.py``,
``tests/gpu/hostcopy_probe.py``, ``tests/gpu/hugepage_probe.py``). Where ``cuda-bindings`` is
installed and CUDA sees the Vulkan device (same UUID), :class:`CudaCopier` runs the Vulkan
domain's blocking copies of ``VKSHMEM_GPU_CUDA_COPY`` bytes or more there: this PE's heap as
CUDA imports it (:class:`~vkshmem.gpu.cudaview.CudaView`), each same-device peer's heap
imported from a duplicate of the fd the core passed (``cuImportExternalMemory``, made at the
first copy that needs it), and the core's host heap registered (``cuMemHostRegister``). The
Vulkan path stays for everything else: smaller copies, non-blocking ones (batched on the
Vulkan queue, completed by ``quiet``), AMOs, shaders, other vendors.

Ordering: every copy here is complete when it returns (a stream synchronize), and vkshmem's
Vulkan work is complete when its call returns (or at ``quiet``), so either API's later work
sees the other's bytes, as with the DLPack view.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any

from .errors import GpuError

if TYPE_CHECKING:
    from .cudaview import CudaView

__all__ = ["CudaCopier"]


class CudaCopier:
    """CUDA copies between this PE's Vulkan heap, its same-device peers' heaps and host
    memory (see the module docstring). Raises GpuError when a CUDA call fails."""

    def __init__(self, view: CudaView, host: tuple[int, int] | None) -> None:
        self.view = view
        cu = self._cu = view.cu
        self._lock = threading.Lock()
        self.copies = 0  # how many copies went through CUDA (tests read it)
        view.make_current()
        self._stream = self._check(cu.cuStreamCreate(
            cu.CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate")
        self._host = (0, 0)
        if host is not None and host[1]:
            try:
                self._check(cu.cuMemHostRegister(host[0], host[1], 0), "cuMemHostRegister")
                self._host = host
            except GpuError:  # pageable: CUDA stages it, still one call
                pass
        #: same-device peers: GpuMemory -> (fd duplicate, size, dedicated) until imported,
        #: then (external memory, pointer)
        self._pending: dict[Any, tuple[int, int, bool]] = {}
        self._peers: dict[Any, tuple[Any, int]] = {}

    def _check(self, res: Any, what: str) -> Any:
        return self.view.check(res, what, GpuError, "a copy through CUDA")

    def add_peer(self, mem: Any, fd: int, size: int, dedicated: bool) -> None:
        """Remember a peer's heap (``fd`` is a duplicate, owned here from now on)."""
        with self._lock:
            self._pending[mem] = (fd, size, dedicated)

    def drop_peer(self, mem: Any) -> None:
        """Forget a peer's heap (before the Vulkan import of it is freed)."""
        with self._lock:
            pending = self._pending.pop(mem, None)
            if pending is not None:
                os.close(pending[0])
            got = self._peers.pop(mem, None)
        if got is not None:
            self.view.make_current()
            self._cu.cuMemFree(got[1])
            self._cu.cuDestroyExternalMemory(got[0])

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
            fd, size, dedicated = pending
            try:
                ext, ptr = self.view.import_fd(fd, size, dedicated)
            except BufferError as exc:
                raise GpuError(f"a copy through CUDA: {exc}") from None
            self._peers[mem] = (ext, ptr)
            return ptr

    def _run(self, issue: Any, *args: Any) -> None:
        self.view.make_current()
        self._check(issue(*args, self._stream), issue.__name__)
        self._check(self._cu.cuStreamSynchronize(self._stream), "cuStreamSynchronize")
        self.copies += 1

    def d2d(self, dst: int, src: int, nbytes: int) -> None:
        """Device to device (CUDA addresses), complete on return."""
        self._run(self._cu.cuMemcpyDtoDAsync, dst, src, nbytes)

    def h2d(self, dst: int, host: int, nbytes: int) -> None:
        """Host address ``host`` to device ``dst``, complete on return."""
        self._run(self._cu.cuMemcpyHtoDAsync, dst, host, nbytes)

    def d2h(self, host: int, src: int, nbytes: int) -> None:
        """Device ``src`` to host address ``host``, complete on return."""
        self._run(self._cu.cuMemcpyDtoHAsync, host, src, nbytes)

    def close(self) -> None:
        """Release the peers' imports, the host registration and the stream (idempotent)."""
        for mem in list(self._pending) + list(self._peers):
            self.drop_peer(mem)
        cu = self._cu
        self.view.make_current()
        if self._host[1]:
            cu.cuMemHostUnregister(self._host[0])
            self._host = (0, 0)
        if self._stream is not None:
            cu.cuStreamDestroy(self._stream)
            self._stream = None
