/* vkshmem.core._fast: alltoall(s) and collect on teams of shm peers (collectives.py:
 * alltoall(), alltoalls(), collect(), _bruck()). Same phases,
 * flags and places as the Python algorithms: a member running those meets one running these.
 * Whatever the Python layer refuses (overlaps, sizes that do not fit or split, strides < 1, a
 * scratch too small) is left to it, before anything moves.
 */
#include "fast.h"

#include <string.h>

/* collectives.py: alltoall(): block j (cnt elements at stride sst from element j*cnt*sst of
 * src) goes to block me of member j's target at (seg, off). */
static int a2a(NativeTeam *t, char *tgt, const char *src, Py_ssize_t cnt, Py_ssize_t sst,
               Py_ssize_t isz, int seg, uint64_t off) {
    int n = t->n, me = t->me, flag = 0;
    Py_ssize_t bb = cnt * isz, sblock = cnt * sst * isz;
    for (int j = 0; j < n; j++)
        if (!fast_peer(seg, t->pes[j]) || !team_internal(t, j)) return 0;
    if (n > 1) team_phase(t, &flag);
    for (int k = 1; k < n; k++) {
        int j = (me + k) % n;
        fast_strided_copy((char *)fast_peer(seg, t->pes[j]) + off + (uint64_t)(me * bb), 1,
                          src + j * sblock, sst, cnt, isz);
        team_signal(t, j, flag);
    }
    fast_strided_copy(tgt + me * bb, 1, src + me * sblock, sst, cnt, isz);
    return n > 1 && team_wait(t, flag, (uint64_t)(n - 1), "alltoall") < 0 ? -1 : 1;
}

/* collectives.py: alltoalls() with a target stride other than 1: element i of the block for
 * member j (src[(j*cnt + i)*sst]) lands in tgt[(me*cnt + i)*tst] of member j, through the
 * scratch (packed blocks, one slot per sender, unpacked by the receiver), one phase a chunk */
static int a2a_scratch(NativeTeam *t, char *tgt, const char *src, Py_ssize_t cnt,
                       Py_ssize_t tst, Py_ssize_t sst, Py_ssize_t isz) {
    int n = t->n, me = t->me, flag;
    uint64_t slot = (t->half / (uint64_t)n) / VK_ALIGN * VK_ALIGN;
    Py_ssize_t per = (Py_ssize_t)(slot / (uint64_t)isz);
    if (per == 0) return 0;  /* the scratch is too small: the Python path raises */
    for (int j = 0; j < n; j++)
        if (!team_internal(t, j)) return 0;
    for (Py_ssize_t e0 = 0; e0 < cnt; e0 += per) {
        Py_ssize_t m = cnt - e0 < per ? cnt - e0 : per;
        uint64_t at = t->scratch_off + team_phase(t, &flag) + (uint64_t)me * slot;
        for (int k = 1; k < n; k++) {
            int j = (me + k) % n;
            fast_strided_copy((char *)team_internal(t, j) + at, 1,
                              src + (j * cnt + e0) * sst * isz, sst, m, isz);
            team_signal(t, j, flag);
        }
        fast_strided_copy(tgt + (me * cnt + e0) * tst * isz, tst,
                          src + (me * cnt + e0) * sst * isz, sst, m, isz);
        if (team_wait(t, flag, (uint64_t)(n - 1), "alltoalls") < 0) return -1;
        const char *scratch = (const char *)(t->internal + at - (uint64_t)me * slot);
        for (int j = 0; j < n; j++)
            if (j != me)
                fast_strided_copy(tgt + (j * cnt + e0) * tst * isz, tst,
                                  scratch + (uint64_t)j * slot, 1, m, isz);
    }
    return 1;
}

