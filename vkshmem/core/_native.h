/* vkshmem core native helper: hardware atomics and copies on symmetric segments.
 *
 * Every path that applies an AMO to host memory (this PE, a same-node peer through the shm
 * path, a transport's progress thread serving a remote request) goes through vk_amo_impl
 * (exported by the cffi helper as vk_amo), so AMOs arriving by different paths on the same
 * word are atomic with each other.
 * Op codes match vkshmem.core.transport.AmoOp.
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

enum { VK_FETCH = 0, VK_SET, VK_SWAP, VK_CSWAP, VK_ADD, VK_AND, VK_OR, VK_XOR };

typedef uint64_t (*vk_amo_fn)(uintptr_t addr, int op, int width, uint64_t operand,
                              uint64_t compare);

/* A transport's data path in C (Transport.native_ops returns the address of one): the core's
 * compiled hot path calls these for PEs the transport reaches, with the GIL released, instead
 * of the transport's Python methods. Each returns 0 or the transport's error status (which
 * Transport.native_error turns into the exception its Python method would raise). put and
 * get are blocking (nbi = 0): the source is reusable, the destination filled on return.
 * quiet and fence (NULL: not offered; then the core calls the Python methods) do what
 * Transport.quiet/fence do (mode 0, or VK_NATIVE_TRY as below); they may also return
 * VK_NATIVE_PYTHON: "not done, call the Python method" (e.g. it holds buffers of
 * non-blocking operations to release).
 * With VK_NATIVE_CAN_TRY in flags, put/get also take nbi = VK_NATIVE_TRY, amo takes
 * fetch | VK_NATIVE_TRY and quiet/fence mode VK_NATIVE_TRY: "only if it completes without
 * waiting" (the core then holds the
 * GIL and has not pinned the buffers, so the call must neither wait nor keep the pointers);
 * such a call returns VK_NATIVE_AGAIN, having done nothing, when it would have to wait, and
 * the core repeats it as a blocking call with the GIL released. */
/* Waking a PE's long waits on its own memory (the core's wait_until, signal_wait, barrier
 * waits: vkshmem/core/csrc/fast_watch.c). A transport may offer `watch` (VK_NATIVE_CAN_WATCH)
 * where every write and AMO of a peer to this PE's memory through it is applied inside the
 * transport by a thread of this process: its progress thread, or a caller reading its
 * completions (libfabric providers with manual data progress: tcp;ofi_rxm, shm), never by a
 * peer storing into the memory itself (shared memory, RDMA hardware) nor by a thread it does
 * not run. The core calls watch(self, w), with or without the GIL, when one of its waits stops
 * spinning; from then on the transport (1) calls w->poke(w), from any thread, after each step
 * of its progress that may have applied incoming data (a CQ read; cheap while nothing waits)
 * and (2) makes sure that its progress runs without this PE's caller (e.g. wakes a progress
 * thread it had paused while the caller drove the progress itself). The core then sleeps on
 * a futex that poke wakes once the awaited word holds, instead of checking it every 50 us;
 * it does so only while every peer's route and every open transport offer watch (no peer on
 * the shm path, no memory domain open), and every sleep is bounded (a poke that never comes
 * costs a wait at most 1 ms, its slice). w stays valid for the life of the process. */
struct vk_watch {
    void (*poke)(struct vk_watch *w);
};

struct vk_native_ops {
    void *self;
    int (*put)(void *self, int32_t pe, uint32_t seg, uint64_t off, const void *src,
               size_t n, int nbi);
    int (*get)(void *self, int32_t pe, uint32_t seg, uint64_t off, void *dst, size_t n,
               int nbi);
    int (*amo)(void *self, int32_t pe, uint32_t seg, uint64_t off, int op, int width,
               uint64_t operand, uint64_t compare, int fetch, uint64_t *result);
    int (*quiet)(void *self, int mode);
    int (*fence)(void *self, int mode);
    unsigned flags;
    /* only with VK_NATIVE_CAN_WATCH in flags (the struct ends at flags without it): */
    void (*watch)(void *self, struct vk_watch *w);
};

#define VK_NATIVE_CAN_TRY 1u  /* flags: put/get/amo accept VK_NATIVE_TRY */
#define VK_NATIVE_CAN_WATCH 2u  /* flags: watch is there (struct vk_watch above) */
#define VK_NATIVE_TRY 2       /* or-ed into put/get's nbi (0) and amo's fetch */
#define VK_NATIVE_AGAIN 1     /* a VK_NATIVE_TRY call would have to wait: nothing done */
#define VK_NATIVE_PYTHON 2    /* quiet/fence: call the transport's Python method instead */

/* A memory domain's operations on its own segment in C (MemoryDomain.native_ops returns the
 * address of one): the domain proxy's native rounds (vkshmem.core.proxyserve) serve requests
 * with them, GIL released. start issues a copy between the segment at off and host memory
 * (to_device 1: host -> segment; the host side lies in memory the domain registered: the host
 * heap, peers' mailboxes) without waiting; quiet completes every copy started; amo (NULL: not
 * offered, those requests go to Python) applies op to the word and stores the old value. Each
 * returns 0 or the domain's error code. Copies of up to write_max / read_max bytes are done
 * by the CPU through mapped (NULL: none) instead, each followed by a store fence. */
struct vk_domain_ops {
    void *self;
    int (*start)(void *self, int to_device, uint64_t off, void *host, uint64_t n);
    int (*quiet)(void *self);
    int (*amo)(void *self, uint64_t off, int op, int width, uint64_t operand, uint64_t compare,
               uint64_t *old);
    uint64_t size;              /* the segment's bytes */
    uint8_t *mapped;            /* the segment in this process's address space, or NULL */
    uint64_t write_max, read_max;
};

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
