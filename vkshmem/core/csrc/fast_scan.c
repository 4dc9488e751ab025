/* vkshmem.core._fast: sum_inscan / sum_exscan on TEAM_WORLD of shm peers, for the types
 * fast_reduce.c adds (collectives.py: scan(), _scan_phase()): the recursive-doubling scan
 * with the butterfly's fold, one phase per chunk of the scratch, region for region and flag
 * for flag the Python algorithm (regions: 0 fold, 1 fold back, 2 + r round r).
 */
#include "fast.h"

#include <string.h>

struct scan { NativeTeam *t; const char *fmt; Py_ssize_t isz; int inclusive; };

/* One phase over cnt elements: tgt = the prefix sum of x; tot and pre: room for cnt each. */
static int scan_phase(const struct scan *c, char *tgt, const char *x, Py_ssize_t cnt,
                      char *tot, char *pre) {
    NativeTeam *t = c->t;
    int me = t->me, have_pre = 0;
    size_t nb = (size_t)(cnt * c->isz);
    uint64_t rb = ((uint64_t)nb + VK_ALIGN - 1) / VK_ALIGN * VK_ALIGN;
    uint64_t sbase = t->scratch_off + team_phase(t, NULL);
    const char *scratch = (const char *)(t->internal + sbase), *xe = NULL;
    if (t->role == 2) {  /* folded out: the odd neighbour scans for both */
        memcpy((char *)team_internal(t, me + 1) + sbase, x, nb);
        team_signal(t, me + 1, F_FOLD);
        if (team_wait(t, F_FOLD_BACK, 1, "scan") < 0) return -1;
        if (c->inclusive) fast_reduce_apply(c->fmt, R_SUM, tgt, scratch + rb, x, cnt);
        else memcpy(tgt, scratch + rb, nb);
        return 1;
    }
    if (t->role == 1) {
        if (team_wait(t, F_FOLD, 1, "scan") < 0) return -1;
        xe = scratch;  /* the even neighbour's data: valid for this whole phase */
        fast_reduce_apply(c->fmt, R_SUM, tot, xe, x, cnt);
    } else {
        memcpy(tot, x, nb);
    }
    for (int i = 0; i < t->nsteps; i++) {
        int partner = t->step_partner[i];
        uint64_t region = (uint64_t)t->step_region[i] * rb;
        memcpy((char *)team_internal(t, partner) + sbase + region, tot, nb);
        team_signal(t, partner, t->step_flag[i]);
        if (team_wait(t, t->step_flag[i], 1, "scan") < 0) return -1;
        const char *other = scratch + region;
        if (partner < me) {  /* the partner's block comes first */
            if (have_pre) fast_reduce_apply(c->fmt, R_SUM, pre, other, pre, cnt);
            else memcpy(pre, other, nb);
            have_pre = 1;
        }
        fast_reduce_apply(c->fmt, R_SUM, tot, tot, other, cnt);
    }
    if (!have_pre) memset(pre, 0, nb);
    if (xe != NULL) {
        memcpy((char *)team_internal(t, me - 1) + sbase + rb, pre, nb);
        team_signal(t, me - 1, F_FOLD_BACK);
        fast_reduce_apply(c->fmt, R_SUM, pre, pre, xe, cnt);
    }
    if (c->inclusive) fast_reduce_apply(c->fmt, R_SUM, tgt, pre, x, cnt);
    else memcpy(tgt, pre, nb);
    return 1;
}

int team_scan(NativeTeam *t, struct fast_view *tb, const char *src, Py_ssize_t cnt,
              int inclusive) {
    struct scan c = {t, tb->format, tb->itemsize, inclusive};
    Py_ssize_t isz = tb->itemsize, nb = cnt * isz, per;
    char *tgt = tb->buf, *copy = NULL, *tmp, room[512];
    if (!team_valid(t) || !fast_reduce_supported(tb->format, R_SUM) || nb > tb->len ||
        vk_locate_in(G.table, tgt, (uint64_t)tb->len) < 0)
        return 0;
    per = (Py_ssize_t)(t->rd_bytes / (uint64_t)isz);
    if (nb == 0) return 1;
    if (t->n == 1) {
        if (inclusive) memmove(tgt, src, (size_t)nb);
        else memset(tgt, 0, (size_t)nb);
        return 1;
    }
    if (per == 0) return 0;  /* the scratch is too small: the Python path raises */
    if (t->role == 2 && !team_internal(t, t->me + 1)) return 0;
    if (t->role == 1 && !team_internal(t, t->me - 1)) return 0;
    for (int i = 0; i < t->nsteps; i++)
        if (!team_internal(t, t->step_partner[i])) return 0;
    Py_ssize_t chunk = cnt < per ? cnt : per;
    tmp = 2 * chunk * isz <= (Py_ssize_t)sizeof room ? room
                                                     : PyMem_Malloc((size_t)(2 * chunk * isz));
    if (src != tgt && src < tgt + nb && tgt < src + nb)  /* as numpy: as if src were copied */
        copy = PyMem_Malloc((size_t)nb);
    if (tmp == NULL || (copy == NULL && src != tgt && src < tgt + nb && tgt < src + nb)) {
        if (tmp != room) PyMem_Free(tmp);
        PyErr_NoMemory();
        return -1;
    }
    if (copy != NULL) src = memcpy(copy, src, (size_t)nb);
    int r = 1;
    for (Py_ssize_t e0 = 0; r > 0 && e0 < cnt; e0 += per) {
        Py_ssize_t m = cnt - e0 < per ? cnt - e0 : per;
        r = scan_phase(&c, tgt + e0 * isz, src + e0 * isz, m, tmp, tmp + chunk * isz);
    }
    if (tmp != room) PyMem_Free(tmp);
    PyMem_Free(copy);
    return r;
}

/* sum_inscan / sum_exscan(target, source, size, team); self->op: inclusive */
int fast_scan(FastCall *self, PyObject **a, PyObject **out) {
    struct fast_view t, s;
    Py_ssize_t nb;
    int r = 0;
    if (!fast_none(a[P_TEAM]) || !team_valid(G.world) || !fast_coll_buffers(a, &t, &s, &nb))
        return 0;
    r = team_scan(G.world, &t, s.buf, nb / t.itemsize, self->op);
    fast_release(&s);
    fast_release(&t);
    return fast_finish(r, out);
}