int team_alltoall(NativeTeam *t, struct fast_view *tb, struct fast_view *sb, Py_ssize_t cnt,
                  Py_ssize_t tst, Py_ssize_t sst) {
    Py_ssize_t isz = tb->itemsize, tbytes = ((t->n * cnt - 1) * tst + 1) * isz;
    Py_ssize_t sbytes = ((t->n * cnt - 1) * sst + 1) * isz;
    int64_t loc = vk_locate_in(G.table, tb->buf, (uint64_t)tb->len);
    if (!team_valid(t) || loc < 0 || cnt < 0 || tst < 1 || sst < 1) return 0;
    if (cnt == 0) return 1;
    if (tbytes > tb->len || sbytes > sb->len ||
        (sb->buf < tb->buf + tbytes && tb->buf < sb->buf + sbytes))
        return 0;  /* refused by Python */
    if (tst != 1) return a2a_scratch(t, tb->buf, sb->buf, cnt, tst, sst, isz);
    return a2a(t, tb->buf, sb->buf, cnt, sst, isz, (int)(loc >> 48),
               (uint64_t)(loc & VK_OFF_MASK));
}

/* alltoall(target, source, size, team) and alltoalls(target, source, tst, sst, size, team)
 * (collectives.py: _a2a_count and the checks before the algorithm). */
int fast_alltoall(FastCall *self, PyObject **a, PyObject **out) {
    struct fast_view t, s;
    NativeTeam *w = G.world;
    long tst = 1, sst = 1, cnt;
    int r = 0;
    if (!fast_none(a[P_TEAM]) || !team_valid(w) || Py_TYPE(a[P_TARGET]) != G.ndarray ||
        Py_TYPE(a[P_SOURCE]) != G.ndarray)
        return 0;
    if ((a[P_TST] != NULL && !fast_long(a[P_TST], &tst)) ||
        (a[P_SST] != NULL && !fast_long(a[P_SST], &sst)) || tst < 1 || sst < 1)
        return 0;
    if (fast_view(a[P_TARGET], &t, 1) < 0) return 0;
    if (fast_view(a[P_SOURCE], &s, 0) < 0) {
        fast_release(&t);
        return 0;
    }
    Py_ssize_t isz = t.itemsize, tlen = (t.len / isz + tst - 1) / tst;
    Py_ssize_t slen = (s.len / isz + sst - 1) / sst;
    Py_ssize_t lim = tlen < slen ? tlen : slen;
    if (!fast_same_format(&t, &s)) goto done;
    if (fast_none(a[P_SIZE])) {
        if (lim % w->n) goto done;
        cnt = (long)(lim / w->n);
    } else if (!fast_long(a[P_SIZE], &cnt) || cnt < 0 || cnt * w->n > lim) {
        goto done;
    }
    r = team_alltoall(w, &t, &s, cnt, tst, sst);
done:
    fast_release(&s);
    fast_release(&t);
    return fast_finish(r, out);
}

/* -- collect ---------------------------------------------------------------------------- */

/* collectives.py: _bruck(): block i of `local` (this PE's copy of (seg, off)) is elements
 * bounds[i]:bounds[i + 1]; this PE's own block is in place. */
static int bruck_v(NativeTeam *t, int seg, uint64_t off, const char *local,
                   const Py_ssize_t *bounds, Py_ssize_t isz, const char *what) {
    int n = t->n, me = t->me;
    for (int d = 1, r = 0; d < n; d <<= 1, r++) {
        int c = d < n - d ? d : n - d, dest = (me - d + n) % n, last = me + c;
        char *to = (char *)fast_peer(seg, t->pes[dest]) + off;
        Py_ssize_t lo = bounds[me];
        if (last <= n) {
            memcpy(to + lo * isz, local + lo * isz, (size_t)((bounds[last] - lo) * isz));
        } else {  /* wraps around: two pieces */
            memcpy(to + lo * isz, local + lo * isz, (size_t)((bounds[n] - lo) * isz));
            memcpy(to, local, (size_t)(bounds[last - n] * isz));
        }
        team_signal(t, dest, F_BRUCK + r);
        if (team_wait(t, F_BRUCK + r, 1, what) < 0) return -1;
    }
    return 1;
}

