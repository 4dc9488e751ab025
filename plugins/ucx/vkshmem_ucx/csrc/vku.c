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

typedef uint64_t (*vku_cpu_amo)(uintptr_t addr, int op, int width, uint64_t operand,
                                uint64_t compare);

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
    vku_cpu_amo cpu_amo; /* the core's CPU atomic (vk_amo), for segments mapped here */
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
    case VKU_EPEER: return "peer not reachable";
    case VKU_ESEG: return "segment not registered";
    case VKU_EBOUNDS: return "outside the segment";
    case VKU_EALIGN: return "misaligned AMO";
    case VKU_EAMO: return "unsupported AMO op or width";
    case VKU_ECLOSED: return "closed";
    case VKU_ENOMEM: return "out of memory";
    case VKU_ETOOBIG: return "blob too large";
    case VKU_ETIMEDOUT: return "timed out";
    case VKU_EFAILED: return "a PE of the job failed";
    case VKU_EBUSY: return "another transport allocated this range";
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
            return now - start > timeout_ns ? VKU_ETIMEDOUT : VKU_EFAILED;
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
                return VKU_ENOMEM;
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
        if (r != VKU_ETIMEDOUT)
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

/* -- context ------------------------------------------------------------------------------ */

void vku_set_liveness(vku_ctx *c, uintptr_t words)
{
    c->failed = (volatile uint64_t *)words;
}

vku_ctx *vku_ctx_create(const char *const *names, const char *const *values, int n,
                        uint32_t spin_us, uint32_t wait_spin_us, double timeout_s,
                        int err_peer, char *err, size_t errlen)
{
    vku_ctx *c = calloc(1, sizeof(*c));
    if (!c) {
        set_err(err, errlen, "out of memory");
        return NULL;
    }
    c->epfd = c->stopfd = -1;
    pthread_mutex_init(&c->list_lock, NULL);
    pthread_mutex_init(&c->mem_lock, NULL);
    c->spin_ns = (uint64_t)spin_us * 1000ull;
    c->wait_spin_ns = (uint64_t)wait_spin_us * 1000ull;
    c->timeout_ns = (uint64_t)(timeout_s * 1e9);
    c->err_peer = err_peer;

    ucp_config_t *config;
    ucs_status_t st = ucp_config_read(NULL, NULL, &config);
    if (st != UCS_OK) {
        set_err(err, errlen, "ucp_config_read: %s", ucs_status_string(st));
        goto fail;
    }
    for (int i = 0; i < n; i++) {
        st = ucp_config_modify(config, names[i], values[i]);
        if (st != UCS_OK) {
            set_err(err, errlen, "UCX rejected UCX_%s=%s: %s", names[i], values[i],
                    ucs_status_string(st));
            ucp_config_release(config);
            goto fail;
        }
    }
    ucp_params_t params;
    memset(&params, 0, sizeof(params));
    params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
    params.features = UCP_FEATURE_RMA | UCP_FEATURE_AMO32 | UCP_FEATURE_AMO64 |
                      UCP_FEATURE_WAKEUP;
    params.mt_workers_shared = 1;
    st = ucp_init(&params, config, &c->context);
    ucp_config_release(config);
    if (st != UCS_OK) {
        c->context = NULL;
        set_err(err, errlen, "ucp_init: %s", ucs_status_string(st));
        goto fail;
    }
    c->epfd = epoll_create1(EPOLL_CLOEXEC);
    c->stopfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (c->epfd < 0 || c->stopfd < 0) {
        set_err(err, errlen, "epoll/eventfd: %s", strerror(errno));
        goto fail;
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
    if (epoll_ctl(c->epfd, EPOLL_CTL_ADD, c->stopfd, &ev) != 0) {
        set_err(err, errlen, "epoll_ctl: %s", strerror(errno));
        goto fail;
    }
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old); /* signals stay with Python's main thread */
    int rc = pthread_create(&c->thread, NULL, progress_main, c);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        set_err(err, errlen, "pthread_create: %s", strerror(rc));
        goto fail;
    }
    c->thread_started = 1;
    return c;
fail:
    vku_ctx_destroy(c);
    return NULL;
}

void vku_ctx_destroy(vku_ctx *c)
{
    if (!c)
        return;
    stop_thread(c);
    while (c->workers)
        vku_worker_destroy(c->workers, 1);
    for (int i = 0; i < c->nlocal; i++)
        unmap_local(c, &c->locals[i]);
    c->nlocal = 0;
    if (c->context)
        ucp_cleanup(c->context);
    if (c->epfd >= 0)
        close(c->epfd);
    if (c->stopfd >= 0)
        close(c->stopfd);
    pthread_mutex_destroy(&c->list_lock);
    pthread_mutex_destroy(&c->mem_lock);
    free(c);
}

void vku_set_emulation(vku_ctx *c, uint32_t mask) { c->emulate = mask; }

void vku_set_direct(vku_ctx *c, uintptr_t cpu_amo, int direct)
{
    c->cpu_amo = (vku_cpu_amo)cpu_amo;
    c->direct = direct;
}

uint32_t vku_get_emulation(vku_ctx *c) { return c->emulate; }

