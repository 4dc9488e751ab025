/* vkshmem.core._fast: reading arguments: plain ints, PEs, and arrays as views of their
 * bytes (numpy's fields for plain arrays, the buffer protocol for anything else). */
#include "fast.h"

#include <stdarg.h>
#include <string.h>

int fast_none(PyObject *o) { return o == NULL || o == Py_None; }

int fast_domains_open(void) {
    if (G.seg_heaps == NULL) return 1;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(G.seg_heaps); i++)
        if (PyList_GET_ITEM(G.seg_heaps, i) != Py_None) return 1;
    return 0;
}

int fast_long(PyObject *o, long *v) {
    int overflow;
    if (o == NULL || !PyLong_CheckExact(o)) return 0;
    *v = PyLong_AsLongAndOverflow(o, &overflow);
    return !overflow;
}

int fast_pe(PyObject *o, long *pe) {
    return fast_long(o, pe) && *pe >= 0 && *pe < G.npes && G.direct[*pe];
}

int fast_route(PyObject *o, long *pe) {
    if (!fast_long(o, pe) || *pe < 0 || *pe >= G.npes || fast_pe_failed(*pe)) return ROUTE_NONE;
    if (G.direct[*pe]) return ROUTE_DIRECT;
    return G.ops != NULL && G.ops[*pe] != NULL ? ROUTE_NATIVE : ROUTE_NONE;
}

/* (native operations reach the host heap only: segment 0) */
PyObject *fast_native_error(long pe, int rc, const char *doing, uint64_t off, Py_ssize_t n,
                            PyObject *buffer) {
    PyObject *exc = PyObject_CallMethod(PyTuple_GET_ITEM(G.transports, pe), "native_error",
                                        "isliKnO", rc, doing, pe, 0,
                                        (unsigned long long)off, n, buffer);
    if (exc != NULL) {
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
        Py_DECREF(exc);
        fast_translate_error(pe);
    }
    return NULL;
}

void fast_translate_error(long pe) {
    if (G.waiter == NULL || G.failed == NULL) return;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL && value != NULL) PyException_SetTraceback(value, tb);
    PyObject *got = value == NULL ? NULL
                    : PyObject_CallMethod(G.waiter, "translate", "Ol", value, pe);
    if (got == NULL || got == value) {  /* keep the original error */
        PyErr_Clear();
        Py_XDECREF(got);
        PyErr_Restore(type, value, tb);
        return;
    }
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    PyErr_SetObject((PyObject *)Py_TYPE(got), got);
    Py_DECREF(got);
}

/* numpy's array object: its first fields (numpy's ABI since 1.x; checked by bind()) */
typedef struct {
    PyObject_HEAD
    char *data;
    int nd;
    Py_ssize_t *dimensions, *strides;
    PyObject *base, *descr;
    int flags;
} nd_fields;
#define ND_C_CONTIGUOUS 0x0001
#define ND_WRITEABLE 0x0400

/* dtype -> element size and format, learnt through the buffer protocol (dtypes of builtin
 * types are singletons: a handful of entries serve every call) */
#define N_DTYPES 16
static struct { PyObject *descr; Py_ssize_t itemsize; char format[8]; } dtypes[N_DTYPES];
static int dtypes_next;

static int learn_dtype(PyObject *o, PyObject *descr) {
    Py_buffer b;
    if (PyObject_GetBuffer(o, &b, PyBUF_RECORDS_RO) < 0) {
        PyErr_Clear();
        return -1;
    }
    int i = -1;
    if (b.format != NULL && strlen(b.format) < sizeof dtypes[0].format &&
        strchr(b.format, 'O') == NULL && b.itemsize > 0) {
        i = dtypes_next;
        dtypes_next = (dtypes_next + 1) % N_DTYPES;
        Py_INCREF(descr);
        Py_XSETREF(dtypes[i].descr, descr);
        dtypes[i].itemsize = b.itemsize;
        strcpy(dtypes[i].format, b.format);
    }
    PyBuffer_Release(&b);
    return i;
}

