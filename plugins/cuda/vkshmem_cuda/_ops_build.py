"""cffi (API mode) build of ``vkshmem_cuda._ops``: the CUDA domain's per-call path in C.

Through ``cuda-bindings`` a blocking copy is three Python-level driver calls (make the context
current, the async copy, a stream synchronize) at about a microsecond each, with the GIL held.
Here each operation is one C call, GIL released: make the context current if it is not, issue
the copy (or the AMO kernel launch), then spin on ``cuStreamQuery`` for up to ``spin_ns``
before blocking in ``cuStreamSynchronize``. Small copies to or from pageable host memory go
through a pinned bounce buffer (one ``memcpy``), which is what CUDA would do, minus its
bookkeeping.

No CUDA headers are needed: the functions come from ``libcuda.so.1`` by ``dlopen``/``dlsym``
at :func:`vkc_load` (so the helper builds on machines without CUDA, and says so at run time);
handles are pointers and device addresses 64-bit integers, as in ``cuda.h`` on 64-bit Linux.
"""

from pathlib import Path

from cffi import FFI

#: the service kernel's host side (see ``csrc/svc.c``), appended to SOURCE
SERVICE_C = (Path(__file__).resolve().parent / "csrc" / "svc.c").read_text()

CDEF = """
int vkc_load(void);
const char *vkc_missing(void);
int vkc_copy(int kind, uintptr_t ctx, uintptr_t stream, uint64_t dst, uint64_t src,
             size_t nbytes, int64_t spin_ns);
int vkc_sync(uintptr_t ctx, uintptr_t stream, int64_t spin_ns);
int vkc_copy_staged(int to_device, uintptr_t ctx, uintptr_t stream, uint64_t dst,
                    uint64_t src, size_t nbytes, uintptr_t bounce, size_t bounce_size,
                    int64_t spin_ns);
int vkc_memset(uintptr_t ctx, uintptr_t stream, uint64_t dst, size_t nbytes, int64_t spin_ns);
int vkc_amo(uintptr_t ctx, uintptr_t stream, uintptr_t fn, uint64_t addr, int op, int width,
            uint64_t operand, uint64_t compare, uint64_t out_dev, uintptr_t out_host,
            uint64_t seq, uint64_t *result, int64_t spin_ns);
int vkc_reduce(uintptr_t ctx, uintptr_t stream, uintptr_t fn, const uint64_t *dsts,
               int ndst, const uint64_t *srcs, int nsrc, uint64_t count, unsigned grid,
               unsigned block, int64_t spin_ns);
typedef struct vkc_svc vkc_svc;
vkc_svc *vkc_svc_new(uintptr_t ctx, uintptr_t stream, uintptr_t fn, uintptr_t box,
                     uint64_t box_dev, unsigned threads, uint64_t idle_ns, int64_t spin_ns);
int vkc_svc_call(vkc_svc *s, int op, int width, uint64_t dst, uint64_t src, uint64_t nbytes,
                 uint64_t operand, uint64_t compare, uintptr_t host_in, uintptr_t host_out,
                 uint64_t *result, int64_t timeout_ns);
int vkc_svc_stop(vkc_svc *s, int64_t timeout_ns);
uint64_t vkc_svc_launches(vkc_svc *s);
void vkc_svc_free(vkc_svc *s);
#define VKC_SVC_TIMEOUT 1100
#define VKC_SVC_BROKEN 1101
"""

