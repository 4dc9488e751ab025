/* vkshmem-ofi: the table vkshmem's compiled hot path calls (Transport.native_ops).
 *
 * Its layout and constants are vkshmem's (vkshmem/core/_native.h, struct vk_native_ops and
 * VK_NATIVE_*); they are restated here because the plugin builds without vkshmem's sources
 * (build isolation). Not part of the cffi cdef: Python only passes the table's address on. */
#ifndef VKO_NATIVE_H
#define VKO_NATIVE_H

#include <stddef.h>
#include <stdint.h>

/* vkshmem's struct vk_watch: the core's wake board, poked after progress applied incoming
 * data (vko.c: poke) */
typedef struct vko_watch {
    void (*poke)(struct vko_watch *w);
} vko_watch;

typedef struct vko_native_table {
    void *self; /* the vko_ep */
    int (*put)(void *, int32_t, uint32_t, uint64_t, const void *, size_t, int);
    int (*get)(void *, int32_t, uint32_t, uint64_t, void *, size_t, int);
    int (*amo)(void *, int32_t, uint32_t, uint64_t, int, int, uint64_t, uint64_t, int,
               uint64_t *);
    int (*quiet)(void *, int);
    int (*fence)(void *, int);
    unsigned flags;
    void (*watch)(void *, vko_watch *); /* with VKO_N_CAN_WATCH */
} vko_native_table;

enum {
    VKO_N_CAN_TRY = 1, /* flags: put/get/amo take VKO_N_TRY */
    VKO_N_CAN_WATCH = 2, /* flags: watch is offered */
    VKO_N_TRY = 2,     /* or-ed into put/get's nbi and amo's fetch; quiet/fence's mode */
    VKO_N_AGAIN = 1,   /* a VKO_N_TRY call would have to wait: nothing done */
    VKO_N_PYTHON = 2,  /* quiet: call the transport's Python quiet instead */
};

#endif
