"""cffi (API mode) build of the core's native helper ``vkshmem.core._native``."""

from pathlib import Path

from cffi import FFI

HERE = Path(__file__).parent

CDEF = """
uint64_t vk_amo(uintptr_t addr, int op, int width, uint64_t operand, uint64_t compare);
void vk_fence(void);
int vk_table_init(int npes, int nsegs);
void vk_set_local(int seg, uintptr_t base, uint64_t size);
void vk_set_peer(int seg, int pe, uintptr_t base);
int64_t vk_locate(const void *p, uint64_t nbytes);
int vk_shm_put(int seg, int pe, uint64_t off, const void *src, uint64_t n);
int vk_shm_get(int seg, int pe, uint64_t off, void *dst, uint64_t n);
uint64_t vk_shm_amo(int seg, int pe, uint64_t off, int op, int width,
                    uint64_t operand, uint64_t compare);
uintptr_t vk_peer_base(int seg, int pe);
int vk_spin_change(const void *addr, const void *snapshot, uint64_t n, uint64_t max_ns);
uintptr_t vk_amo_address(void);
int vk_direct_put(const void *target, const void *src, uint64_t n, int pe);
int vk_direct_get(void *dst, const void *source, uint64_t n, int pe);
uint64_t vk_direct_amo(const void *target, int pe, int op, int width, uint64_t operand,
                       uint64_t compare);
int vk_last_error(void);
#define VK_SENTINEL ...
"""

