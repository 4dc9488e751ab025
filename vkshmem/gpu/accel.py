"""The Vulkan domain's vendor accelerations: the declared interface, and their discovery.

The ``vulkan`` domain runs on any vendor's Vulkan driver. A vendor package may accelerate it
on its own GPUs (the heap from the vendor's allocator, bulk copies and AMOs through the
vendor's API, links to same-node peers on other GPUs, the heap as a DLPack tensor): it
subclasses :class:`GpuAccelerator` and declares an instance under the entry-point group
:data:`ENTRY_POINT_GROUP`::

    [project.entry-points."vkshmem.gpu_accelerators"]
    mine = "my_package.accel:ACCELERATOR"

The domain asks the accelerators in name order (``VKSHMEM_PLUGINS_ALLOW``/``_DENY`` apply, by
entry-point or distribution name) for the first that :meth:`~GpuAccelerator.applies` to its
device, and :meth:`~GpuAccelerator.attach`\\ es it: the :class:`DomainAccelerator` it returns
is asked, at each operation, for what it takes over (``None``/``False``: Vulkan does it). With
none installed (vkshmem-cuda provides the ``cuda`` one, for NVIDIA) the domain is Vulkan-only;
``vkshmem info`` says which were found. Nothing here imports a vendor's API.

Load policy, as for the other plugins (:mod:`vkshmem.core.plugins.loader`): an accelerator
built for another plugin API (its :attr:`~GpuAccelerator.api_version`) is refused, and one
that fails to load, or to attach to a domain, is skipped with a warning (an error under
``VKSHMEM_PLUGINS_STRICT=1``).
"""

from __future__ import annotations

import logging
import os
from abc import ABC, abstractmethod
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any, Protocol

from vkshmem.core.errors import PluginError
from vkshmem.core.plugins.apiversion import API_VERSION, check_api_version
from vkshmem.core.plugins.loader import LoadedPlugin, PluginPolicy, entry_points_for, fail

from .domain.peermap import PeerMaps
from .domain.segment import CONTROL_BYTES, CONTROL_SLOT, CONTROL_WORDS
from .env import (
    DEFAULT_SPIN_US,
    ENV_SPIN,
    EnvVariable,
    GpuSettings,
    env_float,
    parse_bool,
    parse_choice,
    parse_variables,
)
from .env import settings as gpu_settings
from .errors import GpuError
from .vk.memory import ExportInfo, GpuMemory

if TYPE_CHECKING:
    from vkshmem.core.config import Config
    from vkshmem.core.domains.contract import DomainLink

    from .vk.physical import DeviceInfo

__all__ = ["CONTROL_BYTES", "CONTROL_SLOT", "CONTROL_WORDS", "DEFAULT_SPIN_US", "ENTRY_POINT_GROUP",
           "ENV_SPIN", "AcceleratorEntry", "Copier", "DomainAccelerator", "EnvVariable",
           "ExportInfo", "GpuAccelerator", "GpuError", "GpuMemory", "GpuSettings", "HeapMemory",
           "PeerMaps", "accelerator_for", "attach_accelerator", "env_float", "gpu_settings",
           "installed_accelerators", "parse_bool", "parse_choice", "parse_variables",
           "vulkan_initiator"]

log = logging.getLogger("vkshmem")

#: the entry-point group of the Vulkan domain's accelerators
ENTRY_POINT_GROUP = "vkshmem.gpu_accelerators"


class HeapMemory(Protocol):
    """A vendor's allocation the domain imports into Vulkan as its heap (opaque fd)."""

    size: int  #: bytes (at least what was asked)

    def export_fd(self) -> int:
        """A new opaque fd of the whole allocation (the caller owns it)."""

    def zero(self, offset: int, nbytes: int) -> None:
        """Zero ``nbytes`` at ``offset``."""

    def close(self) -> None:
        """Release the allocation (after Vulkan's import of it is freed)."""


