"""The Vulkan domain's CUDA side on NVIDIA: the heap from CUDA's VMM (:mod:`..vmm`), the heap
viewed by CUDA (DLPack, ``__cuda_array_interface__``; :mod:`.view`), bulk copies and AMOs
through CUDA (:mod:`.copier`) and links to peers on other GPUs (:mod:`.link`), as the
:class:`~vkshmem.plugin.DomainAccelerator` of a :class:`~vkshmem.gpu.domain.vulkan.VulkanDomain`.
Everything here is made at first use and says why (``BufferError``, or an info log for the
copies) where it cannot be: no NVIDIA driver, no ``cuda-bindings``, a device CUDA does not
list."""

from __future__ import annotations

import importlib.util
import logging
import os
import threading
from typing import TYPE_CHECKING, Any

from vkshmem.plugin import (
    CONTROL_BYTES,
    CONTROL_WORDS,
    KDL_CUDA,
    DomainAccelerator,
    ExportInfo,
    GpuError,
    PeerMaps,
    gpu_settings,
)

from ..service_kernel import BOX_BYTES
from .copier import CudaCopier
from .hub import LinkHub
from .link import CudaLink
from .settings import settings
from .view import CudaView

if TYPE_CHECKING:
    from ..service_kernel import CudaService
    from ..vmm import VmmHeap

__all__ = ["CudaInterop"]

log = logging.getLogger("vkshmem")


