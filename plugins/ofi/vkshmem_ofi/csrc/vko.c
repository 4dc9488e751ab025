/* vkshmem-ofi native helper (see vko.h for the API, the request design and the locking).
 *
 * Progress: one pthread per vko_ctx (no GIL, signals blocked) reads the shared CQ
 * (vko_progress.c). Reading the CQ is what makes every OFI provider here progress (rxm/tcp
 * serving peers' RMA and atomics, shm its command queue), so a PE busy in Python never stalls
 * its peers. A caller waiting for its own request reads the CQ itself meanwhile.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <rdma/fabric.h>
#include <rdma/fi_atomic.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include "vko.h"

/* The API version asked of fi_getinfo: 1.9 (what the plugin needs), or 1.20 where the headers
 * have FI_MR_DMABUF: a library reads fi_mr_attr.dmabuf only for a fabric opened at 1.20 or
 * later (below that it reads the same union as mr_iov: a dma-buf registration would describe
 * garbage). Never 2.x: the 1.x semantics stay the same whichever library is loaded. */
#ifdef FI_MR_DMABUF
#define VKO_API FI_VERSION(1, 20)
#else
#define VKO_API FI_VERSION(1, 9)
#endif
#define VKO_IDLE_MS 50
#define VKO_IDLE_AFTER_NS 1000000000ull
#define VKO_CLOSE_NS 5000000000ull

enum { PENDING = 0, DONE = 1, ORPHAN = 2, AUTOFREE = 3 };
enum { VKO_W_WRITE = 1, VKO_W_PUT = 3 }; /* vko_req.is_write: a put is a write too */

typedef struct vko_req {
    struct fi_context2 fictx; /* first: providers with FI_CONTEXT(2) mode use it */
    vko_ep *ep;
    int state, err, is_write;
    uint64_t operand, compare, result;
    char bounce[VKO_BOUNCE];
} vko_req;

typedef struct { uint64_t base, size, key; int valid; } vko_rseg;
typedef struct {
    fi_addr_t fa;
    int valid;
    size_t namelen;
    char name[VKO_ADDR_MAX];
    vko_rseg segs[VKO_MAX_SEGS];
} vko_peer;

struct vko_ep {
    vko_ctx *c;
    struct fid_ep *ep;
    struct fid_cq *cq;           /* the context's shared CQ (root), or its own (contexts) */
    int64_t outstanding, writes, puts; /* atomics; writes = puts + non-fetching AMOs */
    int64_t amos;                /* atomic: non-fetching AMOs in flight (writes - puts) */
    int first_err;               /* atomic: first failed operation since the last quiet */
    unsigned char *dirty;        /* PEs with inject atomics not yet flushed */
    vko_ep *next;
    struct vk_native_ops nops;       /* vko_native_ops (vko_native.c) */
    int py_held;                 /* Python holds buffers of non-blocking operations */
    uint64_t n_polls;            /* atomic: CQ reads made by callers waiting (vko_probe) */
    int pooled;                  /* a closed context's endpoint, kept for the next (c->lock) */
    int shared;                  /* a context on the root's libfabric endpoint and CQ (its own
                                    counts: its quiet and fence wait only for its operations) */
};