SOURCE = r"""
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <time.h>
#include "_native.h"

static int g_npes, g_nsegs;
static uintptr_t g_base[16];
static uint64_t g_size[16];
static uintptr_t *g_peer; /* [seg * npes + pe] */

uint64_t vk_amo(uintptr_t addr, int op, int width, uint64_t a, uint64_t b) {
    if (width == 8) {
        uint64_t *p = (uint64_t *)addr;
        switch (op) {
        case VK_FETCH: return __atomic_load_n(p, __ATOMIC_SEQ_CST);
        case VK_SET: __atomic_store_n(p, a, __ATOMIC_SEQ_CST); return 0;
        case VK_SWAP: return __atomic_exchange_n(p, a, __ATOMIC_SEQ_CST);
        case VK_CSWAP:
            __atomic_compare_exchange_n(p, &b, a, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
            return b;
        case VK_ADD: return __atomic_fetch_add(p, a, __ATOMIC_SEQ_CST);
        case VK_AND: return __atomic_fetch_and(p, a, __ATOMIC_SEQ_CST);
        case VK_OR: return __atomic_fetch_or(p, a, __ATOMIC_SEQ_CST);
        case VK_XOR: return __atomic_fetch_xor(p, a, __ATOMIC_SEQ_CST);
        }
    } else if (width == 4) {
        uint32_t *p = (uint32_t *)addr, x = (uint32_t)a, c = (uint32_t)b;
        switch (op) {
        case VK_FETCH: return __atomic_load_n(p, __ATOMIC_SEQ_CST);
        case VK_SET: __atomic_store_n(p, x, __ATOMIC_SEQ_CST); return 0;
        case VK_SWAP: return __atomic_exchange_n(p, x, __ATOMIC_SEQ_CST);
        case VK_CSWAP:
            __atomic_compare_exchange_n(p, &c, x, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
            return c;
        case VK_ADD: return __atomic_fetch_add(p, x, __ATOMIC_SEQ_CST);
        case VK_AND: return __atomic_fetch_and(p, x, __ATOMIC_SEQ_CST);
        case VK_OR: return __atomic_fetch_or(p, x, __ATOMIC_SEQ_CST);
        case VK_XOR: return __atomic_fetch_xor(p, x, __ATOMIC_SEQ_CST);
        }
    }
    return 0;
}

uintptr_t vk_amo_address(void) { return (uintptr_t)&vk_amo; }

void vk_fence(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

int vk_table_init(int npes, int nsegs) {
    free(g_peer);
    g_peer = calloc((size_t)npes * (size_t)nsegs, sizeof(uintptr_t));
    if (!g_peer) return -1;
    g_npes = npes;
    g_nsegs = nsegs;
    memset(g_base, 0, sizeof g_base);
    memset(g_size, 0, sizeof g_size);
    return 0;
}

void vk_set_local(int seg, uintptr_t base, uint64_t size) {
    g_base[seg] = base;
    g_size[seg] = size;
}

void vk_set_peer(int seg, int pe, uintptr_t base) { g_peer[seg * g_npes + pe] = base; }

uintptr_t vk_peer_base(int seg, int pe) { return g_peer[seg * g_npes + pe]; }

/* (seg << 48) | offset of p within a local segment; -1 outside every segment;
 * -2 when it starts inside one but runs past its end. */
int64_t vk_locate(const void *p, uint64_t nbytes) {
    uintptr_t a = (uintptr_t)p;
    for (int s = 0; s < g_nsegs; s++) {
        if (g_size[s] && a >= g_base[s] && a < g_base[s] + g_size[s]) {
            uint64_t off = a - g_base[s];
            if (nbytes > g_size[s] - off) return -2;
            return ((int64_t)s << 48) | (int64_t)off;
        }
    }
    if (nbytes == 0) {  /* empty views may point one past the end */
        for (int s = 0; s < g_nsegs; s++)
            if (g_size[s] && a == g_base[s] + g_size[s])
                return ((int64_t)s << 48) | (int64_t)g_size[s];
    }
    return -1;
}

int vk_shm_put(int seg, int pe, uint64_t off, const void *src, uint64_t n) {
    uintptr_t base = g_peer[seg * g_npes + pe];
    if (!base) return -1;
    memcpy((void *)(base + off), src, n);
    return 0;
}

int vk_shm_get(int seg, int pe, uint64_t off, void *dst, uint64_t n) {
    uintptr_t base = g_peer[seg * g_npes + pe];
    if (!base) return -1;
    memcpy(dst, (const void *)(base + off), n);
    return 0;
}

uint64_t vk_shm_amo(int seg, int pe, uint64_t off, int op, int width, uint64_t a, uint64_t b) {
    return vk_amo(g_peer[seg * g_npes + pe] + off, op, width, a, b);
}

/* Fused shm fast paths: resolve the symmetric address, find the peer mapping, move the data,
 * all in one call. Return 0, or the vk_locate error (-1, -2), or -3 when pe is not mapped. */
int vk_direct_put(const void *target, const void *src, uint64_t n, int pe) {
    int64_t r = vk_locate(target, n);
    if (r < 0) return (int)r;
    uintptr_t base = g_peer[(r >> 48) * g_npes + pe];
    if (!base) return -3;
    memcpy((void *)(base + (uint64_t)(r & VK_OFF_MASK)), src, n);
    return 0;
}

int vk_direct_get(void *dst, const void *source, uint64_t n, int pe) {
    int64_t r = vk_locate(source, n);
    if (r < 0) return (int)r;
    uintptr_t base = g_peer[(r >> 48) * g_npes + pe];
    if (!base) return -3;
    memcpy(dst, (const void *)(base + (uint64_t)(r & VK_OFF_MASK)), n);
    return 0;
}

static __thread int g_err;

int vk_last_error(void) { int e = g_err; g_err = 0; return e; }

/* Returns the old value; on error returns VK_SENTINEL and records the error for
 * vk_last_error() (a genuine VK_SENTINEL value reads a 0 error). */
uint64_t vk_direct_amo(const void *target, int pe, int op, int width, uint64_t a, uint64_t b) {
    int64_t r = vk_locate(target, (uint64_t)width);
    if (r < 0) { g_err = (int)r; return VK_SENTINEL; }
    uintptr_t base = g_peer[(r >> 48) * g_npes + pe];
    if (!base) { g_err = -3; return VK_SENTINEL; }
    if (r & (width - 1)) { g_err = -4; return VK_SENTINEL; }
    return vk_amo(base + (uint64_t)(r & VK_OFF_MASK), op, width, a, b);
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Spin (GIL released by cffi) until the n bytes at addr differ from snapshot, or max_ns pass.
 * Pauses first, then yields the CPU, so oversubscribed nodes still make progress. */
int vk_spin_change(const void *addr, const void *snapshot, uint64_t n, uint64_t max_ns) {
    uint64_t start = now_ns();
    for (unsigned i = 0;; i++) {
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (memcmp(addr, snapshot, n) != 0) return 1;
        if ((i & 63) == 63 && now_ns() - start >= max_ns) return 0;
        if (i < 256) {
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#endif
        } else {
            sched_yield();
        }
    }
}
"""

ffibuilder = FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source("vkshmem.core._native", SOURCE, include_dirs=[str(HERE)],
                      extra_compile_args=["-O2"])

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