void vku_stats(vku_ctx *c, uint64_t *out3)
{
    out3[3] = c->stat_sleeps;
    out3[4] = c->stat_sleep_timeouts;
    out3[0] = c->stat_wakeups;
    out3[1] = c->stat_idle;
    out3[2] = c->stat_busy;
}

/* Copy the pages of [src, src+size) that are resident (mincore) to dst: the bytes that can
 * differ from zero, without touching (and so allocating) the rest of a sparse segment. */
static void copy_resident(void *dst, const void *src, uint64_t size)
{
    long page = sysconf(_SC_PAGESIZE);
    size_t npages = (size_t)((size + (uint64_t)page - 1) / (uint64_t)page);
    unsigned char *vec = malloc(npages ? npages : 1);
    if (!vec || mincore((void *)src, (size_t)size, vec) != 0) {
        memcpy(dst, src, (size_t)size); /* cannot tell: copy everything */
        free(vec);
        return;
    }
    for (size_t i = 0; i < npages; i++) {
        if (!(vec[i] & 1))
            continue;
        size_t j = i;
        while (j + 1 < npages && (vec[j + 1] & 1))
            j++;
        uint64_t off = (uint64_t)i * (uint64_t)page;
        uint64_t end = (uint64_t)(j + 1) * (uint64_t)page;
        memcpy((char *)dst + off, (const char *)src + off, (size_t)((end < size ? end : size) - off));
        i = j;
    }
    free(vec);
}

/* Ranges UCX allocated in place, process-wide: a second transport (another rail) must not
 * allocate over the first one's memory, so it registers that memory as it is instead. */
static pthread_mutex_t g_alloc_lock = PTHREAD_MUTEX_INITIALIZER;
static uintptr_t g_alloc_addr[VKU_MAX_LOCAL];
static uint64_t g_alloc_size[VKU_MAX_LOCAL];

/* Claim [addr, addr+size) (claim=1; 0 when another transport holds an overlapping range) or
 * release it (claim=0). */
static int alloc_claim(uintptr_t addr, uint64_t size, int claim)
{
    int ok = 0, free_slot = -1;
    pthread_mutex_lock(&g_alloc_lock);
    for (int i = 0; i < VKU_MAX_LOCAL; i++) {
        if (!g_alloc_size[i]) {
            if (free_slot < 0)
                free_slot = i;
            continue;
        }
        if (!claim && g_alloc_addr[i] == addr && g_alloc_size[i] == size) {
            g_alloc_size[i] = 0;
            ok = 1;
            break;
        }
        if (claim && addr < g_alloc_addr[i] + g_alloc_size[i] && g_alloc_addr[i] < addr + size)
            goto out;
    }
    if (claim && free_slot >= 0) {
        g_alloc_addr[free_slot] = addr;
        g_alloc_size[free_slot] = size;
        ok = 1;
    }
out:
    pthread_mutex_unlock(&g_alloc_lock);
    return ok;
}

/* Replace the memfd mapping at [addr, addr+size) by memory UCX allocates at the same address
 * (ucp_mem_map ALLOCATE | FIXED), keeping its bytes: UCX's shared-memory transports then
 * reach it directly (stores and CPU atomics into the mapping) instead of by cma and software
 * atomics. 0 on success; else the range still holds the memfd mapping. */
static int map_allocated(vku_ctx *c, uintptr_t addr, uint64_t size, int fd, ucp_mem_h *memh)
{
    if (!alloc_claim(addr, size, 1))
        return VKU_EBUSY;
    void *old = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (old == MAP_FAILED) {
        alloc_claim(addr, size, 0);
        return VKU_ENOMEM;
    }
    ucp_mem_map_params_t mp;
    memset(&mp, 0, sizeof(mp));
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                    UCP_MEM_MAP_PARAM_FIELD_FLAGS;
    mp.address = (void *)addr;
    mp.length = size;
    mp.flags = UCP_MEM_MAP_ALLOCATE | UCP_MEM_MAP_FIXED;
    ucs_status_t st = ucp_mem_map(c->context, &mp, memh);
    int rc = st;
    if (st == UCS_OK) {
        ucp_mem_attr_t attr;
        memset(&attr, 0, sizeof(attr));
        attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
        if (ucp_mem_query(*memh, &attr) != UCS_OK || (uintptr_t)attr.address != addr ||
            attr.length != size) {
            /* not where the core's mapping was (or not all of it): put the memfd back */
            ucp_mem_unmap(c->context, *memh);
            mmap((void *)addr, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
                 fd, 0);
            rc = VKU_ENOMEM;
        } else {
            copy_resident((void *)addr, old, size);
            rc = 0;
        }
    }
    munmap(old, (size_t)size);
    if (rc)
        alloc_claim(addr, size, 0);
    return rc;
}

/* Give the range back to the memfd (with the bytes written meanwhile), then release UCX's
 * memory: the core's mapping (and arrays still viewing it) stay valid after close. */
