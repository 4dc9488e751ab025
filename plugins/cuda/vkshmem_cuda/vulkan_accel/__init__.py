"""The Vulkan domain's NVIDIA accelerations: a :class:`~vkshmem.plugin.GpuAccelerator`
declared under the entry-point group ``vkshmem.gpu_accelerators`` (``cuda``).

On an NVIDIA device of the ``vulkan`` domain it makes the heap a CUDA VMM allocation imported
into Vulkan (:mod:`..vmm`, ``VKSHMEM_GPU_CUDA_HEAP``), runs bulk copies and AMOs through CUDA
(:mod:`.copier`, ``VKSHMEM_GPU_CUDA_COPY``/``_AMO``/``_SERVICE``), links to same-node peers on
other GPUs (:mod:`.link`, ``VKSHMEM_GPU_CUDA_LINK``/``LINK_MAP``/``LINK_PIECE``) and makes the
heap a DLPack tensor (:mod:`.view`); see :class:`~.interop.CudaInterop`. Importing this module
imports no CUDA library: each piece is made at first use and says why where it cannot be.
"""

from __future__ import annotations

from typing import Any

from vkshmem.plugin import DomainAccelerator, GpuAccelerator

from .settings import VARIABLES

__all__ = ["ACCELERATOR", "CudaAccelerator"]


class CudaAccelerator(GpuAccelerator):
    """CUDA under the Vulkan domain on NVIDIA GPUs (see the module docstring)."""

    name = "cuda"
    description = ("NVIDIA: the heap from CUDA's VMM, copies and AMOs through CUDA, links to "
                   "peers on other GPUs, DLPack")
    variables = VARIABLES

    def applies(self, info: Any) -> bool:
        return info.vendor == "NVIDIA"

    def attach(self, domain: Any) -> DomainAccelerator:
        from .interop import CudaInterop

        return CudaInterop(domain)

    def status(self) -> str:
        import importlib.util

        if importlib.util.find_spec("cuda.bindings") is None:
            return "installed; cuda-bindings missing (pip install cuda-bindings)"
        return "installed"


#: the entry point's object
ACCELERATOR = CudaAccelerator()
