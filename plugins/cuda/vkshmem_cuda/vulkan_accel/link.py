"""Links of the Vulkan domain to same-node peers on other GPUs, through CUDA (NVIDIA).

Vulkan memory cannot be imported on another GPU, and CUDA's import of it is not mapped for
peer GPUs either (``tests/gpu/vulkan_cuda_peer_probe.py``); a CUDA VMM allocation is. So
where the peer's heap is CUDA's (:mod:`~vkshmem_cuda.vmm`, ``VKSHMEM_GPU_CUDA_HEAP``) a
:class:`CudaLink` (a :class:`~vkshmem.core.domains.contract.DomainLink`, route ``link``) maps it on
this
GPU (:attr:`CudaLink.direct`) and every operation is one step in this GPU's context:

* host bytes and device bytes: one copy (``cuMemcpy*Async`` + a spin on the stream, one
  GIL-free C call, ``csrc/cudalink.c``), across NVLink where there is one;
* small puts and gets, where this PE also maps the peer's heap on the CPU
  (:mod:`~vkshmem.gpu.domain.peermap`, ``VKSHMEM_GPU_LINK_MAP``): CPU stores and loads across PCIe,
  no GPU command (:meth:`CudaLink.attach_map`);
* AMOs: the one-thread kernel of the domain's CUDA copier on the mapped word, atomic with the
  peer's own AMOs (both resolve at the owning GPU);
* a ring all-reduce's last fold and the push after it: one pass of the reduce kernel writing
  both targets (:mod:`.fold`).

Where the peer's heap is Vulkan's, or this GPU cannot map the other's memory, the link goes
through a bounce buffer instead (:mod:`.bounce`, route ``link+proxy``: AMOs
stay with the domain proxy). Every call is complete when it returns. Measured on 2 x H100
through the API (``benchmarks/multi_gpu.py``, the ``vulkan`` job): 308 / 369 / 381 GB/s put at
16 / 64 / 256 MiB with the direct link (CUDA's own peer copy 312 / 372 / 388), against 221 /
316 / 357 through the bounce and 38 through the domain proxy. An 8-byte put between the GPUs
through ``shmem.put``: 4.5 µs with the peer's heap CPU-mapped, 11.6 without
(``tests/gpu/link_latency_probe.py``, 2026-11-27); 5.2 µs in ``benchmarks/multi_gpu.py``,
where CUDA's own peer copy from CuPy takes 10.2.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from vkshmem.plugin import DomainLink, GpuError, address_of

from .. import _ops
from .bounce import SLOTS, RemoteGpu, piece_size
from .hub import LinkHub
from .pair import PairPlan, can_pair, pair_plan, pair_round

if TYPE_CHECKING:
    from vkshmem.plugin import AmoOp, GpuMemory

    from .copier import CudaCopier

__all__ = ["CudaLink"]

log = logging.getLogger("vkshmem")

_bar = _ops.lib.vkc_bar_copy  # CPU copies through BAR mappings (csrc/cudalink.c)
_PAIR_PLANS = 64  # the distinct all-reduce call shapes whose pair rounds are kept


class CudaLink(DomainLink):
    """The link to one peer's heap on another GPU (see the module docstring): a heap that is
    CUDA's (``vmm``) is mapped on this GPU at once where it can be (then every copy is one, in
    this GPU's context: :attr:`direct`; and AMOs are the kernel of ``amo()``, the domain's CUDA
    copier, on the mapped word), else imported in that GPU's context at first use (the
    bounce). Owns ``fd`` from the start (closed on failure). Raises GpuError when CUDA
    fails."""

    def __init__(self, hub: LinkHub, fd: int, size: int, dedicated: bool, uuid_hex: str,
                 check_range: Any, vmm: bool = False,
                 amo: Callable[[], CudaCopier | None] | None = None) -> None:
        self.hub = hub
        self.size = size
        self._fd, self._dedicated, self._vmm = fd, dedicated, vmm
        try:
            self._ordinal = hub.ordinal_of(uuid_hex)
        except BaseException:
            os.close(fd)
            raise
        self._check_range = check_range
        self._remote: RemoteGpu | None = None
        self._ext: Any = None
        self._ptr = 0
        self._lock = threading.Lock()
        self.calls = 0  #: operations carried (tests read it)
        #: the peer's heap is mapped on this GPU: one copy per operation, no bounce
        self.direct = False
        self._copier: CudaCopier | None = None
        #: this PE's own heap's size as CUDA maps it (the bound of its offsets here)
        self._own = hub.view.size
        #: the peer's heap mapped on the CPU (attach_map), its address (0: none), this PE's
        #: own heap's mapping (0: none) and its size, the largest CPU stores and loads
        self._map_mem: GpuMemory | None = None
        self._map = self._local = self._local_size = self._wmax = self._rmax = 0
        self.mapped_calls = 0  #: operations done by the CPU through the mappings (tests)
        self._pair_seq = 0  # two-GPU all-reduces with this peer (it counts alike)
        self._pair_plans: dict[tuple[Any, ...], PairPlan] = {}  # per call shape
        self._pairs: dict[tuple[Any, ...], bool] = {}  # pairs() answers, per call shape
        if vmm:
            try:
                with self._lock:
                    self._map_here()
                # AMOs by the CUDA kernel of this PE's heap on the mapped word, where this GPU's
                # atomics on the peer's memory are native (NVLink; not plain PCIe peer access)
                if self.direct and amo is not None and self._native_atomics():
                    self._copier = amo()
            except BaseException:
                self.close()  # the fd, or the mapping that took it
                raise
            self.amos = self._copier is not None

    def attach_map(self, mem: GpuMemory, local: int, local_size: int, write_max: int,
                   read_max: int) -> None:
        """Take ``mem``, the peer's heap mapped write-combined on the CPU (freed at
        :meth:`close`): from now on puts of host bytes up to ``write_max`` bytes are CPU
        stores into it, gets up to ``read_max`` CPU loads, and device puts and gets up to
        ``read_max`` a CPU copy between it and this PE's own mapped heap, ``local_size``
        bytes at ``local`` (0: not mapped, they stay CUDA's). Every such call has landed
        when it returns (written bytes read back)."""
        with self._lock:
            self._map_mem, self._local, self._local_size = mem, local, local_size
            self._wmax, self._rmax = write_max, read_max
            self._map = mem.host_address

    def _cpu(self, to_peer: bool, offset: int, other: int, nbytes: int, readback: int) -> bool:
        """One CPU copy between the peer's mapped heap at ``offset`` and address ``other``
        (``to_peer``: into the peer's), the written bytes read back where ``readback`` (a
        GPU's BAR); under the lock, so that :meth:`close` waits for it. False (nothing done)
        once the mapping is gone."""
        with self._lock:
            peer = self._map
            if not peer:
                return False
            if to_peer:
                _bar(peer + offset, other, nbytes, readback)
            else:
                _bar(other, peer + offset, nbytes, readback)
            self.mapped_calls += 1
        return True

    def _peer(self) -> tuple[RemoteGpu | None, int]:
        if self._ptr:
            return self._remote, self._ptr
        with self._lock:
            if not self._ptr:
                if self._fd < 0:
                    raise GpuError("a CUDA link used after close")
                remote = self.hub.remote(self._ordinal)  # the bounce (a direct link has _ptr)
                with self.hub.on(remote.ctx):
                    ext, ptr = self._import()
                # _remote first: another thread that sees _ptr set takes the bounce path
                self._remote, self._ext = remote, ext
                self._ptr = ptr
        return self._remote, self._ptr

    def _native_atomics(self) -> bool:
        """Whether this GPU's atomics on the peer GPU's memory are performed natively there
        (``CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED``: NVLink), so that they are atomic
        with the peer's own."""
        hub, cu = self.hub, self.hub.cu
        try:
            peer = hub.check(cu.cuDeviceGet(self._ordinal), "cuDeviceGet")
            attr = cu.CUdevice_P2PAttribute.CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED
            value = hub.check(cu.cuDeviceGetP2PAttribute(attr, hub.view.device, peer),
                              "cuDeviceGetP2PAttribute")
        except GpuError as exc:
            log.info("a CUDA link from GPU %d to GPU %d carries no AMOs: %s", hub.ordinal,
                     self._ordinal, exc)
            return False
        return bool(value)

    def _map_here(self) -> bool:
        """Map the peer's VMM heap on this GPU (its fd stays for the fallback); False (logged)
        where this GPU cannot reach that one's memory (no NVLink or PCIe peer access)."""
        hub = self.hub
        try:
            with hub.on(hub.view.context):
                self._ext, self._ptr = hub.view.import_fd(os.dup(self._fd), self.size, False,
                                                          vmm=True)
        except BufferError as exc:
            log.info("a CUDA link from GPU %d cannot map GPU %d's heap (%s): its copies go "
                     "through a bounce buffer", hub.ordinal, self._ordinal, exc)
            return False
        os.close(self._fd)
        self._fd = -1
        self.direct = True
        return True

    def _import(self) -> tuple[Any, int]:
        """The peer's heap imported in its GPU's context (current): CUDA owns the fd then."""
        cu, check = self.hub.cu, self.hub.check
        desc = cu.CUDA_EXTERNAL_MEMORY_HANDLE_DESC()
        desc.type = cu.CUexternalMemoryHandleType.CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD
        desc.handle.fd = self._fd
        desc.size = self.size
        desc.flags = cu.CUDA_EXTERNAL_MEMORY_DEDICATED if self._dedicated else 0
        ext = check(cu.cuImportExternalMemory(desc),
                    f"cuImportExternalMemory of the peer's heap on GPU {self._ordinal}")
        self._fd = -1
        buf = cu.CUDA_EXTERNAL_MEMORY_BUFFER_DESC()
        buf.offset, buf.size, buf.flags = 0, self.size, 0
        try:
            return ext, int(check(cu.cuExternalMemoryGetMappedBuffer(ext, buf),
                                  "cuExternalMemoryGetMappedBuffer"))
        except BaseException:
            cu.cuDestroyExternalMemory(ext)
            raise

    def _host(self, kind: int, offset: int, buf: memoryview, what: str) -> None:
        n = buf.nbytes
        self._check_range(offset, n, what)
        if n == 0:
            return
        remote, ptr = self._peer()
        address = address_of(buf)
        dst, src = (ptr + offset, address) if kind == 1 else (address, ptr + offset)
        hub = self.hub
        if remote is None:
            self._one(kind, dst, src, n, what)
            return
        with remote.lock:
            res = hub._lib.vkc_link_host(kind, remote.ctx_ptr, remote.stream_ptr, dst, src, n,
                                         hub.spin_ns)
        self.hub.done(res, what)
        self.calls += 1

    def put(self, offset: int, src: memoryview) -> None:
        n = src.nbytes
        if n <= self._wmax and 0 < n and 0 <= offset <= self.size - n and self._map and \
                self._cpu(True, offset, address_of(src), n, 1):  # CPU stores, read back
            return
        if self.direct and 0 < n and 0 <= offset <= self.size - n:  # the hot path
            self._one(1, self._ptr + offset, address_of(src), n, "a put of host bytes")
        else:
            self._host(1, offset, src, "a put of host bytes")

    def get(self, offset: int, dst: memoryview) -> None:
        n = dst.nbytes
        if n <= self._rmax and 0 < n and 0 <= offset <= self.size - n and self._map and \
                self._cpu(False, offset, address_of(dst), n, 0):  # CPU loads across PCIe
            return
        if self.direct and 0 < n and 0 <= offset <= self.size - n:
            self._one(2, address_of(dst), self._ptr + offset, n, "a get into host bytes")
        else:
            self._host(2, offset, dst, "a get into host bytes")

    def _device(self, to_peer: bool, offset: int, local_off: int, nbytes: int) -> None:
        what = "a put between GPUs" if to_peer else "a get between GPUs"
        self._check_range(offset, nbytes, what)
        self._check_range(local_off, nbytes, what)
        if nbytes == 0:
            return
        hub = self.hub
        remote, ptr = self._peer()
        local = hub.view.pointer + local_off
        if remote is None:  # mapped here: one copy across the link
            dst, src = (ptr + offset, local) if to_peer else (local, ptr + offset)
            self._one(0, dst, src, nbytes, what)
            return
        piece = piece_size(hub.piece, nbytes)
        here = (hub.ctx_ptr, hub.stream_ptr, hub.local_events[0])
        there = (remote.ctx_ptr, remote.stream_ptr, remote.events[0])
        # stage 1 writes across the link into a slot on the other GPU, stage 2 copies it out
        # there: a put starts here, a get on the peer's GPU
        (ctx1, s1, ev1), (ctx2, s2, ev2) = (here, there) if to_peer else (there, here)
        dst, src = (ptr + offset, local) if to_peer else (local, ptr + offset)
        with hub.copy_lock:
            bounce = remote.bounce_address(remote.ordinal if to_peer else hub.ordinal)
            res = hub._lib.vkc_link_copy(ctx1, s1, ctx2, s2, dst, src, nbytes, bounce, piece,
                                         SLOTS, ev1, ev2, hub.spin_ns)
        hub.done(res, what)
        self.calls += 1

    def amo(self, offset: int, op: AmoOp, width: int, operand: int, compare: int) -> int:
        """An AMO on the peer's word across the link (see :attr:`amos`)."""
        if self._copier is None or not self._ptr:
            raise GpuError("an AMO through a CUDA link that carries none (or was closed)")
        old = self._copier.amo_at(self._ptr + offset, int(op), width, operand, compare)
        self.calls += 1
        return old

    def fold_put(self, dst_off: int, src_off: int, count: int, op: str, dtype: Any) -> bool:
        """``dst op= src`` in this PE's heap, the result into the peer's too, by one kernel
        pass (a direct link only: the peer's heap mapped here)."""
        if not self.direct or count <= 0:
            return False
        dtype = np.dtype(dtype)
        nbytes = count * dtype.itemsize
        for off in (dst_off, src_off):  # a kernel's store out of range would fault the GPU
            self._check_range(off, nbytes, "a fold through a CUDA link")  # heaps are symmetric
        local = self.hub.view.pointer
        done = self.hub.fold([local + dst_off, self._ptr + dst_off],
                             [local + dst_off, local + src_off], count, op, dtype)
        self.calls += done
        return done

    def pairs(self, pes: tuple[int, int], op: str, dtype: Any) -> bool:
        key = (pes, op, dtype)  # kept: the answer does not change while the link is direct
        found = self._pairs.get(key)
        if found is None:
            found = can_pair(self.hub, self.direct, self.size, pes, op, np.dtype(dtype))
            if found:
                self._pairs[key] = found
        return found

    def pair_reduce(self, index: int, pes: tuple[int, int], shares: Sequence[tuple[int, int]],
                    dst_off: int, src_off: int, op: str, dtype: Any) -> None:
        """The two-GPU all-reduce's round (:mod:`.pair`), its plan kept per
        call shape: a repeated call goes from one lookup to the C call."""
        key = (index, pes, *shares, dst_off, src_off, op, dtype)
        plan = self._pair_plans.get(key)
        if plan is None:
            dtype = np.dtype(dtype)
            nbytes = (shares[-1][0] + shares[-1][1]) * dtype.itemsize
            for off in (dst_off, src_off):  # a kernel's store out of range would fault
                self._check_range(off, nbytes, "an all-reduce through a CUDA link")
            if len(self._pair_plans) >= _PAIR_PLANS:
                self._pair_plans.clear()
            plan = self._pair_plans[key] = pair_plan(self.hub, self._ptr, index, pes, shares,
                                                     dst_off, src_off, op, dtype)
        self._pair_seq = (self._pair_seq + 2) & 0xFFFFFFFF or 2  # two numbers a round
        pair_round(self.hub, plan, self._pair_seq, self.hub.timeout)
        self.calls += 1

    def put_device(self, offset: int, src_off: int, nbytes: int) -> None:
        if nbytes <= self._rmax and 0 < nbytes and 0 <= offset <= self.size - nbytes and \
                0 <= src_off <= self._local_size - nbytes and self._local and \
                self._cpu(True, offset, self._local + src_off, nbytes, 1):
            return
        if self.direct and 0 < nbytes and 0 <= offset <= self.size - nbytes and \
                0 <= src_off <= self._own - nbytes:  # the hot path: checks inline
            self._one(0, self._ptr + offset, self.hub.view.pointer + src_off, nbytes,
                      "a put between GPUs")
        else:
            self._device(True, offset, src_off, nbytes)

    def get_device(self, offset: int, dst_off: int, nbytes: int) -> None:
        if nbytes <= self._rmax and 0 < nbytes and 0 <= offset <= self.size - nbytes and \
                0 <= dst_off <= self._local_size - nbytes and self._local and \
                self._cpu(False, offset, self._local + dst_off, nbytes, 1):  # landed here too
            return
        if self.direct and 0 < nbytes and 0 <= offset <= self.size - nbytes and \
                0 <= dst_off <= self._own - nbytes:
            self._one(0, self.hub.view.pointer + dst_off, self._ptr + offset, nbytes,
                      "a get between GPUs")
        else:
            self._device(False, offset, dst_off, nbytes)

    def _one(self, kind: int, dst: int, src: int, nbytes: int, what: str) -> None:
        """One copy in this GPU's context (a direct link; ``kind`` 0: device to device, 1:
        host to device, 2: device to host), complete on return."""
        hub = self.hub
        with hub.copy_lock:
            res = hub._lib.vkc_link_host(kind, hub.ctx_ptr, hub.stream_ptr, dst, src, nbytes,
                                         hub.spin_ns)
        if res:
            hub.done(res, what)
        self.calls += 1

    def close(self) -> None:
        with self._lock:
            self.direct = self.amos = False  # the fast paths end here
            self._pairs.clear()
            self._pair_plans.clear()
            self._map = self._local = 0
            self._copier = None
            if self._map_mem is not None:
                self._map_mem.free()
                self._map_mem = None
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
            if self._ptr and self._remote is None:
                with self.hub.on(self.hub.view.context):
                    self.hub.view.release(self._ext, self._ptr)
            elif self._ptr:
                cu = self.hub.cu
                with self.hub.on(self._remote.ctx):
                    cu.cuMemFree(self._ptr)
                    cu.cuDestroyExternalMemory(self._ext)
            self._ptr, self._ext = 0, None
