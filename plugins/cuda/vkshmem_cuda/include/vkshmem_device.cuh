/* vkshmem device API for CUDA kernels on the `cuda` domain's symmetric heap.
 *
 * Include it from CuPy RawKernel/RawModule, NVRTC or a torch extension with the folder
 * vkshmem_cuda.include_dir() on the include path, and pass the kernel the context pointer
 * shmem.device_context() returns (a device address: a `const vks_ctx *`):
 *
 *   #include "vkshmem_device.cuh"
 *   extern "C" __global__ void ring(const vks_ctx *ctx, unsigned long long buf, ...) {
 *       int next = (vks_my_pe(ctx) + 1) % vks_n_pes(ctx);
 *       vks_putmem_signal_block(ctx, next, buf, buf, nbytes, sig, 1, VKS_SIGNAL_ADD);
 *   }
 *
 * Offsets are symmetric: byte offsets in the GPU heap (DomainArray.offset, shmem.offset_of),
 * the same on every PE. Every PE of the node is reached by plain loads, stores and atomics
 * through the peer mappings the domain already makes (the same GPU, or another GPU of the
 * node over NVLink/P2P): vks_ptr(ctx, pe, off) is null only for a PE of another node, which
 * this header does not reach (the host API does).
 *
 * Scopes: _thread (one thread), _warp (every thread of the warp, converged), _block (every
 * thread of the block, like __syncthreads()). Ordering: vks_fence/vks_quiet are
 * __threadfence_system(): stores before them are visible to every GPU and the host before any
 * store after them; a signal is a system-scope atomic after such a fence, so a PE that sees it
 * sees the data. Waits are bounded (`spins` polls, 0: VKS_DEFAULT_SPINS) and return false
 * instead of hanging. vks_barrier_all is called by one thread per PE (the same number of times
 * on every PE); kernels that wait for each other must run at the same time: one PE per GPU, or
 * MPS (kernels of several processes on one GPU are time-sliced otherwise).
 */
#ifndef VKSHMEM_DEVICE_CUH
#define VKSHMEM_DEVICE_CUH

#define VKS_SIGNAL_SET 0
#define VKS_SIGNAL_ADD 1
#define VKS_CMP_EQ 1
#define VKS_CMP_NE 2
#define VKS_CMP_GT 3
#define VKS_CMP_LE 4
#define VKS_CMP_LT 5
#define VKS_CMP_GE 6
#ifndef VKS_DEFAULT_SPINS
#define VKS_DEFAULT_SPINS (1ull << 26)
#endif

/* What shmem.device_context() points to (vkshmem_cuda.devapi.CONTEXT). */
typedef struct vks_ctx {
    const unsigned long long *bases;  /* per PE: its heap's address here (0: not reachable) */
    unsigned long long sync_off;      /* the device-sync block's heap offset (barrier) */
    unsigned long long heap_size;
    int my_pe;
    int n_pes;
} vks_ctx;

__device__ inline int vks_my_pe(const vks_ctx *c) { return c->my_pe; }
__device__ inline int vks_n_pes(const vks_ctx *c) { return c->n_pes; }

/* Address of byte `off` of PE `pe`'s heap in this kernel (null where not reachable). */
__device__ inline void *vks_ptr(const vks_ctx *c, int pe, unsigned long long off) {
    if (pe < 0 || pe >= c->n_pes || c->bases[pe] == 0ull) return nullptr;
    return (void *)(c->bases[pe] + off);
}

__device__ inline char *vks_local(const vks_ctx *c, unsigned long long off) {
    return (char *)(c->bases[c->my_pe] + off);
}

/* Copy by thread `lane` of `lanes`: 16-byte units where everything is 16-aligned. */
__device__ inline void vks_copy_(char *dst, const char *src, unsigned long long n, unsigned lane,
                                 unsigned lanes) {
    if ((((unsigned long long)dst | (unsigned long long)src | n) & 15ull) == 0ull) {
        int4 *d = (int4 *)dst;
        const int4 *s = (const int4 *)src;
        for (unsigned long long i = lane; i < n / 16; i += lanes) d[i] = s[i];
    } else {
        for (unsigned long long i = lane; i < n; i += lanes) dst[i] = src[i];
    }
}

__device__ inline unsigned vks_lane_in_block_() {
    return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
}

/* -- RMA --------------------------------------------------------------------------------- */
/* Put: `nbytes` from offset `src` of this PE's heap to offset `dst` of PE `pe`'s heap.
 * Get: from offset `src` of PE `pe`'s heap to offset `dst` of this PE's. Return false where
 * the PE is not reachable (nothing moved). */
