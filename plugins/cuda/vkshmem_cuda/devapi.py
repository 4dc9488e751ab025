"""The device API's context for CUDA kernels (``include/vkshmem_device.cuh``).

:meth:`DeviceContext.open` writes, in device memory of this PE's GPU, the table of every PE's
heap address *in this process* (its own VMM mapping, and the peers' mappings the domain made
at start-up: same GPU or NVLink/P2P; 0 for a PE it cannot reach) and the ``vks_ctx`` struct
that points to it, and returns the struct's device address: the one argument a kernel needs.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

from vkshmem.plugin import InvalidArgumentError

from .driver import CudaError, check

__all__ = ["CONTEXT", "DeviceContext", "include_dir", "vulkan_kernels"]

#: ``vks_ctx``: bases pointer, sync block offset, heap size, my PE, number of PEs
CONTEXT = struct.Struct("<QQQii")


def include_dir() -> str:
    """The folder holding ``vkshmem_device.cuh`` (``-I`` for NVRTC, CuPy, torch extensions)."""
    return str(Path(__file__).resolve().parent / "include")


class DeviceContext:
    """The device-memory context of one PE's kernels (freed with :meth:`close`)."""

    def __init__(self, device: Any, bases: list[int], sync_off: int, heap_size: int,
                 my_pe: int) -> None:
        self.device = device
        n = len(bases)
        blob = CONTEXT.pack(0, sync_off, heap_size, my_pe, n) + struct.pack(f"<{n}Q", *bases)
        device.current()
        self.address = int(check(device.cu.cuMemAlloc(len(blob)), "cuMemAlloc"))
        try:  # the struct first, then the table right after it
            blob = CONTEXT.pack(self.address + CONTEXT.size, sync_off, heap_size, my_pe, n) + \
                blob[CONTEXT.size:]
            device.htod(self.address, bytearray(blob), len(blob))
        except BaseException:
            self.close()
            raise
        #: per PE, whether kernels reach it by loads and stores
        self.reachable = [b != 0 for b in bases]

    @classmethod
    def of_heap(cls, runtime: Any, seg_id: int, device: Any, heap_size: int,
                my_pe: int) -> DeviceContext:
        """The context of segment ``seg_id``'s heap: every PE's base as the domain heap of
        ``runtime`` maps it here (0 where it does not)."""
        if runtime is None:
            raise InvalidArgumentError("the device API needs the runtime (shmem.init)")
        heap = runtime.domains.heap_of(seg_id)
        bases = [int(m.va) if m is not None else 0 for m in heap.direct]
        return cls(device, bases, heap.device_sync_off, heap_size, my_pe)

    def close(self) -> None:
        if self.address:
            addr, self.address = self.address, 0
            try:
                self.device.current()
                self.device.cu.cuMemFree(addr)
            except CudaError:
                pass


def vulkan_kernels(runtime: Any, seg_id: int, device: Any, fd: int, size: int) -> Any:
    """Vulkan kernels on a cuda heap (:func:`vkshmem.shmem.gpu_kernel`): the Vulkan device of
    this GPU imports the VMM heap's fd (device-local memory), so the Vulkan domain's kernels,
    request ring and ring service run on it unchanged (see
    :mod:`vkshmem.gpu.initiated.initiator`). Needs the GPU's Vulkan driver and the ``vulkan``
    package (FeatureNotAvailableError says which is missing)."""
    from vkshmem.plugin import vulkan_initiator

    if runtime is None:
        raise InvalidArgumentError("GPU kernels need the runtime (shmem.init)")
    return vulkan_initiator(runtime, seg_id, device.uuid, fd, size)
