/* vkshmem.core._fast: put/get (blocking and nbi: on the shm path both complete at once), the
 * AMOs and quiet/fence, for numpy arrays on the shm route (see fast.h). */
#include "fast.h"

#include <float.h>
#include <math.h>
#include <string.h>

/* Copies this large run with the GIL released (other threads go on meanwhile). */
#define NOGIL_BYTES (256 << 10)

static void copy(void *dst, const void *src, Py_ssize_t n, struct fast_view *a,
                 struct fast_view *b) {
    if (n >= NOGIL_BYTES && fast_hold(a) == 0 && fast_hold(b) == 0) {
        Py_BEGIN_ALLOW_THREADS
        memcpy(dst, src, (size_t)n);
        Py_END_ALLOW_THREADS
    } else {
        memcpy(dst, src, (size_t)n);
    }
}

uintptr_t fast_remote(const void *p, Py_ssize_t n, long pe) {
    int64_t r = vk_locate_in(G.table, p, (uint64_t)n);
    if (r < 0) return 0;
    uintptr_t base = fast_peer((int)(r >> 48), (int)pe);
    return base ? base + (uint64_t)(r & VK_OFF_MASK) : 0;
}

/* put or get through a transport's C data path (Transport.native_ops): the host heap only,
 * blocking (an nbi operation may complete early); first, below NOGIL_BYTES, as a
 * VK_NATIVE_TRY call with the GIL held, then (if it would wait) with the buffers held and
 * the GIL released. */
static int native_rma(PyObject **out, int to_peer, long pe, struct fast_view *t,
                      struct fast_view *s, Py_ssize_t nbytes) {
    struct fast_view *loc = to_peer ? s : t;
    int64_t r = vk_locate_in(G.table, (to_peer ? t : s)->buf, (uint64_t)nbytes);
    if (r < 0 || (r >> 48) != 0) return 0;
    struct vk_native_ops *ops = G.ops[pe];
    uint64_t off = (uint64_t)(r & VK_OFF_MASK);
    int rc = VK_NATIVE_AGAIN;
    if ((ops->flags & VK_NATIVE_CAN_TRY) && nbytes < NOGIL_BYTES) {
        if (to_peer) rc = ops->put(ops->self, (int32_t)pe, 0, off, loc->buf, (size_t)nbytes,
                                   VK_NATIVE_TRY);
        else rc = ops->get(ops->self, (int32_t)pe, 0, off, loc->buf, (size_t)nbytes,
                           VK_NATIVE_TRY);
    }
    if (rc == VK_NATIVE_AGAIN) {
        if (fast_hold(t) < 0 || fast_hold(s) < 0) return 0;
        Py_BEGIN_ALLOW_THREADS
        if (to_peer) rc = ops->put(ops->self, (int32_t)pe, 0, off, loc->buf, (size_t)nbytes,
                                   0);
        else rc = ops->get(ops->self, (int32_t)pe, 0, off, loc->buf, (size_t)nbytes, 0);
        Py_END_ALLOW_THREADS
    }
    *out = rc ? fast_native_error(pe, rc, to_peer ? "put to" : "get from", off, nbytes,
                                  loc->obj)
              : Py_NewRef(Py_None);
    return 1;
}

/* put (to_peer) or get: views of the plain numpy arrays, the bytes, the peer's address. */
static int rma(PyObject **a, PyObject **out, int to_peer) {
    PyObject *target = a[P_TARGET], *source = a[P_SOURCE];
    struct fast_view t, s;
    Py_ssize_t nbytes;
    uintptr_t peer = 0;
    long pe;
    int route, done = 0;
    if (Py_TYPE(target) != G.ndarray || Py_TYPE(source) != G.ndarray || !fast_none(a[P_CTX]) ||
        !(route = fast_route(a[P_PE], &pe)) || fast_view(target, &t, !to_peer) < 0)
        return 0;
    if (fast_view(source, &s, 0) < 0) {
        fast_release(&t);
        return 0;
    }
    if (fast_same_format(&t, &s) && fast_count(a[P_SIZE], &t, &s, &nbytes)) {
        if (route == ROUTE_NATIVE) {
            done = native_rma(out, to_peer, pe, &t, &s, nbytes);
        } else if ((peer = fast_remote(to_peer ? t.buf : s.buf, nbytes, pe)) != 0) {
            if (to_peer) copy((void *)peer, s.buf, nbytes, &t, &s);
            else copy(t.buf, (const void *)peer, nbytes, &t, &s);
            *out = Py_NewRef(Py_None);
            done = 1;
        }
    }
    fast_release(&s);
    fast_release(&t);
    return done;
}

int fast_put(FastCall *self, PyObject **a, PyObject **out) { return rma(a, out, 1); }

