"""CPU mappings of the cuda domain's heaps (this PE's and its same-node peers'), through Vulkan.

CUDA gives device memory no CPU mapping, so every small operation of the domain costs a GPU
command or the service kernel's round trip (7-12 µs from Python on an H100). Vulkan on NVIDIA
imports a VMM allocation's POSIX fd into the GPU's CPU-mapped BAR type and maps it
(:meth:`vkshmem.gpu.domain.peermap.PeerMaps.map_vmm`, the Vulkan domain's CPU-mapped peers): a
Vulkan device of this process on each GPU that holds a heap (no commands, ~26 MiB of that
GPU's memory each). With the heaps mapped, the domain does a put of host bytes of up to
``VKSHMEM_GPU_BAR_WRITE_MAX`` bytes as CPU stores (read back before it returns), a get or a
GPU-to-GPU copy of up to ``VKSHMEM_GPU_BAR_READ_MAX`` bytes as CPU loads, and the service
kernel takes its requests in this PE's GPU memory (polled there instead of across PCIe).

``VKSHMEM_CUDA_CPU_MAP``: ``auto`` (default: where the ``vulkan`` package, the Vulkan loader
and the GPU's Vulkan driver work; a failure is logged at INFO), ``on`` (the same, a failure
logged as a warning), ``off`` (no Vulkan device is opened).
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

from .driver import env_choice

if TYPE_CHECKING:
    from .driver import Device, Mapping

__all__ = ["ENV_MAP", "CpuMaps", "map_mode"]

log = logging.getLogger("vkshmem")

ENV_MAP = "VKSHMEM_CUDA_CPU_MAP"


def map_mode() -> str:
    """``VKSHMEM_CUDA_CPU_MAP``: auto (default), on or off."""
    return env_choice(ENV_MAP)


class CpuMaps:
    """The Vulkan devices that map this PE's heap and its peers' on the CPU (see the module
    docstring). :meth:`open` returns None where they cannot be had."""

    def __init__(self, maps: Any, cuda: Any) -> None:
        self._maps = maps  # vkshmem.plugin.PeerMaps (the Vulkan domain's)
        self.pe: int = maps.pe
        self._ffi = cuda.ffi
        #: ``vkc_bar_copy(dst, src, nbytes, readback)``: a CPU copy through a mapping, the
        #: written bytes read back where ``readback``
        self.bar_copy = cuda.lib.vkc_bar_copy
        self._memories: dict[int, Any] = {}  # Mapping id -> the Vulkan import (GpuMemory)

    @classmethod
    def open(cls, pe: int, timeout: float) -> CpuMaps | None:
        """The maps of PE ``pe``, or None (logged) where ``VKSHMEM_CUDA_CPU_MAP=off`` or the
        Vulkan side cannot be imported."""
        mode = map_mode()
        if mode == "off":
            return None
        try:
            from vkshmem.plugin import PeerMaps

            from . import _ops
        except Exception as exc:  # no vulkan package, no loader, no helper build
            log.log(logging.WARNING if mode == "on" else logging.INFO,
                    "PE %d: the cuda heaps are not CPU-mapped (Vulkan: %s; %s=off skips "
                    "the attempt)", pe, exc, ENV_MAP)
            return None
        return cls(PeerMaps(pe, timeout), _ops)

    def map(self, mapping: Mapping, fd: int, uuid: bytes) -> bool:
        """Map ``mapping`` (its allocation's POSIX fd, owned here; on the GPU with ``uuid``):
        sets ``mapping.cpu`` to the CPU address of its first byte. False (logged) where
        Vulkan cannot."""
        mem = self._maps.map_vmm(fd, mapping.size, uuid)
        if mem is None:
            return False
        self._memories[id(mapping)] = mem
        mapping.cpu = mem.host_address
        return True

    def map_own(self, device: Device, mapping: Mapping, fd: int, offset: int) -> bool:
        """Map this PE's heap ``mapping`` (its fd, which stays the caller's) and check it at
        ``offset`` (:meth:`works`); False (logged; nothing raised) where either fails."""
        try:
            if not self.map(mapping, os.dup(fd), device.uuid):
                why = "Vulkan did not import it into a CPU-mapped type (logged above)"
            elif self.works(device, mapping, offset):
                return True
            else:
                why = "CPU and GPU do not see each other's writes through it"
        except Exception as exc:  # a driver's refusal, a failed CUDA copy
            why = str(exc)
        self.unmap(mapping)
        log.log(logging.WARNING if map_mode() == "on" else logging.INFO,
                "PE %d: the cuda heap is not CPU-mapped: %s (%s=off skips the attempt)",
                self.pe, why, ENV_MAP)
        return False

    def works(self, device: Device, mapping: Mapping, offset: int) -> bool:
        """Whether CPU stores through ``mapping`` (this PE's own) reach CUDA's reads and CUDA's
        writes the CPU's loads, checked on 128 bytes at ``offset`` (zeroed afterwards)."""
        a, b = os.urandom(64), os.urandom(64)
        seen_gpu, seen_cpu = bytearray(64), bytearray(64)
        ffi, cpu = self._ffi, mapping.cpu + offset
        self.bar_copy(cpu, int(ffi.cast("uintptr_t", ffi.from_buffer(a))), 64, 1)
        device.dtoh(seen_gpu, mapping.va + offset, 64)
        device.htod(mapping.va + offset + 64, b, 64)
        self.bar_copy(int(ffi.cast("uintptr_t", ffi.from_buffer(seen_cpu))), cpu + 64, 64, 0)
        device.zero(mapping.va + offset, 128)
        return bytes(seen_gpu) == a and bytes(seen_cpu) == b

    def unmap(self, mapping: Mapping) -> None:
        """Drop ``mapping``'s CPU mapping (before CUDA releases the allocation)."""
        mapping.cpu = 0
        mem = self._memories.pop(id(mapping), None)
        if mem is not None:
            mem.free()

    def close(self) -> None:
        """Free every mapping and close the Vulkan devices."""
        for mem in self._memories.values():
            mem.free()
        self._memories.clear()
        self._maps.close()