int fast_view(PyObject *o, struct fast_view *v, int writable) {
    v->obj = o;
    v->writable = writable;
    v->held = 0;
    if (G.struct_ok && Py_TYPE(o) == G.ndarray) {
        nd_fields *a = (nd_fields *)o;
        int i = 0;
        if (!(a->flags & ND_C_CONTIGUOUS) || (writable && !(a->flags & ND_WRITEABLE)))
            return -1;
        while (i < N_DTYPES && dtypes[i].descr != a->descr) i++;
        if (i == N_DTYPES && (i = learn_dtype(o, a->descr)) < 0) return -1;
        Py_ssize_t n = 1;
        for (int d = 0; d < a->nd; d++) n *= a->dimensions[d];
        v->buf = a->data;
        v->itemsize = dtypes[i].itemsize;
        v->len = n * v->itemsize;
        v->format = dtypes[i].format;
        return 0;
    }
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(o, &v->pb, flags) < 0) {
        PyErr_Clear();
        return -1;
    }
    if (v->pb.format == NULL || v->pb.itemsize <= 0) {
        PyBuffer_Release(&v->pb);
        return -1;
    }
    v->held = 1;
    v->buf = v->pb.buf;
    v->len = v->pb.len;
    v->itemsize = v->pb.itemsize;
    v->format = v->pb.format;
    return 0;
}

int fast_hold(struct fast_view *v) {
    if (v->held) return 0;
    if (PyObject_GetBuffer(v->obj, &v->pb, PyBUF_C_CONTIGUOUS |
                           (v->writable ? PyBUF_WRITABLE : 0)) < 0) {
        PyErr_Clear();
        return -1;
    }
    v->held = 1;
    return 0;
}

void fast_release(struct fast_view *v) {
    if (v->held) PyBuffer_Release(&v->pb);
    v->held = 0;
}

/* Same element type, and one that holds no Python objects. */
int fast_same_format(const struct fast_view *a, const struct fast_view *b) {
    return a->itemsize == b->itemsize &&
           (a->format == b->format || strcmp(a->format, b->format) == 0) &&
           strchr(a->format, 'O') == NULL;
}

/* Bytes to move: `size` elements (checked against both buffers) or the shorter buffer. */
int fast_count(PyObject *size, const struct fast_view *t, const struct fast_view *s,
               Py_ssize_t *nbytes) {
    long n;
    if (fast_none(size)) {
        *nbytes = t->len < s->len ? t->len : s->len;
        return 1;
    }
    if (!fast_long(size, &n) || n < 0 || n > t->len / t->itemsize || n > s->len / s->itemsize)
        return 0;
    *nbytes = (Py_ssize_t)n * t->itemsize;
    return 1;
}

/* Whether array `o` reads, through nd_fields, as the buffer protocol describes it. */
int fast_layout_agrees(PyObject *o) {
    Py_buffer b;
    nd_fields *a = (nd_fields *)o;
    int ok;
    if (PyObject_GetBuffer(o, &b, PyBUF_RECORDS_RO) < 0) {
        PyErr_Clear();
        return 0;
    }
    ok = a->data == b.buf && a->nd == b.ndim &&
         !(a->flags & ND_C_CONTIGUOUS) == !PyBuffer_IsContiguous(&b, 'C') &&
         !(a->flags & ND_WRITEABLE) == !!b.readonly;
    for (int d = 0; ok && d < b.ndim; d++)
        ok = a->dimensions[d] == b.shape[d] && a->strides[d] == b.strides[d];
    PyBuffer_Release(&b);
    return ok;
}


int fast_invalid(const char *fmt, ...) {
    va_list va;
    va_start(va, fmt);
    PyObject *msg = PyUnicode_FromFormatV(fmt, va);
    va_end(va);
    PyObject *mod = msg == NULL ? NULL : PyImport_ImportModule("vkshmem.core.errors");
    PyObject *cls = mod == NULL ? NULL : PyObject_GetAttrString(mod, "InvalidArgumentError");
    if (cls != NULL) PyErr_SetObject(cls, msg);
    Py_XDECREF(cls);
    Py_XDECREF(mod);
    Py_XDECREF(msg);
    return -1;
}
