/* The core's native helper vkshmem.core._native (built by vkshmem/core/_native_build.py with
 * cffi; its declarations are CDEF there): the segment table, the shm path, AMOs, waits and the
 * domain proxy's rounds. */
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <time.h>
#include "_native.h"
#include "copy_stream.h"

static struct vk_table g;
#define g_npes g.npes
#define g_peer g.peer

static __thread int g_err;

/* Error codes: -1 outside every segment (vk_locate), -2 runs past a segment's end, -3 pe not
 * mapped, -4 misaligned AMO, -5 segment id or PE index out of range, -6 bad AMO width/op. */
static inline int seg_pe_ok(int seg, int pe) {
    return seg >= 0 && seg < g.nsegs && pe >= 0 && pe < g_npes && g_peer != NULL;
}

/* pe's mapping of [off, off + n) of segment seg, or 0 with the error in *err. */
static inline uintptr_t shm_addr(int seg, int pe, uint64_t off, uint64_t n, int *err) {
    if (!seg_pe_ok(seg, pe)) { *err = -5; return 0; }
    uintptr_t base = g_peer[seg * g_npes + pe];
    if (!base) { *err = -3; return 0; }
    if (off > g.size[seg] || n > g.size[seg] - off) { *err = -2; return 0; }
    return base + off;
}

uint64_t vk_amo(uintptr_t addr, int op, int width, uint64_t a, uint64_t b) {
    return vk_amo_impl(addr, op, width, a, b);
}

uintptr_t vk_amo_address(void) { return (uintptr_t)&vk_amo; }

uintptr_t vk_table_address(void) { return (uintptr_t)&g; }

