"""The runtime's GPU memory domain: symmetric segment 1, made of exportable Vulkan memory.

:class:`GpuDomain` is created collectively by the first allocation with ``domain='gpu'`` (see
:meth:`vkshmem.core.runtime.Runtime.gpu_domain`), so a job that never asks for GPU memory
never opens a Vulkan device. Start-up:

1. open this PE's Vulkan device (``VKSHMEM_GPU_DEVICE``, else local rank modulo GPUs) and
   allocate ``VKSHMEM_GPU_SYMMETRIC_SIZE`` bytes of exportable memory, exported as an fd;
2. all-gather each PE's device UUID and export parameters;
3. same-node peers on the same device (with the shm path on) pass their fds over Unix sockets
   and import each other's memory: puts, gets and AMOs to them are local Vulkan copies and
   shader atomics on the very same memory;
4. if any pair of PEs cannot do that, every PE starts a :class:`~vkshmem.gpu.proxy.GpuProxy`,
   which carries GPU operations to those peers over the host-heap transports.

To the API it looks like a transport for segment 1 (``put/get/amo`` by ``(pe, offset)``),
plus device-side sources and destinations (``put_device``/``get_device``). GPU operations are
complete when they return, so ``quiet`` and ``fence`` have nothing to wait for.
"""

from __future__ import annotations

import ctypes
import json
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from vkshmem.core._native import lib as _core
from vkshmem.core.errors import ConfigError, InvalidArgumentError, WaitTimeoutError
from vkshmem.core.fdshare import exchange_fds
from vkshmem.core.heap import Allocator
from vkshmem.core.transport import AmoOp

from .device import VulkanDevice
from .errors import GpuError
from .memory import ExportInfo, GpuMemory
from .segment import GpuSegment

if TYPE_CHECKING:
    from vkshmem.core.runtime import Runtime

    from .initiated import Initiator
    from .proxy import GpuProxy

__all__ = ["GPU_SEG", "SCRATCH_BYTES", "GpuDomain"]

log = logging.getLogger("vkshmem")

GPU_SEG = 1
#: GPU scratch of the collectives on GPU memory, per team slot
SCRATCH_BYTES = 256 << 10
_ZEROS = 1 << 20


