/* vkshmem-ucx native helper (see vku.h for the API and the locking rules).
 *
 * Progress design. Workers are created UCS_THREAD_MODE_SERIALIZED and every UCX call on a
 * worker is made under that worker's mutex. Each vku_ctx runs one pthread (never takes the
 * GIL, all signals blocked) that, for every worker of the context, progresses it until idle and
 * re-arms it (ucp_worker_arm), then sleeps in epoll_wait on the workers' event fds
 * (UCP_FEATURE_WAKEUP) and an eventfd used to stop it. So a peer's traffic that needs this PE
 * (UCX's software RMA/AMO over tcp or over shared memory on memory UCX did not allocate, the
 * tcp wire-up, rendezvous replies) is served while the PE's Python code is busy or idle.
 *
 * The calling thread makes its own operations progress while it waits for them (it holds the
 * worker's mutex, so the progress thread stays out): it spins on ucp_worker_progress for
 * the rail's wait_spin time, then arms the worker and sleeps in poll() on its event fd in steps of at
 * most 1 ms, with the mutex released so the progress thread can serve peers meanwhile. After
 * a wait it drains and re-arms the worker, so no event it consumed leaves the thread asleep
 * with work pending. Every wait is bounded by the transport's timeout.
 *
 * Ordering extras on top of UCP: a get or a fetching AMO to a PE that has un-flushed puts or
 * non-fetching AMOs from this worker flushes that endpoint first, so it observes them (UCP
 * alone orders neither get after put nor AMO after put across lanes).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <ucp/api/ucp.h>

#include "vku.h"

#define VKU_IDLE_MS 100             /* the progress thread re-checks at least this often */
#define VKU_CLOSE_TIMEOUT_NS 5000000000ull
#define VKU_DRAIN_MAX 1024          /* progress calls per drain (fairness to the caller) */
#define VKU_REAP_AT 1024            /* pending nbi requests before completed ones are reaped */

typedef struct vku_cell {
    uint64_t operand;
    uint64_t reply;
} vku_cell;

typedef struct vku_pend {
    void *req;
    vku_cell *cell; /* operand/reply storage of a non-fetching SET (a SWAP), else NULL */
} vku_pend;

typedef struct vku_rseg {
    uint64_t base;
    uint64_t size;
    void *packed;
    size_t packed_len;
    ucp_rkey_h rkey; /* unpacked on first use (it needs the endpoint) */
    char *ptr;       /* where UCX maps the segment here (ucp_rkey_ptr), or NULL */
    int device;      /* device memory: no CPU loads, stores or atomics on it */
} vku_rseg;

typedef struct vku_peer {
    void *addr;
    size_t addr_len;
    ucp_ep_h ep;
    ucs_status_t failed; /* set by the endpoint error handler */
    uint64_t dirty;      /* == worker epoch: un-flushed puts/non-fetching AMOs to it */
    vku_rseg segs[VKU_MAX_SEGS];
} vku_peer;

struct vku_worker {
    vku_ctx *ctx;
    ucp_worker_h worker;
    int efd;
    int wakefd;   /* eventfd: the progress thread made progress while a caller slept */
    int sleepers; /* callers asleep in wait_req (under lock) */
    pthread_mutex_t lock;
    int32_t npes;
    vku_peer *peers;
    vku_pend *pend;
    size_t npend, cap;
    int deferred; /* the error of a reaped non-blocking request, reported by the next quiet */
    int py_held;  /* Python holds buffers of non-blocking operations: quiet must run there */
    void *reply;  /* the reply cell of blocking fetching AMOs (a vku_word) */
    uint64_t epoch;
    int dirty;    /* a UCX put since the last quiet (whose remote completion needs a flush) */
    int listed;
    vku_worker *next;
};

typedef struct vku_local {
    uintptr_t addr;
    uint64_t size;
    ucp_mem_h memh;
    int fd; /* >= 0: UCX allocated this range over the core's memfd (a dup of it) */
    int hollow; /* the memfd's pages were punched out when UCX took the range: it reads 0 */
} vku_local;

struct vku_ctx {
    ucp_context_h context;
    pthread_t thread;
    int thread_started;
    int epfd, stopfd;
    volatile int stopping;
    pthread_mutex_t list_lock; /* the worker list; taken before any worker's lock */
    vku_worker *workers;
    pthread_mutex_t mem_lock;
    vku_local locals[VKU_MAX_LOCAL];
    int nlocal;
    uint64_t spin_ns, wait_spin_ns, timeout_ns;
    int err_peer;
    int direct; /* use ucp_rkey_ptr mappings for loads, stores and CPU atomics */
    volatile uint64_t *failed; /* the core's liveness words, or NULL */
    volatile uint32_t emulate;
    vk_amo_fn cpu_amo; /* the core's CPU atomic (vk_amo), for segments mapped here */
    volatile uint64_t stat_wakeups, stat_idle, stat_busy, stat_sleeps, stat_sleep_timeouts;
};

