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
#define VK_ALIGN 64                  /* teams.py: ALIGN */
#define VK_RING_MIN_BYTES (64 << 10) /* teams.py: RING_MIN_BYTES */

/* collectives.py: the flags (counters of the team slot) of the collectives */
#define F_BCAST 0
#define F_BRUCK 32
#define F_RD 64
#define F_FOLD 96
#define F_FOLD_BACK 97
#define F_RING_RS 98
#define F_RING_AG 99
#define F_A2A 100
#define F_BCAST_DONE 104


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
       P_ROOT, P_TEAM, P_SIGNAL, P_SIGOP, P_TST, P_SST, P_LOCK, P_STATUS, P_NROLES };

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
/* whether a memory domain is open (its quiet completes its batched non-blocking operations
 * and barrier_all checks its errors: both take the Python path then) */
int fast_domains_open(void);
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
/* the mapping of pe's copy of the symmetric bytes [p, p + n) of this PE, or 0 */
uintptr_t fast_remote(const void *p, Py_ssize_t n, long pe);
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
int fast_set_true(const struct fast_pred *p);  /* fast_waitset.c: a set-wide predicate */
typedef PyObject *(*fast_what)(const void *ctx);
int fast_wait(struct fast_pred *p, fast_what what, const void *ctx);
int fast_wait_until(FastCall *self, PyObject **a, PyObject **out);
int fast_test(FastCall *self, PyObject **a, PyObject **out);
/* test_/wait_until_ all/any/some (+ _vector): op = mode (0 all, 1 any, 2 some)
 * | vector << 2 | wait << 3 */
int fast_wait_set(FastCall *self, PyObject **a, PyObject **out);

/* fast_watch.c: the wake board (struct vk_watch, _native.h): a long wait sleeps on a futex
 * the transports poke once the predicate holds. fast_watch_set: the ops of every open
 * transport (0 returned: the board is not usable, as when one does not offer watch). */
#define VK_MAX_WATCH 16
int fast_watch_set(struct vk_native_ops *const *ops, int n);
/* configure's watch_ops (released here; obj NULL: none) into ops[VK_MAX_WATCH]: how many */
int fast_watch_take(Py_buffer *b, struct vk_native_ops **ops);
int fast_watch_usable(void);                     /* GIL held: a wait may arm the board */
int fast_watch_arm(const struct fast_pred *p);   /* 1: this wait holds the board now */
void fast_watch_sleep(struct fast_pred *p, uint64_t ns);  /* until poked, p holds, or ns */
void fast_watch_disarm(void);
PyObject *fast_watch_stats(PyObject *mod, PyObject *noargs);  /* _fast.watch_stats */

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
    uint64_t rd_bytes;          /* CollTeam.rd_bytes: the bytes of one butterfly phase */
    int role, nsteps;           /* CollTeam.bfly */
    int step_partner[32], step_flag[32], step_region[32];
    uint64_t ctr[VK_N_CTRS];    /* expected signal counts per flag, phase, barrier epoch */
    /* per member: the C data path of the transport reaching it, for the barrier's remote adds
     * (NULL: mapped here; the collectives take the Python path unless every member they write
     * is mapped); NULL when every member is */
    struct vk_native_ops **ops;
};
typedef struct native_team NativeTeam;
int team_valid(NativeTeam *t);
int team_sync(NativeTeam *t);
/* member m's internal segment (0: not mapped here) */
static inline uintptr_t team_internal(NativeTeam *t, int m) {
    return fast_peer(VK_INTERNAL_SEG, t->pes[m]);
}
/* +1 on counter `flag` of member m, after this PE's earlier stores */
void team_signal(NativeTeam *t, int m, int flag);
/* wait for `count` more signals on this PE's counter `flag` (0, or -1 with the error) */
int team_wait(NativeTeam *t, int flag, uint64_t count, const char *what);
/* start a phase: the offset of its half in the scratch; *flag: its many-senders flag */
static inline uint64_t team_phase(NativeTeam *t, int *flag) {
    uint64_t p = t->ctr[VK_CTR_PHASE]++;
    if (flag != NULL) *flag = F_A2A + (int)(p & 1);
    return (p & 1) * t->half;
}
/* one phase of the butterfly all-reduce of cnt elements (nb bytes) into tgt at (seg, off) */
int team_reduce_rd(NativeTeam *t, char *tgt, const char *src, Py_ssize_t cnt,
                   const char *fmt, int op, Py_ssize_t nb, int seg, uint64_t off);