static void unmap_local(vku_ctx *c, vku_local *l)
{
    if (l->fd < 0) {
        ucp_mem_unmap(c->context, l->memh);
        return;
    }
    void *back = mmap(NULL, (size_t)l->size, PROT_READ | PROT_WRITE, MAP_SHARED, l->fd, 0);
    if (back != MAP_FAILED)
        copy_resident(back, (void *)l->addr, l->size);
    ucp_mem_unmap(c->context, l->memh); /* unmaps the range */
    if (back == MAP_FAILED ||
        mremap(back, (size_t)l->size, (size_t)l->size, MREMAP_MAYMOVE | MREMAP_FIXED,
               (void *)l->addr) == MAP_FAILED) {
        /* keep the range reserved at least (zeros), so nothing else lands in it */
        mmap((void *)l->addr, (size_t)l->size, PROT_READ | PROT_WRITE,
             MAP_SHARED | MAP_FIXED, l->fd, 0);
        if (back != MAP_FAILED)
            munmap(back, (size_t)l->size);
    }
    close(l->fd);
    l->fd = -1;
    alloc_claim(l->addr, l->size, 0);
}

int vku_mem_map(vku_ctx *c, uintptr_t addr, uint64_t size, int fd, int *allocate, void *buf,
                size_t *len)
{
    int rc = 0;
    pthread_mutex_lock(&c->mem_lock);
    vku_local *l = NULL;
    for (int i = 0; i < c->nlocal; i++)
        if (c->locals[i].addr == addr && c->locals[i].size == size)
            l = &c->locals[i];
    if (!l) {
        if (c->nlocal == VKU_MAX_LOCAL) {
            rc = VKU_ENOMEM;
            goto out;
        }
        ucp_mem_h memh;
        int own = -1;
        long page = sysconf(_SC_PAGESIZE);
        if (*allocate && fd >= 0 && addr % (uintptr_t)page == 0 && size % (uint64_t)page == 0 &&
            (own = fcntl(fd, F_DUPFD_CLOEXEC, 0)) >= 0 &&
            map_allocated(c, addr, size, own, &memh) != 0) {
            close(own);
            own = -1;
        }
        if (own < 0) {
            ucp_mem_map_params_t mp;
            memset(&mp, 0, sizeof(mp));
            mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
            mp.address = (void *)addr;
            mp.length = size;
            ucs_status_t st = ucp_mem_map(c->context, &mp, &memh);
            if (st != UCS_OK) {
                rc = st;
                goto out;
            }
        }
        l = &c->locals[c->nlocal++];
        l->addr = addr;
        l->size = size;
        l->memh = memh;
        l->fd = own;
    }
    *allocate = l->fd >= 0;
    void *packed;
    size_t plen;
    ucs_status_t st = ucp_rkey_pack(c->context, l->memh, &packed, &plen);
    if (st != UCS_OK) {
        rc = st;
        goto out;
    }
    if (plen > *len) {
        rc = VKU_ETOOBIG;
    } else {
        memcpy(buf, packed, plen);
    }
    *len = plen;
    ucp_rkey_buffer_release(packed);
out:
    pthread_mutex_unlock(&c->mem_lock);
    return rc;
}

/* -- workers ------------------------------------------------------------------------------ */

vku_worker *vku_worker_create(vku_ctx *c, int32_t n_pes, char *err, size_t errlen)
{
    vku_worker *w = calloc(1, sizeof(*w));
    if (!w || n_pes < 0) {
        free(w);
        set_err(err, errlen, "out of memory");
        return NULL;
    }
    w->ctx = c;
    w->npes = n_pes;
    w->epoch = 1;
    w->efd = -1;
    w->wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    w->peers = calloc(n_pes ? (size_t)n_pes : 1, sizeof(vku_peer));
    if (!w->peers) {
        free(w);
        set_err(err, errlen, "out of memory");
        return NULL;
    }
    pthread_mutex_init(&w->lock, NULL);
    if (w->wakefd < 0) {
        set_err(err, errlen, "eventfd: %s", strerror(errno));
        goto fail;
    }
    ucp_worker_params_t wp;
    memset(&wp, 0, sizeof(wp));
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
    ucs_status_t st = ucp_worker_create(c->context, &wp, &w->worker);
    if (st != UCS_OK) {
        set_err(err, errlen, "ucp_worker_create: %s", ucs_status_string(st));
        goto fail;
    }
    st = ucp_worker_get_efd(w->worker, &w->efd);
    if (st != UCS_OK) {
        set_err(err, errlen, "ucp_worker_get_efd: %s", ucs_status_string(st));
        goto fail;
    }
    ucp_worker_arm(w->worker);
    pthread_mutex_lock(&c->list_lock);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = w};
    if (epoll_ctl(c->epfd, EPOLL_CTL_ADD, w->efd, &ev) != 0) {
        pthread_mutex_unlock(&c->list_lock);
        set_err(err, errlen, "epoll_ctl: %s", strerror(errno));
        goto fail;
    }
    w->next = c->workers;
    c->workers = w;
    w->listed = 1;
    pthread_mutex_unlock(&c->list_lock);
    return w;
fail:
    if (w->worker)
        ucp_worker_destroy(w->worker);
    if (w->wakefd >= 0)
        close(w->wakefd);
    pthread_mutex_destroy(&w->lock);
    free(w->peers);
    free(w);
    return NULL;
}

