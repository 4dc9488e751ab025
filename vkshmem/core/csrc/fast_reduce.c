/* vkshmem.core._fast: the reduction operators of the all-reduce, as numpy's ufuncs compute
 * them elementwise (integers wrap; min/max propagate a NaN as np.minimum/np.maximum do). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3")  /* vectorised loops (with run-time alias checks), as numpy's */
#endif
#include "fast.h"

#include <math.h>
#include <string.h>

#define INT_LOOP(T, U)                                                                     \
    do {                                                                                   \
        T *d = dst;                                                                        \
        const T *x = a, *y = b;                                                            \
        switch (op) {                                                                      \
        case R_SUM: for (i = 0; i < n; i++) d[i] = (T)((U)x[i] + (U)y[i]); break;          \
        case R_PROD: for (i = 0; i < n; i++) d[i] = (T)((U)x[i] * (U)y[i]); break;         \
        case R_MIN: for (i = 0; i < n; i++) d[i] = x[i] <= y[i] ? x[i] : y[i]; break;      \
        case R_MAX: for (i = 0; i < n; i++) d[i] = x[i] >= y[i] ? x[i] : y[i]; break;      \
        case R_AND: for (i = 0; i < n; i++) d[i] = x[i] & y[i]; break;                     \
        case R_OR: for (i = 0; i < n; i++) d[i] = x[i] | y[i]; break;                      \
        case R_XOR: for (i = 0; i < n; i++) d[i] = x[i] ^ y[i]; break;                     \
        }                                                                                  \
    } while (0)

#define FLOAT_LOOP(T)                                                                      \
    do {                                                                                   \
        T *d = dst;                                                                        \
        const T *x = a, *y = b;                                                            \
        switch (op) {                                                                      \
        case R_SUM: for (i = 0; i < n; i++) d[i] = x[i] + y[i]; break;                     \
        case R_PROD: for (i = 0; i < n; i++) d[i] = x[i] * y[i]; break;                    \
        case R_MIN:                                                                        \
            for (i = 0; i < n; i++) d[i] = (x[i] <= y[i] || isnan(x[i])) ? x[i] : y[i];    \
            break;                                                                         \
        case R_MAX:                                                                        \
            for (i = 0; i < n; i++) d[i] = (x[i] >= y[i] || isnan(x[i])) ? x[i] : y[i];    \
            break;                                                                         \
        }                                                                                  \
    } while (0)

/* One-letter native formats this file computes: integers, then the floats. */
static const char INTS[] = "bBhHiIlLqQ";
static const char FLOATS[] = "fd";

int fast_reduce_supported(const char *fmt, int op) {
    if (fmt == NULL || fmt[0] == '\0' || fmt[1] != '\0' || op < R_SUM || op > R_XOR) return 0;
    if (strchr(INTS, fmt[0]) != NULL) return 1;
    return strchr(FLOATS, fmt[0]) != NULL && op <= R_MAX;
}

void fast_reduce_apply(const char *fmt, int op, void *dst, const void *a, const void *b,
                       Py_ssize_t n) {
    Py_ssize_t i;
    switch (fmt[0]) {
    case 'b': INT_LOOP(int8_t, uint32_t); break;
    case 'B': INT_LOOP(uint8_t, uint32_t); break;
    case 'h': INT_LOOP(int16_t, uint32_t); break;
    case 'H': INT_LOOP(uint16_t, uint32_t); break;
    case 'i': INT_LOOP(int32_t, uint32_t); break;
    case 'I': INT_LOOP(uint32_t, uint32_t); break;
    case 'l': INT_LOOP(long, unsigned long); break;
    case 'L': INT_LOOP(unsigned long, unsigned long); break;
    case 'q': INT_LOOP(long long, unsigned long long); break;
    case 'Q': INT_LOOP(unsigned long long, unsigned long long); break;
    case 'f': FLOAT_LOOP(float); break;
    case 'd': FLOAT_LOOP(double); break;
    }
}
