/* vkshmem.core._fast: waiting on local memory (spin, then yield, then sleep; back in Python
 * for signals and the timeout every millisecond), and wait_until/test on one integer.
 * The waits run with the GIL held for their first microseconds, then without it. Where the
 * open transports offer it (fast_watch.c), a wait that stops spinning arms the wake board and
 * its sleeps are futex waits that the transports' progress ends once the word holds, not
 * SLEEP_NS naps. */
#include "fast.h"
#include "fast_int.h"

#include <sched.h>
#include <string.h>
#include <time.h>

#define HOLD_NS 3000         /* wait this long holding the GIL (a peer a cache miss away), */
#define SLICE_NS 1000000     /* then, GIL released, return to Python at least this often */
#define YIELD_NS 2000000     /* yield the CPU between checks until this long, */
#define SLEEP_NS 50000       /* then sleep this long between checks; */
#define WATCH_YIELD_NS 100000 /* with the wake board armed, yield this long, then sleep on it */
#define SPIN_MIN 200         /* the pause-spin before the first yield adapts in these bounds */
#define SPIN_MAX 50000

/* How long a wait pause-spins before it yields the CPU: it grows while waits end during the
 * spin (the PE waited for runs on another CPU) and halves when one needs the yield (it may
 * share this CPU, or be descheduled: spinning only delays it). */
static uint64_t spin_ns = 2000;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}


int fast_pred_true(struct fast_pred *p) {
    uint64_t v;
    if (p->kind == 's') return fast_set_true(p);
    switch (p->width) {
    case 1: v = __atomic_load_n((const uint8_t *)p->addr, __ATOMIC_SEQ_CST); break;
    case 2: v = __atomic_load_n((const uint16_t *)p->addr, __ATOMIC_SEQ_CST); break;
    case 4: v = __atomic_load_n((const uint32_t *)p->addr, __ATOMIC_SEQ_CST); break;
    default: v = __atomic_load_n((const uint64_t *)p->addr, __ATOMIC_SEQ_CST); break;
    }
    int c;  /* -1, 0, 1: v against the value */
    p->seen = v;
    if (p->kind == 'i') {
        int shift = 64 - 8 * p->width;
        int64_t s = (int64_t)(v << shift) >> shift, w = (int64_t)p->value;
        c = s < w ? -1 : s > w;
    } else {
        c = v < p->value ? -1 : v > p->value;
    }
    switch (p->cmp) {
    case 1: return c == 0;
    case 2: return c != 0;
    case 3: return c > 0;
    case 4: return c <= 0;
    case 5: return c < 0;
    default: return c >= 0;
    }
}

/* Check until the predicate holds (1) or `until` passes (0): pause-spin for the first
 * `budget` ns of the wait (from `start`), then yield the CPU between checks, and from
 * YIELD_NS on sleep between them. *yielded: whether it had to yield. *watch: 1 the wake board
 * may be armed when the spin ends, 2 armed (the sleeps are on it, from WATCH_YIELD_NS on: a
 * sleep ends as soon as a transport applied the data, so a longer yield phase would only
 * take CPU time from the threads that apply it), 0 neither. */
static int poll(struct fast_pred *p, uint64_t start, uint64_t until, uint64_t budget,
                int *yielded, int *watch) {
    for (;;) {
        if (fast_pred_true(p)) return 1;
        uint64_t now = now_ns(), waited = now - start;
        if (now >= until) return 0;
        if (waited < budget) {
            for (int k = 0; k < 16 && !fast_pred_true(p); k++) relax();
            continue;
        }
        if (*watch == 1) *watch = fast_watch_arm(p) ? 2 : 0;
        *yielded = 1;
        if (waited < (*watch == 2 ? WATCH_YIELD_NS : YIELD_NS)) {
            sched_yield();
        } else if (*watch == 2) {
            fast_watch_sleep(p, until - now);
        } else {
            struct timespec ts = {0, SLEEP_NS};
            nanosleep(&ts, NULL);
        }
    }
}

static void adapt(int yielded) {
    if (!yielded) spin_ns = spin_ns + spin_ns / 4 < SPIN_MAX ? spin_ns + spin_ns / 4 : SPIN_MAX;
    else spin_ns = spin_ns / 2 > SPIN_MIN ? spin_ns / 2 : SPIN_MIN;
}

/* Raise the Waiter's error `method` (timeout_error, failure_error) of the wait for `what`. */
static void raise_timeout(fast_what what, const void *ctx, const char *method) {
    if (G.waiter == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "vkshmem was finalized during a wait");
        return;
    }
    PyObject *msg = what(ctx);
    if (msg == NULL) return;
    PyObject *exc = PyObject_CallMethod(G.waiter, method, "O", msg);
    Py_DECREF(msg);
    if (exc != NULL) {
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
        Py_DECREF(exc);
    }
}

/* 0 once the predicate holds; -1 with an exception: the runtime's Waiter timeout passed
 * (VKSHMEM_WAIT_TIMEOUT), a PE of the job failed (the liveness words, read once per slice:
 * PeerFailedError), or a signal handler raised (Ctrl-C). */
static int wait_slices(struct fast_pred *p, fast_what what, const void *ctx, uint64_t start,
                       uint64_t budget, int *watch);