struct vko_ctx {
    struct fi_info *info;
    struct fid_fabric *fabric;
    struct fid_domain *domain;
    struct fid_av *av;
    struct fid_cq *cq;
    int32_t n_pes;
    vko_peer *peers;
    pthread_mutex_t lock; /* peers' names, MR list, endpoint list */
    pthread_rwlock_t cqlock; /* read: the progress thread's round; write: closing a context */
    struct fid_mr **mrs;
    size_t n_mrs, cap_mrs;
    uint64_t *keys;   /* the keys requested of each MR (random; mrs[i]'s is keys[i]) */
    char src_node[128]; /* the address the endpoints bind (FI_SOURCE), "": the provider's */
    vko_ep *eps;
    vko_ep *root;                /* the first endpoint (c->lock) */
    int ctx_own;                 /* context endpoints open their own libfabric endpoint */
    uint32_t valid, emulate;
    int valid_done, inject_amo, waitable, stop, eps_n, root_taken;
    int puts_ordered; /* fence leaves puts in flight (the provider orders write after write) */
    uint32_t poll_us, spin_us;
    uint64_t timeout_ns;
    pthread_t thread;
    int thread_started;
    uint64_t n_done, n_err, n_wakeups, n_issued;
    uint32_t idle_poll_us, busy_us;
    struct fid_cntr *rcntr; /* peers' RMA/atomics that landed here (polling providers) */
    uint64_t n_remote, n_busy;
    int32_t my_pe;               /* -1 until vko_set_self */
    volatile uint64_t *failed;   /* the core's liveness words, or NULL */
    uint64_t n_native;           /* calls served by vko_native_ops' table */
    uint64_t n_emulated;         /* AMOs run as compare-and-swap loops */
    uint64_t n_rounds;           /* the progress thread's rounds (vko_probe) */
    int busy_yield;              /* busy window: sched_yield between polls (else spin) */
    int wait_fd;                 /* the root CQ's wait fd (FI_GETWAIT), -1: none or sread */
    uint64_t seen_issued;        /* the progress thread's last look at n_issued */
    int n_driving;               /* atomic: callers waiting on the root CQ, reading it */
    uint64_t drive_end;          /* atomic: when the last of those waits ended (now_ns) */
    uint32_t drive_short;        /* atomic: bit i: the i-th last gap between two such waits was
                                    under VKO_TIGHT_NS */
    uint32_t park_seq;           /* atomic: the futex word the progress thread parks on */
    uint64_t n_parks;            /* atomic: times it parked */
    int parked;                  /* atomic: it is parked now */
    struct vk_watch *watch;            /* atomic: the core's wake board, once a wait armed it */
    char lasterr[VKO_ERRLEN];
};

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

uint32_t vko_version(void) { return fi_version(); }
uint32_t vko_build_version(void) { return FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION); }
#ifdef FI_MR_DMABUF
int vko_has_dmabuf(void) { return 1; }
#else
int vko_has_dmabuf(void) { return 0; }
#endif

/* -- completions -------------------------------------------------------------------------- */

static void complete(vko_ctx *c, vko_req *r, int err) {
    vko_ep *e = r->ep;
    if (err) {
        int zero = 0;
        __atomic_compare_exchange_n(&e->first_err, &zero, err, 0, __ATOMIC_RELAXED,
                                    __ATOMIC_RELAXED);
        __atomic_add_fetch(&c->n_err, 1, __ATOMIC_RELAXED);
    }
    r->err = err;
    if (r->is_write == VKO_W_WRITE)
        __atomic_sub_fetch(&e->amos, 1, __ATOMIC_RELEASE);
    if (r->is_write & VKO_W_PUT)
        __atomic_sub_fetch(&e->puts, 1, __ATOMIC_RELEASE);
    if (r->is_write)
        __atomic_sub_fetch(&e->writes, 1, __ATOMIC_RELEASE);
    __atomic_sub_fetch(&e->outstanding, 1, __ATOMIC_RELEASE);
    __atomic_add_fetch(&c->n_done, 1, __ATOMIC_RELAXED);
    int pending = PENDING;
    if (!__atomic_compare_exchange_n(&r->state, &pending, DONE, 0, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE))
        free(r); /* AUTOFREE or ORPHAN: nobody waits for it */
}

/* Read every completion available; returns how many (or a negative error of the CQ). */
/* After a CQ read (which applies peers' incoming writes and AMOs: manual data progress),
 * whichever thread made it: tell the core's wake board, once a wait of the core armed it
 * (vko_native.c: native_watch). */
static void poke(vko_ctx *c) {
    struct vk_watch *w = __atomic_load_n(&c->watch, __ATOMIC_ACQUIRE);
    if (w)
        w->poke(w);
}