class Copier(Protocol):
    """What the domain calls on the copier a :class:`DomainAccelerator` hands out; every call
    is complete when it returns (but :meth:`start`, completed by :meth:`DomainAccelerator.sync`)."""

    def pointer(self, mem: GpuMemory) -> int:
        """The device address of ``mem`` in the vendor's API (0: not reachable there)."""

    def h2d(self, dst: int, src: int, nbytes: int) -> None: ...

    def d2h(self, dst: int, src: int, nbytes: int) -> None: ...

    def copy(self, dst: GpuMemory, dst_offset: int, src: GpuMemory, src_offset: int,
             nbytes: int) -> bool:
        """A device copy; False where it cannot (Vulkan copies then)."""

    def pinned(self, host: int, nbytes: int) -> bool:
        """Whether ``nbytes`` at host address ``host`` are registered for DMA."""

    def start(self, kind: int, dst: int, src: int, nbytes: int) -> None:
        """Issue a copy (kind 1: host to device, 2: device to host) without waiting."""

    def amo(self, mem: GpuMemory, offset: int, op: int, width: int, operand: int,
            compare: int) -> int | None:
        """One AMO on ``mem``: the old value, or None (Vulkan's shader does it then)."""


class DomainAccelerator:
    """One Vulkan domain's acceleration (:meth:`GpuAccelerator.attach`). This base class is
    the Vulkan-only domain's: it takes nothing over; a vendor's overrides what it does."""

    def __init__(self, why: str = "no GPU accelerator is installed") -> None:
        self.why = why

    def make_heap(self, nbytes: int) -> HeapMemory | None:
        """The heap's memory (``nbytes``, the symmetric bytes and :data:`CONTROL_BYTES`),
        or None: Vulkan allocates it. Raising is logged and Vulkan allocates it too."""
        return None

    def copier(self, nbytes: int) -> Copier | None:
        """The copier for a blocking copy of ``nbytes`` (None: Vulkan copies)."""
        return None

    def amo_copier(self) -> Copier | None:
        """The copier for an AMO (None: Vulkan's shaders)."""
        return None

    def native_ops(self, address: int) -> bool:
        """Fill the proxy's native ops table at ``address`` (``struct vk_domain_ops``) for
        this heap; False where this accelerator does not."""
        return False

    def sync(self) -> None:
        """Complete what :meth:`Copier.start` issued (the domain's ``quiet``)."""

    def pin_host(self, address: int, size: int) -> None:
        """Host memory the domain imported (a peer's proxy mailbox): register it for DMA."""

    def dup_peer_fd(self, fd: int) -> int:
        """A duplicate of a same-device peer's heap fd where copies may want it, else -1."""
        return -1

    def keep_peer(self, mem: GpuMemory, fd: int, info: ExportInfo) -> None:
        """The peer's heap ``mem`` (Vulkan's import) and the duplicate :meth:`dup_peer_fd`
        gave (owned here from now on)."""
        os.close(fd)

    def drop_peer(self, mem: GpuMemory) -> None:
        """Forget a peer's heap (before Vulkan's import of it is freed)."""

    def link_group(self) -> str | None:
        """The domain's ``link_group`` (see
        :class:`~vkshmem.core.domains.contract.DomainExport`)."""
        return None

    def link_peer(self, pe: int, fds: list[int], meta: bytes,
                  group: str | None) -> DomainLink | None:
        """A link to ``pe``'s heap on another GPU (``fds`` owned here), or None."""
        for fd in fds:
            os.close(fd)
        return None

    def view(self) -> Any:
        """The heap as the vendor's compute API sees it (``pointer``, ``ordinal``), for
        DLPack and ``__cuda_array_interface__``; BufferError saying why where it cannot be."""
        raise BufferError(f"DeviceArrays are DLPack tensors only where a GPU accelerator "
                          f"imports the heap (vkshmem-cuda, on NVIDIA GPUs; here {self.why}): "
                          f"use to_numpy() for a copy")

    def dlpack_range(self) -> tuple[int, int, int, int] | None:
        """Where the heap appears to DLPack consumers (see :meth:`view`), or None."""
        return None

    def close(self) -> None:
        """Release everything (after the core closed the links)."""