static void close_peer(vku_worker *w, vku_peer *p, uint64_t deadline, int force)
{
    for (int s = 0; s < VKU_MAX_SEGS; s++) {
        if (p->segs[s].rkey)
            ucp_rkey_destroy(p->segs[s].rkey);
        free(p->segs[s].packed);
        memset(&p->segs[s], 0, sizeof(p->segs[s]));
    }
    if (p->ep) {
        ucp_request_param_t prm;
        memset(&prm, 0, sizeof(prm));
        prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
        prm.flags = (p->failed || force) ? UCP_EP_CLOSE_FLAG_FORCE : 0;
        void *req = ucp_ep_close_nbx(p->ep, &prm);
        uint64_t now = now_ns();
        int rc = wait_req(w, req, now < deadline ? deadline - now : 0);
        (void)rc;
        p->ep = NULL;
    }
    free(p->addr);
    p->addr = NULL;
}

void vku_worker_destroy(vku_worker *w, int force)
{
    vku_ctx *c = w->ctx;
    pthread_mutex_lock(&c->list_lock);
    if (w->listed) {
        for (vku_worker **pp = &c->workers; *pp; pp = &(*pp)->next) {
            if (*pp == w) {
                *pp = w->next;
                break;
            }
        }
        epoll_ctl(c->epfd, EPOLL_CTL_DEL, w->efd, NULL);
        w->listed = 0;
    }
    pthread_mutex_unlock(&c->list_lock);
    pthread_mutex_lock(&w->lock);
    finish_pending(w, VKU_CLOSE_TIMEOUT_NS, 0);
    free(w->reply);
    w->reply = NULL;
    free(w->pend);
    w->pend = NULL;
    w->cap = 0;
    uint64_t deadline = now_ns() + VKU_CLOSE_TIMEOUT_NS;
    for (int32_t pe = 0; pe < w->npes; pe++)
        close_peer(w, &w->peers[pe], deadline, force);
    ucp_worker_destroy(w->worker);
    pthread_mutex_unlock(&w->lock);
    pthread_mutex_destroy(&w->lock);
    close(w->wakefd);
    free(w->peers);
    free(w);
}

int vku_worker_address(vku_worker *w, void *buf, size_t *len)
{
    ucp_worker_attr_t attr;
    memset(&attr, 0, sizeof(attr));
    attr.field_mask = UCP_WORKER_ATTR_FIELD_ADDRESS;
    pthread_mutex_lock(&w->lock);
    ucs_status_t st = ucp_worker_query(w->worker, &attr);
    pthread_mutex_unlock(&w->lock);
    if (st != UCS_OK)
        return st;
    int rc = 0;
    if (attr.address_length > *len)
        rc = VKU_ETOOBIG;
    else
        memcpy(buf, attr.address, attr.address_length);
    *len = attr.address_length;
    ucp_worker_release_address(w->worker, attr.address);
    return rc;
}

int vku_peer_set(vku_worker *w, int32_t pe, const void *addr, size_t len)
{
    if (pe < 0 || pe >= w->npes)
        return VKU_EPEER;
    if (len == 0 || len > VKU_RKEY_MAX)
        return VKU_ETOOBIG;
    int rc = 0;
    pthread_mutex_lock(&w->lock);
    vku_peer *p = &w->peers[pe];
    if (p->addr) {
        if (p->addr_len != len || memcmp(p->addr, addr, len) != 0)
            rc = VKU_EPEER; /* a PE's worker address never changes */
    } else if ((p->addr = malloc(len)) == NULL) {
        rc = VKU_ENOMEM;
    } else {
        memcpy(p->addr, addr, len);
        p->addr_len = len;
    }
    pthread_mutex_unlock(&w->lock);
    return rc;
}

int vku_peer_seg(vku_worker *w, int32_t pe, uint32_t seg, uint64_t base, uint64_t size,
                 const void *rkey, size_t len)
{
    if (pe < 0 || pe >= w->npes)
        return VKU_EPEER;
    if (seg >= VKU_MAX_SEGS)
        return VKU_ESEG;
    if (len == 0 || len > VKU_RKEY_MAX)
        return VKU_ETOOBIG;
    int rc = 0;
    pthread_mutex_lock(&w->lock);
    vku_rseg *s = &w->peers[pe].segs[seg];
    if (s->packed && s->packed_len == len && memcmp(s->packed, rkey, len) == 0 &&
        s->base == base && s->size == size)
        goto out; /* the same key again */
    void *copy = malloc(len);
    if (!copy) {
        rc = VKU_ENOMEM;
        goto out;
    }
    memcpy(copy, rkey, len);
    if (s->rkey)
        ucp_rkey_destroy(s->rkey);
    free(s->packed);
    s->rkey = NULL;
    s->packed = copy;
    s->packed_len = len;
    s->base = base;
    s->size = size;
out:
    pthread_mutex_unlock(&w->lock);
    return rc;
}

static void on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    (void)ep;
    vku_peer *p = arg;
    p->failed = status;
}