/* The sizes' exchange has happened: the errors the Python path raises now, on every member
 * alike (total) or on this one (overlap). */
static int collect_errors(NativeTeam *t, const int64_t *counts, Py_ssize_t total,
                          Py_ssize_t tlen, int overlaps) {
    if (total > tlen) {
        PyObject *list = PyList_New(t->n);
        for (int i = 0; list != NULL && i < t->n; i++) {
            PyObject *c = PyLong_FromLongLong(counts[i]);
            if (c == NULL) Py_CLEAR(list);
            else PyList_SET_ITEM(list, i, c);
        }
        if (list == NULL) return -1;
        fast_invalid("collect: the %d PEs contribute %zd elements in all (per PE: %R), but "
                     "target holds %zd", t->n, total, list, tlen);
        Py_DECREF(list);
        return -1;
    }
    if (overlaps)
        return fast_invalid("collect: source overlaps target (only this PE's own block of the "
                            "target may be its source)");
    return 0;
}

int team_collect(NativeTeam *t, struct fast_view *tb, const char *src, Py_ssize_t cnt) {
    int64_t loc = vk_locate_in(G.table, tb->buf, (uint64_t)tb->len);
    if (!team_valid(t) || loc < 0 || cnt < 0 || cnt > tb->len / tb->itemsize) return 0;
    int n = t->n, me = t->me, r, seg = (int)(loc >> 48);
    uint64_t off = (uint64_t)(loc & VK_OFF_MASK);
    Py_ssize_t isz = tb->itemsize, tlen = tb->len / isz, sb = cnt * isz;
    Py_ssize_t bounds_small[65], *bounds = bounds_small;
    int64_t one = cnt;
    const int64_t *counts = &one;
    if (n > 1 && 8 * (uint64_t)n > t->half) return 0;  /* the Python path raises */
    for (int d = 1; d < n; d <<= 1) {
        int dest = (me - d + n) % n;
        if (!fast_peer(seg, t->pes[dest]) || !team_internal(t, dest)) return 0;
    }
    if (n >= 65 && (bounds = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(n + 1))) == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    if (n > 1) {  /* the sizes: a dissemination allgather through the scratch (one phase) */
        uint64_t rel = t->scratch_off + team_phase(t, NULL);
        int64_t *table = (int64_t *)(t->internal + rel);
        table[me] = cnt;
        for (int i = 0; i <= n; i++) bounds[i] = i;
        if (bruck_v(t, VK_INTERNAL_SEG, rel, (const char *)table, bounds, 8,
                    "collect sizes") < 0) {
            r = -1;
            goto done;
        }
        counts = table;
    }
    bounds[0] = 0;
    for (int i = 0; i < n; i++) bounds[i + 1] = bounds[i] + (Py_ssize_t)counts[i];
    const char *own = tb->buf + bounds[me] * isz;
    if (collect_errors(t, counts, bounds[n], tlen,
                       sb && src != own && src < tb->buf + tb->len && tb->buf < src + sb) < 0) {
        r = -1;
        goto done;
    }
    if (src != own) memmove(tb->buf + bounds[me] * isz, src, (size_t)sb);
    r = n > 1 ? bruck_v(t, seg, off, tb->buf, bounds, isz, "collect") : 1;
done:
    if (bounds != bounds_small) PyMem_Free(bounds);
    return r;
}

/* collect(target, source, size, team) */
int fast_collect(FastCall *self, PyObject **a, PyObject **out) {
    struct fast_view t, s;
    long cnt;
    int r = 0;
    if (!fast_world_views(a, &t, &s, &cnt)) return 0;
    if (cnt >= 0) r = team_collect(G.world, &t, s.buf, cnt);
    fast_release(&s);
    fast_release(&t);
    return fast_finish(r, out);
}
