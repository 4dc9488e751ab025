/* vkshmem core native helper: hardware atomics and copies on symmetric segments.
 *
 * Every path that applies an AMO to host memory (this PE, a same-node peer through the shm
 * path, a transport's progress thread serving a remote request) goes through vk_amo_impl
 * (exported by the cffi helper as vk_amo), so AMOs arriving by different paths on the same
 * word are atomic with each other.
 * Op codes match vkshmem.plugin.AmoOp (vkshmem/include/vkshmem/plugin.h).
 *
 * Two native modules include this header: the cffi helper ``vkshmem.core._native`` (which
 * owns the peer table) and the CPython extension ``vkshmem.core._fast`` (the per-call hot
 * path), which reads the same table through the address vk_table_address() returns.
 */
#ifndef VK_NATIVE_H
#define VK_NATIVE_H
#include <stddef.h>
#include <stdint.h>

#define VK_OFF_MASK ((1ull << 48) - 1)
#define VK_SENTINEL 0xA5A5A5A5A5A5A5A5ull
#define VK_MAX_SEGS 16

/* The plugin ABI (AMO op codes, vk_amo_fn, struct vk_native_ops, struct vk_watch,
 * struct vk_domain_ops, the VK_ST_* status codes): one definition, shipped for plugins. */
#include "../include/vkshmem/plugin.h"

/* The segments of this PE and where every PE's segments are mapped here. */
struct vk_table {
    int npes, nsegs;
    uintptr_t base[VK_MAX_SEGS];  /* this PE's segment seg starts here (0: none) */
    uint64_t size[VK_MAX_SEGS];
    uintptr_t *peer;               /* [seg * npes + pe]: pe's segment seg, mapped here (0: not) */
    /* per segment, one bit per VK_GRANULE bytes: set inside a live allocation (NULL: the
     * segment's allocations are not tracked). Allocations start and end on granules. */
    uint8_t *live[VK_MAX_SEGS];
};

#define VK_GRANULE_SHIFT 6  /* 64 bytes: the allocator's smallest block and alignment */

static inline int vk_live_bit(const uint8_t *live, uint64_t off) {
    uint64_t g = off >> VK_GRANULE_SHIFT;
    return (live[g >> 3] >> (g & 7)) & 1;
}

static inline uint64_t vk_amo_impl(uintptr_t addr, int op, int width, uint64_t a, uint64_t b) {
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

/* (seg << 48) | offset of p within a local segment; -1 outside every segment;
 * -2 when it starts inside one but runs past its end; -3 when its first or last byte lies
 * outside every live allocation of a tracked segment (memory freed, or never allocated). */
static inline int64_t vk_locate_in(const struct vk_table *t, const void *p, uint64_t nbytes) {
    uintptr_t a = (uintptr_t)p;
    for (int s = 0; s < t->nsegs; s++) {
        if (t->size[s] && a >= t->base[s] && a < t->base[s] + t->size[s]) {
            uint64_t off = a - t->base[s];
            if (nbytes > t->size[s] - off) return -2;
            const uint8_t *live = t->live[s];
            if (live && nbytes &&
                !(vk_live_bit(live, off) && vk_live_bit(live, off + nbytes - 1)))
                return -3;
            return ((int64_t)s << 48) | (int64_t)off;
        }
    }
    if (nbytes == 0) {  /* empty views may point one past the end */
        for (int s = 0; s < t->nsegs; s++)
            if (t->size[s] && a == t->base[s] + t->size[s])
                return ((int64_t)s << 48) | (int64_t)t->size[s];
    }
    return -1;
}

#endif
