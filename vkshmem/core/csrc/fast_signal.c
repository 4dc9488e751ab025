/* vkshmem.core._fast: signals (OpenSHMEM 1.5/1.6) on the shm path: put_signal(_nbi),
 * signal_add/signal_set, signal_fetch and signal_wait_until, for a signal that is a plain
 * one-element 64-bit integer array of the host heap (see vkshmem._api.signal). */
#include "fast.h"

#include <string.h>

/* The local address and heap offset of signal word `sig`; 0 when it is not such a word. */
static int signal_word(PyObject *sig, uintptr_t *local, uint64_t *off) {
    struct fast_view v;
    if (Py_TYPE(sig) != G.ndarray || fast_view(sig, &v, 0) < 0) return 0;
    const char *f = v.format;
    int ok = v.itemsize == 8 && v.len == 8 && f[0] != '\0' && f[1] == '\0' &&
             strchr("lLqQ", f[0]) != NULL;
    if (ok) {
        int64_t r = vk_locate_in(G.table, v.buf, 8);
        ok = r >= 0 && (r >> 48) == 0 && (r & 7) == 0;  /* the host heap: segment 0 */
        *local = (uintptr_t)v.buf;
        *off = (uint64_t)(r & VK_OFF_MASK);
    }
    fast_release(&v);
    return ok;
}

/* A plain int, modulo 2**64 (signal values are unsigned 64-bit). */
static int value64(PyObject *o, uint64_t *u) {
    if (o == NULL || !PyLong_CheckExact(o)) return 0;
    *u = PyLong_AsUnsignedLongLongMask(o);
    if (*u == (uint64_t)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return 1;
}

static int lookup(PyObject *map, PyObject *key, int *code) {
    PyObject *c = map == NULL || key == NULL ? NULL : PyDict_GetItemWithError(map, key);
    if (c == NULL) {
        PyErr_Clear();
        return 0;
    }
    *code = (int)PyLong_AsLong(c);
    return 1;
}

/* put_signal / put_signal_nbi: the copy is complete, and the sequentially consistent
 * atomic that follows is ordered after it (as vkshmem._api.signal's shm path). */
int fast_put_signal(FastCall *self, PyObject **a, PyObject **out) {
    uintptr_t local, peer;
    uint64_t off, v;
    long pe;
    int op;
    if (!fast_none(a[P_CTX]) || !fast_pe(a[P_PE], &pe) || !lookup(self->opmap, a[P_SIGOP], &op) ||
        !value64(a[P_VALUE], &v) || !signal_word(a[P_SIGNAL], &local, &off) ||
        !(peer = fast_peer(0, (int)pe)) || !fast_rma_put(a))
        return 0;
    vk_amo_impl(peer + off, op, 8, v, 0);
    *out = Py_NewRef(Py_None);
    return 1;
}

/* signal_add / signal_set (the op is the entry's) */
int fast_signal_update(FastCall *self, PyObject **a, PyObject **out) {
    uintptr_t local, peer;
    uint64_t off, v;
    long pe;
    if (!fast_none(a[P_CTX]) || !fast_pe(a[P_PE], &pe) || !value64(a[P_VALUE], &v) ||
        !signal_word(a[P_SIGNAL], &local, &off) || !(peer = fast_peer(0, (int)pe)))
        return 0;
    vk_amo_impl(peer + off, self->op, 8, v, 0);
    *out = Py_NewRef(Py_None);
    return 1;
}

int fast_signal_fetch(FastCall *self, PyObject **a, PyObject **out) {
    uintptr_t local;
    uint64_t off;
    if (!signal_word(a[P_SIGNAL], &local, &off)) return 0;
    *out = PyLong_FromUnsignedLongLong(__atomic_load_n((uint64_t *)local, __ATOMIC_SEQ_CST));
    return 1;
}

struct what_ctx { PyObject *cmp; uint64_t value; };

static PyObject *what_signal_wait(const void *p) {
    const struct what_ctx *c = p;
    PyObject *empty = PyUnicode_FromString(""), *cmp = NULL, *r = NULL;
    if (empty != NULL && (cmp = PyObject_Format(c->cmp, empty)) != NULL)
        r = PyUnicode_FromFormat("signal_wait_until(signal %U %llu)", cmp,
                                 (unsigned long long)c->value);
    Py_XDECREF(empty);
    Py_XDECREF(cmp);
    return r;
}

/* signal_wait_until: returns the value that satisfied the comparison */
int fast_signal_wait(FastCall *self, PyObject **a, PyObject **out) {
    uintptr_t local;
    uint64_t off, v;
    int cmp;
    if (!G.native_waits || !lookup(self->opmap, a[P_CMP], &cmp) || !value64(a[P_VALUE], &v) ||
        !signal_word(a[P_SIGNAL], &local, &off))
        return 0;
    struct fast_pred p = {(const void *)local, 8, 'u', cmp, v, 0};
    struct what_ctx c = {a[P_CMP], v};
    *out = fast_wait(&p, what_signal_wait, &c) < 0 ? NULL : PyLong_FromUnsignedLongLong(p.seen);
    return 1;
}