void vk_fence(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

int vk_table_init(int npes, int nsegs) {
    free(g.peer);
    g.peer = NULL;
    for (int s = 0; s < VK_MAX_SEGS; s++) {
        free(g.live[s]);
        g.live[s] = NULL;
    }
    g.npes = g.nsegs = 0;
    memset(g.base, 0, sizeof g.base);
    memset(g.size, 0, sizeof g.size);
    if (nsegs > VK_MAX_SEGS) return -1;
    g.peer = calloc((size_t)npes * (size_t)nsegs, sizeof(uintptr_t));
    if (!g.peer) return -1;
    g.npes = npes;
    g.nsegs = nsegs;
    return 0;
}

int vk_set_local(int seg, uintptr_t base, uint64_t size) {
    if (seg < 0 || seg >= g.nsegs) return -5;
    g.base[seg] = base;
    g.size[seg] = size;
    return 0;
}

int vk_set_peer(int seg, int pe, uintptr_t base) {
    if (!seg_pe_ok(seg, pe)) return -5;
    g_peer[seg * g_npes + pe] = base;
    return 0;
}

uintptr_t vk_peer_base(int seg, int pe) {
    return seg_pe_ok(seg, pe) ? g_peer[seg * g_npes + pe] : 0;
}

/* Track the live allocations of segment seg (set with vk_set_local): from now on vk_locate
 * refuses memory outside them (-3). Nothing is live until vk_mark_live says so. */
int vk_track(int seg) {
    if (seg < 0 || seg >= g.nsegs || !g.size[seg]) return -1;
    free(g.live[seg]);
    g.live[seg] = calloc((g.size[seg] >> VK_GRANULE_SHIFT) / 8 + 1, 1);
    return g.live[seg] ? 0 : -1;
}

/* Granules [off, off + n) of segment seg (granule-aligned: the allocator's blocks) become
 * live or dead. */
void vk_mark_live(int seg, uint64_t off, uint64_t n, int live) {
    uint8_t *bits = (seg >= 0 && seg < g.nsegs) ? g.live[seg] : NULL;
    if (!bits || off >= g.size[seg]) return;
    if (n > g.size[seg] - off) n = g.size[seg] - off;
    uint64_t end = (off + n + (1u << VK_GRANULE_SHIFT) - 1) >> VK_GRANULE_SHIFT;
    for (uint64_t q = off >> VK_GRANULE_SHIFT; q < end; q++) {
        if (live) bits[q >> 3] |= (uint8_t)(1u << (q & 7));
        else bits[q >> 3] &= (uint8_t)~(1u << (q & 7));
    }
}

int64_t vk_locate(const void *p, uint64_t nbytes) { return vk_locate_in(&g, p, nbytes); }

/* 0, or an error code (see above). */
int vk_shm_put(int seg, int pe, uint64_t off, const void *src, uint64_t n) {
    int err = 0;
    uintptr_t p = shm_addr(seg, pe, off, n, &err);
    if (!p) return err;
    memcpy((void *)p, src, n);
    return 0;
}

int vk_shm_get(int seg, int pe, uint64_t off, void *dst, uint64_t n) {
    int err = 0;
    uintptr_t p = shm_addr(seg, pe, off, n, &err);
    if (!p) return err;
    memcpy(dst, (const void *)p, n);
    return 0;
}

static inline int amo_ok(int op, int width) {
    return (width == 4 || width == 8) && op >= VK_FETCH && op <= VK_XOR;
}

/* The old value; on error VK_SENTINEL, with the error for vk_last_error(). */
uint64_t vk_shm_amo(int seg, int pe, uint64_t off, int op, int width, uint64_t a, uint64_t b) {
    if (!amo_ok(op, width)) { g_err = -6; return VK_SENTINEL; }
    uintptr_t p = shm_addr(seg, pe, off, (uint64_t)width, &g_err);
    if (!p) return VK_SENTINEL;
    if (p & (uintptr_t)(width - 1)) { g_err = -4; return VK_SENTINEL; }
    return vk_amo_impl(p, op, width, a, b);
}

/* Fused shm fast paths: resolve the symmetric address, find the peer mapping, move the data,
 * all in one call. Return 0, or the vk_locate error (-1, -2), or -3 when pe is not mapped. */
int vk_direct_put(const void *target, const void *src, uint64_t n, int pe) {
    if (pe < 0 || pe >= g_npes) return -5;
    int64_t r = vk_locate(target, n);
    if (r < 0) return (int)r;
    uintptr_t base = g_peer[(r >> 48) * g_npes + pe];
    if (!base) return -3;
    memcpy((void *)(base + (uint64_t)(r & VK_OFF_MASK)), src, n);
    return 0;
}

int vk_direct_get(void *dst, const void *source, uint64_t n, int pe) {
    if (pe < 0 || pe >= g_npes) return -5;
    int64_t r = vk_locate(source, n);
    if (r < 0) return (int)r;
    uintptr_t base = g_peer[(r >> 48) * g_npes + pe];
    if (!base) return -3;
    memcpy(dst, (const void *)(base + (uint64_t)(r & VK_OFF_MASK)), n);
    return 0;
}

int vk_last_error(void) { int e = g_err; g_err = 0; return e; }

/* Returns the old value; on error returns VK_SENTINEL and records the error for
 * vk_last_error() (a genuine VK_SENTINEL value reads a 0 error). */
uint64_t vk_direct_amo(const void *target, int pe, int op, int width, uint64_t a, uint64_t b) {
    if (pe < 0 || pe >= g_npes) { g_err = -5; return VK_SENTINEL; }
    if (!amo_ok(op, width)) { g_err = -6; return VK_SENTINEL; }
    int64_t r = vk_locate(target, (uint64_t)width);
    if (r < 0) { g_err = (int)r; return VK_SENTINEL; }
    uintptr_t base = g_peer[(r >> 48) * g_npes + pe];
    if (!base) { g_err = -3; return VK_SENTINEL; }
    if (r & (width - 1)) { g_err = -4; return VK_SENTINEL; }
    return vk_amo_impl(base + (uint64_t)(r & VK_OFF_MASK), op, width, a, b);
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Copy n bytes into memory another process reads next (a peer's proxy mailbox), with
 * streaming stores: see copy_stream.h. */
void vk_copy_stream(void *dst, const void *src, uint64_t n) {
    copy_stream((char *)dst, (const char *)src, (size_t)n);
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

/* The domain proxy's serving side (vkshmem.core.proxy.serve): list the requests due, spinning
 * (GIL released by cffi) up to max_ns while there are none. bells[s * depth + j] is the last
 * seq sender s rang in slot j; next[s] the seq due from s next (in slot (seq - 1) % depth).
 * Writes (s, j, seq) triples into out, up to max of them, in sequence order per sender,
 * advances next, and returns how many. */
int vk_proxy_due(const uint64_t *bells, uint64_t *next, int n, int depth, uint64_t *out,
                 int max, uint64_t max_ns) {
    uint64_t start = 0;
    for (unsigned i = 0;; i++) {
        int found = 0;
        for (int s = 0; s < n && found < max; s++) {
            while (found < max) {
                uint64_t seq = next[s];
                int j = (int)((seq - 1) % (uint64_t)depth);
                if (__atomic_load_n(&bells[s * depth + j], __ATOMIC_ACQUIRE) != seq) break;
                out[3 * found] = (uint64_t)s;
                out[3 * found + 1] = (uint64_t)j;
                out[3 * found + 2] = seq;
                found++;
                next[s] = seq + 1;
            }
        }
        if (found || max_ns == 0) return found;
        if (!start) start = now_ns();
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

/* the domain proxy's native rounds (after vk_proxy_due, which they call) */
#include "proxy_round.c"