/* Resolve (pe, seg, off, n) to an endpoint, rkey and remote address (w->lock held). */
static int target(vku_worker *w, int32_t pe, uint32_t seg, uint64_t off, uint64_t n,
                  vku_peer **pp, ucp_rkey_h *rkey, uint64_t *raddr, char **local)
{
    if (!w->worker)
        return VKU_ECLOSED;
    if (pe < 0 || pe >= w->npes || !w->peers[pe].addr)
        return VKU_EPEER;
    vku_peer *p = &w->peers[pe];
    if (seg >= VKU_MAX_SEGS || !p->segs[seg].packed)
        return VKU_ESEG;
    vku_rseg *s = &p->segs[seg];
    if (off > s->size || n > s->size - off)
        return VKU_EBOUNDS;
    if (p->failed)
        return p->failed;
    if (!p->ep) {
        ucp_ep_params_t ep;
        memset(&ep, 0, sizeof(ep));
        ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
        ep.address = p->addr;
        ep.err_mode = w->ctx->err_peer ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
        if (w->ctx->err_peer) {
            ep.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER;
            ep.err_handler.cb = on_ep_error;
            ep.err_handler.arg = p;
        }
        ucs_status_t st = ucp_ep_create(w->worker, &ep, &p->ep);
        if (st != UCS_OK) {
            p->ep = NULL;
            return st;
        }
    }
    if (!s->rkey) {
        ucs_status_t st = ucp_ep_rkey_unpack(p->ep, s->packed, &s->rkey);
        if (st != UCS_OK) {
            s->rkey = NULL;
            return st;
        }
        /* UCX's shared memory maps memory it allocated (heap=ucx) into this process: loads,
         * stores and CPU atomics reach it directly (as UCX's own posix transport does) */
        void *lp;
        if (ucp_rkey_ptr(s->rkey, s->base, &lp) == UCS_OK && w->ctx->direct)
            s->ptr = lp;
    }
    *pp = p;
    *rkey = s->rkey;
    *raddr = s->base + off;
    if (local)
        *local = s->ptr ? s->ptr + off : NULL;
    return 0;
}

/* Take the worker's lock; try: only if free at once (else 1, not taken). */
static int lock_worker(vku_worker *w, int try)
{
    if (try)
        return pthread_mutex_trylock(&w->lock) != 0;
    pthread_mutex_lock(&w->lock);
    return 0;
}

/* Whether every operation of the worker since its last quiet is complete (w->lock held):
 * then quiet and fence have nothing to wait for or order. */
static int settled(vku_worker *w) { return !w->dirty && !w->npend && !w->deferred; }

/* Before a get or fetching AMO: flush the endpoint if it has un-flushed writes. */
static int order_after_writes(vku_worker *w, vku_peer *p)
{
    if (p->dirty != w->epoch)
        return 0;
    ucp_request_param_t prm;
    memset(&prm, 0, sizeof(prm));
    int rc = wait_req(w, ucp_ep_flush_nbx(p->ep, &prm), w->ctx->timeout_ns);
    if (rc == 0)
        p->dirty = 0;
    return rc;
}

int vku_put(vku_worker *w, int32_t pe, uint32_t seg, uint64_t off, const void *src, size_t n,
            int nbi)
{
    vku_peer *p;
    ucp_rkey_h rkey;
    uint64_t raddr;
    char *local;
    int try = nbi == VKU_TRY;
    if (lock_worker(w, try))
        return VKU_AGAIN;
    int rc = target(w, pe, seg, off, n, &p, &rkey, &raddr, &local);
    if (rc == 0 && n > 0 && local) { /* after this worker's UCX writes to pe (ordering) */
        if (try && p->dirty == w->epoch)
            rc = VKU_AGAIN;
        else if ((rc = order_after_writes(w, p)) == 0)
            memcpy(local, src, n);
    } else if (rc == 0 && n > 0 && try) {
        rc = VKU_AGAIN;
    } else if (rc == 0 && n > 0) {
        ucp_request_param_t prm;
        memset(&prm, 0, sizeof(prm));
        void *req = ucp_put_nbx(p->ep, src, n, raddr, rkey, &prm);
        p->dirty = w->epoch;
        w->dirty = 1;
        rc = nbi ? track(w, req, NULL) : wait_req(w, req, w->ctx->timeout_ns);
    }
    pthread_mutex_unlock(&w->lock);
    return rc;
}

int vku_get(vku_worker *w, int32_t pe, uint32_t seg, uint64_t off, void *dst, size_t n,
            int nbi)
{
    vku_peer *p;
    ucp_rkey_h rkey;
    uint64_t raddr;
    char *local;
    int try = nbi == VKU_TRY;
    if (lock_worker(w, try))
        return VKU_AGAIN;
    int rc = target(w, pe, seg, off, n, &p, &rkey, &raddr, &local);
    if (rc == 0 && n > 0 && try && (!local || p->dirty == w->epoch))
        rc = VKU_AGAIN;
    if (rc == 0 && n > 0)
        rc = order_after_writes(w, p);
    if (rc == 0 && n > 0 && local) {
        memcpy(dst, local, n);
    } else if (rc == 0 && n > 0) {
        ucp_request_param_t prm;
        memset(&prm, 0, sizeof(prm));
        void *req = ucp_get_nbx(p->ep, dst, n, raddr, rkey, &prm);
        rc = nbi ? track(w, req, NULL) : wait_req(w, req, w->ctx->timeout_ns);
    }
    pthread_mutex_unlock(&w->lock);
    return rc;
}

