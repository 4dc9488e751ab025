/* vkshmem.core._fast: all-reduces larger than one butterfly phase (collectives.py: reduce()),
 * for the types fast_reduce.c computes. From RING_MIN_BYTES, when every member's block gets
 * an element: the ring (reduce-scatter through the scratch, one region per step, then the
 * allgather straight into the targets), one phase per chunk of n blocks; below it, the
 * butterfly of fast_team.c in chunks of one phase. Flag for flag, region for region and
 * chunk for chunk the Python algorithms (_reduce_ring, _reduce_rd), so a member running those
 * meets one running these; every chunk runs here, with no Python in between.
 */
#include "fast.h"

#include <string.h>

#define PIECE (16 << 10)  /* bytes reduced, then sent on, at a time */

static Py_ssize_t min_ss(Py_ssize_t a, Py_ssize_t b) { return a < b ? a : b; }

/* collectives.py: _reduce_ring(). 1 done, -1 error. */
static int ring(NativeTeam *t, char *tgt, const char *src, Py_ssize_t cnt, Py_ssize_t isz,
                const char *fmt, int op, Py_ssize_t per, uint64_t region, char *peer_tgt) {
    int n = t->n, me = t->me, right = (me + 1) % n;
    char *right_internal = (char *)team_internal(t, right);
    Py_ssize_t *bl = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(n + 1));
    char *tmp = PyMem_Malloc((size_t)((min_ss(cnt, per) / n + 1) * isz));
    int r = 1;
    if (bl == NULL || tmp == NULL) {
        PyErr_NoMemory();
        r = -1;
    }
    for (Py_ssize_t e0 = 0; r > 0 && e0 < cnt; e0 += per) {
        Py_ssize_t m = min_ss(per, cnt - e0);
        for (int i = 0; i <= n; i++) bl[i] = e0 + (i * m) / n;  /* block i: bl[i]:bl[i + 1] */
        uint64_t sbase = t->scratch_off + team_phase(t, NULL);
        const char *scratch = (const char *)(t->internal + sbase);
        memcpy(right_internal + sbase, src + bl[me] * isz, (size_t)((bl[me + 1] - bl[me]) * isz));
        team_signal(t, right, F_RING_RS);
        for (int s = 0; s < n - 1; s++) {
            int b = ((me - 1 - s) % n + n) % n;
            Py_ssize_t lo = bl[b], len = bl[b + 1] - bl[b];
            if (team_wait(t, F_RING_RS, 1, "reduce") < 0) {
                r = -1;
                break;
            }
            const char *got = scratch + (uint64_t)s * region;
            if (s < n - 2) {
                fast_reduce_apply(fmt, op, tmp, got, src + lo * isz, len);
                memcpy(right_internal + sbase + (uint64_t)(s + 1) * region, tmp,
                       (size_t)(len * isz));
                team_signal(t, right, F_RING_RS);
            } else {  /* b == me + 1: this PE's block is complete, and the allgather's */
                /* first put (this block) goes out piece by piece while each is in cache */
                for (Py_ssize_t i = 0; i < len; i += PIECE / isz) {
                    Py_ssize_t k = min_ss(PIECE / isz, len - i), at = (lo + i) * isz;
                    fast_reduce_apply(fmt, op, tgt + at, got + i * isz, src + at, k);
                    memcpy(peer_tgt + at, tgt + at, (size_t)(k * isz));
                }
            }
        }
        for (int k = 0, b = (me + 1) % n; r > 0 && k < n - 1; k++, b = (b - 1 + n) % n) {
            Py_ssize_t lo = bl[b];
            if (k > 0)  /* k == 0: sent while reduced */
                memcpy(peer_tgt + lo * isz, tgt + lo * isz, (size_t)((bl[b + 1] - lo) * isz));
            team_signal(t, right, F_RING_AG);
            if (team_wait(t, F_RING_AG, 1, "reduce") < 0) r = -1;
        }
    }
    PyMem_Free(tmp);
    PyMem_Free(bl);
    return r;
}

int team_reduce_large(NativeTeam *t, struct fast_view *tb, struct fast_view *sb,
                      Py_ssize_t nb, int op) {
    Py_ssize_t isz = tb->itemsize, cnt = nb / isz, per;
    int n = t->n, right = (t->me + 1) % n, use_ring = nb >= VK_RING_MIN_BYTES && cnt >= n;
    uint64_t region = 0;
    char *tgt = tb->buf, *peer_tgt = NULL, *copy = NULL;
    const char *src = sb->buf;
    int64_t r = vk_locate_in(G.table, tgt, (uint64_t)nb);
    if (r < 0) return 0;
    int seg = (int)(r >> 48);
    uint64_t off = (uint64_t)(r & VK_OFF_MASK);
    if (use_ring) {
        region = (t->half / (uint64_t)(n - 1)) / VK_ALIGN * VK_ALIGN;  /* per step: one block */
        per = (Py_ssize_t)(region / (uint64_t)isz) * n;  /* elements per chunk (n blocks) */
        if (!team_internal(t, right) || !fast_peer(seg, t->pes[right])) return 0;
        peer_tgt = (char *)fast_peer(seg, t->pes[right]) + off;
    } else {
        per = (Py_ssize_t)(t->rd_bytes / (uint64_t)isz);
    }
    if (per == 0) return 0;  /* the scratch is too small: the Python path raises */
    if (src != tgt && src < tgt + nb && tgt < src + nb) {  /* chunk k's result must not */
        if ((copy = PyMem_Malloc((size_t)nb)) == NULL) {  /* overwrite chunk k+1's input */
            PyErr_NoMemory();
            return -1;
        }
        memcpy(copy, src, (size_t)nb);
        src = copy;
    }
    int done;
    if (use_ring) {
        done = ring(t, tgt, src, cnt, isz, tb->format, op, per, region, peer_tgt);
    } else {
        done = 1;
        for (Py_ssize_t e0 = 0; done > 0 && e0 < cnt; e0 += per) {
            Py_ssize_t m = min_ss(per, cnt - e0);
            /* 0 (a member not mapped here) can come only before the first phase */
            done = team_reduce_rd(t, tgt + e0 * isz, src + e0 * isz, m, tb->format, op,
                                  m * isz, seg, off + (uint64_t)(e0 * isz));
        }
    }
    PyMem_Free(copy);
    return done;
}