int fast_wait(struct fast_pred *p, fast_what what, const void *ctx) {
    if (fast_pred_true(p)) return 0;
    uint64_t start = now_ns(), budget = G.crowded ? 0 : spin_ns;
    int watch = fast_watch_usable(), rc;
    rc = wait_slices(p, what, ctx, start, budget, &watch);
    if (watch == 2) fast_watch_disarm();
    return rc;
}

/* fast_wait's work: 0 once the predicate holds, -1 with an exception. */
static int wait_slices(struct fast_pred *p, fast_what what, const void *ctx, uint64_t start,
                       uint64_t budget, int *watch) {
    int yielded = 0, done;
    if (poll(p, start, start + HOLD_NS, budget, &yielded, watch)) {  /* most waits end here */
        adapt(yielded);
        return 0;
    }
    double timeout = 0;
    if (G.waiter != NULL) {
        PyObject *t = PyObject_GetAttrString(G.waiter, "timeout");
        if (t == NULL) return -1;
        timeout = PyFloat_AsDouble(t);
        Py_DECREF(t);
        if (timeout == -1.0 && PyErr_Occurred()) return -1;
    }
    uint64_t deadline = timeout > 0 ? start + (uint64_t)(timeout * 1e9) : 0;
    for (;;) {
        Py_BEGIN_ALLOW_THREADS
        done = poll(p, start, now_ns() + SLICE_NS, budget, &yielded, watch);
        Py_END_ALLOW_THREADS
        if (done) {
            adapt(yielded);
            return 0;
        }
        if (PyErr_CheckSignals() < 0) return -1;
        if (G.failed != NULL && G.failed[0]) {
            if (fast_pred_true(p)) return 0;
            raise_timeout(what, ctx, "failure_error");
            return -1;
        }
        if (deadline && now_ns() > deadline) {
            if (fast_pred_true(p)) return 0;
            raise_timeout(what, ctx, "timeout_error");
            return -1;
        }
    }
}

/* -- wait_until / test ----------------------------------------------------------------------- */
/* A predicate on one aligned integer of a numpy array against a plain int in its range. */
static int make_pred(FastCall *self, PyObject **a, struct fast_pred *p) {
    PyObject *ivar = a[P_TARGET], *code;
    struct fast_view b;
    long long v;
    int overflow, ok = 0;
    if (Py_TYPE(ivar) != G.ndarray || self->opmap == NULL || !PyLong_CheckExact(a[P_VALUE]))
        return 0;
    code = PyDict_GetItemWithError(self->opmap, a[P_CMP]);
    if (code == NULL) {
        PyErr_Clear();
        return 0;
    }
    if (fast_view(ivar, &b, 0) < 0) return 0;
    const char *f = b.format;
    int width = (int)b.itemsize;
    p->addr = b.buf;
    p->width = width;
    p->cmp = (int)PyLong_AsLong(code);
    p->kind = f[0] != '\0' && f[1] == '\0' && strchr("bhilq", f[0]) ? 'i'
              : f[0] != '\0' && f[1] == '\0' && strchr("BHILQ", f[0]) ? 'u' : 0;
    if (p->kind == 0 || b.len != b.itemsize || (width != 1 && width != 2 && width != 4 &&
        width != 8) || ((uintptr_t)b.buf & (uintptr_t)(width - 1)))
        goto done;
    /* only a live symmetric word (a freed or private one: the Python path raises) */
    if (vk_locate_in(G.table, b.buf, (uint64_t)b.len) < 0)
        goto done;
    if (p->kind == 'i') {
        v = PyLong_AsLongLongAndOverflow(a[P_VALUE], &overflow);
        if (overflow || (width < 8 && (v < -(1LL << (8 * width - 1)) ||
                                       v >= (1LL << (8 * width - 1)))))
            goto done;
        p->value = (uint64_t)v;
    } else {
        unsigned long long u = PyLong_AsUnsignedLongLong(a[P_VALUE]);
        if (u == (unsigned long long)-1 && PyErr_Occurred()) {
            PyErr_Clear();
            goto done;
        }
        if (width < 8 && u >= (1ULL << (8 * width))) goto done;
        p->value = u;
    }
    ok = 1;
done:
    /* the caller keeps the array alive: the address stays valid while it waits */
    fast_release(&b);
    return ok;
}

static PyObject *what_wait_until(const void *ctx) {
    PyObject *const *a = ctx, *empty = PyUnicode_FromString(""), *c = NULL, *v = NULL, *r = NULL;
    if (empty != NULL && (c = PyObject_Format(a[P_CMP], empty)) != NULL &&
        (v = PyObject_Format(a[P_VALUE], empty)) != NULL)
        r = PyUnicode_FromFormat("wait_until(ivar %U %U)", c, v);
    Py_XDECREF(empty);
    Py_XDECREF(c);
    Py_XDECREF(v);
    return r;
}

int fast_wait_until(FastCall *self, PyObject **a, PyObject **out) {
    struct fast_pred p;
    if (!G.native_waits || !make_pred(self, a, &p)) return 0;
    *out = fast_wait(&p, what_wait_until, a) < 0 ? NULL : Py_NewRef(Py_None);
    return 1;
}

int fast_test(FastCall *self, PyObject **a, PyObject **out) {
    struct fast_pred p;
    if (!make_pred(self, a, &p)) return 0;
    *out = PyBool_FromLong(fast_pred_true(&p));
    return 1;
}
