"""CPU mappings of same-node peers' heaps on other GPUs (the Vulkan domain on NVIDIA).

A CUDA link (:mod:`~vkshmem_cuda.vulkan_accel.link`) copies with one CUDA call per operation, which
costs ~8-10 µs however few the bytes. Where the peer's heap sits in the CPU-mapped BAR type
(:mod:`~vkshmem.gpu.domain.segment`), this PE can map it too: a Vulkan device of its own on the
peer's GPU (opened at the first such link, one per GPU, matched by UUID) imports the peer's
fd into that type and maps it. Then a small put is CPU stores across PCIe and a small get CPU
loads (``VKSHMEM_GPU_BAR_WRITE_MAX`` / ``VKSHMEM_GPU_BAR_READ_MAX``, as on one GPU), with no
GPU command at all; ``VKSHMEM_GPU_LINK_MAP=0`` leaves every copy to CUDA. The extra device
costs 26 MiB on the other GPU (an H100; measured by ``tests/gpu/link_latency_probe.py``).
"""

from __future__ import annotations

import logging
import os
import threading

from ..vk.instance import list_devices
from ..vk.logical import LogicalDevice
from ..vk.memory import ExportInfo, GpuMemory
from ..vk.physical import MEM_HOST_VISIBLE, DeviceInfo

__all__ = ["PeerMaps"]

log = logging.getLogger("vkshmem")


class PeerMaps:
    """The Vulkan devices this PE opens on other GPUs to map peers' heaps there (one per GPU,
    at first use; None where it could not be opened, logged once). They only import and map
    memory (no commands), so they run without the validation layer."""

    def __init__(self, pe: int, timeout: float) -> None:
        self.pe = pe
        self._timeout = timeout
        self._lock = threading.Lock()
        self._devices: dict[bytes, LogicalDevice | None] = {}
        self._infos: list[DeviceInfo] | None = None  # Vulkan's devices (first use)

    def _info(self, uuid: bytes) -> DeviceInfo | None:
        with self._lock:
            if self._infos is None:
                try:
                    self._infos = list_devices()
                except Exception as exc:  # a loader or driver failure: no mappings then
                    log.info("PE %d: Vulkan's devices could not be listed (%s)", self.pe, exc)
                    self._infos = []
            return next((d for d in self._infos if d.device_uuid == uuid), None)

    def _device(self, info: DeviceInfo) -> LogicalDevice | None:
        uuid = info.device_uuid
        with self._lock:
            if uuid in self._devices:
                return self._devices[uuid]
            dev = None
            try:
                dev = LogicalDevice(info.index, timeout=self._timeout)  # no commands: no validation
            except Exception as exc:  # GpuError, FeatureNotAvailableError, a driver's refusal
                log.info("PE %d: peers' heaps on GPU %s are not CPU-mapped (%s); their small "
                         "copies go through CUDA", self.pe, uuid.hex(), exc)
            self._devices[uuid] = dev
            return dev

    def map(self, fd: int, info: ExportInfo) -> GpuMemory | None:
        """The peer's heap (``fd``, owned here; ``info`` its export) imported by this PE's
        device on that GPU, mapped write-combined; None (logged) where it cannot be: no such
        device, a heap outside the BAR type, a refused import."""
        gpu = self._info(info.device_uuid)
        kind = info.memory_type_index
        if gpu is None or kind >= len(gpu.memory_types) or \
                not gpu.memory_types[kind][0] & MEM_HOST_VISIBLE:  # no device opened for it
            log.info("PE %d: a peer's heap on GPU %s is not CPU-mapped (%s)", self.pe,
                     info.device_uuid.hex(), "Vulkan lists no such device" if gpu is None
                     else f"memory type {kind} is not host-visible")
            os.close(fd)
            return None
        return self._import(gpu, fd, info.size, info.memory_type_index, info.dedicated)

    def map_vmm(self, fd: int, size: int, device_uuid: bytes) -> GpuMemory | None:
        """A CUDA VMM allocation (its POSIX fd, owned here; ``size`` bytes, the whole
        allocation) on the GPU with ``device_uuid``, imported into that device's CPU-mapped
        BAR type and mapped write-combined; None (logged) where it cannot be (see :meth:`map`).
        The cuda domain maps its heaps so (``vkshmem_cuda.cpumap``)."""
        gpu = self._info(device_uuid)
        if gpu is None:
            log.info("PE %d: a heap on GPU %s is not CPU-mapped (Vulkan lists no such device)",
                     self.pe, device_uuid.hex())
            os.close(fd)
            return None
        return self._import(gpu, fd, size, None, False)

    def _import(self, gpu: DeviceInfo, fd: int, size: int, kind: int | None,
                dedicated: bool) -> GpuMemory | None:
        """``fd`` (owned here) imported by this PE's device on ``gpu`` as memory type ``kind``
        (None: the BAR type where the device takes it), or None (logged)."""
        dev = self._device(gpu)
        if dev is None:
            os.close(fd)
            return None
        uuid = gpu.device_uuid.hex()
        try:
            mem = dev.import_fd(fd, size, memory_type_index=kind, dedicated=dedicated,
                                take_ownership=True)
        except Exception as exc:  # GpuError, InvalidArgumentError (fd closed by the import)
            log.info("PE %d: a peer's heap on GPU %s is not CPU-mapped (%s)", self.pe, uuid,
                     exc)
            return None
        if not mem.host_visible or mem.host_cached:
            log.info("PE %d: a peer's heap on GPU %s is not in the CPU-mapped BAR type (%s)",
                     self.pe, uuid, mem.map_reason or "cached memory")
            mem.free()
            return None
        return mem

    def close(self) -> None:
        """Close the devices (after the links freed their mappings)."""
        with self._lock:
            devices, self._devices = list(self._devices.values()), {}
        for dev in devices:
            if dev is not None:
                dev.close()