typedef union {
    uint32_t u32;
    uint64_t u64;
} vku_word;

static void put_word(vku_word *x, int width, uint64_t v)
{
    if (width == 4)
        x->u32 = (uint32_t)v;
    else
        x->u64 = v;
}

static uint64_t get_word(const vku_word *x, int width)
{
    return width == 4 ? x->u32 : x->u64;
}

static void *post_amo(vku_peer *p, ucp_atomic_op_t uop, int width, const void *operand,
                      void *reply, uint64_t raddr, ucp_rkey_h rkey)
{
    ucp_request_param_t prm;
    memset(&prm, 0, sizeof(prm));
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE;
    prm.datatype = ucp_dt_make_contig((size_t)width);
    if (reply) {
        prm.op_attr_mask |= UCP_OP_ATTR_FIELD_REPLY_BUFFER;
        prm.reply_buffer = reply;
    }
    return ucp_atomic_op_nbx(p->ep, uop, operand, 1, raddr, rkey, &prm);
}

/* A fetching atomic that waits for its reply; for CSWAP *reply holds the new value on entry. */
static int amo_fetch(vku_worker *w, vku_peer *p, ucp_atomic_op_t uop, int width,
                     uint64_t operand, uint64_t reply_in, uint64_t raddr, ucp_rkey_h rkey,
                     uint64_t *out)
{
    vku_word op;
    /* The worker's spare reply cell, taken while in use (the wait may release the lock to
     * another thread, which then allocates its own), given back after: no allocation per
     * AMO. Abandoned to UCX if the reply never comes (timeout). */
    vku_word *rep = w->reply;
    w->reply = NULL;
    if (!rep && !(rep = malloc(sizeof(*rep))))
        return VKU_ENOMEM;
    put_word(&op, width, operand);
    put_word(rep, width, reply_in);
    int rc = wait_req(w, post_amo(p, uop, width, &op, rep, raddr, rkey), w->ctx->timeout_ns);
    if (rc == 0)
        *out = get_word(rep, width);
    if (rc == VKU_ETIMEDOUT)
        return rc; /* rep leaked: UCX may still write it */
    if (!w->reply)
        w->reply = rep;
    else
        free(rep);
    return rc;
}

static uint64_t apply(int op, uint64_t old, uint64_t operand, uint64_t mask)
{
    switch (op) {
    case VKU_AND: return old & operand;
    case VKU_OR: return old | operand;
    case VKU_XOR: return old ^ operand;
    case VKU_ADD: return (old + operand) & mask;
    default: return operand; /* SET, SWAP */
    }
}

/* op emulated by a compare-and-swap loop (a UCX whose native op writes wrong values). */
static int amo_by_cas(vku_worker *w, vku_peer *p, int op, int width, uint64_t operand,
                      uint64_t mask, uint64_t raddr, ucp_rkey_h rkey, uint64_t *out)
{
    uint64_t old;
    int rc = amo_fetch(w, p, UCP_ATOMIC_OP_ADD, width, 0, 0, raddr, rkey, &old);
    while (rc == 0) {
        uint64_t seen;
        uint64_t want = apply(op, old, operand, mask);
        rc = amo_fetch(w, p, UCP_ATOMIC_OP_CSWAP, width, old, want, raddr, rkey, &seen);
        if (rc == 0 && seen == old) {
            *out = old;
            break;
        }
        old = seen;
    }
    return rc;
}

static const ucp_atomic_op_t UOP[8] = {
    [VKU_FETCH] = UCP_ATOMIC_OP_ADD, [VKU_SET] = UCP_ATOMIC_OP_SWAP,
    [VKU_SWAP] = UCP_ATOMIC_OP_SWAP, [VKU_CSWAP] = UCP_ATOMIC_OP_CSWAP,
    [VKU_ADD] = UCP_ATOMIC_OP_ADD,   [VKU_AND] = UCP_ATOMIC_OP_AND,
    [VKU_OR] = UCP_ATOMIC_OP_OR,     [VKU_XOR] = UCP_ATOMIC_OP_XOR,
};