class CudaInterop(DomainAccelerator):
    """CUDA's view of the heap, the CUDA copier and the links of the Vulkan domain ``dom``
    (whose ``device``, ``memory``, ``size``, ``ctx``, ``my_pe``, ``closed`` and ``vmm`` it
    reads at use). Its counters and switches (``cuda_amo``, ``cuda_copies``, ...) are read
    and set as ``domain.accel.<name>`` (tests, probes)."""

    def __init__(self, dom: Any) -> None:
        super().__init__()
        self.dom = dom
        #: this accelerator's variables (settings.py) and the Vulkan domain's
        self.own, self.gpu = settings(), gpu_settings()
        copy_min, amo = self.own.copy, self.own.amo
        self._cuda: CudaView | None = None  # the heap as CUDA sees it (first use)
        self._cuda_error = ""
        self._cuda_lock = threading.Lock()
        self._copier_lock = threading.Lock()
        #: blocking copies from this size go through CUDA (NVIDIA; VKSHMEM_GPU_CUDA_COPY, 0:
        #: never); the copier is made at the first such copy (False: it could not be)
        self.cuda_copy_min = copy_min
        #: AMOs through a CUDA kernel (NVIDIA; VKSHMEM_GPU_CUDA_AMO)
        self.cuda_amo = amo
        self._copier: CudaCopier | bool | None = None
        #: same-device peers' fd duplicates until the copier exists: (fd, size, dedicated, vmm)
        self._peer_fds: dict[Any, tuple[int, int, bool, bool]] = {}
        #: host ranges registered for DMA beyond the host heap (the copier registers them too)
        self._host_ranges: list[tuple[int, int]] = []
        #: the links to same-node peers on other GPUs (first link; False: they cannot be)
        self._hub: LinkHub | bool | None = None
        #: the devices that map those peers' heaps on the CPU (first mapped link)
        self._maps: PeerMaps | None = None

    @property
    def cuda_copies(self) -> int:
        """How many copies went through CUDA so far."""
        return self._copier.copies if isinstance(self._copier, CudaCopier) else 0

    @property
    def cuda_amos(self) -> int:
        """How many AMOs went through CUDA so far."""
        return self._copier.amos if isinstance(self._copier, CudaCopier) else 0

    @property
    def cuda_service(self) -> CudaService | None:
        """The service kernel serving AMOs through CUDA (VKSHMEM_GPU_CUDA_SERVICE), None
        where there is none (not used, or no AMO yet)."""
        return self._copier.service if isinstance(self._copier, CudaCopier) else None

    # -- peers' fds, for CUDA's import of their heaps ------------------------------------------

    def dup_peer_fd(self, fd: int) -> int:
        """A duplicate of a peer's fd where CUDA copies may want it (else -1)."""
        if self._copier is False or not (self.cuda_copy_min or self.cuda_amo) or \
                self.dom.device.info.vendor != "NVIDIA":
            return -1
        return os.dup(fd)

    def keep_peer(self, mem: Any, fd: int, info: ExportInfo) -> None:
        if isinstance(self._copier, CudaCopier):
            self._copier.add_peer(mem, fd, info.size, info.dedicated, info.vmm)
        else:
            self._peer_fds[mem] = (fd, info.size, info.dedicated, info.vmm)

    def drop_peer(self, mem: Any) -> None:
        if isinstance(self._copier, CudaCopier):
            self._copier.drop_peer(mem)
        pending = self._peer_fds.pop(mem, None)
        if pending is not None:
            os.close(pending[0])

    # -- links to peers on other GPUs (see :mod:`.link`) -----------------------

    def link_group(self) -> str | None:
        """``cuda`` where this PE may link to other GPUs' peers (NVIDIA, cuda-bindings,
        ``VKSHMEM_GPU_CUDA_LINK``), else None: the core passes such peers' fds only between
        PEs that both say so."""
        if not self.own.link or self.dom.device.info.vendor != "NVIDIA" or \
                importlib.util.find_spec("cuda.bindings") is None:
            return None
        return "cuda"

    def link_peer(self, pe: int, fds: list[int], meta: bytes,
                  group: str | None) -> CudaLink | None:
        """A CUDA link to ``pe``'s heap on another GPU (the core's ``link_group`` route)."""
        if group is None:
            os.close(fds[0])
            return None
        return self._link(fds[0], ExportInfo.unpack(meta), group)

    def _link(self, fd: int, info: ExportInfo, uuid_hex: str) -> CudaLink | None:
        """A link to a peer's heap (its fd, owned here) on the GPU ``uuid_hex``, or None
        (logged once) where CUDA cannot make one."""
        cfg = self.dom.ctx.config
        if self._hub is None:
            try:
                self._hub = LinkHub(self.cuda_view(), self.own.link_piece,
                                    int(self.gpu.spin_us * 1000))
                self._hub.timeout = cfg.gpu_timeout
                dom = self.dom
                if dom.vmm is not None and dom.memory.size - dom.size >= CONTROL_BYTES:
                    self._hub.control_off = self.dom.size  # the two-GPU all-reduce's words
            except (BufferError, GpuError) as exc:
                log.info("PE %d: peers on other GPUs go through the domain proxy (%s)",
                         self.dom.my_pe, exc)
                self._hub = False
        if not isinstance(self._hub, LinkHub):
            os.close(fd)
            return None
        cpu = -1  # a duplicate for the CPU mapping (peermap)
        if self.own.link_map and self.gpu.mapped:
            try:
                cpu = os.dup(fd)
            except OSError:
                os.close(fd)
                raise
        try:  # the link owns fd from here (closed on failure), not cpu
            link = CudaLink(self._hub, fd, info.size, info.dedicated, uuid_hex,
                            self.dom.check_range, info.vmm, self.amo_copier)
        except BaseException:
            if cpu >= 0:
                os.close(cpu)
            raise
        if cpu >= 0:
            try:
                self._map_peer(link, cpu, info)
            except BaseException:
                link.close()
                raise
        return link

    def _map_peer(self, link: CudaLink, fd: int, info: ExportInfo) -> None:
        """Map the link's peer heap on the CPU too (``fd`` owned here), for the small copies
        (:mod:`~vkshmem.gpu.domain.peermap`)."""
        cfg = self.dom.ctx.config
        if self._maps is None:
            self._maps = PeerMaps(self.dom.my_pe, cfg.gpu_timeout)
        mem = self._maps.map(fd, info)
        if mem is not None:
            local = self.dom.memory.host_address if self.dom.memory.host_visible else 0
            link.attach_map(mem, local, self.dom.memory.size, self.gpu.bar_write_max,
                            self.gpu.bar_read_max)

    def copier(self, nbytes: int) -> CudaCopier | None:
        """The CUDA copier for a blocking copy of ``nbytes`` (None: take the Vulkan path)."""
        copier = self._copier
        if isinstance(copier, CudaCopier):
            return copier if nbytes >= self.cuda_copy_min > 0 else None
        if copier is False or not self.cuda_copy_min or nbytes < self.cuda_copy_min:
            return None
        return self._open_copier()

    def amo_copier(self) -> CudaCopier | None:
        """The CUDA copier where AMOs go through CUDA (None: Vulkan shaders)."""
        copier = self._copier
        if copier is False or not self.cuda_amo:
            return None
        if copier is None:
            if self.dom.device.info.vendor != "NVIDIA":
                self._copier = False  # no CUDA here: not asked again
                return None
            copier = self._open_copier()
        return copier if copier is not None and copier.can_amo() else None

    def _open_copier(self) -> CudaCopier | None:
        """Make the copier at first use (None where it cannot be: logged once)."""
        with self._copier_lock:  # the proxy thread copies too
            if self._copier is None:
                self._copier = self._make_copier()
                for fd, *_rest in self._peer_fds.values():
                    if self._copier is False:
                        os.close(fd)
                if isinstance(self._copier, CudaCopier):
                    for mem, pending in self._peer_fds.items():
                        self._copier.add_peer(mem, *pending)
                self._peer_fds.clear()
            made = self._copier
        return made if isinstance(made, CudaCopier) else None

    def _make_copier(self) -> CudaCopier | bool:
        try:
            view = self.cuda_view()
            host = self.dom.ctx.host_heap
            heap = [(host.address, host.size)] if host else []
            copier = CudaCopier(view, heap + self._host_ranges,
                                self.gpu.spin_us)
        except (BufferError, GpuError) as exc:
            log.info("PE %d: GPU copies stay on Vulkan (%s)", self.dom.my_pe, exc)
            return False
        cfg = self.dom.ctx.config
        if self.cuda_amo and self.own.service != "off":
            flights = self.dom.device.in_flight  # changed in place, per queue
            copier.use_service(self.own.service, self.own.service_idle_us,
                               cfg.gpu_timeout, lambda: bool(flights[0] or flights[1]),
                               self._request_box(view))
            self.dom.device.on_submit = copier.park
        return copier

    def _request_box(self, view: CudaView) -> tuple[int, int] | None:
        """Where the service kernel's requests go: the CUDA heap's control bytes past the
        symmetric ones (``CONTROL_BYTES``) where the CPU maps the heap (then the kernel polls
        GPU memory, not host memory across PCIe), else None (pinned host memory)."""
        mem = self.dom.memory
        if self.dom.vmm is None or not mem.host_visible or not mem.host_address or \
                mem.size - self.dom.size < CONTROL_BYTES or BOX_BYTES > CONTROL_WORDS:
            return None
        return mem.host_address + self.dom.size, view.pointer + self.dom.size

    def pin_host(self, address: int, size: int) -> None:
        """Register a host range for CUDA's DMA too (now, or when the copier is made)."""
        if self.dom.device.info.vendor != "NVIDIA" or self._copier is False:
            return
        self._host_ranges.append((address, size))
        if isinstance(self._copier, CudaCopier):
            self._copier.add_host(address, size)

    def make_heap(self, nbytes: int) -> VmmHeap | None:
        """The heap as a CUDA VMM allocation where ``VKSHMEM_GPU_CUDA_HEAP`` and CUDA can
        supply it (NVIDIA, cuda-bindings; see :mod:`..vmm`), else None (Vulkan's)."""
        dom = self.dom
        if not self.own.heap or dom.device.info.vendor != "NVIDIA" or \
                importlib.util.find_spec("cuda.bindings") is None:
            return None
        from ..vmm import VmmHeap

        return VmmHeap(dom.device.info.device_uuid, nbytes)

    def native_ops(self, address: int) -> bool:
        """The proxy's native rounds through CUDA's copies and AMO kernel (small copies
        through the BAR mapping, as the domain's ``write_nbi`` does)."""
        dom = self.dom
        if dom.device.info.vendor != "NVIDIA" or self._copier is False or \
                not self.cuda_copy_min:  # VKSHMEM_GPU_CUDA_COPY=0: copies stay on Vulkan
            return False
        copier = self._copier if isinstance(self._copier, CudaCopier) else self._open_copier()
        if copier is None:
            return False
        mem = dom.memory
        mapped = mem.host_address if dom.mapped and mem.host_visible else 0
        wide = 1 << 62 if mem.host_cached else 0
        copier.native_ops(address, dom.size, mapped, max(wide, dom.bar_write_max),
                          max(wide, dom.bar_read_max), self.cuda_amo)
        return True

    def sync(self) -> None:
        """Complete the copies issued on CUDA's stream."""
        copier = self._copier
        if copier.__class__ is CudaCopier:
            copier.sync()

    # -- the heap viewed by CUDA ---------------------------------------------------------------

    def view(self) -> CudaView:
        return self.cuda_view()

    def cuda_view(self) -> CudaView:
        """This PE's heap imported into CUDA (made on first use, kept until close; see
        :mod:`.view`); BufferError saying why where it cannot be."""
        view = self._cuda
        if view is not None:
            return view
        with self._cuda_lock:
            if self._cuda is None:
                if self._cuda_error:
                    raise BufferError(self._cuda_error)
                if self.dom.closed:
                    raise BufferError("the GPU heap was released (finalize)")
                try:
                    if self.dom.device.info.vendor != "NVIDIA":
                        raise BufferError(f"DeviceArrays are DLPack tensors only on NVIDIA GPUs "
                                          f"(CUDA imports the Vulkan heap); this is "
                                          f"{self.dom.device.name}: use to_numpy() for a copy")
                    self._cuda = CudaView(self.dom.memory, self.dom.device.info.device_uuid,
                                          self.dom.vmm)
                except BufferError as exc:
                    self._cuda_error = str(exc)
                    raise
            return self._cuda

    def dlpack_range(self) -> tuple[int, int, int, int] | None:
        """Where the heap appears to DLPack consumers once CUDA has imported it."""
        view = self._cuda
        return None if view is None else (KDL_CUDA, view.ordinal, view.pointer, self.dom.size)

    def close(self) -> None:
        """Release the links' hub (after the core closed the links), the copier (peers'
        imports included) and the view."""
        if isinstance(self._hub, LinkHub):
            self._hub.close()
        self._hub = False
        if self._maps is not None:
            self._maps.close()
            self._maps = None
        self.dom.device.on_submit = None
        if isinstance(self._copier, CudaCopier):
            self._copier.close()
        self._copier = False
        for fd, *_rest in self._peer_fds.values():
            os.close(fd)
        self._peer_fds.clear()
        if self._cuda is not None:
            self._cuda.close()
            self._cuda = None