int fast_rma_put(PyObject **a) {
    PyObject *out = NULL;
    int r = rma(a, &out, 1);
    Py_XDECREF(out);
    return r;
}

int fast_get(FastCall *self, PyObject **a, PyObject **out) { return rma(a, out, 0); }

/* -- AMOs ---------------------------------------------------------------------------------- */

/* 'i' signed, 'u' unsigned or 'f' float for an AMO word of this format and size; 0: none. */
static int word_kind(const struct fast_view *b) {
    const char *f = b->format;
    if (f[0] == '\0' || f[1] != '\0' || b->len != b->itemsize) return 0;
    if (b->itemsize == 4) return f[0] == 'i' ? 'i' : f[0] == 'I' ? 'u' : f[0] == 'f' ? 'f' : 0;
    if (b->itemsize != 8) return 0;
    switch (f[0]) {
    case 'l': case 'q': return 'i';
    case 'L': case 'Q': return 'u';
    case 'd': return 'f';
    }
    return 0;
}

/* The word's bits for operand v (as the Python path encodes it); 0 when not a plain int or
 * float that this path takes as is. */
static int encode(PyObject *v, int kind, int width, uint64_t *bits) {
    if (kind != 'f') {
        if (!PyLong_CheckExact(v)) return 0;
        uint64_t u = PyLong_AsUnsignedLongLongMask(v);
        if (u == (uint64_t)-1 && PyErr_Occurred()) {
            PyErr_Clear();
            return 0;
        }
        *bits = width == 4 ? (u & 0xffffffffu) : u;
        return 1;
    }
    double d;
    if (PyFloat_CheckExact(v)) {
        d = PyFloat_AS_DOUBLE(v);
    } else if (PyLong_CheckExact(v)) {
        d = PyLong_AsDouble(v);
        if (d == -1.0 && PyErr_Occurred()) {
            PyErr_Clear();
            return 0;
        }
    } else {
        return 0;
    }
    if (width == 8) {
        memcpy(bits, &d, 8);
        return 1;
    }
    float f = (float)d;
    if (isinf(f) && !isinf(d)) return 0;  /* the Python path raises OverflowError */
    uint32_t u;
    memcpy(&u, &f, 4);
    *bits = u;
    return 1;
}

static PyObject *decode(uint64_t u, int kind, int width) {
    if (kind == 'i') return PyLong_FromLongLong(width == 4 ? (int32_t)u : (int64_t)u);
    if (kind == 'u') return PyLong_FromUnsignedLongLong(width == 4 ? (uint32_t)u : u);
    if (width == 4) {
        float f;
        uint32_t w = (uint32_t)u;
        memcpy(&f, &w, 4);
        return PyFloat_FromDouble(f);
    }
    double d;
    memcpy(&d, &u, 8);
    return PyFloat_FromDouble(d);
}

/* Every atomic_* (and atomic_*_nbi with its `fetch` array): the op is fixed by the entry, or
 * looked up in its opmap (atomic_op/atomic_fetch_op: op | inc << 4 | ints_only << 5). */
