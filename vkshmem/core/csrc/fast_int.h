/* vkshmem.core._fast: plain Python ints in the element types of integer views, shared by the
 * single-word waits (fast_wait.c) and the set-wide ones (fast_waitset.c). */
#ifndef VKSHMEM_FAST_INT_H
#define VKSHMEM_FAST_INT_H

#include "fast.h"

/* o an exact int of one digit at most (|o| < 2**30: the ints of most calls): *v its value,
 * read from the object itself (no call, no overflow check); 0 for every other object */
#if PY_VERSION_HEX < 0x030B0000
#include <longintrepr.h>
#endif
static inline int small_int(PyObject *o, long long *v) {
    if (!PyLong_CheckExact(o)) return 0;
#if PY_VERSION_HEX >= 0x030C0000
    if (!PyUnstable_Long_IsCompact((PyLongObject *)o)) return 0;
    *v = (long long)PyUnstable_Long_CompactValue((PyLongObject *)o);
#else
    Py_ssize_t size = Py_SIZE(o);
    if (size < -1 || size > 1) return 0;
    *v = size == 0 ? 0 : size * (long long)((PyLongObject *)o)->ob_digit[0];
#endif
    return 1;
}

/* The plain ints type (kind, width) holds, [*lo, *hi], as far as small_int's reach (unsigned
 * 64-bit: up to 2**63 - 1) */
static inline void int_range(int kind, int width, long long *lo, long long *hi) {
    if (kind == 'i') {
        *lo = width == 8 ? INT64_MIN : -(1LL << (8 * width - 1));
        *hi = width == 8 ? INT64_MAX : (1LL << (8 * width - 1)) - 1;
    } else {
        *lo = 0;
        *hi = width == 8 ? INT64_MAX : (1LL << (8 * width)) - 1;
    }
}

/* int_in for every int small_int does not read */
static inline int int_in_slow(PyObject *o, int kind, int width, uint64_t *out) {
    int overflow;
    if (!PyLong_Check(o)) return 0;
    if (kind == 'i') {
        long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
        if (overflow || (v == -1 && PyErr_Occurred()) ||
            (width < 8 && (v < -(1LL << (8 * width - 1)) || v >= (1LL << (8 * width - 1))))) {
            PyErr_Clear();
            return 0;
        }
        *out = (uint64_t)v;
        return 1;
    }
    unsigned long long u = PyLong_AsUnsignedLongLong(o);
    if (u == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    if (width < 8 && u >= (1ULL << (8 * width))) return 0;
    *out = u;
    return 1;
}

/* *out: o, a plain int that type (kind, width) holds; 0 when it is not one */
static inline int int_in(PyObject *o, int kind, int width, uint64_t *out) {
    long long v, lo, hi;
    if (!small_int(o, &v)) return int_in_slow(o, kind, width, out);
    int_range(kind, width, &lo, &hi);
    if (v < lo || v > hi) return 0;
    *out = (uint64_t)v;
    return 1;
}

/* The element type of a view: 'i' signed or 'u' unsigned integer of width 1, 2, 4 or 8, else 0 */
static inline int int_kind(const struct fast_view *b) {
    const char *f = b->format;
    int w = (int)b->itemsize;
    if (f[0] == '\0' || f[1] != '\0' || (w != 1 && w != 2 && w != 4 && w != 8)) return 0;
    switch (f[0]) {
    case 'b': case 'h': case 'i': case 'l': case 'q': return 'i';
    case 'B': case 'H': case 'I': case 'L': case 'Q': return 'u';
    default: return 0;
    }
}

#endif
