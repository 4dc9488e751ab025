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

from .driver import CudaError, check

__all__ = ["CONTEXT", "DeviceContext", "include_dir"]

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

    def close(self) -> None:
        if self.address:
            addr, self.address = self.address, 0
            try:
                self.device.current()
                self.device.cu.cuMemFree(addr)
            except CudaError:
                pass