static void unmap_local(vku_ctx *c, vku_local *l);

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void set_err(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || !errlen)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

void vku_version(unsigned *major, unsigned *minor, unsigned *release)
{
    ucp_get_version(major, minor, release);
}

const char *vku_library_path(void)
{
    Dl_info info;
    if (dladdr((void *)ucp_get_version, &info) && info.dli_fname)
        return info.dli_fname;
    return "?";
}

void vku_build_version(unsigned *major, unsigned *minor)
{
    *major = UCP_API_MAJOR;
    *minor = UCP_API_MINOR;
}

const char *vku_status_string(int status)
{
    switch (status) {
    case VK_ST_PEER: return "peer not reachable";
    case VK_ST_SEG: return "segment not registered";
    case VK_ST_BOUNDS: return "outside the segment";
    case VK_ST_ALIGN: return "misaligned AMO";
    case VK_ST_AMO: return "unsupported AMO op or width";
    case VK_ST_CLOSED: return "closed";
    case VK_ST_NOMEM: return "out of memory";
    case VK_ST_TOOBIG: return "blob too large";
    case VK_ST_TIMEDOUT: return "timed out";
    case VK_ST_FAILED: return "a PE of the job failed";
    case VK_ST_BUSY: return "another transport allocated this range";
    default: return ucs_status_string((ucs_status_t)status);
    }
}

/* -- waiting ------------------------------------------------------------------------------ */

/* Drain the worker and re-arm it, so the progress thread is woken by the next event. */
static void settle(vku_worker *w)
{
    for (int tries = 0; tries < 4; tries++) {
        for (int i = 0; i < VKU_DRAIN_MAX && ucp_worker_progress(w->worker); i++) {
        }
        ucs_status_t st = ucp_worker_arm(w->worker);
        if (st != UCS_ERR_BUSY)
            return;
    }
    ucp_worker_signal(w->worker); /* still busy: let the progress thread take over */
}

/* Wait (w->lock held) for a request returned by a *_nbx call; frees it. */
static int wait_req(vku_worker *w, void *req, uint64_t timeout_ns)
{
    if (req == NULL)
        return UCS_OK;
    if (UCS_PTR_IS_ERR(req))
        return UCS_PTR_STATUS(req);
    ucs_status_t st;
    uint64_t start = 0;
    unsigned idle = 0;
    int progressed = 0;
    while ((st = ucp_request_check_status(req)) == UCS_INPROGRESS) {
        progressed = 1;
        if (ucp_worker_progress(w->worker)) {
            idle = 0;
            continue;
        }
        if (++idle < 32)
            continue;
        idle = 0;
        uint64_t now = now_ns();
        if (!start) {
            start = now;
            continue;
        }
        if (now - start > timeout_ns || (w->ctx->failed && w->ctx->failed[0])) {
            ucp_request_free(req); /* released by UCX when it completes */
            settle(w);
            return now - start > timeout_ns ? VK_ST_TIMEDOUT : VK_ST_FAILED;
        }
        if (now - start >= w->ctx->wait_spin_ns && ucp_worker_arm(w->worker) == UCS_OK) {
            /* Sleep until the worker has an event, or the progress thread (which may take
             * our event first) says it made progress on this worker. */
            struct pollfd p[2] = {{.fd = w->efd, .events = POLLIN},
                                  {.fd = w->wakefd, .events = POLLIN}};
            if (w->sleepers++ == 0 && w->listed) /* the thread need not wake for it */
                epoll_ctl(w->ctx->epfd, EPOLL_CTL_DEL, w->efd, NULL);
            pthread_mutex_unlock(&w->lock);
            int n = poll(p, 2, 1);
            pthread_mutex_lock(&w->lock);
            if (--w->sleepers == 0 && w->listed) {
                struct epoll_event ev = {.events = EPOLLIN, .data.ptr = w};
                epoll_ctl(w->ctx->epfd, EPOLL_CTL_ADD, w->efd, &ev);
            }
            if (n > 0 && (p[1].revents & POLLIN)) {
                uint64_t v;
                ssize_t r = read(w->wakefd, &v, sizeof(v));
                (void)r;
            }
            w->ctx->stat_sleeps++;
            if (n == 0)
                w->ctx->stat_sleep_timeouts++;
        }
    }
    ucp_request_free(req);
    if (progressed)
        settle(w);
    return st;
}

