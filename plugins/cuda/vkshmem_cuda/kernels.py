"""The CUDA domain's kernels, compiled by NVRTC at first use: the one-thread AMO and the
service kernel (vkshmem's own, :mod:`vkshmem.gpu.cudakernels`, which the Vulkan domain also
launches on NVIDIA), and the element-wise reduction of up to :data:`MAX_SOURCES` arrays (a PE's own
and its peers', as mapped on its GPU) into one, per (op, dtype) (vkshmem's own too, which the
Vulkan domain launches for its links' folds)."""

from __future__ import annotations

from vkshmem.gpu.cudakernels import (
    AMO_NAME,
    AMO_SOURCE,
    MAX_SOURCES,
    REDUCE_NAME,
    SERVICE_MAX,
    SERVICE_NAME,
    SERVICE_SOURCE,
    SERVICE_THREADS,
    compile_kernel,
    reduce_source,
)

__all__ = ["AMO_NAME", "AMO_SOURCE", "MAX_SOURCES", "REDUCE_NAME", "SERVICE_MAX", "SERVICE_NAME",
           "SERVICE_SOURCE", "SERVICE_THREADS", "compile_kernel", "reduce_source"]

