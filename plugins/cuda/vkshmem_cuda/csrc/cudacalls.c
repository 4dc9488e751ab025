/* CUDA driver calls from C for vkshmem's GPU code: the Vulkan domain's copies and AMOs on
   NVIDIA (vkshmem_cuda.vulkan_accel) and the cuda domain plugin
   (plugins/cuda, whose helper compiles this file ahead of its own functions). Each call is
   one C call with the GIL released: make the context current if it is not, issue the copy or
   the kernel launch on the caller's stream, then spin on the stream (or on the AMO's
   completion flag) for up to spin_ns before blocking.

   No CUDA headers: the functions come from libcuda.so.1 by dlopen/dlsym at vkc_load (so this
   builds on machines without CUDA, and says so at run time); handles are pointers and device
   addresses 64-bit integers, as in cuda.h on 64-bit Linux. Declarations: cudacalls.h. */

#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stddef.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include <vkshmem/plugin.h> /* struct vk_domain_ops (vkshmem.plugin.get_include()) */

typedef int CUresult;
typedef uint64_t CUdeviceptr;
typedef void *CUstream;
typedef void *CUcontext;
typedef void *CUfunction;
typedef void *CUevent;
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
    CUresult (*record)(CUevent, CUstream);
    CUresult (*wait_event)(CUstream, CUevent, unsigned);
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
    cu.record = (CUresult (*)(CUevent, CUstream))sym(lib, "cuEventRecord");
    cu.wait_event = (CUresult (*)(CUstream, CUevent, unsigned))sym(lib, "cuStreamWaitEvent");
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

/* A domain's segment for the core's domain proxy in C (struct vk_domain_ops): copies on the
   proxy's own stream, completed together by quiet; AMOs by the AMO kernel with the proxy's
   own result words. One serving thread uses it. */
struct vkc_domain {
    uintptr_t ctx, stream, amo_fn, amo_host;
    uint64_t base, amo_dev, seq;
    int64_t spin_ns;
    int issued;
};

static int vkc_dom_start(void *self, int to_device, uint64_t off, void *host, uint64_t n) {
    struct vkc_domain *d = (struct vkc_domain *)self;
    uint64_t h = (uint64_t)(uintptr_t)host;
    int r = to_device ? vkc_copy(1, d->ctx, d->stream, d->base + off, h, n, -1)
                      : vkc_copy(2, d->ctx, d->stream, h, d->base + off, n, -1);
    if (!r) d->issued = 1;
    return r;
}

static int vkc_dom_quiet(void *self) {
    struct vkc_domain *d = (struct vkc_domain *)self;
    if (!d->issued) return 0;
    d->issued = 0;
    return vkc_sync(d->ctx, d->stream, d->spin_ns);
}

static int vkc_dom_amo(void *self, uint64_t off, int op, int width, uint64_t operand,
                       uint64_t compare, uint64_t *old) {
    struct vkc_domain *d = (struct vkc_domain *)self;
    d->seq++;
    return vkc_amo(d->ctx, d->stream, d->amo_fn, d->base + off, op, width, operand, compare,
                   d->amo_dev, d->amo_host, d->seq, old, d->spin_ns);
}

void vkc_domain_ops(struct vkc_domain *d, struct vk_domain_ops *ops) {
    ops->self = d;
    ops->start = vkc_dom_start;
    ops->quiet = vkc_dom_quiet;
    ops->amo = d->amo_fn ? vkc_dom_amo : NULL;
}