/* The AMO itself (w->lock held, target resolved); emulate: honour the emulation mask. */
static int amo_locked(vku_worker *w, vku_peer *p, ucp_rkey_h rkey, uint64_t raddr, int op,
                      int width, uint64_t operand, uint64_t compare, int fetch, int emulate,
                      uint64_t *result)
{
    uint64_t mask = width == 4 ? 0xFFFFFFFFull : ~0ull;
    operand &= mask;
    compare &= mask;
    uint64_t unused;
    if (!result)
        result = &unused;
    /* Every AMO waits for its result, fetching or not: UCX 1.22's worker flush was seen not to
     * wait for posted (non-fetching) software atomics over posix,cma,self, so a contended
     * counter read after quiet and a barrier still missed 60 to 500 of 2000 adds at 4 PEs
     * under load (tests/pe/amo.py, about one run in three). A fetching atomic is complete at
     * the target when its reply arrives. */
    fetch = 1;
    int rc = 0;
    if (fetch)
        rc = order_after_writes(w, p);
    if (rc)
        return rc;
    uint32_t bit = 1u << (op + (fetch ? 0 : VKU_EMU_NONFETCH));
    if (emulate && (w->ctx->emulate & bit)) {
        uint64_t old = 0;
        rc = amo_by_cas(w, p, op, width, operand, mask, raddr, rkey, &old);
        if (fetch)
            *result = old;
        return rc;
    }
    switch (op) {
    case VKU_FETCH:
        return amo_fetch(w, p, UCP_ATOMIC_OP_ADD, width, 0, 0, raddr, rkey, result);
    case VKU_CSWAP: /* UCP: compare in the operand buffer, new value in the reply buffer */
        return amo_fetch(w, p, UCP_ATOMIC_OP_CSWAP, width, compare, operand, raddr, rkey,
                         result);
    default:
        break;
    }
    return amo_fetch(w, p, UOP[op], width, operand, 0, raddr, rkey, result);
}

int vku_amo(vku_worker *w, int32_t pe, uint32_t seg, uint64_t off, int op, int width,
            uint64_t operand, uint64_t compare, int fetch, uint64_t *result)
{
    if (width != 4 && width != 8)
        return VKU_EAMO;
    if (op < VKU_FETCH || op > VKU_XOR)
        return VKU_EAMO;
    vku_peer *p;
    ucp_rkey_h rkey;
    uint64_t raddr;
    char *local;
    int try = (fetch & VKU_TRY) != 0;
    fetch &= ~VKU_TRY;
    if (lock_worker(w, try))
        return VKU_AGAIN;
    int rc = target(w, pe, seg, off, (uint64_t)width, &p, &rkey, &raddr, &local);
    if (rc == 0 && off % (uint64_t)width)
        rc = VKU_EALIGN;
    if (rc == 0 && try && (!local || !w->ctx->cpu_amo || p->dirty == w->epoch))
        rc = VKU_AGAIN;
    if (rc == 0 && local && w->ctx->cpu_amo) {
        /* the core's CPU atomic on UCX's mapping: atomic with every other AMO on the word */
        if ((rc = order_after_writes(w, p)) == 0) {
            uint64_t old = w->ctx->cpu_amo((uintptr_t)local, op == VKU_SET && fetch ? VKU_SWAP
                                           : op, width, operand, compare);
            if (result)
                *result = old;
        }
    } else if (rc == 0) {
        rc = amo_locked(w, p, rkey, raddr, op, width, operand, compare, fetch, 1, result);
    }
    pthread_mutex_unlock(&w->lock);
    return rc;
}

int vku_fence(vku_worker *w)
{
    pthread_mutex_lock(&w->lock);
    int rc = w->worker ? ucp_worker_fence(w->worker) : VKU_ECLOSED;
    pthread_mutex_unlock(&w->lock);
    return rc;
}

int vku_quiet(vku_worker *w)
{
    pthread_mutex_lock(&w->lock);
    int rc = 0;
    /* Nothing to flush when every operation since the last quiet completed on return: the
     * blocking gets and AMOs, and everything done through a direct mapping (stores there are
     * made visible by the caller's fence). */
    if (!settled(w)) {
        ucp_request_param_t prm;
        memset(&prm, 0, sizeof(prm));
        rc = wait_req(w, ucp_worker_flush_nbx(w->worker, &prm), w->ctx->timeout_ns);
        rc = finish_pending(w, w->ctx->timeout_ns, rc); /* complete by now: their status */
        if (rc == 0) {
            w->epoch++; /* nothing is dirty any more */
            w->dirty = 0;
        }
    }
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&w->lock);
    return rc;
}

int vku_progress(vku_worker *w)
{
    if (pthread_mutex_trylock(&w->lock) != 0)
        return 0; /* someone is progressing it already */
    int n = 0;
    while (n < VKU_DRAIN_MAX && ucp_worker_progress(w->worker))
        n++;
    ucp_worker_arm(w->worker);
    pthread_mutex_unlock(&w->lock);
    return n;
}

/* -- the start-up self-test --------------------------------------------------------------- */