class GpuDomain:
    """The GPU heap of one PE and its routes to every peer's GPU heap (collective to make)."""

    def __init__(self, rt: Runtime) -> None:
        cfg = rt.config
        self.rt = rt
        self.my_pe = rt.my_pe
        self.closed = False
        self.proxy: GpuProxy | None = None
        self.initiator: Initiator | None = None
        self.segment: GpuSegment | None = None
        self.peers: dict[int, GpuMemory] = {}
        self._seen_errors = 0
        #: use CPU mappings of host-visible GPU memory for copies, waits and zeroing
        self.mapped = cfg.gpu_mapped
        self.device = VulkanDevice(cfg.gpu_device, cfg.gpu_validation,
                                   local_rank=rt.local_rank, timeout=cfg.gpu_timeout,
                                   staging_size=cfg.gpu_staging_size)
        self.device.spin_wait = cfg.gpu_spin_us * 1e-6
        try:
            self._start()
        except BaseException:
            self.close(check=False)
            raise

    def _start(self) -> None:
        rt, cfg, dev = self.rt, self.rt.config, self.device
        size = cfg.gpu_symmetric_size
        self.segment = seg = GpuSegment(dev, GPU_SEG, size)
        self.memory: GpuMemory = seg.memory
        self.size = size
        self.heap = Allocator(size, "gpu", "VKSHMEM_GPU_SYMMETRIC_SIZE")
        # Collective scratch on the GPU, one slot per team slot (the first allocation of a
        # fresh allocator: the same offset on every PE).
        self.scratch_bytes = SCRATCH_BYTES
        if rt.teams_max * SCRATCH_BYTES * 2 > size:
            raise ConfigError("VKSHMEM_GPU_SYMMETRIC_SIZE",
                              f"{size} bytes cannot hold the GPU collectives' scratch "
                              f"({rt.teams_max} teams x {SCRATCH_BYTES} bytes) and leave as "
                              "much again for arrays; raise it (or lower VKSHMEM_TEAMS_MAX)")
        self.scratch_off = self.heap.alloc(rt.teams_max * SCRATCH_BYTES)
        me = {"uuid": dev.uuid.hex(), "fd": dev.has_external_memory_fd,
              "cpu": dev.info.is_cpu, "name": dev.name, "size": size,
              "export": seg.export_info().pack().hex()}
        infos = [json.loads(b) for b in rt.bootstrap.allgather(json.dumps(me).encode())]
        sizes = {i["size"] for i in infos}
        if len(sizes) > 1:
            raise ConfigError("VKSHMEM_GPU_SYMMETRIC_SIZE",
                              f"PEs disagree on the GPU heap size ({sorted(sizes)}); set the "
                              "same value for every PE")
        self.infos = infos

        def group(pe: int) -> tuple[str, str] | None:
            """PEs with equal groups import each other's memory (None: nobody)."""
            i = infos[pe]
            if not cfg.shm or not i["fd"]:
                return None
            return (rt.node_ids[pe], i["uuid"])

        groups = [group(pe) for pe in range(rt.n_pes)]
        mine = groups[self.my_pe]
        direct = [pe for pe in range(rt.n_pes)
                  if pe != self.my_pe and mine is not None and groups[pe] == mine]
        got = exchange_fds(f"{rt.token}.gpu", self.my_pe, direct, [seg.fd],
                           rt.bootstrap.barrier, cfg.bootstrap_timeout)
        failed: list[int] = []
        for pe in sorted(got):
            info = ExportInfo.unpack(bytes.fromhex(infos[pe]["export"]))
            try:
                self.peers[pe] = dev.import_fd(got[pe][0], info.size,
                                               memory_type_index=info.memory_type_index,
                                               dedicated=info.dedicated, take_ownership=True)
            except Exception as exc:  # (the fd is closed) reach that PE through the proxy
                # the validation layer reported the failed call: handled here, not an error
                self._seen_errors = len(dev.validation_errors)
                log.warning("PE %d cannot import the GPU heap of PE %d on the same device "
                            "(%s): %s; it goes through the GPU proxy instead", self.my_pe, pe,
                            dev.name, exc)
                failed.append(pe)
        # Every PE learns whether some import failed: the proxy is collective to start.
        failures = [json.loads(b) for b in rt.bootstrap.allgather(json.dumps(failed).encode())]
        self.peers[self.my_pe] = self.memory
        #: per PE, its GPU heap imported here, or None (reached through the proxy)
        self.route: list[GpuMemory | None] = [self.peers.get(pe) for pe in range(rt.n_pes)]
        # CPU Vulkan drivers (lavapipe) keep device memory in host RAM and compile shader
        # atomics to CPU atomics: the core's native CPU atomics on the mapping are atomic
        # with them and 50x faster than a dispatch.
        self.cpu_atomics = dev.info.is_cpu and cfg.gpu_mapped
        needs_proxy = rt.n_pes > 1 and (None in groups or len(set(groups)) > 1
                                         or any(failures))
        if needs_proxy:
            from .proxy import GpuProxy
            self.proxy = GpuProxy(self)
        rt.bootstrap.barrier()
        log.info("PE %d GPU domain: %s, %d bytes, imported from PEs %s%s", self.my_pe,
                 dev.name, size, sorted(self.peers),
                 ", proxy for the others" if self.proxy else "")

    # -- local memory (own or imported) ---------------------------------------------------

    def write_local(self, mem: GpuMemory, offset: int, src: Any) -> None:
        """Copy host bytes into ``mem`` (through the mapping where there is one)."""
        self.device.write(mem, offset, src, direct=self.mapped and mem.host_visible)

    def read_local(self, mem: GpuMemory, offset: int, dst: Any) -> None:
        """Copy ``mem`` bytes into a host buffer."""
        self.device.read(mem, offset, dst, direct=self.mapped and mem.host_visible)

    def amo_local(self, mem: GpuMemory, offset: int, op: AmoOp, width: int, operand: int,
                  compare: int) -> int:
        """One AMO on ``mem``, atomic with shader atomics on the word; returns the old value."""
        mem.check_range(offset, width, "GPU AMO")
        if width not in (4, 8) or offset % width:
            raise InvalidArgumentError(f"GPU AMOs take aligned 4- or 8-byte words; got {width} "
                                       f"bytes at offset {offset}")
        if self.cpu_atomics and mem.host_address:
            return int(_core.vk_amo(mem.host_address + offset, int(op), width, operand,
                                    compare))
        return self.device.amo(mem, offset, op, width, operand, compare)

    def copy_local(self, dst: GpuMemory, dst_off: int, src: GpuMemory, src_off: int,
                   nbytes: int) -> None:
        """Device-to-device copy (both mapped: a memmove)."""
        if self.mapped and dst.host_address and src.host_address:
            dst.check_range(dst_off, nbytes, "GPU copy")
            src.check_range(src_off, nbytes, "GPU copy")
            ctypes.memmove(dst.host_address + dst_off, src.host_address + src_off, nbytes)
        else:
            self.device.copy(dst, dst_off, src, src_off, nbytes)

    # -- the transport-shaped interface for segment 1 --------------------------------------

    def put(self, pe: int, seg: int, offset: int, src: memoryview) -> None:
        """Host bytes into ``pe``'s GPU heap; complete when it returns."""
        mem = self.route[pe]
        if mem is not None:
            self.write_local(mem, offset, src)
        else:
            self._proxy().put(pe, offset, src)

    put_nbi = put

    def get(self, pe: int, seg: int, offset: int, dst: memoryview) -> None:
        """``pe``'s GPU heap into host bytes."""
        mem = self.route[pe]
        if mem is not None:
            self.read_local(mem, offset, dst)
        else:
            self._proxy().get(pe, offset, dst)

    get_nbi = get

    def amo(self, pe: int, seg: int, offset: int, op: AmoOp, width: int, operand: int,
            compare: int, fetch: bool = True) -> int:
        """An AMO on ``pe``'s GPU word, applied by a shader (or CPU atomics on lavapipe)."""
        mem = self.route[pe]
        if mem is not None:
            return self.amo_local(mem, offset, op, width, operand, compare)
        return self._proxy().amo(pe, offset, op, width, operand, compare)

    def put_device(self, pe: int, offset: int, src_off: int, nbytes: int) -> None:
        """Bytes of this PE's GPU heap at ``src_off`` into ``pe``'s GPU heap at ``offset``."""
        mem = self.route[pe]
        if mem is not None:
            self.copy_local(mem, offset, self.memory, src_off, nbytes)
            return
        proxy = self._proxy()
        tmp = memoryview(bytearray(min(nbytes, proxy.chunk)))
        for lo in range(0, nbytes, proxy.chunk):
            piece = tmp[:min(proxy.chunk, nbytes - lo)]
            self.read_local(self.memory, src_off + lo, piece)
            proxy.put(pe, offset + lo, piece)

    def get_device(self, pe: int, offset: int, dst_off: int, nbytes: int) -> None:
        """Bytes of ``pe``'s GPU heap at ``offset`` into this PE's GPU heap at ``dst_off``."""
        mem = self.route[pe]
        if mem is not None:
            self.copy_local(self.memory, dst_off, mem, offset, nbytes)
            return
        proxy = self._proxy()
        tmp = memoryview(bytearray(min(nbytes, proxy.chunk)))
        for lo in range(0, nbytes, proxy.chunk):
            piece = tmp[:min(proxy.chunk, nbytes - lo)]
            proxy.get(pe, offset + lo, piece)
            self.write_local(self.memory, dst_off + lo, piece)

    def quiet(self) -> None:
        """Nothing to wait for: GPU operations complete before they return."""

    def fence(self) -> None:
        """Nothing to order (see :meth:`quiet`)."""

    def _proxy(self) -> GpuProxy:
        if self.proxy is None:  # pragma: no cover - routes are None only with a proxy
            raise GpuError("no GPU proxy: this peer's GPU heap is unreachable")
        return self.proxy

    # -- waiting on local GPU words -----------------------------------------------------------

    def watch_address(self, offset: int) -> int:
        """Host address of this PE's GPU heap at ``offset`` if waits may spin on the mapping
        (host-visible memory and ``VKSHMEM_GPU_MAPPED=1``), else 0."""
        addr = self.memory.host_address
        return addr + offset if addr and self.mapped else 0

    def wait(self, pred: Callable[[], object], offset: int, snapshot: memoryview,
             what: str) -> None:
        """Return once ``pred()`` is true, re-reading ``snapshot.nbytes`` bytes of this PE's GPU
        heap at ``offset`` into ``snapshot`` (what ``pred`` looks at) between tries; honours
        ``VKSHMEM_WAIT_TIMEOUT``. Mapped memory is watched by the core's native spin instead."""
        mem = self.memory
        n = snapshot.nbytes
        if self.watch_address(offset):
            self.rt.waiter.wait(pred, mem.host_address + offset, n, what)
            return
        timeout = self.rt.config.wait_timeout
        deadline = time.monotonic() + timeout if timeout else None
        pause = 0.0
        while True:
            self.read_local(mem, offset, snapshot)
            if pred():
                return
            if deadline is not None and time.monotonic() > deadline:
                raise WaitTimeoutError(f"{what} did not happen within {timeout:g} s "
                                       "(VKSHMEM_WAIT_TIMEOUT; 0 waits for ever)")
            pause = min(1e-3, pause * 2 or 20e-6)
            time.sleep(pause)

    # -- collective allocation -----------------------------------------------------------------

    def alloc(self, nbytes: int, align: int, clear: bool,
              fill: Callable[[int], None] | None = None) -> int:
        """Collective: ``nbytes`` of the GPU heap, zeroed when ``clear`` or handed to ``fill``
        (called with the offset) before the closing barrier."""
        off = self.heap.alloc(nbytes, align)
        try:
            if clear:
                self.zero(off, self.heap.block_size(off))
            elif fill is not None:
                fill(off)
        except BaseException:
            self.heap.free(off)
            raise
        self.rt._collective_check(4, nbytes, align, off)
        return off

    def zero(self, offset: int, nbytes: int) -> None:
        """Zero ``nbytes`` of this PE's GPU heap."""
        mem = self.memory
        mem.check_range(offset, nbytes, "zero")
        if self.mapped and mem.host_address:
            ctypes.memset(mem.host_address + offset, 0, nbytes)
            return
        zeros = bytes(min(nbytes, _ZEROS))
        for lo in range(0, nbytes, _ZEROS):
            self.device.write(mem, offset + lo, zeros[:min(_ZEROS, nbytes - lo)])

    def free(self, off: int) -> None:
        """Collective: release the GPU allocation at ``off``."""
        if off not in self.heap.used:
            raise InvalidArgumentError(
                f"free: GPU offset {off} is not the start of a live symmetric allocation "
                "(double free, or a slice instead of the allocated array?)")
        self.rt.quiet()
        self.rt._collective_check(5, self.heap.block_size(off), 0, off)
        self.heap.free(off)

    # -- GPU-initiated communication -------------------------------------------------------

    def get_initiator(self) -> Initiator:
        """The launch device, request ring and ring service (made on first use, not
        collective)."""
        if self.initiator is None:
            from .initiated import Initiator
            self.initiator = Initiator(self)
        return self.initiator

    # -- errors and teardown ---------------------------------------------------------------------

    def stop_threads(self) -> BaseException | None:
        """Stop serving: the ring service (kernels' requests) first, then the GPU proxy
        (peers' requests). Returns a failure of the ring service, if one was recorded."""
        error = None
        if self.initiator is not None:
            try:
                self.initiator.close()
            except Exception as exc:
                error = exc
            self.initiator = None
        if self.proxy is not None:
            self.proxy.stop()
        return error

    def check_validation(self) -> None:
        """Raise GpuError for validation-layer errors reported since the last check."""
        if not self.device.validation:
            return
        errors = self.device.validation_errors
        if len(errors) > self._seen_errors:
            new = errors[self._seen_errors:]
            self._seen_errors = len(errors)
            raise GpuError(f"Vulkan validation errors on PE {self.my_pe} "
                           f"(VKSHMEM_GPU_VALIDATION=1): " + " | ".join(new[:5]))

    def close(self, check: bool = True) -> None:
        """Stop the proxy, release imported memory, the segment and the device; then raise
        validation errors if there were any (``check``)."""
        if self.closed:
            return
        self.closed = True
        failure = self.stop_threads()
        if self.proxy is not None:
            self.proxy.close()  # its thread is stopped: this releases the endpoints
        for pe, mem in list(self.peers.items()):
            if pe != self.my_pe:
                try:
                    mem.free()
                except BufferError as exc:
                    log.warning("PE %d: imported GPU heap of PE %d still viewed: %s",
                                self.my_pe, pe, exc)
        self.peers.clear()
        if self.segment is not None:
            try:
                self.segment.close()
            except BufferError as exc:
                log.warning("PE %d: the GPU heap is still viewed by arrays (to_numpy(zero_copy"
                            "=True)); it is released with the device: %s", self.my_pe, exc)
        self.device.close()  # the layer reports leaks during close: read errors after it
        errors = self.device.validation_errors[self._seen_errors:] \
            if self.device.validation else []
        if check and failure is not None:
            raise failure
        if check and errors:
            raise GpuError(f"Vulkan validation errors on PE {self.my_pe} "
                           f"(VKSHMEM_GPU_VALIDATION=1): " + " | ".join(errors[:5]))