static int drain(vko_ctx *c, struct fid_cq *cq) {
    struct fi_cq_entry ent[16];
    int total = 0;
    for (;;) {
        ssize_t n = fi_cq_read(cq, ent, 16);
        if (n > 0) {
            for (ssize_t i = 0; i < n; i++)
                complete(c, (vko_req *)ent[i].op_context, 0);
            total += (int)n;
            continue;
        }
        if (n == -FI_EAVAIL) {
            struct fi_cq_err_entry ee;
            memset(&ee, 0, sizeof ee);
            if (fi_cq_readerr(cq, &ee, 0) > 0) {
                char buf[128];
                const char *why = fi_cq_strerror(cq, ee.prov_errno, ee.err_data, buf,
                                                 sizeof buf);
                pthread_mutex_lock(&c->lock);
                snprintf(c->lasterr, sizeof c->lasterr, "%s (%s)", fi_strerror(ee.err),
                         why ? why : "");
                pthread_mutex_unlock(&c->lock);
                if (ee.op_context)
                    complete(c, (vko_req *)ee.op_context, -(ee.err ? ee.err : FI_EIO));
                total++;
            }
            continue;
        }
        poke(c);
        return total;
    }
}

/* -- a waiting caller drives the progress ---------------------------------------------------
 * A caller waiting on the root endpoint's CQ reads it without sleeping, and reading it is what
 * progresses every request of the domain (tcp;ofi_rxm's progress is manual), peers' included.
 * In a loop of such waits (put + quiet, get, fetch_add in a loop: at least 5 of the last 8
 * gaps between the end of one of this PE's waits and the start of the next under
 * VKO_TIGHT_NS, the next operation's post included), the progress thread (fd regime only)
 * therefore parks on a futex instead of sleeping on the CQ's wait fd, which the replies to the
 * caller's own operations would wake once per operation: on a node with as many PEs as CPUs
 * that wake-up preempts the caller or a target's busy thread (README "Progress"). It looks
 * again every VKO_PARK_US (vko_progress.c: park) and sleeps on the fd again once no wait is
 * under way and the last ended over VKO_TIGHT_NS ago: a peer's request arriving just after
 * the loop waits for that. A wait outside such a loop (a barrier's quiet: the next comes a
 * barrier later) changes nothing: the thread never parks for it (waking it when the wait ended
 * would cost the caller a system call). *drive: -1 not counted (another CQ, or a thread
 * without a wait fd), 0 counted. */
#define VKO_TIGHT_NS 30000ull

static void drive_enter(vko_ep *e, int *drive, uint64_t now) {
    vko_ctx *c = e->c;
    if (e->cq != c->cq || c->wait_fd < 0)
        return;
    uint32_t bits = __atomic_load_n(&c->drive_short, __ATOMIC_RELAXED); /* racy: a hint */
    bits = bits << 1 | (now - __atomic_load_n(&c->drive_end, __ATOMIC_RELAXED) < VKO_TIGHT_NS);
    __atomic_store_n(&c->drive_short, bits, __ATOMIC_RELAXED);
    __atomic_add_fetch(&c->n_driving, 1, __ATOMIC_SEQ_CST);
    *drive = 0;
}

static int drive_leave(vko_ctx *c, int *drive, int rc) {
    if (*drive < 0)
        return rc;
    __atomic_store_n(&c->drive_end, now_ns(), __ATOMIC_RELAXED);
    __atomic_sub_fetch(&c->n_driving, 1, __ATOMIC_SEQ_CST);
    *drive = -1;
    return rc;
}

/* One round of a caller's wait that began at start, after i rounds: 0 to go on (spinning for
 * spin_us, then yielding the CPU between rounds until busy_us, then sleeping poll_us between
 * rounds: no longer driving the progress, see above), VK_ST_TIMEDOUT past the timeout,
 * VK_ST_FAILED once a PE of the job failed. */
static int wait_step(vko_ctx *c, uint64_t start, unsigned i, int *drive) {
    if (i < 64)
        return 0;
    uint64_t t = now_ns() - start;
    if (t > c->timeout_ns)
        return VK_ST_TIMEDOUT;
    if (c->failed && c->failed[0])
        return VK_ST_FAILED;
    if (t > (uint64_t)(c->busy_us > c->spin_us ? c->busy_us : c->spin_us) * 1000) {
        drive_leave(c, drive, 0); /* the thread serves peers again while this caller sleeps */
        struct timespec nap = {0, (long)c->poll_us * 1000};
        nanosleep(&nap, NULL);
    } else if (t > (uint64_t)c->spin_us * 1000) {
        sched_yield();
    }
    return 0;
}