__device__ inline bool vks_putmem(const vks_ctx *c, int pe, unsigned long long dst,
                                  unsigned long long src, unsigned long long nbytes) {
    char *to = (char *)vks_ptr(c, pe, dst);
    if (!to) return false;
    vks_copy_(to, vks_local(c, src), nbytes, 0, 1);
    return true;
}

__device__ inline bool vks_getmem(const vks_ctx *c, int pe, unsigned long long dst,
                                  unsigned long long src, unsigned long long nbytes) {
    const char *from = (const char *)vks_ptr(c, pe, src);
    if (!from) return false;
    vks_copy_(vks_local(c, dst), from, nbytes, 0, 1);
    return true;
}

__device__ inline bool vks_putmem_warp(const vks_ctx *c, int pe, unsigned long long dst,
                                       unsigned long long src, unsigned long long nbytes) {
    char *to = (char *)vks_ptr(c, pe, dst);
    if (to) vks_copy_(to, vks_local(c, src), nbytes, threadIdx.x % 32u, 32u);
    __syncwarp();
    return to != nullptr;
}

__device__ inline bool vks_getmem_warp(const vks_ctx *c, int pe, unsigned long long dst,
                                       unsigned long long src, unsigned long long nbytes) {
    const char *from = (const char *)vks_ptr(c, pe, src);
    if (from) vks_copy_(vks_local(c, dst), from, nbytes, threadIdx.x % 32u, 32u);
    __syncwarp();
    return from != nullptr;
}

__device__ inline bool vks_putmem_block(const vks_ctx *c, int pe, unsigned long long dst,
                                        unsigned long long src, unsigned long long nbytes) {
    __syncthreads();
    char *to = (char *)vks_ptr(c, pe, dst);
    if (to) vks_copy_(to, vks_local(c, src), nbytes, vks_lane_in_block_(),
                      blockDim.x * blockDim.y * blockDim.z);
    __syncthreads();
    return to != nullptr;
}

__device__ inline bool vks_getmem_block(const vks_ctx *c, int pe, unsigned long long dst,
                                        unsigned long long src, unsigned long long nbytes) {
    __syncthreads();
    const char *from = (const char *)vks_ptr(c, pe, src);
    if (from) vks_copy_(vks_local(c, dst), from, nbytes, vks_lane_in_block_(),
                        blockDim.x * blockDim.y * blockDim.z);
    __syncthreads();
    return from != nullptr;
}

/* One element (nvshmem_p / nvshmem_g). */
template <typename T>
__device__ inline bool vks_p(const vks_ctx *c, int pe, unsigned long long dst, T value) {
    T *to = (T *)vks_ptr(c, pe, dst);
    if (!to) return false;
    *(volatile T *)to = value;
    return true;
}

template <typename T>
__device__ inline T vks_g(const vks_ctx *c, int pe, unsigned long long src) {
    const T *from = (const T *)vks_ptr(c, pe, src);
    return from ? *(const volatile T *)from : T(0);
}

/* -- ordering ------------------------------------------------------------------------------ */
__device__ inline void vks_fence(const vks_ctx *) { __threadfence_system(); }
__device__ inline void vks_quiet(const vks_ctx *) { __threadfence_system(); }

/* -- signals and AMOs (system scope: atomic with every GPU's and the host's atomics) -------- */
__device__ inline bool vks_signal_op(const vks_ctx *c, int pe, unsigned long long sig,
                                     unsigned long long value, int op) {
    unsigned long long *w = (unsigned long long *)vks_ptr(c, pe, sig);
    if (!w) return false;
    if (op == VKS_SIGNAL_ADD) atomicAdd_system(w, value);
    else atomicExch_system(w, value);
    return true;
}

/* Put, then (the data delivered first) the signal. Thread / block scope. */
__device__ inline bool vks_putmem_signal(const vks_ctx *c, int pe, unsigned long long dst,
                                         unsigned long long src, unsigned long long nbytes,
                                         unsigned long long sig, unsigned long long value, int op) {
    if (!vks_putmem(c, pe, dst, src, nbytes)) return false;
    __threadfence_system();
    return vks_signal_op(c, pe, sig, value, op);
}

__device__ inline bool vks_putmem_signal_block(const vks_ctx *c, int pe, unsigned long long dst,
                                               unsigned long long src, unsigned long long nbytes,
                                               unsigned long long sig, unsigned long long value,
                                               int op) {
    bool ok = vks_putmem_block(c, pe, dst, src, nbytes);
    __threadfence_system();
    __syncthreads();
    if (ok && vks_lane_in_block_() == 0) vks_signal_op(c, pe, sig, value, op);
    return ok;
}

