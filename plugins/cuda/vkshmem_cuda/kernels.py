"""CUDA kernels that vkshmem's GPU code on NVIDIA launches, compiled by NVRTC at first use:
the one-thread AMO (the Vulkan domain's AMOs through CUDA, and the cuda domain's), the service
kernel (:mod:`~vkshmem_cuda.service_kernel`: small copies and AMOs from a mailbox, both domains),
the element-wise reduction of up to :data:`MAX_SOURCES` arrays into up to as many destinations
(:func:`reduce_source`: the cuda domain's reductions, the Vulkan domain's folds across a CUDA
link), and :func:`compile_kernel`, which the cuda domain plugin also uses (``AMO_APPLY`` is
the AMO the AMO and service kernels run)."""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np

from vkshmem.plugin import FeatureNotAvailableError

__all__ = ["AMO_APPLY", "AMO_NAME", "AMO_SOURCE", "MAX_SOURCES", "REDUCE_NAME", "SERVICE_MAX",
           "SERVICE_NAME", "SERVICE_SOURCE", "SERVICE_THREADS", "compile_kernel", "reduce_source"]

AMO_NAME = b"vkshmem_amo"
REDUCE_NAME = b"vkshmem_reduce"
#: sources (and destinations) one reduce launch takes (structs of pointers passed by value)
MAX_SOURCES = 8

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


SERVICE_NAME = b"vkshmem_service"

#: bytes one service request carries inline (host data of a put, or what a get returns)
SERVICE_MAX = 4096
#: threads of the service kernel's one block (they share a request's copy)
SERVICE_THREADS = 128

SERVICE_SOURCE = AMO_APPLY + r"""
/* The service kernel: one block that stays resident while requests keep coming and serves the
   mailbox (layout in csrc/cudasvc.c): the host stores a request and then its sequence number
   into the request box ``b`` (mapped pinned host memory, or device memory the CPU maps, which
   the block then polls without crossing PCIe); the block copies (device addresses: this
   GPU's heap, peers' heaps mapped here, or the request box's payload for host data) or runs
   the AMO, fences system-wide and stores the sequence number into the reply box ``r``'s
   ``done`` (pinned host memory; ``r`` may be ``b``). No request for ``idle_ns`` (the GPU's
   global timer): it stores ``r->alive = 0`` and ends, so that a device-wide synchronize of
   the application's (cudaDeviceSynchronize) is held up at most that long; the host launches
   it again for its next request. ``last``: the request served before this launch. Loads are
   volatile (the L1 would keep an earlier request's bytes). */
struct box {
    u64 seq; unsigned op, width; u64 dst, src, nbytes, operand, compare, alive;
    u64 done, value, pad[6];
};
enum { OP_STOP = 0, OP_COPY = 1, OP_AMO = 2, INLINE_WORDS = 16 };

__device__ __forceinline__ u64 ld_acquire(const u64 *p) {
    u64 v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ u64 gtime(void) {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

extern "C" __global__ void vkshmem_service(const struct box *b, struct box *r, u64 last,
                                            u64 idle_ns) {
    /* the request header as warp 0 read it: seq, op | width << 32, dst, src, nbytes,
       operand, compare */
    __shared__ u64 h[8];
    /* the first INLINE_WORDS words of the payload, read with the header (host data of a
       small put then costs no second dependent read over PCIe) */
    __shared__ u64 inl[INLINE_WORDS];
    for (;;) {
        if (threadIdx.x < 32) {
            u64 seq = last;
            if (threadIdx.x == 0) {
                const u64 since = gtime();
                while ((seq = ld_acquire(&b->seq)) == last && gtime() - since <= idle_ns) {
                }
            }
            seq = __shfl_sync(0xffffffffu, seq, 0);
            __syncwarp();
            /* one coalesced read of the header (seven dependent loads over PCIe cost ~1 us
               each); ordered after lane 0's acquire by the warp barrier */
            if (seq != last && threadIdx.x > 0 && threadIdx.x < 7)
                h[threadIdx.x] = ((const volatile u64 *)b)[threadIdx.x];
            if (seq != last && threadIdx.x >= 32 - INLINE_WORDS)
                inl[threadIdx.x - (32 - INLINE_WORDS)] =
                    ((const volatile u64 *)(b + 1))[threadIdx.x - (32 - INLINE_WORDS)];
            if (threadIdx.x == 0) h[0] = seq;
            if (seq == last && threadIdx.x == 0) h[1] = OP_STOP;
        }
        __syncthreads();
        const u64 seq = h[0];
        const unsigned op = (unsigned)h[1];
        if (op == OP_STOP) {
            if (threadIdx.x == 0) {
                ((volatile struct box *)r)->alive = 0;
                __threadfence_system();
                if (seq != last) ((volatile struct box *)r)->done = seq;
            }
            return;
        }
        if (op == OP_COPY) {
            const u64 src = h[3], dst = h[2], n = h[4];
            if (src == (u64)(b + 1) && n <= 8 * INLINE_WORDS) {
                /* host data already read with the header */
                if (((dst | n) & 7) == 0) {
                    if (threadIdx.x < n / 8) ((u64 *)dst)[threadIdx.x] = inl[threadIdx.x];
                } else if (threadIdx.x < n) {
                    ((unsigned char *)dst)[threadIdx.x] = ((const unsigned char *)inl)[threadIdx.x];
                }
            } else if (((src | dst | n) & 7) == 0) {
                for (u64 i = threadIdx.x; i < n / 8; i += blockDim.x)
                    ((u64 *)dst)[i] = ((const volatile u64 *)src)[i];
            } else {
                for (u64 i = threadIdx.x; i < n; i += blockDim.x)
                    ((unsigned char *)dst)[i] = ((const volatile unsigned char *)src)[i];
            }
        } else if (op == OP_AMO && threadIdx.x == 0) {
            /* AMO requests: dst the word, src the AmoOp number */
            r->value = amo_apply(h[2], (int)h[3], (int)(h[1] >> 32), h[5], h[6]);
        }
        __threadfence_system();
        __syncthreads();  /* also: h is read by every thread before warp 0 overwrites it */
        if (threadIdx.x == 0) ((volatile struct box *)r)->done = seq;
        last = seq;
    }
}
"""

