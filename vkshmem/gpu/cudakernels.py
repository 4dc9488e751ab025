"""CUDA kernels that vkshmem's GPU code on NVIDIA launches, compiled by NVRTC at first use:
the one-thread AMO (the Vulkan domain's AMOs through CUDA, and the cuda domain's), and
:func:`compile_kernel`, which the cuda domain plugin also uses for its reductions and its
service kernel (``AMO_APPLY`` is the AMO both kernels run)."""

from __future__ import annotations

from typing import Any

from vkshmem.core.errors import FeatureNotAvailableError

__all__ = ["AMO_APPLY", "AMO_NAME", "AMO_SOURCE", "compile_kernel"]

AMO_NAME = b"vkshmem_amo"

AMO_APPLY = r"""
typedef unsigned long long u64;
/* The OpenSHMEM AMO ``op`` (vkshmem's AmoOp numbers) on the word at addr; the old value. */
__device__ __forceinline__ u64 amo_apply(u64 addr, int op, int width, u64 operand,
                                         u64 compare) {
    u64 old = 0;
    if (width == 8) {
        u64 *p = (u64 *)addr;
        switch (op) {
        case 0: old = atomicAdd(p, 0ull); break;                 /* FETCH */
        case 1: case 2: old = atomicExch(p, operand); break;    /* SET, SWAP */
        case 3: old = atomicCAS(p, compare, operand); break;    /* CSWAP */
        case 4: old = atomicAdd(p, operand); break;
        case 5: old = atomicAnd(p, operand); break;
        case 6: old = atomicOr(p, operand); break;
        case 7: old = atomicXor(p, operand); break;
        }
    } else {
        unsigned *p = (unsigned *)addr;
        unsigned v = (unsigned)operand, c = (unsigned)compare;
        switch (op) {
        case 0: old = atomicAdd(p, 0u); break;
        case 1: case 2: old = atomicExch(p, v); break;
        case 3: old = atomicCAS(p, c, v); break;
        case 4: old = atomicAdd(p, v); break;
        case 5: old = atomicAnd(p, v); break;
        case 6: old = atomicOr(p, v); break;
        case 7: old = atomicXor(p, v); break;
        }
    }
    return old;
}
"""

AMO_SOURCE = AMO_APPLY + r"""
/* out[0] = the old value, then out[1] = seq: the host (out is mapped pinned memory) returns
   once it sees seq, without waiting for the kernel's completion to reach the stream. */
extern "C" __global__ void vkshmem_amo(u64 addr, int op, int width, u64 operand, u64 compare,
                                       u64 *out, u64 seq) {
    u64 old = amo_apply(addr, op, width, operand, compare);
    out[0] = old;
    __threadfence_system();
    ((volatile u64 *)out)[1] = seq;
}
"""


def compile_kernel(cu: Any, check: Any, dev: Any, source: str, name: bytes,
                   error: type[Exception]) -> Any:
    """NVRTC-compile ``source`` for device ``dev``, load it, return the function ``name``
    (``error``: the exception a compile error raises)."""
    try:
        from cuda.bindings import nvrtc
    except ImportError as exc:
        raise FeatureNotAvailableError(f"kernels on CUDA memory need NVRTC: {exc}") from None
    attr = cu.CUdevice_attribute
    major = check(cu.cuDeviceGetAttribute(
        attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev), "compute capability")
    minor = check(cu.cuDeviceGetAttribute(
        attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev), "compute capability")
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), name + b".cu", 0, [], [])
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise FeatureNotAvailableError(f"NVRTC could not start ({err}): install "
                                       "nvidia-cuda-nvrtc for kernels on CUDA memory")
    opts = [f"--gpu-architecture=compute_{major}{minor}".encode()]
    (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        _e, n = nvrtc.nvrtcGetProgramLogSize(prog)
        log = b" " * n
        nvrtc.nvrtcGetProgramLog(prog, log)
        raise error(f"NVRTC could not compile {name.decode()}: {log.decode()}", err)
    _e, n = nvrtc.nvrtcGetPTXSize(prog)
    ptx = b" " * n
    nvrtc.nvrtcGetPTX(prog, ptx)
    nvrtc.nvrtcDestroyProgram(prog)
    module = check(cu.cuModuleLoadData(ptx), f"cuModuleLoadData ({name.decode()})")
    return check(cu.cuModuleGetFunction(module, name), "cuModuleGetFunction")