SOURCE = r"""
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stddef.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

typedef int CUresult;
typedef uint64_t CUdeviceptr;
typedef void *CUstream;
typedef void *CUcontext;
typedef void *CUfunction;
#define VKC_NOT_READY 600     /* CUDA_ERROR_NOT_READY */
#define VKC_NO_DRIVER 100     /* CUDA_ERROR_NO_DEVICE, returned when libcuda is missing */

static struct {
    int loaded;
    const char *missing;
    CUresult (*ctx_get)(CUcontext *);
    CUresult (*ctx_set)(CUcontext);
    CUresult (*d2d)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
    CUresult (*h2d)(CUdeviceptr, const void *, size_t, CUstream);
    CUresult (*d2h)(void *, CUdeviceptr, size_t, CUstream);
    CUresult (*memset8)(CUdeviceptr, unsigned char, size_t, CUstream);
    CUresult (*query)(CUstream);
    CUresult (*sync)(CUstream);
    CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                       unsigned, unsigned, CUstream, void **, void **);
} cu;

static void *sym(void *lib, const char *name) {
    void *p = dlsym(lib, name);
    if (!p && !cu.missing) cu.missing = name;
    return p;
}

int vkc_load(void) {
    if (cu.loaded) return 0;
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!lib) { cu.missing = "libcuda.so.1"; return -1; }
    cu.ctx_get = (CUresult (*)(CUcontext *))sym(lib, "cuCtxGetCurrent");
    cu.ctx_set = (CUresult (*)(CUcontext))sym(lib, "cuCtxSetCurrent");
    cu.d2d = (CUresult (*)(CUdeviceptr, CUdeviceptr, size_t, CUstream))
        sym(lib, "cuMemcpyDtoDAsync_v2");
    cu.h2d = (CUresult (*)(CUdeviceptr, const void *, size_t, CUstream))
        sym(lib, "cuMemcpyHtoDAsync_v2");
    cu.d2h = (CUresult (*)(void *, CUdeviceptr, size_t, CUstream))
        sym(lib, "cuMemcpyDtoHAsync_v2");
    cu.memset8 = (CUresult (*)(CUdeviceptr, unsigned char, size_t, CUstream))
        sym(lib, "cuMemsetD8Async");
    cu.query = (CUresult (*)(CUstream))sym(lib, "cuStreamQuery");
    cu.sync = (CUresult (*)(CUstream))sym(lib, "cuStreamSynchronize");
    cu.launch = (CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                              unsigned, unsigned, CUstream, void **, void **))
        sym(lib, "cuLaunchKernel");
    if (cu.missing) return -2;
    cu.loaded = 1;
    return 0;
}

const char *vkc_missing(void) { return cu.missing ? cu.missing : ""; }

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static CUresult current(uintptr_t ctx) {
    CUcontext cur = 0;
    CUresult r = cu.ctx_get(&cur);
    if (r == 0 && cur != (CUcontext)ctx) r = cu.ctx_set((CUcontext)ctx);
    return r;
}

/* Spin on the stream for up to spin_ns, then block: a small copy completes in a few
   microseconds, well before the blocking wait would have been woken. */
static CUresult finish(CUstream s, int64_t spin_ns) {
    if (spin_ns > 0) {
        int64_t end = now_ns() + spin_ns;
        do {
            CUresult r = cu.query(s);
            if (r != VKC_NOT_READY) return r;
        } while (now_ns() < end);
    }
    return cu.sync(s);
}

int vkc_copy(int kind, uintptr_t ctx, uintptr_t stream, uint64_t dst, uint64_t src,
             size_t nbytes, int64_t spin_ns) {
    if (!cu.loaded) return VKC_NO_DRIVER;
    CUresult r = current(ctx);
    if (r) return r;
    CUstream s = (CUstream)stream;
    if (kind == 0) r = cu.d2d(dst, src, nbytes, s);
    else if (kind == 1) r = cu.h2d(dst, (const void *)(uintptr_t)src, nbytes, s);
    else r = cu.d2h((void *)(uintptr_t)dst, src, nbytes, s);
    if (r || spin_ns < 0) return r;  /* spin_ns < 0: issued only (a non-blocking operation) */
    return finish(s, spin_ns);
}

/* Wait for everything issued on the stream (quiet of the non-blocking copies). */
int vkc_sync(uintptr_t ctx, uintptr_t stream, int64_t spin_ns) {
    if (!cu.loaded) return VKC_NO_DRIVER;
    CUresult r = current(ctx);
    return r ? r : finish((CUstream)stream, spin_ns);
}

int vkc_copy_staged(int to_device, uintptr_t ctx, uintptr_t stream, uint64_t dst,
                    uint64_t src, size_t nbytes, uintptr_t bounce, size_t bounce_size,
                    int64_t spin_ns) {
    if (!cu.loaded) return VKC_NO_DRIVER;
    CUresult r = current(ctx);
    if (r) return r;
    CUstream s = (CUstream)stream;
    for (size_t lo = 0; lo < nbytes; lo += bounce_size) {
        size_t n = nbytes - lo < bounce_size ? nbytes - lo : bounce_size;
        if (to_device) {
            memcpy((void *)bounce, (const char *)(uintptr_t)src + lo, n);
            r = cu.h2d(dst + lo, (const void *)bounce, n, s);
            if (!r) r = finish(s, spin_ns);
        } else {
            r = cu.d2h((void *)bounce, src + lo, n, s);
            if (!r) r = finish(s, spin_ns);
            if (!r) memcpy((char *)(uintptr_t)dst + lo, (const void *)bounce, n);
        }
        if (r) return r;
    }
    return 0;
}

int vkc_memset(uintptr_t ctx, uintptr_t stream, uint64_t dst, size_t nbytes, int64_t spin_ns) {
    if (!cu.loaded) return VKC_NO_DRIVER;
    CUresult r = current(ctx);
    if (r) return r;
    r = cu.memset8(dst, 0, nbytes, (CUstream)stream);
    return r ? r : finish((CUstream)stream, spin_ns);
}

/* The AMO kernel writes the old value, then seq, into mapped pinned memory: spin on seq (a
   host load, far cheaper than cuStreamQuery), polling the stream now and then in case the
   kernel failed; past spin_ns, block on the stream. */
int vkc_amo(uintptr_t ctx, uintptr_t stream, uintptr_t fn, uint64_t addr, int op, int width,
            uint64_t operand, uint64_t compare, uint64_t out_dev, uintptr_t out_host,
            uint64_t seq, uint64_t *result, int64_t spin_ns) {
    if (!cu.loaded) return VKC_NO_DRIVER;
    CUresult r = current(ctx);
    if (r) return r;
    CUstream s = (CUstream)stream;
    uint64_t *out = (uint64_t *)out_host;
    void *params[] = {&addr, &op, &width, &operand, &compare, &out_dev, &seq};
    r = cu.launch((CUfunction)fn, 1, 1, 1, 1, 1, 1, 0, s, params, 0);
    if (r) return r;
    int64_t end = now_ns() + spin_ns;
    for (unsigned k = 1;; ++k) {
        if (__atomic_load_n(&out[1], __ATOMIC_ACQUIRE) == seq) {
            *result = __atomic_load_n(&out[0], __ATOMIC_RELAXED);
            return 0;
        }
        if (k % 64 == 0) {
            r = cu.query(s);
            if (r != VKC_NOT_READY) break;  /* done (the flag is checked below) or failed */
            if (now_ns() > end) { r = cu.sync(s); break; }
        }
    }
    if (r) return r;
    if (__atomic_load_n(&out[1], __ATOMIC_ACQUIRE) != seq) return 999;  /* CUDA_ERROR_UNKNOWN */
    *result = __atomic_load_n(&out[0], __ATOMIC_RELAXED);
    return 0;
}

/* The reduce kernel takes its destinations and sources by value, as structs of
   VKC_MAX_SOURCES pointers. */
#define VKC_MAX_SOURCES 8
int vkc_reduce(uintptr_t ctx, uintptr_t stream, uintptr_t fn, const uint64_t *dsts,
               int ndst, const uint64_t *srcs, int nsrc, uint64_t count, unsigned grid,
               unsigned block, int64_t spin_ns) {
    if (!cu.loaded) return VKC_NO_DRIVER;
    if (nsrc < 1 || nsrc > VKC_MAX_SOURCES || ndst < 1 || ndst > VKC_MAX_SOURCES)
        return 1;  /* CUDA_ERROR_INVALID_VALUE */
    CUresult r = current(ctx);
    if (r) return r;
    uint64_t src_by_value[VKC_MAX_SOURCES] = {0}, dst_by_value[VKC_MAX_SOURCES] = {0};
    memcpy(src_by_value, srcs, (size_t)nsrc * sizeof(uint64_t));
    memcpy(dst_by_value, dsts, (size_t)ndst * sizeof(uint64_t));
    void *params[] = {dst_by_value, &ndst, src_by_value, &nsrc, &count};
    r = cu.launch((CUfunction)fn, grid, 1, 1, block, 1, 1, 0, (CUstream)stream, params, 0);
    return r ? r : finish((CUstream)stream, spin_ns);
}
""" + SERVICE_C

ffibuilder = FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source("vkshmem_cuda._ops", SOURCE, libraries=["dl"],
                      extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"],
                      py_limited_api=True)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
