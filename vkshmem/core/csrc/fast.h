/* vkshmem.core._fast: the per-call hot path of the shm route, as a CPython extension.
 *
 * Every public entry point it serves (put/get and their nbi forms, the AMOs, quiet/fence,
 * wait_until/test, barrier_all/sync_all/sync, small broadcasts and reductions) is a FastCall:
 * a callable holding the Python implementation it stands in for. A call reads its numpy
 * arrays through the buffer protocol, checks types, PE, bounds and route in C and does the
 * work; anything it does not handle (another array type, a context, a transport route, a bad
 * argument) goes, untouched, to the Python implementation, which takes its general path or
 * raises its usual error. No Python object is made per call beyond the result.
 */
#ifndef VK_FAST_H
#define VK_FAST_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include "../_native.h"

#define VK_INTERNAL_SEG 1
#define VK_N_FLAGS 256
#define VK_OFF_FLAGS (8 * 32 + 64)  /* teams.py: _OFF_FLAGS */
#define VK_CTR_PHASE VK_N_FLAGS      /* NativeTeam counters: the expected counts, then these */
#define VK_CTR_EPOCH (VK_N_FLAGS + 1)
#define VK_N_CTRS (VK_N_FLAGS + 2)
#define VK_MAX_PARAMS 8


/* What the running runtime told this module (configure), and the peer table of _native. */
struct fast_global {
    struct vk_table *table;
    PyTypeObject *ndarray;
    int enabled;                /* a runtime is configured: the fast paths may run */
    uint64_t generation;        /* bumped by reset(): native teams of an older runtime */
    int my_pe, npes;
    uint8_t *direct;            /* [pe]: the default route to pe is the shm path */
    struct vk_native_ops **ops; /* [pe]: else the route's data path in C (NULL: none) */
    PyObject *transports;       /* [pe]: the route's transport (tuple; its native_error) */
    int quiet_fence;            /* quiet and fence are a memory fence (no transport open) */
    int nquiet;                 /* else, with every open transport offering quiet and fence
                                   in C: how many (-1: some do not, quiet takes Python) */
    struct vk_native_ops **quiet_ops; /* [nquiet]: their ops */
    uint8_t *fence_quiet;       /* [nquiet]: fence is a quiet on it (several rails, or no
                                   native fence) */
    PyObject *quiet_transports; /* [nquiet]: the transports (tuple; their native_error) */
    int native_waits;           /* no transport needs progress calls while this PE waits */
    PyObject *seg_heaps;        /* the runtime's list of open domain heaps per segment:
                                   while all are None, barrier_all = fence + world sync */
    int crowded;                /* more PEs on this node than CPUs: yield at once */
    struct native_team *world;  /* TEAM_WORLD (NULL: not a native team) */
    PyObject *waiter;           /* the runtime's Waiter (its timeout, its errors) */
    volatile uint64_t *failed;  /* the liveness words (liveness.py): [0] != 0 once a PE
                                   failed, [1 + pe] != 0 once pe did; NULL: none */
    int struct_ok;              /* numpy's array layout checked: views read it directly */
};
extern struct fast_global G;

typedef struct fastcall FastCall;
/* 1: handled (*out is the result, or NULL with an exception set); 0: not handled, no
 * exception set (the Python implementation runs). a[] holds the arguments by parameter. */
typedef int (*fast_impl)(FastCall *self, PyObject **a, PyObject **out);

enum { P_TARGET, P_SOURCE, P_PE, P_SIZE, P_CTX, P_VALUE, P_COND, P_FETCH, P_OP, P_CMP,
       P_ROOT, P_TEAM, P_SIGNAL, P_SIGOP, P_NROLES };

struct fastcall {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    fast_impl impl;
    PyObject *fallback;         /* the Python implementation */
    PyObject *names;            /* its parameter names (tuple of str) */
    PyObject *opmap;            /* op argument -> op code (dict), or NULL */
    int nparams, nrequired;
    int slot[P_NROLES];         /* parameter index of each role (-1: none) */
    int op, fetch, ints_only;   /* fixed parameters of the kind */
};

/* A C-contiguous array's bytes: read from the numpy array itself when it is a plain
 * np.ndarray of a dtype seen before (the layout of its first fields is numpy's ABI, checked at
 * bind()), else through the buffer protocol (held: an export to release). */
struct fast_view {
    char *buf;
    Py_ssize_t len, itemsize;
    const char *format;         /* struct-module format of one element */
    PyObject *obj;
    int writable, held;
    Py_buffer pb;
};

/* fast_view.c */
int fast_layout_agrees(PyObject *o);
int fast_long(PyObject *o, long *v);
int fast_pe(PyObject *o, long *pe);  /* a PE the shm path reaches */
enum { ROUTE_NONE, ROUTE_DIRECT, ROUTE_NATIVE };
int fast_route(PyObject *o, long *pe);  /* how the fast path reaches PE o */
/* PE pe is known to have failed (the Python path then raises PeerFailedError) */
static inline int fast_pe_failed(long pe) {
    return G.failed != NULL && G.failed[0] && G.failed[1 + pe];
}
/* with an exception set: turn a transport's error into PeerFailedError when a failed PE
 * caused it (Waiter.translate); pe: the PE addressed, or -1 */