/* 1 done, 0 not handled (the Python algorithm runs), -1 error: of validated buffers */
int team_broadcast(NativeTeam *t, struct fast_view *tb, struct fast_view *sb, Py_ssize_t nb,
                   int root);
int team_reduce(NativeTeam *t, struct fast_view *tb, struct fast_view *sb, Py_ssize_t nb,
                int op);
/* bb: the bytes of each member's block */
int team_fcollect(NativeTeam *t, struct fast_view *tb, struct fast_view *sb, Py_ssize_t bb);
/* views of a collective's plain numpy target (writable) and source of one type, and the
 * bytes `size` asks for: 1, else 0 (nothing held) */
int fast_coll_buffers(PyObject **a, struct fast_view *t, struct fast_view *s, Py_ssize_t *nb);
/* an entry's return for team result r (1 done, -1 error, 0 not handled) */
int fast_finish(int r, PyObject **out);
/* raise InvalidArgumentError (vkshmem.core.errors) with this message; always -1 */
int fast_invalid(const char *fmt, ...);
int fast_barrier(FastCall *self, PyObject **a, PyObject **out);
int fast_sync(FastCall *self, PyObject **a, PyObject **out);
int fast_broadcast(FastCall *self, PyObject **a, PyObject **out);
int fast_reduce(FastCall *self, PyObject **a, PyObject **out);
int fast_fcollect(FastCall *self, PyObject **a, PyObject **out);
/* (target, source, size) of a TEAM_WORLD collective on plain numpy arrays: 1 with both views
 * held (release them) and *cnt the element count, or -1 when the size or the formats do not
 * suit the C path; 0 (nothing held) to take the Python path */
int fast_world_views(PyObject **a, struct fast_view *t, struct fast_view *s, long *cnt);

/* fast_ring.c: all-reduces above one butterfly phase (ring, or butterfly in chunks) */
int team_reduce_large(NativeTeam *t, struct fast_view *tb, struct fast_view *sb,
                      Py_ssize_t nb, int op);

/* fast_a2a.c: alltoall(s) and collect. team_alltoall: block j (cnt elements at stride sst
 * of sb) to block me of member j's target (at stride tst); team_collect: the members' cnt elements of src
 * concatenated into the whole target (1 done, 0 not handled, -1 error: collect's errors
 * after the counts' exchange are raised, with the Python messages). */
int team_alltoall(NativeTeam *t, struct fast_view *tb, struct fast_view *sb, Py_ssize_t cnt,
                  Py_ssize_t tst, Py_ssize_t sst);
int team_collect(NativeTeam *t, struct fast_view *tb, const char *src, Py_ssize_t cnt);
int fast_alltoall(FastCall *self, PyObject **a, PyObject **out);
int fast_collect(FastCall *self, PyObject **a, PyObject **out);

/* fast_scan.c: sum_inscan (op 1) / sum_exscan (op 0); team_scan: of the first cnt elements
 * of src into those of the target (1 done, 0 not handled, -1 error) */
int team_scan(NativeTeam *t, struct fast_view *tb, const char *src, Py_ssize_t cnt,
              int inclusive);
int fast_scan(FastCall *self, PyObject **a, PyObject **out);

/* fast_strided.c: iput / iget; n elements of isz bytes, src[i*sst] -> dst[i*tst] */
void fast_strided_copy(char *dst, Py_ssize_t tst, const char *src, Py_ssize_t sst,
                       Py_ssize_t n, Py_ssize_t isz);
int fast_iput(FastCall *self, PyObject **a, PyObject **out);
int fast_iget(FastCall *self, PyObject **a, PyObject **out);

/* fast_lock.c: set_lock / test_lock / clear_lock (opmap: {"held": lock._held, "wait":
 * the Python wait for a queued ticket}) */
int fast_set_lock(FastCall *self, PyObject **a, PyObject **out);
int fast_test_lock(FastCall *self, PyObject **a, PyObject **out);
int fast_clear_lock(FastCall *self, PyObject **a, PyObject **out);

/* fast_team_type.c */
extern PyTypeObject NativeTeamType;

/* fast_reduce.c: dst[i] = op(a[i], b[i]) for n elements of format fmt; 0 if unsupported */
int fast_reduce_supported(const char *fmt, int op);
void fast_reduce_apply(const char *fmt, int op, void *dst, const void *a, const void *b,
                       Py_ssize_t n);

enum { R_SUM = 1, R_PROD, R_MIN, R_MAX, R_AND, R_OR, R_XOR };

#endif