int vku_selftest(vku_ctx *c, uint32_t *bad_mask, char *err, size_t errlen)
{
    /* Worker a applies each op to memory reached through worker b (UCX's shared memory or
     * network transports between workers) and through a itself (UCX's "self" transport, where
     * 1.13.1 writes wrong values for fetching AND/OR/XOR). */
    static const int ops[3] = {VKU_AND, VKU_OR, VKU_XOR};
    static const uint64_t old8 = 0xF0F0A5A5C3C3FF00ull, arg8 = 0x0FF0FF0033CC0F0Full;
    *bad_mask = 0;
    vku_worker *a = vku_worker_create(c, 2, err, errlen);
    vku_worker *b = a ? vku_worker_create(c, 1, err, errlen) : NULL;
    uint64_t *mem = aligned_alloc(64, 4096);
    int rc = (a && b && mem) ? 0 : VKU_ENOMEM;
    char blob[VKU_RKEY_MAX];
    size_t len = sizeof(blob);
    if (rc == 0) {
        memset(mem, 0, 4096);
        rc = vku_worker_address(b, blob, &len);
        if (rc == 0)
            rc = vku_peer_set(a, 0, blob, len);
        len = sizeof(blob);
        if (rc == 0)
            rc = vku_worker_address(a, blob, &len);
        if (rc == 0)
            rc = vku_peer_set(a, 1, blob, len);
        len = sizeof(blob);
        int no = 0;
        if (rc == 0)
            rc = vku_mem_map(c, (uintptr_t)mem, 4096, -1, &no, blob, &len);
        for (int32_t pe = 0; rc == 0 && pe < 2; pe++)
            rc = vku_peer_seg(a, pe, 0, (uint64_t)(uintptr_t)mem, 4096, blob, len);
        if (rc)
            set_err(err, errlen, "set-up: %s", vku_status_string(rc));
    }
    for (int32_t pe = 0; rc == 0 && pe < 2; pe++) {
        for (int width = 4; rc == 0 && width <= 8; width += 4) {
            uint64_t mask = width == 4 ? 0xFFFFFFFFull : ~0ull;
            for (int i = 0; rc == 0 && i < 3; i++) {
                for (int fetch = 0; rc == 0 && fetch < 2; fetch++) {
                    int op = ops[i];
                    size_t slot = (size_t)(32 * pe + 8 * (width / 4 - 1) + 2 * i + fetch);
                    uint64_t old = old8 & mask, arg = arg8 & mask, got = ~0ull;
                    if (width == 4)
                        ((uint32_t *)mem)[2 * slot] = (uint32_t)old;
                    else
                        mem[slot] = old;
                    vku_peer *p;
                    ucp_rkey_h rkey;
                    uint64_t raddr;
                    pthread_mutex_lock(&a->lock);
                    rc = target(a, pe, 0, slot * 8, (uint64_t)width, &p, &rkey, &raddr,
                                NULL);
                    if (rc == 0)
                        rc = amo_locked(a, p, rkey, raddr, op, width, arg, 0, fetch, 0, &got);
                    pthread_mutex_unlock(&a->lock);
                    if (rc == 0 && !fetch)
                        rc = vku_quiet(a);
                    if (rc) {
                        set_err(err, errlen, "op %d width %d: %s", op, width,
                                vku_status_string(rc));
                        break;
                    }
                    uint64_t now = width == 4 ? ((uint32_t *)mem)[2 * slot] : mem[slot];
                    if (now != apply(op, old, arg, mask) || (fetch && got != old))
                        *bad_mask |= 1u << (op + (fetch ? 0 : VKU_EMU_NONFETCH));
                }
            }
        }
    }
    if (a) /* first: its endpoints to b close while b is still served */
        vku_worker_destroy(a, 1);
    if (b)
        vku_worker_destroy(b, 1);
    if (mem) {
        pthread_mutex_lock(&c->mem_lock);
        for (int i = 0; i < c->nlocal; i++) {
            if (c->locals[i].addr == (uintptr_t)mem) {
                unmap_local(c, &c->locals[i]);
                c->locals[i] = c->locals[--c->nlocal];
                break;
            }
        }
        pthread_mutex_unlock(&c->mem_lock);
        free(mem);
    }
    return rc;
}

/* -- the core's compiled hot path (struct vk_native_ops) ------------------------------------ */

static int native_put(void *w, int32_t pe, uint32_t seg, uint64_t off, const void *src,
                      size_t n, int nbi) {
    return vku_put(w, pe, seg, off, src, n, nbi);
}

static int native_get(void *w, int32_t pe, uint32_t seg, uint64_t off, void *dst, size_t n,
                      int nbi) {
    return vku_get(w, pe, seg, off, dst, n, nbi);
}

static int native_amo(void *w, int32_t pe, uint32_t seg, uint64_t off, int op, int width,
                      uint64_t operand, uint64_t compare, int fetch, uint64_t *result) {
    return vku_amo(w, pe, seg, off, op, width, operand, compare, fetch, result);
}

/* A try-quiet or try-fence: done (a memory fence) when the worker has nothing to flush or
 * order, else VKU_AGAIN (also while another thread holds the worker). */
static int try_settled(vku_worker *w) {
    if (lock_worker(w, 1))
        return VKU_AGAIN;
    int rc = settled(w) ? 0 : VKU_AGAIN;
    pthread_mutex_unlock(&w->lock);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    return rc;
}

/* VKU_PYTHON ("call the Python quiet") while Python holds buffers it must release after the
 * flush */
static int native_quiet(void *w, int mode) {
    if (((vku_worker *)w)->py_held)
        return VKU_PYTHON;
    return mode == VKU_TRY ? try_settled(w) : vku_quiet(w);
}

static int native_fence(void *w, int mode) {
    return mode == VKU_TRY ? try_settled(w) : vku_fence(w);
}

void vku_native_ops(vku_worker *w, struct vk_native_ops *ops) {
    ops->self = w;
    ops->put = native_put;
    ops->get = native_get;
    ops->amo = native_amo;
    ops->quiet = native_quiet;
    ops->fence = native_fence;
    ops->flags = VKU_CAN_TRY;
}

int *vku_held_flag(vku_worker *w) { return &w->py_held; }