int fast_amo(FastCall *self, PyObject **a, PyObject **out) {
    PyObject *target = a[P_TARGET] ? a[P_TARGET] : a[P_SOURCE], *fetch = a[P_FETCH];
    int op = self->op, inc = op == VK_ADD && self->slot[P_VALUE] < 0;  /* atomic_(fetch_)inc */
    int ints_only = self->ints_only;
    uint64_t operand = 0, compare = 0, u = 0, off = 0;
    struct fast_view t, f;
    uintptr_t word = 0;
    long pe;
    int kind, width, ok = 0;
    int route;
    if (Py_TYPE(target) != G.ndarray || !fast_none(a[P_CTX]) ||
        !(route = fast_route(a[P_PE], &pe)))
        return 0;
    if (self->opmap != NULL) {
        PyObject *code = PyDict_GetItemWithError(self->opmap, a[P_OP]);
        if (code == NULL) {
            PyErr_Clear();
            return 0;
        }
        long c = PyLong_AsLong(code);
        op = (int)(c & 15);
        inc = (int)(c >> 4 & 1);
        ints_only = (int)(c >> 5 & 1);
    }
    if (fetch != NULL && Py_TYPE(fetch) != G.ndarray) return 0;
    if (fast_view(target, &t, 0) < 0) return 0;
    kind = word_kind(&t);
    width = (int)t.itemsize;
    if (kind == 0 || (ints_only && kind == 'f')) goto done;
    if (op != VK_FETCH) {
        if (inc) operand = 1;
        else if (a[P_VALUE] == NULL || !encode(a[P_VALUE], kind, width, &operand)) goto done;
    }
    if (op == VK_CSWAP && (a[P_COND] == NULL || !encode(a[P_COND], kind, width, &compare)))
        goto done;
    /* this PE's own word: the CPU atomic on either route (as the transports do) */
    if (route == ROUTE_NATIVE && pe != G.my_pe) {
        int64_t r = vk_locate_in(G.table, t.buf, (uint64_t)width);
        if (r < 0 || (r >> 48) != 0 || (r & (width - 1))) goto done;
        off = (uint64_t)(r & VK_OFF_MASK);
    } else {
        word = fast_remote(t.buf, width, pe);
        if (!word || (word & (uintptr_t)(width - 1))) goto done;
    }
    if (fetch != NULL) {
        if (fast_view(fetch, &f, 1) < 0) goto done;
        if (!fast_same_format(&t, &f) || f.len != t.len) {
            fast_release(&f);
            goto done;
        }
    }
    ok = 1;
    if (word) {
        u = vk_amo_impl(word, op, width, operand, compare);
    } else {
        struct vk_native_ops *ops = G.ops[pe];
        int fetching = self->fetch || fetch != NULL, rc = VK_NATIVE_AGAIN;
        if (ops->flags & VK_NATIVE_CAN_TRY)  /* without releasing the GIL, if it can */
            rc = ops->amo(ops->self, (int32_t)pe, 0, off, op, width, operand, compare,
                          fetching | VK_NATIVE_TRY, &u);
        if (rc == VK_NATIVE_AGAIN) {
            Py_BEGIN_ALLOW_THREADS
            rc = ops->amo(ops->self, (int32_t)pe, 0, off, op, width, operand, compare,
                          fetching, &u);
            Py_END_ALLOW_THREADS
        }
        if (rc) {
            if (fetch != NULL) fast_release(&f);
            *out = fast_native_error(pe, rc, "AMO on", off, width, target);
            goto done;
        }
    }
    if (fetch != NULL) {
        if (width == 4) {
            uint32_t w = (uint32_t)u;
            memcpy(f.buf, &w, 4);
        } else {
            memcpy(f.buf, &u, 8);
        }
        fast_release(&f);
        *out = Py_NewRef(Py_None);
    } else {
        *out = self->fetch ? decode(u, kind, width) : Py_NewRef(Py_None);
    }
done:
    fast_release(&t);
    return ok;
}

/* quiet (op 0) or fence (op 1) of every open transport through its C functions (first as a
 * VK_NATIVE_TRY call with the GIL held where the transport takes one, else or then with the
 * GIL released): 1 done, 0 when one asks for its Python method (nothing left half done: the
 * Python path then quiets every transport again), -1 with the transport's exception set. */
int fast_transports_quiet(int fence) {
    int rc = 0, i;
    if (G.nquiet < 0) return 0;
    for (i = 0; i < G.nquiet && rc == 0; i++) {
        struct vk_native_ops *o = G.quiet_ops[i];
        int (*f)(void *, int) = fence && !G.fence_quiet[i] ? o->fence : o->quiet;
        rc = (o->flags & VK_NATIVE_CAN_TRY) ? f(o->self, VK_NATIVE_TRY) : VK_NATIVE_AGAIN;
        if (rc == VK_NATIVE_AGAIN) {
            Py_BEGIN_ALLOW_THREADS
            rc = f(o->self, 0);
            Py_END_ALLOW_THREADS
        }
    }
    if (rc > 0) return 0;
    if (rc < 0) {
        const char *doing = fence ? "fence" : "quiet";
        PyObject *exc = PyObject_CallMethod(PyTuple_GET_ITEM(G.quiet_transports, i - 1),
                                            "native_error", "isliKnO", rc, doing, -1L, 0,
                                            0ULL, (Py_ssize_t)0, Py_None);
        if (exc != NULL) {
            PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
            Py_DECREF(exc);
            fast_translate_error(-1);
        }
        return -1;
    }
    return 1;
}

/* quiet and fence of the default context (op: 0 quiet, 1 fence): a full fence while no
 * transport is open (the shm path's copies are complete on return, its AMOs sequentially
 * consistent), then the open transports' quiet/fence in C when each offers them; the Python
 * path while a memory domain is open (it may hold batched non-blocking operations). */
int fast_quiet(FastCall *self, PyObject **a, PyObject **out) {
    if (!G.enabled || !fast_none(a[P_CTX]) || fast_domains_open()) return 0;
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    if (!G.quiet_fence) {
        int r = fast_transports_quiet(self->op == 1);
        if (r <= 0) {
            *out = NULL;
            return r < 0;
        }
    }
    *out = Py_NewRef(Py_None);
    return 1;
}
