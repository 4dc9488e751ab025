/* vkshmem.core._fast: strided put/get (iput/iget) of plain, contiguous numpy arrays to a PE
 * on the shm path: element i*sst of the source goes to element i*tst of the target, loads
 * and stores of the peer's mapping. Anything else (another route, a context, a bad stride or
 * size, an overlap of the two sides) is left to the Python implementation (rma.py).
 */
#include "fast.h"

#include <string.h>

void fast_strided_copy(char *dst, Py_ssize_t tst, const char *src, Py_ssize_t sst,
                       Py_ssize_t n, Py_ssize_t isz) {
    Py_ssize_t ts = tst * isz, ss = sst * isz;
    if (tst == 1 && sst == 1) {
        memcpy(dst, src, (size_t)(n * isz));
        return;
    }
    switch (isz) {  /* constant sizes: the compiler turns each copy into one load and store */
    case 8: for (Py_ssize_t i = 0; i < n; i++) memcpy(dst + i * ts, src + i * ss, 8); break;
    case 4: for (Py_ssize_t i = 0; i < n; i++) memcpy(dst + i * ts, src + i * ss, 4); break;
    case 2: for (Py_ssize_t i = 0; i < n; i++) memcpy(dst + i * ts, src + i * ss, 2); break;
    case 1: for (Py_ssize_t i = 0; i < n; i++) dst[i * ts] = src[i * ss]; break;
    default:
        for (Py_ssize_t i = 0; i < n; i++) memcpy(dst + i * ts, src + i * ss, (size_t)isz);
    }
}

/* rma.py: _strided_count(): the elements to move, or -1 (left to Python) */
static Py_ssize_t strided_count(PyObject **a, const struct fast_view *t,
                                const struct fast_view *s, long tst, long sst) {
    Py_ssize_t tlen = (t->len / t->itemsize + tst - 1) / tst;
    Py_ssize_t slen = (s->len / s->itemsize + sst - 1) / sst;
    long n;
    if (fast_none(a[P_SIZE])) return tlen < slen ? tlen : slen;
    if (!fast_long(a[P_SIZE], &n) || n < 0 || n > tlen || n > slen) return -1;
    return n;
}

static int strided(PyObject **a, PyObject **out, int to_peer) {
    struct fast_view t, s;
    long pe, tst = 1, sst = 1;
    int done = 0;
    if (Py_TYPE(a[P_TARGET]) != G.ndarray || Py_TYPE(a[P_SOURCE]) != G.ndarray ||
        !fast_none(a[P_CTX]) || fast_route(a[P_PE], &pe) != ROUTE_DIRECT)
        return 0;
    if ((a[P_TST] != NULL && !fast_long(a[P_TST], &tst)) ||
        (a[P_SST] != NULL && !fast_long(a[P_SST], &sst)) || tst < 1 || sst < 1)
        return 0;
    if (fast_view(a[P_TARGET], &t, !to_peer) < 0) return 0;
    if (fast_view(a[P_SOURCE], &s, 0) < 0) {
        fast_release(&t);
        return 0;
    }
    Py_ssize_t n = fast_same_format(&t, &s) ? strided_count(a, &t, &s, tst, sst) : -1;
    if (n > 0) {
        Py_ssize_t isz = t.itemsize, tspan = ((n - 1) * tst + 1) * isz;
        Py_ssize_t sspan = ((n - 1) * sst + 1) * isz;
        uintptr_t peer = fast_remote(to_peer ? t.buf : s.buf, to_peer ? tspan : sspan, pe);
        char *dst = to_peer ? (char *)peer : t.buf;
        const char *src = to_peer ? s.buf : (const char *)peer;
        /* the same memory on both sides (pe is this PE): numpy's copy semantics, in Python */
        if (peer && !(dst < src + sspan && src < dst + tspan)) {
            fast_strided_copy(dst, tst, src, sst, n, isz);
            *out = Py_NewRef(Py_None);
            done = 1;
        }
    }
    fast_release(&s);
    fast_release(&t);
    return done;
}

/* iput(target, source, pe, tst, sst, size, ctx) */
int fast_iput(FastCall *self, PyObject **a, PyObject **out) { return strided(a, out, 1); }

/* iget(target, source, pe, tst, sst, size, ctx) */
int fast_iget(FastCall *self, PyObject **a, PyObject **out) { return strided(a, out, 0); }