static int add_pending(vku_worker *w, void *req, vku_cell *cell)
{
    if (w->npend == w->cap) {
        if (w->npend >= VKU_REAP_AT) { /* drop the completed ones first */
            size_t k = 0;
            for (size_t i = 0; i < w->npend; i++) {
                vku_pend p = w->pend[i];
                ucs_status_t st = ucp_request_check_status(p.req);
                if (st != UCS_INPROGRESS) {
                    if (st != UCS_OK && w->deferred == 0)
                        w->deferred = st;
                    ucp_request_free(p.req);
                    free(p.cell);
                } else {
                    w->pend[k++] = p;
                }
            }
            w->npend = k;
        }
        if (w->npend == w->cap) {
            size_t cap = w->cap ? 2 * w->cap : 256;
            vku_pend *np = realloc(w->pend, cap * sizeof(*np));
            if (!np)
                return VK_ST_NOMEM;
            w->pend = np;
            w->cap = cap;
        }
    }
    w->pend[w->npend].req = req;
    w->pend[w->npend].cell = cell;
    w->npend++;
    return 0;
}

/* Track the request of a non-blocking operation (completed by quiet). */
static int track(vku_worker *w, void *req, vku_cell *cell)
{
    if (req == NULL) {
        free(cell);
        return 0;
    }
    if (UCS_PTR_IS_ERR(req)) {
        free(cell);
        return UCS_PTR_STATUS(req);
    }
    int rc = add_pending(w, req, cell);
    if (rc) { /* cannot track it: wait for it now */
        rc = wait_req(w, req, w->ctx->timeout_ns);
        free(cell);
    }
    return rc;
}

/* Complete the tracked non-blocking requests (all within one timeout), or, once something
 * failed (rc != 0), abandon those still in flight: they are released to UCX, and their cells
 * deliberately leaked since UCX may still write into them. Returns the first error. */
static int finish_pending(vku_worker *w, uint64_t timeout_ns, int rc)
{
    if (rc == 0)
        rc = w->deferred;
    w->deferred = 0;
    if (w->npend == 0) /* the common case: blocking operations only */
        return rc;
    uint64_t deadline = now_ns() + timeout_ns;
    for (size_t i = 0; i < w->npend; i++) {
        vku_pend p = w->pend[i];
        if (rc != 0 && ucp_request_check_status(p.req) == UCS_INPROGRESS) {
            ucp_request_free(p.req);
            continue;
        }
        uint64_t now = now_ns();
        int r = wait_req(w, p.req, now < deadline ? deadline - now : 0);
        if (r != VK_ST_TIMEDOUT)
            free(p.cell);
        if (rc == 0)
            rc = r;
    }
    w->npend = 0;
    return rc;
}

/* -- the progress thread ----------------------------------------------------------------- */

static void *progress_main(void *arg)
{
    vku_ctx *c = arg;
    struct epoll_event ev[16];
    uint64_t active_at = now_ns();
    while (!c->stopping) {
        int busy = 0, skipped = 0;
        pthread_mutex_lock(&c->list_lock);
        for (vku_worker *w = c->workers; w; w = w->next) {
            /* A worker locked by a caller is being progressed by that caller (which may sit
             * in a blocking UCX call such as a strong fence): skip it, serve the others. */
            if (pthread_mutex_trylock(&w->lock) != 0) {
                skipped = 1;
                continue;
            }
            int i = 0;
            while (i < VKU_DRAIN_MAX && ucp_worker_progress(w->worker))
                i++;
            if (i == VKU_DRAIN_MAX || ucp_worker_arm(w->worker) == UCS_ERR_BUSY)
                busy = 1;
            if (i && w->sleepers) {
                uint64_t one = 1;
                ssize_t r = write(w->wakefd, &one, sizeof(one));
                (void)r;
            }
            pthread_mutex_unlock(&w->lock);
            if (i)
                busy = 1;
        }
        pthread_mutex_unlock(&c->list_lock);
        if (busy) {
            c->stat_busy++;
            if (c->spin_ns)
                active_at = now_ns();
            continue;
        }
        if (c->spin_ns && now_ns() - active_at < c->spin_ns)
            continue;
        if (skipped) { /* its event fd may stay readable: poll the others at a gentle pace */
            struct timespec ts = {0, 50000};
            nanosleep(&ts, NULL);
            continue;
        }
        int n = epoll_wait(c->epfd, ev, 16, VKU_IDLE_MS);
        c->stat_wakeups++;
        if (n == 0)
            c->stat_idle++;
        for (int i = 0; i < n; i++) {
            if (ev[i].data.ptr == NULL) {
                uint64_t v;
                ssize_t r = read(c->stopfd, &v, sizeof(v));
                (void)r;
            }
        }
        if (c->spin_ns)
            active_at = now_ns();
    }
    return NULL;
}

static void stop_thread(vku_ctx *c)
{
    if (!c->thread_started)
        return;
    c->stopping = 1;
    uint64_t one = 1;
    ssize_t r = write(c->stopfd, &one, sizeof(one));
    (void)r;
    pthread_join(c->thread, NULL);
    c->thread_started = 0;
}