class GpuAccelerator(ABC):
    """A vendor's acceleration of the Vulkan domain (see the module docstring)."""

    #: its name (the entry point's), and one line for ``vkshmem info``
    name: str = ""
    description: str = ""
    #: its own environment variables: (name, default, doc), listed by ``vkshmem info`` (parse
    #: them once: :func:`parse_variables`)
    variables: tuple[tuple[str, str, str], ...] = ()
    #: the plugin API version it was built for (``"major.minor"``; by default that of the
    #: vkshmem it was imported from): checked at load as a spec's ``api_version`` is
    api_version: str = API_VERSION

    @abstractmethod
    def applies(self, info: DeviceInfo) -> bool:
        """Whether it accelerates the Vulkan device ``info`` (its vendor's)."""

    @abstractmethod
    def attach(self, domain: Any) -> DomainAccelerator:
        """Its accelerator of ``domain`` (a :class:`~vkshmem.gpu.domain.vulkan.VulkanDomain`, whose
        ``device``, ``memory``, ``size``, ``ctx``, ``my_pe``, ``mapped``, ``vmm``, ... it
        reads at use: attach comes before the heap is made)."""

    def status(self) -> str:
        """Whether it can work here, for ``vkshmem info`` (e.g. a missing library)."""
        return "installed"


@dataclass
class AcceleratorEntry:
    """One entry point of :data:`ENTRY_POINT_GROUP` and what became of it."""

    name: str
    distribution: str
    accelerator: GpuAccelerator | None
    status: str


@cache
def _load(policy: PluginPolicy) -> tuple[AcceleratorEntry, ...]:
    records: list[LoadedPlugin] = []
    loaded: dict[int, GpuAccelerator] = {}
    for ep, rec in entry_points_for(ENTRY_POINT_GROUP, policy, records, by_name=True):
        what = f"GPU accelerator {ep.name!r} from {rec.distribution}"
        try:
            accel = ep.load()
            if isinstance(accel, type):
                accel = accel()
            if not isinstance(accel, GpuAccelerator):
                raise TypeError(f"{ep.value} is not a GpuAccelerator")
        except Exception as exc:  # a third party's bug must not take the job down
            rec.status = f"failed: {type(exc).__name__}: {exc}"
            fail(policy.strict, f"{what} failed to load: {type(exc).__name__}: {exc}")
            continue
        refused = check_api_version(accel.api_version)
        if refused:
            rec.status = f"refused: {refused}"
            fail(policy.strict, f"{what} {rec.version} is refused: {refused}")
            continue
        loaded[id(rec)] = accel
    return tuple(AcceleratorEntry(r.name, r.distribution, loaded.get(id(r)), r.status)
                 for r in records)


def installed_accelerators(config: Config) -> tuple[AcceleratorEntry, ...]:
    """Every entry point of :data:`ENTRY_POINT_GROUP` (loaded once per process and filter)."""
    return _load(PluginPolicy.of(config))


def accelerator_for(info: DeviceInfo, config: Config) -> GpuAccelerator | None:
    """The first installed accelerator that applies to the device ``info``, or None."""
    for entry in installed_accelerators(config):
        if entry.accelerator is not None and entry.accelerator.applies(info):
            return entry.accelerator
    return None


def attach_accelerator(domain: Any, device: Any, config: Config) -> DomainAccelerator:
    """The accelerator of the Vulkan domain ``domain`` on ``device``: the first installed one
    that applies, attached; else the Vulkan-only one saying why. Where attaching raises (a
    third party's bug must not abort the domain's open): a warning and the Vulkan-only one (an
    error under ``VKSHMEM_PLUGINS_STRICT=1``, as for a plugin that fails to load)."""
    found = accelerator_for(device.info, config)
    if found is None:
        return DomainAccelerator(f"none installed applies to {device.name}")
    try:
        return found.attach(domain)
    except Exception as exc:
        why = f"GPU accelerator {found.name!r} failed to attach: {type(exc).__name__}: {exc}"
        if config.plugins_strict:
            raise PluginError(why + " (VKSHMEM_PLUGINS_STRICT=1 makes this an error)") from exc
        log.warning("PE %d: %s; the domain is Vulkan-only (set VKSHMEM_PLUGINS_STRICT=1 to "
                    "fail instead)", getattr(domain, "my_pe", -1), why)
        return DomainAccelerator(why)


def vulkan_initiator(runtime: Any, seg_id: int, device_uuid: bytes, fd: int, size: int) -> Any:
    """GPU-initiated communication (Vulkan kernels, the request ring and its service) on
    another domain's heap: the Vulkan device whose UUID is ``device_uuid`` imports the opaque
    fd ``fd`` (a duplicate is taken) of ``size`` bytes (see
    :mod:`vkshmem.gpu.initiated.initiator`)."""
    from .initiated.initiator import Initiator

    return Initiator.for_fd(runtime, seg_id, device_uuid, fd, size)