void fast_translate_error(long pe);
/* sets the exception of status rc of a native transport operation; always NULL */
PyObject *fast_native_error(long pe, int rc, const char *doing, uint64_t off, Py_ssize_t n,
                            PyObject *buffer);
int fast_none(PyObject *o);
/* 0, or -1 (no exception left) when o is not a C-contiguous array (writable if asked) */
int fast_view(PyObject *o, struct fast_view *v, int writable);
/* an export of the view's memory (before the GIL is released); -1 when none */
int fast_hold(struct fast_view *v);
void fast_release(struct fast_view *v);
int fast_same_format(const struct fast_view *a, const struct fast_view *b);
int fast_count(PyObject *size, const struct fast_view *t, const struct fast_view *s,
               Py_ssize_t *nbytes);
static inline uintptr_t fast_peer(int seg, int pe) {
    return G.table->peer[seg * G.table->npes + pe];
}

/* fast_rma.c */
int fast_put(FastCall *self, PyObject **a, PyObject **out);
int fast_get(FastCall *self, PyObject **a, PyObject **out);
int fast_amo(FastCall *self, PyObject **a, PyObject **out);
int fast_quiet(FastCall *self, PyObject **a, PyObject **out);
/* quiet (fence=0) or fence of every open transport in C: 1 done, 0 not handled, -1 error */
int fast_transports_quiet(int fence);

/* fast_signal.c */
int fast_put_signal(FastCall *self, PyObject **a, PyObject **out);
int fast_signal_update(FastCall *self, PyObject **a, PyObject **out);
int fast_signal_fetch(FastCall *self, PyObject **a, PyObject **out);
int fast_signal_wait(FastCall *self, PyObject **a, PyObject **out);
/* for put_signal: 1 when the put (target, source, pe, size) was done, else 0 */
int fast_rma_put(PyObject **a);

/* fast_wait.c */
struct fast_pred {
    const void *addr;
    int width, kind;            /* kind: 'i' signed, 'u' unsigned */
    int cmp;                    /* CMP: 1 EQ, 2 NE, 3 GT, 4 LE, 5 LT, 6 GE */
    uint64_t value;
    uint64_t seen;              /* the value the last check read */
};
int fast_pred_true(struct fast_pred *p);
typedef PyObject *(*fast_what)(const void *ctx);
int fast_wait(struct fast_pred *p, fast_what what, const void *ctx);
int fast_wait_until(FastCall *self, PyObject **a, PyObject **out);
int fast_test(FastCall *self, PyObject **a, PyObject **out);

/* fast_team.c: a team whose members all take the shm path */
struct native_team {
    PyObject_HEAD
    uint64_t generation;
    int n, me, slot;
    int *pes;                   /* world PE of each member */
    uint64_t base;              /* offset of the team slot in the internal segment */
    uintptr_t internal;         /* this PE's internal segment */
    uint64_t scratch_off, half; /* CollTeam: the scratch and its halves */
    Py_ssize_t rd_fast;         /* CollTeam.rd_fast: the one-phase butterfly's limit */
    int role, nsteps;           /* CollTeam.bfly */
    int step_partner[32], step_flag[32], step_region[32];
    uint64_t ctr[VK_N_CTRS];    /* expected signal counts per flag, phase, barrier epoch */
};
typedef struct native_team NativeTeam;
int team_valid(NativeTeam *t);
int team_sync(NativeTeam *t);
/* 1 done, 0 not handled (the Python algorithm runs), -1 error: of validated buffers */
int team_broadcast(NativeTeam *t, struct fast_view *tb, struct fast_view *sb, Py_ssize_t nb,
                   int root);
int team_reduce(NativeTeam *t, struct fast_view *tb, struct fast_view *sb, Py_ssize_t nb,
                int op);
/* bb: the bytes of each member's block */
int team_fcollect(NativeTeam *t, struct fast_view *tb, struct fast_view *sb, Py_ssize_t bb);
int fast_barrier(FastCall *self, PyObject **a, PyObject **out);
int fast_sync(FastCall *self, PyObject **a, PyObject **out);
int fast_broadcast(FastCall *self, PyObject **a, PyObject **out);
int fast_reduce(FastCall *self, PyObject **a, PyObject **out);
int fast_fcollect(FastCall *self, PyObject **a, PyObject **out);

/* fast_team_type.c */
extern PyTypeObject NativeTeamType;

/* fast_reduce.c: dst[i] = op(a[i], b[i]) for n elements of format fmt; 0 if unsupported */
int fast_reduce_supported(const char *fmt, int op);
void fast_reduce_apply(const char *fmt, int op, void *dst, const void *a, const void *b,
                       Py_ssize_t n);

enum { R_SUM = 1, R_PROD, R_MIN, R_MAX, R_AND, R_OR, R_XOR };

#endif
