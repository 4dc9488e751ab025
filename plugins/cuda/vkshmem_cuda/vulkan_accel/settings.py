"""The variables of the Vulkan domain's NVIDIA accelerations (declared here, listed by
``vkshmem info`` under the accelerator, parsed once per process: :func:`settings`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from vkshmem.plugin import EnvVariable, parse_bool, parse_choice, parse_size, parse_variables

__all__ = ["VARIABLES", "CudaSettings", "settings"]


def _positive_us(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise ValueError("must be > 0 (microseconds)")
    return value


@dataclass(frozen=True)
class CudaSettings:
    """The accelerations' variables, parsed."""

    copy: int
    amo: bool
    service: str
    service_idle_us: float
    heap: bool
    link: bool
    link_map: bool
    link_piece: int


_VARIABLES = (
    EnvVariable(
        "VKSHMEM_GPU_CUDA_COPY", "256K",
        "On NVIDIA, with cuda-bindings installed, blocking copies of the Vulkan heap of this many "
        "bytes or more (GPU<->GPU on one device, CPU<->GPU) go through CUDA's copy path (the heap "
        "imported into CUDA): a Vulkan submission costs more per call and its DMA of host memory "
        "moves less. 0 keeps every copy on Vulkan.", parse_size, "copy"),
    EnvVariable(
        "VKSHMEM_GPU_CUDA_AMO", "1",
        "On NVIDIA, with cuda-bindings and NVRTC installed, AMOs on the Vulkan heap are a "
        "one-thread CUDA kernel on the same memory (a launch costs less than a Vulkan "
        "submission); 0 keeps them in Vulkan shaders. Atomic with the shaders' atomics either "
        "way.", parse_bool, "amo"),
    EnvVariable(
        "VKSHMEM_GPU_CUDA_SERVICE", "auto",
        "With VKSHMEM_GPU_CUDA_AMO's kernel, AMOs on the Vulkan heap and across CUDA links are "
        "served by a one-block CUDA kernel that stays resident while they keep coming (no launch "
        "per AMO; it ends after 1 ms without one and at the PE's next Vulkan submission, and is "
        "not used while Vulkan work is in flight: the GPU time-slices the two). auto: where the "
        "PE is alone on its GPU; on: always; off: a launch per AMO.",
        parse_choice("auto", "on", "off"), "service"),
    EnvVariable(
        "VKSHMEM_GPU_CUDA_SERVICE_IDLE_US", "1000",
        "Microseconds without an AMO after which VKSHMEM_GPU_CUDA_SERVICE's kernel ends (a "
        "synchronize of the whole CUDA context, e.g. torch.cuda.synchronize(), waits that long "
        "at most).", _positive_us, "service_idle_us"),
    EnvVariable(
        "VKSHMEM_GPU_CUDA_HEAP", "1",
        "On NVIDIA, with cuda-bindings installed, the GPU heap is a CUDA VMM allocation imported "
        "into Vulkan (the same bytes for shaders, Vulkan and CUDA), so same-node peers on other "
        "GPUs map it and copy across NVLink in one step (each PE then holds a CUDA context on its "
        "GPU from the heap's opening); 0 allocates it from Vulkan (peers on other GPUs then copy "
        "through a bounce buffer, VKSHMEM_GPU_CUDA_LINK).", parse_bool, "heap"),
    EnvVariable(
        "VKSHMEM_GPU_CUDA_LINK", "1",
        "On NVIDIA, with cuda-bindings installed, a PE reaches same-node peers on other GPUs "
        "through CUDA: their heaps mapped on its GPU where they are CUDA's (VKSHMEM_GPU_CUDA_HEAP; "
        "puts and gets, NVLink where there is one, and AMOs where the GPUs' atomics on each "
        "other's memory are native and VKSHMEM_GPU_CUDA_AMO's kernel compiles), else imported in "
        "a context on their GPU with device bytes through a bounce buffer mapped on both (puts "
        "and gets); the domain proxy carries the rest, and all of it with 0.", parse_bool,
        "link"),
    EnvVariable(
        "VKSHMEM_GPU_LINK_MAP", "1",
        "On NVIDIA, a PE with a CUDA link to a peer whose heap is in the CPU-mapped BAR type "
        "(VKSHMEM_GPU_BAR) maps that heap too, through a Vulkan device of its own on the peer's "
        "GPU (one per other GPU, some memory there): puts from host memory of up to "
        "VKSHMEM_GPU_BAR_WRITE_MAX bytes, and gets and GPU-to-GPU copies of up to "
        "VKSHMEM_GPU_BAR_READ_MAX bytes, across GPUs are then CPU stores and loads instead of a "
        "CUDA copy each (with VKSHMEM_GPU_MAPPED=1); 0 leaves them to CUDA.", parse_bool,
        "link_map"),
    EnvVariable(
        "VKSHMEM_GPU_LINK_PIECE", "0",
        "Piece size of a device copy through a CUDA link's bounce buffer (4 pieces in flight, "
        "the bounce buffer on the peer's GPU holds 4 of the largest); 0: a quarter of the copy, "
        "2-32 MiB.", parse_size, "link_piece"),
)

#: ``(name, default, meaning)`` of each: :attr:`CudaAccelerator.variables
#: <vkshmem_cuda.vulkan_accel.CudaAccelerator.variables>`
VARIABLES = tuple((v.name, v.default, v.doc) for v in _VARIABLES)


def settings(environ: Mapping[str, str] | None = None) -> CudaSettings:
    """The variables as set in ``environ`` (default ``os.environ``), parsed once."""
    return parse_variables(_VARIABLES, CudaSettings, environ)
