"""CUDA kernels that vkshmem's GPU code on NVIDIA launches, compiled by NVRTC at first use:
the one-thread AMO (the Vulkan domain's AMOs through CUDA, and the cuda domain's), the service
kernel (:mod:`~vkshmem_cuda.service_kernel`: small copies and AMOs from a mailbox, both domains),
the element-wise reduction of up to :data:`MAX_SOURCES` arrays into up to as many destinations
(:func:`reduce_source`: the cuda domain's reductions, the Vulkan domain's folds across a CUDA
link), and :func:`compile_kernel`, which the cuda domain plugin also uses (``AMO_APPLY`` is
the AMO the AMO and service kernels run)."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from vkshmem.plugin import FeatureNotAvailableError

__all__ = ["AMO_APPLY", "AMO_NAME", "AMO_SOURCE", "MAX_SOURCES", "REDUCE_NAME", "SERVICE_MAX",
           "SERVICE_NAME", "SERVICE_SOURCE", "SERVICE_THREADS", "compile_kernel", "reduce_source"]

_CU = Path(__file__).resolve().parent / "cu"


def _source(name: str) -> str:
    """The CUDA C of ``cu/<name>`` (NVRTC compiles it at first use)."""
    return (_CU / name).read_text()


AMO_NAME = b"vkshmem_amo"
REDUCE_NAME = b"vkshmem_reduce"
#: sources (and destinations) one reduce launch takes (structs of pointers passed by value)
MAX_SOURCES = 8

AMO_APPLY = _source("amo_apply.cuh")

AMO_SOURCE = AMO_APPLY + _source("amo.cu")


SERVICE_NAME = b"vkshmem_service"

#: bytes one service request carries inline (host data of a put, or what a get returns)
SERVICE_MAX = 4096
#: threads of the service kernel's one block (they share a request's copy)
SERVICE_THREADS = 128

SERVICE_SOURCE = AMO_APPLY + _source("service.cu")

_CTYPES = {"int8": "signed char", "int16": "short", "int32": "int", "int64": "long long",
           "uint8": "unsigned char", "uint16": "unsigned short", "uint32": "unsigned int",
           "uint64": "unsigned long long", "float32": "float", "float64": "double"}
_OPS = {"sum": "a + b", "prod": "a * b", "min": "(b < a ? b : a)", "max": "(b > a ? b : a)",
        "and": "a & b", "or": "a | b", "xor": "a ^ b"}

#: a %-template: T (the C type), U (unroll), N (MAX_SOURCES), OP (of a and b)
_REDUCE = _source("reduce.cu.in")


@cache
def reduce_source(op: str, dtype: np.dtype, unroll: int = 4) -> str | None:
    """CUDA C for ``op`` over ``dtype`` (None where this kernel does not do that pair:
    float16, complex, bool and bitwise ops on floats go to the core's other paths), each
    thread loading ``unroll`` 16-byte packs of a source per step (4: more loads in flight hide
    NVLink's latency; the pair all-reduce, which reads local memory only, measured best with
    2). Cached: every all-reduce asks (``can_reduce_from``)."""
    ctype = _CTYPES.get(np.dtype(dtype).name)
    if ctype is None or op not in _OPS or (op in ("and", "or", "xor") and
                                            np.dtype(dtype).kind == "f"):
        return None
    return _REDUCE % {"T": ctype, "N": MAX_SOURCES, "OP": _OPS[op], "U": unroll}


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