#define VKS_AMO_(name, expr)                                                              \
    __device__ inline unsigned long long vks_atomic_##name(                              \
        const vks_ctx *c, int pe, unsigned long long off, unsigned long long value) {     \
        unsigned long long *w = (unsigned long long *)vks_ptr(c, pe, off);                \
        return w ? (expr) : 0ull;                                                         \
    }
VKS_AMO_(fetch_add, atomicAdd_system(w, value))
VKS_AMO_(swap, atomicExch_system(w, value))
VKS_AMO_(fetch_and, atomicAnd_system(w, value))
VKS_AMO_(fetch_or, atomicOr_system(w, value))
VKS_AMO_(fetch_xor, atomicXor_system(w, value))
#undef VKS_AMO_

__device__ inline unsigned long long vks_atomic_fetch(const vks_ctx *c, int pe,
                                                      unsigned long long off) {
    return vks_atomic_fetch_add(c, pe, off, 0ull);
}

__device__ inline unsigned long long vks_atomic_compare_swap(const vks_ctx *c, int pe,
                                                             unsigned long long off,
                                                             unsigned long long cond,
                                                             unsigned long long value) {
    unsigned long long *w = (unsigned long long *)vks_ptr(c, pe, off);
    return w ? atomicCAS_system(w, cond, value) : 0ull;
}

__device__ inline unsigned vks_atomic_fetch_add32(const vks_ctx *c, int pe, unsigned long long off,
                                                  unsigned value) {
    unsigned *w = (unsigned *)vks_ptr(c, pe, off);
    return w ? atomicAdd_system(w, value) : 0u;
}

/* -- waits on this PE's words ---------------------------------------------------------------- */
__device__ inline bool vks_compare_(unsigned long long a, int cmp, unsigned long long b) {
    switch (cmp) {
    case VKS_CMP_EQ: return a == b;
    case VKS_CMP_NE: return a != b;
    case VKS_CMP_GT: return a > b;
    case VKS_CMP_LE: return a <= b;
    case VKS_CMP_LT: return a < b;
    case VKS_CMP_GE: return a >= b;
    default: return false;
    }
}

/* Wait until this PE's uint64 at `off` satisfies `word cmp value`; false after `spins`
 * polls (0: VKS_DEFAULT_SPINS). The value seen is in *seen. */
__device__ inline bool vks_wait_until(const vks_ctx *c, unsigned long long off, int cmp,
                                      unsigned long long value, unsigned long long spins = 0,
                                      unsigned long long *seen = nullptr) {
    volatile unsigned long long *w = (volatile unsigned long long *)vks_local(c, off);
    unsigned long long limit = spins ? spins : VKS_DEFAULT_SPINS;
    for (unsigned long long i = 0; i < limit; ++i) {
        unsigned long long v = *w;
        if (vks_compare_(v, cmp, value)) {
            __threadfence_system();  /* acquire: what was put before the signal is seen */
            if (seen) *seen = v;
            return true;
        }
        if (i > 64) __nanosleep(100);
    }
    if (seen) *seen = *w;
    return false;
}

__device__ inline bool vks_signal_wait_until(const vks_ctx *c, unsigned long long sig, int cmp,
                                             unsigned long long value,
                                             unsigned long long *seen = nullptr,
                                             unsigned long long spins = 0) {
    return vks_wait_until(c, sig, cmp, value, spins, seen);
}

/* -- across PEs -------------------------------------------------------------------------------- */
/* Device barrier over every PE: quiet, then a dissemination barrier on the device-sync block
 * (the same 512 bytes every domain heap reserves). One thread per PE. */
__device__ inline bool vks_barrier_all(const vks_ctx *c, unsigned long long spins = 0) {
    __threadfence_system();
    unsigned long long *gen = (unsigned long long *)vks_local(c, c->sync_off);
    unsigned long long g = *gen + 1ull;
    *gen = g;
    unsigned long long word = c->sync_off + 8ull;
    for (int dist = 1; dist < c->n_pes; dist <<= 1) {
        if (!vks_signal_op(c, (c->my_pe + dist) % c->n_pes, word, 1ull, VKS_SIGNAL_ADD) ||
            !vks_wait_until(c, word, VKS_CMP_GE, g, spins))
            return false;
        word += 8ull;
    }
    return true;
}

#endif /* VKSHMEM_DEVICE_CUH */