_CTYPES = {"int8": "signed char", "int16": "short", "int32": "int", "int64": "long long",
           "uint8": "unsigned char", "uint16": "unsigned short", "uint32": "unsigned int",
           "uint64": "unsigned long long", "float32": "float", "float64": "double"}
_OPS = {"sum": "a + b", "prod": "a * b", "min": "(b < a ? b : a)", "max": "(b > a ? b : a)",
        "and": "a & b", "or": "a | b", "xor": "a ^ b"}

_REDUCE = r"""
typedef unsigned long long u64;
typedef %(T)s T;
enum { VEC = 16 / sizeof(T), UNROLL = %(U)d };
struct sources { const T *p[%(N)d]; };  /* also the destinations */
struct __align__(16) pack { T v[VEC]; };
__device__ __forceinline__ T combine(T a, T b) { return %(OP)s; }
/* dst_d[i] = src0[i] op src1[i] op ... for every destination d: 16-byte loads and stores
   where every pointer allows (peers' memory is read and written over NVLink: wide accesses
   keep the link busy), then the tail. */
extern "C" __global__ void vkshmem_reduce(struct sources dst, int nd, struct sources src,
                                          int n, u64 count) {
    u64 tid = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    u64 stride = (u64)gridDim.x * blockDim.x;
    bool wide = true;
    for (int j = 0; j < n; ++j) wide = wide && ((u64)src.p[j] %% 16) == 0;
    for (int d = 0; d < nd; ++d) wide = wide && ((u64)dst.p[d] %% 16) == 0;
    u64 packs = wide ? count / VEC : 0;
    u64 i = tid;
    /* UNROLL packs per thread per step, every load of a source issued before any combine:
       more reads in flight per thread hide NVLink's latency */
    for (; i + (UNROLL - 1) * stride < packs; i += UNROLL * stride) {
        struct pack a[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) a[u] = ((const struct pack *)src.p[0])[i + u * stride];
        for (int j = 1; j < n; ++j) {
            struct pack b[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u)
                b[u] = ((const struct pack *)src.p[j])[i + u * stride];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u)
#pragma unroll
                for (int k = 0; k < VEC; ++k) a[u].v[k] = combine(a[u].v[k], b[u].v[k]);
        }
        for (int d = 0; d < nd; ++d)
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) ((struct pack *)dst.p[d])[i + u * stride] = a[u];
    }
    for (; i < packs; i += stride) {
        struct pack a = ((const struct pack *)src.p[0])[i];
        for (int j = 1; j < n; ++j) {
            struct pack b = ((const struct pack *)src.p[j])[i];
#pragma unroll
            for (int k = 0; k < VEC; ++k) a.v[k] = combine(a.v[k], b.v[k]);
        }
        for (int d = 0; d < nd; ++d) ((struct pack *)dst.p[d])[i] = a;
    }
    for (u64 i = packs * VEC + tid; i < count; i += stride) {
        T a = src.p[0][i];
        for (int j = 1; j < n; ++j) { T b = src.p[j][i]; a = combine(a, b); }
        for (int d = 0; d < nd; ++d) ((T *)dst.p[d])[i] = a;
    }
}
"""


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