/* Wait until *count is 0, reading the endpoint's CQ meanwhile (bounded: wait_step). */
static int wait_zero(vko_ep *e, int64_t *count) {
    vko_ctx *c = e->c;
    uint64_t start = 0;
    int drive = -1;
    for (unsigned i = 0;; i++) {
        if (__atomic_load_n(count, __ATOMIC_ACQUIRE) <= 0)
            return drive_leave(c, &drive, 0);
        if (!start)
            drive_enter(e, &drive, start = now_ns());
        drain(c, e->cq);
        __atomic_add_fetch(&e->n_polls, 1, __ATOMIC_RELAXED);
        int rc = wait_step(c, start, i, &drive);
        if (rc)
            return drive_leave(c, &drive, rc);
    }
}

static int wait_req(vko_ep *e, vko_req *r, uint64_t *result) {
    vko_ctx *c = e->c;
    uint64_t start = 0;
    int drive = -1;
    for (unsigned i = 0;; i++) {
        if (__atomic_load_n(&r->state, __ATOMIC_ACQUIRE) == DONE) {
            int err = r->err;
            if (result)
                *result = r->result;
            free(r);
            return drive_leave(c, &drive, err);
        }
        if (!start)
            drive_enter(e, &drive, start = now_ns());
        drain(c, e->cq);
        __atomic_add_fetch(&e->n_polls, 1, __ATOMIC_RELAXED);
        int rc = wait_step(c, start, i, &drive);
        if (rc) {
            int pending = PENDING;
            if (__atomic_compare_exchange_n(&r->state, &pending, ORPHAN, 0,
                                            __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
                return drive_leave(c, &drive, rc); /* freed by whoever completes it */
        }
    }
}

static vko_req *new_req(vko_ep *e, int is_write, int autofree) {
    vko_req *r = malloc(sizeof *r);
    if (!r)
        return NULL;
    r->ep = e;
    r->state = autofree ? AUTOFREE : PENDING;
    r->err = 0;
    r->is_write = is_write;
    r->result = 0;
    __atomic_add_fetch(&e->c->n_issued, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&e->outstanding, 1, __ATOMIC_ACQ_REL);
    if (is_write)
        __atomic_add_fetch(&e->writes, 1, __ATOMIC_ACQ_REL);
    if (is_write & VKO_W_PUT)
        __atomic_add_fetch(&e->puts, 1, __ATOMIC_ACQ_REL);
    if (is_write == VKO_W_WRITE)
        __atomic_add_fetch(&e->amos, 1, __ATOMIC_ACQ_REL);
    return r;
}

static void drop_req(vko_req *r) { /* the post failed: it never went out */
    if (r->is_write == VKO_W_WRITE)
        __atomic_sub_fetch(&r->ep->amos, 1, __ATOMIC_RELEASE);
    if (r->is_write & VKO_W_PUT)
        __atomic_sub_fetch(&r->ep->puts, 1, __ATOMIC_RELEASE);
    if (r->is_write)
        __atomic_sub_fetch(&r->ep->writes, 1, __ATOMIC_RELEASE);
    __atomic_sub_fetch(&r->ep->outstanding, 1, __ATOMIC_RELEASE);
    free(r);
}

/* Retry a post while the provider says -FI_EAGAIN (making progress meanwhile), bounded by
 * the timeout and the liveness word; with try_ set, return -FI_EAGAIN at once instead (the
 * caller must not wait). */
#define POST(e, try_, expr)                                                               \
    ({                                                                                    \
        ssize_t rc_;                                                                      \
        uint64_t t0_ = 0;                                                                 \
        while ((rc_ = (expr)) == -FI_EAGAIN && !(try_)) {                                 \
            drain((e)->c, (e)->cq);                                                       \
            if (!t0_)                                                                     \
                t0_ = now_ns();                                                           \
            else if (now_ns() - t0_ > (e)->c->timeout_ns) {                               \
                rc_ = VK_ST_TIMEDOUT;                                                      \
                break;                                                                    \
            } else if ((e)->c->failed && (e)->c->failed[0]) {                             \
                rc_ = VK_ST_FAILED;                                                        \
                break;                                                                    \
            }                                                                             \
        }                                                                                 \
        (int)rc_;                                                                         \
    })

#include "vko_progress.c"
#include "vko_query.c"
#include "vko_setup.c"
#include "vko_data.c"
#include "vko_native.c"
#include "vko_probe.c"
