"""vkshmem-cuda: the ``cuda`` memory domain (a plugin of ``vkshmem.domains``).

Each PE's symmetric GPU heap is a CUDA virtual-memory-management allocation (``cuMemCreate``
with a POSIX-fd handle) on its GPU (local rank modulo GPUs, or ``VKSHMEM_CUDA_DEVICE``). The
fd goes to the PEs of the node, which map the heap into their own address space on *their*
GPU (``cuMemImportFromShareableHandle`` + ``cuMemMap`` + ``cuMemSetAccess``): a put into a peer
on another GPU of the node is one ``cuMemcpy`` over NVLink, with no CPU in the way. Arrays are
:class:`~vkshmem_cuda.array.CudaArray` (``__cuda_array_interface__``: CuPy, PyTorch and Numba
take them without a copy). Selected by ``domain='cuda'``, and by ``domain='gpu'``/``'auto'``
where CUDA can open on every PE (``VKSHMEM_GPU_PROVIDER`` picks another). Importing this
module imports no CUDA library: the domain is built on first use.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vkshmem.plugin import Config, DomainContext, DomainSpec, MemoryDomain, hookimpl

__all__ = ["SPEC", "include_dir", "register_domains"]


def include_dir() -> str:
    """The folder holding ``vkshmem_device.cuh``, the device API for CUDA kernels on the
    ``cuda`` domain (``-I`` for NVRTC, CuPy RawKernel/RawModule, torch extensions)."""
    from .devapi import include_dir as _include_dir

    return _include_dir()


def _open(ctx: DomainContext) -> MemoryDomain:
    from .domain import CudaDomain

    return CudaDomain(SPEC, ctx)


def _available(config: Config) -> bool:
    """Whether the CUDA driver and a GPU are there (the binding imports, cuInit succeeds)."""
    from .driver import device_count

    return device_count() > 0


SPEC = DomainSpec(
    name="cuda", factory=_open, family="gpu", priority=20, accelerator=_available,
    available=_available,
    description="a CUDA VMM allocation (NVIDIA; peers on every GPU of the node map it)",
    size_variable="VKSHMEM_CUDA_SYMMETRIC_SIZE",
    memory_kinds=frozenset({"cuda_va", "dmabuf"}),
    variables=(  # vkshmem info lists them with their values (README.md says more)
        ("VKSHMEM_CUDA_DEVICE", "", "CUDA device of this PE (empty: the PE's local rank "
         "modulo the node's GPUs)."),
        ("VKSHMEM_CUDA_SYMMETRIC_SIZE", "", "Size of each PE's CUDA heap (units K, M, G; "
         "empty: VKSHMEM_GPU_SYMMETRIC_SIZE), rounded up to the allocation granularity."),
        ("VKSHMEM_CUDA_SPIN_US", "100", "Microseconds a blocking operation spins on its "
         "stream before it blocks in the driver."),
        ("VKSHMEM_CUDA_SERVICE", "auto", "Small copies and AMOs served by a resident kernel: "
         "auto (where the PE is alone on its GPU), on, off (a launch or copy each)."),
        ("VKSHMEM_CUDA_SERVICE_IDLE_US", "1000", "Microseconds without a request after which "
         "the resident kernel ends (a device synchronize of yours waits that long at most)."),
        ("VKSHMEM_CUDA_CPU_MAP", "auto", "Map the heaps of this PE and its same-node peers on "
         "the CPU through Vulkan, so small copies are CPU stores and loads: auto, on (warns "
         "where it cannot), off.")),
)


@hookimpl
def register_domains(register: Callable[[Any], None]) -> None:
    """The CUDA domain."""
    register(SPEC)
