/* vkshmem.core._fast: teams whose members all take the shm path (NativeTeam), their barrier
 * and the small broadcasts and all-reduces, on the team slot of the internal segment.
 *
 * The protocols are those of vkshmem.core.teams (dissemination barrier) and
 * vkshmem.core.collectives.host (push broadcast down the binomial tree; one-phase butterfly
 * all-reduce with the fold for non-powers of two), flag for flag and byte for byte, and the
 * counts they expect (and the phase) are the ones the Python side reads through this object's
 * buffer: a member running the Python algorithm meets one running this one.
 */
#include "fast.h"

#include <string.h>

#define BCAST_CHUNK (256 << 10)  /* collectives/host.py: larger broadcasts are pulled in chunks */


int team_valid(NativeTeam *t) { return t != NULL && G.enabled && t->generation == G.generation; }

void team_signal(NativeTeam *t, int m, int flag) {
    /* a sequentially consistent RMW: the stores before it are visible first */
    vk_amo_impl(team_internal(t, m) + t->base + VK_OFF_FLAGS + 8 * (uint64_t)flag, VK_ADD, 8, 1, 0);
}

struct wait_ctx { NativeTeam *t; const char *what; int flag, from; };

/* The member whose signals on `flag` this member waits for (vkshmem/core/collectives/team.py:
 * CollTeam.waited_for), or -1: every member (alltoall) or not a collective's flag. */
static int flag_sender(NativeTeam *t, int flag) {
    int n = t->n, me = t->me, m;
    if (flag >= F_BCAST && flag < F_BRUCK) m = me - (1 << (flag - F_BCAST));
    else if (flag >= F_BRUCK && flag < F_RD) m = me + (1 << (flag - F_BRUCK));
    else if (flag >= F_RD && flag < F_FOLD) {
        m = me;
        for (int i = 0; i < t->nsteps; i++)
            if (t->step_flag[i] == flag) m = t->step_partner[i];
    } else if (flag == F_FOLD || flag == F_RING_RS || flag == F_RING_AG) m = me - 1;
    else if (flag == F_FOLD_BACK) m = me + 1;
    else if (flag >= F_BCAST_DONE && flag < F_BCAST_DONE + 32)
        m = me + (1 << (flag - F_BCAST_DONE));
    else return -1;
    return ((m % n) + n) % n;
}

static PyObject *what_signal(const void *p) {
    const struct wait_ctx *c = p;
    if (c->flag < 0)
        return PyUnicode_FromFormat("team barrier round %d (waiting for PE %d)", c->from,
                                    c->t->pes[(c->t->me - (1 << c->from) + c->t->n * 2) %
                                              c->t->n]);
    int m = flag_sender(c->t, c->flag);
    if (m < 0)
        return PyUnicode_FromFormat("%s (waiting for every PE of the team; signal %d of team "
                                    "slot %d)", c->what, c->flag, c->t->slot);
    return PyUnicode_FromFormat("%s (waiting for PE %d; signal %d of team slot %d)", c->what,
                                c->t->pes[m], c->flag, c->t->slot);
}

/* The Waiter of barriers and collectives (Waiter.for_collectives: VKSHMEM_COLLECTIVE_TIMEOUT
 * too) of the runtime of generation coll_generation; given with each NativeTeam. */
static PyObject *coll_waiter;
static uint64_t coll_generation;

void team_set_waiter(PyObject *waiter) {
    Py_XSETREF(coll_waiter, Py_NewRef(waiter));
    coll_generation = G.generation;
}

/* A wait of a barrier or collective: fast_wait with the collective Waiter in G.waiter (read
 * for the timeout and the errors once the wait outlasts its first microseconds; a wait_until
 * of another thread that starts meanwhile gets that bound as well). Swapped with the GIL
 * held, and put back only if still there: waits of several threads interleave, and a
 * finalize during the wait (clear_config) leaves G.waiter alone. */
static int coll_wait(struct fast_pred *p, struct wait_ctx *c) {
    if (fast_pred_true(p)) return 0;
    PyObject *cw = coll_waiter, *plain = G.waiter;
    if (cw == NULL || plain == NULL || coll_generation != G.generation)
        return fast_wait(p, what_signal, c);
    G.waiter = Py_NewRef(cw);  /* G.waiter's reference to plain is now this wait's */
    int rc = fast_wait(p, what_signal, c);
    if (G.waiter == cw) {
        G.waiter = plain;
        Py_DECREF(cw);
    } else {
        Py_DECREF(plain);
    }
    return rc;
}

/* CollTeam.wait: `count` more signals on this PE's counter `flag`. */
int team_wait(NativeTeam *t, int flag, uint64_t count, const char *what) {
    struct wait_ctx c = {t, what, flag, 0};
    struct fast_pred p = {(const void *)(t->internal + t->base + VK_OFF_FLAGS + 8 * flag), 8,
                          'u', 6, t->ctr[flag] += count};
    return coll_wait(&p, &c);
}

/* +1 on barrier counter k of member m: a store where it is mapped, else through the C data
 * path of its transport (the GIL released); 0, or -1 with the transport's error */
static int barrier_add(NativeTeam *t, int m, int k) {
    uint64_t off = t->base + 8 * (uint64_t)k, u;
    uintptr_t at = team_internal(t, m);
    if (at) {
        vk_amo_impl(at + off, VK_ADD, 8, 1, 0);
        return 0;
    }
    struct vk_native_ops *o = t->ops[m];
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = o->amo(o->self, (int32_t)t->pes[m], VK_INTERNAL_SEG, off, VK_ADD, 8, 1, 0, 0, &u);
    Py_END_ALLOW_THREADS
    if (rc) fast_native_error(t->pes[m], rc, "AMO on", off, 8, Py_None);
    return rc ? -1 : 0;
}

int team_sync(NativeTeam *t) {
    int n = t->n;
    if (n == 1) return 0;
    uint64_t epoch = ++t->ctr[VK_CTR_EPOCH];
    for (int dist = 1, k = 0; dist < n; dist <<= 1, k++) {
        int to = (t->me + dist) % n;
        if (barrier_add(t, to, k) < 0) return -1;
        struct wait_ctx c = {t, NULL, -1, k};
        struct fast_pred p = {(const void *)(t->internal + t->base + 8 * (uint64_t)k), 8, 'u',
                              6, epoch};
        if (coll_wait(&p, &c) < 0) return -1;
    }
    return 0;
}

/* -- broadcast (binomial tree: small data pushed, large data pulled in chunks) ---------------- */

struct tree { int v, bits, nk, kids[32], flags[32]; };

/* collectives/host.py: _tree(): the children of relative rank v are v + 2**k for 2**k > v */
static int tree_of(NativeTeam *t, int root, int seg, struct tree *tr) {
    int n = t->n, v = (t->me - root + n) % n;
    tr->v = v;
    tr->bits = 0;
    tr->nk = 0;
    while ((v >> tr->bits) != 0) tr->bits++;
    for (int k = tr->bits; v + (1 << k) < n; k++) {
        tr->kids[tr->nk] = (t->me + (1 << k)) % n;
        tr->flags[tr->nk++] = F_BCAST + k;
    }
    for (int i = 0; i < tr->nk; i++)  /* every member this PE writes is mapped here */
        if (!fast_peer(seg, t->pes[tr->kids[i]]) || !team_internal(t, tr->kids[i])) return 0;
    return v == 0 || (fast_peer(seg, t->pes[(t->me - (1 << (tr->bits - 1)) + n) % n]) &&
                      team_internal(t, (t->me - (1 << (tr->bits - 1)) + n) % n));
}

#include "copy_stream.h"

static void copy_nogil(void *dst, const void *src, Py_ssize_t n, int stream) {
    Py_BEGIN_ALLOW_THREADS
    if (stream) copy_stream(dst, src, (size_t)n);
    else memmove(dst, src, (size_t)n);
    Py_END_ALLOW_THREADS
}

/* collectives/host.py: _broadcast_pull(). The caller holds exports of tgt and src. */
static int bcast_pull(NativeTeam *t, char *tgt, const char *src, Py_ssize_t nb,
                      Py_ssize_t isz, int seg, uint64_t off, struct tree *tr) {
    Py_ssize_t chunk = BCAST_CHUNK / isz > 0 ? BCAST_CHUNK / isz * isz : isz;
    char *tmp = NULL;
    int r = 1;
    if (tr->v == 0) {
        if (src != tgt && src < tgt + nb && tgt < src + nb) {  /* a partial overlap */
            if ((tmp = PyMem_Malloc((size_t)nb)) == NULL) {
                PyErr_NoMemory();
                return -1;
            }
            memcpy(tmp, src, (size_t)nb);
            src = tmp;
        }
        for (Py_ssize_t lo = 0; lo < nb; lo += chunk) {
            Py_ssize_t len = nb - lo < chunk ? nb - lo : chunk;
            if (src != tgt) copy_nogil(tgt + lo, src + lo, len, 1);
            for (int i = 0; i < tr->nk; i++) team_signal(t, tr->kids[i], tr->flags[i]);
        }
        PyMem_Free(tmp);
    } else {
        int k_in = tr->bits - 1, parent = (t->me - (1 << k_in) + t->n) % t->n;
        const char *from = (const char *)fast_peer(seg, t->pes[parent]) + off;
        for (Py_ssize_t lo = 0; lo < nb; lo += chunk) {
            Py_ssize_t len = nb - lo < chunk ? nb - lo : chunk;
            if (team_wait(t, F_BCAST + k_in, 1, "broadcast") < 0) return -1;
            copy_nogil(tgt + lo, from + lo, len, 0);
            for (int i = 0; i < tr->nk; i++) team_signal(t, tr->kids[i], tr->flags[i]);
        }
        team_signal(t, parent, F_BCAST_DONE + k_in);
    }
    for (int i = 0; i < tr->nk && r > 0; i++)  /* the children have read this target */
        if (team_wait(t, F_BCAST_DONE + tr->flags[i] - F_BCAST, 1, "broadcast") < 0) r = -1;
    return r;
}

/* 1 done, 0 not handled (a member's memory is not mapped here), -1 error. */
static int bcast(NativeTeam *t, char *tgt, const char *src, Py_ssize_t nb, int root, int seg,
                 uint64_t off) {
    struct tree tr;
    if (!tree_of(t, root, seg, &tr)) return 0;
    int nk = tr.nk, *kids = tr.kids, *flags = tr.flags, bits = tr.bits;
    if (tr.v == 0) {
        for (int i = nk - 1; i >= 0; i--) {  /* largest subtree first */
            memcpy((char *)fast_peer(seg, t->pes[kids[i]]) + off, src, (size_t)nb);
            team_signal(t, kids[i], flags[i]);
        }
        if (tgt != src) memmove(tgt, src, (size_t)nb);
        return 1;
    }
    if (team_wait(t, F_BCAST + bits - 1, 1, "broadcast") < 0) return -1;
    for (int i = nk - 1; i >= 0; i--) {
        memcpy((char *)fast_peer(seg, t->pes[kids[i]]) + off, tgt, (size_t)nb);
        team_signal(t, kids[i], flags[i]);
    }
    return 1;
}

/* -- all-reduce (one phase of the butterfly) ------------------------------------------------- */

static void put_internal(NativeTeam *t, int m, uint64_t off, const void *src, Py_ssize_t nb) {
    memcpy((char *)team_internal(t, m) + off, src, (size_t)nb);
}

int team_reduce_rd(NativeTeam *t, char *tgt, const char *src, Py_ssize_t cnt,
                     const char *fmt, int op, Py_ssize_t nb, int seg, uint64_t off) {
    int me = t->me, role = t->role;
    if ((role == 2 && !team_internal(t, me + 1)) ||
        (role == 1 && (!team_internal(t, me - 1) || !fast_peer(seg, t->pes[me - 1]))))
        return 0;
    for (int i = 0; i < t->nsteps; i++)
        if (!team_internal(t, t->step_partner[i])) return 0;
    uint64_t p = t->ctr[VK_CTR_PHASE]++;
    uint64_t rel = (p & 1) * t->half, sbase = t->scratch_off + rel;
    const char *scratch = (const char *)(t->internal + t->scratch_off + rel);
    if (role == 2) {  /* folded out: the odd neighbour reduces for both */
        put_internal(t, me + 1, sbase, src, nb);
        team_signal(t, me + 1, F_FOLD);
        return team_wait(t, F_FOLD_BACK, 1, "reduce") < 0 ? -1 : 1;
    }
    uint64_t rb = ((uint64_t)nb + VK_ALIGN - 1) / VK_ALIGN * VK_ALIGN;
    const char *acc = src;
    if (role == 1) {
        if (team_wait(t, F_FOLD, 1, "reduce") < 0) return -1;
        fast_reduce_apply(fmt, op, tgt, src, scratch, cnt);
        acc = tgt;
    }
    for (int i = 0; i < t->nsteps; i++) {
        uint64_t region = (uint64_t)t->step_region[i] * rb;
        put_internal(t, t->step_partner[i], sbase + region, acc, nb);
        team_signal(t, t->step_partner[i], t->step_flag[i]);
        if (team_wait(t, t->step_flag[i], 1, "reduce") < 0) return -1;
        fast_reduce_apply(fmt, op, tgt, acc, scratch + region, cnt);
        acc = tgt;
    }
    if (role == 1) {  /* the folded-out neighbour's result goes straight into its target */
        memcpy((char *)fast_peer(seg, t->pes[me - 1]) + off, tgt, (size_t)nb);
        team_signal(t, me - 1, F_FOLD_BACK);
    }
    return 1;
}

/* -- fcollect (dissemination allgather, Bruck) ---------------------------------------------- */

/* collectives/host.py: fcollect(): in round r this PE puts the blocks it holds (up to 2**r, from
 * its own) straight into the target of PE me - 2**r, at their final places. */
static int bruck(NativeTeam *t, char *tgt, const char *src, Py_ssize_t bb, int seg,
                 uint64_t off) {
    int n = t->n, me = t->me;
    char *own = tgt + (Py_ssize_t)me * bb;
    for (int d = 1; d < n; d <<= 1) {
        int dest = (me - d + n) % n;
        if (!fast_peer(seg, t->pes[dest]) || !team_internal(t, dest)) return 0;
    }
    for (int d = 1, r = 0; d < n; d <<= 1, r++) {
        int dest = (me - d + n) % n, c = d < n - d ? d : n - d;
        char *to = (char *)fast_peer(seg, t->pes[dest]) + off;
        if (me + c <= n) {
            memcpy(to + (Py_ssize_t)me * bb, c == 1 ? src : own, (size_t)(c * bb));
        } else {  /* wraps around: two pieces */
            memcpy(to + (Py_ssize_t)me * bb, own, (size_t)((n - me) * bb));
            memcpy(to, tgt, (size_t)((me + c - n) * bb));
        }
        team_signal(t, dest, F_BRUCK + r);
        if (r == 0 && own != src) memmove(own, src, (size_t)bb);  /* while it travels */
        if (team_wait(t, F_BRUCK + r, 1, "fcollect") < 0) return -1;
    }
    if (n == 1 && own != src) memmove(own, src, (size_t)bb);
    return 1;
}

int team_fcollect(NativeTeam *t, struct fast_view *tb, struct fast_view *sb, Py_ssize_t bb) {
    Py_ssize_t total = bb * (t != NULL ? t->n : 0);
    const char *tp = tb->buf, *sp = sb->buf, *own;
    if (!team_valid(t) || total > tb->len) return 0;
    if (bb == 0) return 1;
    own = tp + (Py_ssize_t)t->me * bb;
    if (sp != own && sp < tp + total && tp < sp + bb) return 0;  /* refused by Python */
    int64_t r = vk_locate_in(G.table, tp, (uint64_t)total);
    if (r < 0) return 0;
    return bruck(t, tb->buf, sp, bb, (int)(r >> 48), (uint64_t)(r & VK_OFF_MASK));
}

/* -- shared by the entry points and the NativeTeam methods ------------------------------------ */

/* 1 done, 0 not handled, -1 error: broadcast of validated, contiguous buffers. */
int team_broadcast(NativeTeam *t, struct fast_view *tb, struct fast_view *sb, Py_ssize_t nb,
                   int root) {
    struct tree tr;
    if (!team_valid(t) || root < 0 || root >= t->n) return 0;
    int64_t r = vk_locate_in(G.table, tb->buf, (uint64_t)nb);
    if (r < 0) return 0;
    if (nb == 0) return 1;
    int seg = (int)(r >> 48);
    uint64_t off = (uint64_t)(r & VK_OFF_MASK);
    if (nb <= BCAST_CHUNK) return bcast(t, tb->buf, sb->buf, nb, root, seg, off);
    if (!tree_of(t, root, seg, &tr) || fast_hold(tb) < 0 || fast_hold(sb) < 0) return 0;
    return bcast_pull(t, tb->buf, sb->buf, nb, tb->itemsize, seg, off, &tr);
}

int team_reduce(NativeTeam *t, struct fast_view *tb, struct fast_view *sb, Py_ssize_t nb,
                int op) {
    const char *tp = tb->buf, *sp = sb->buf;
    if (!team_valid(t) || !fast_reduce_supported(tb->format, op)) return 0;
    if (t->n > 1 && nb > t->rd_fast) return team_reduce_large(t, tb, sb, nb, op);
    if (tp != sp && tp < sp + nb && sp < tp + nb)
        return 0;  /* another type, or a partial overlap: the Python algorithm */
    int64_t r = vk_locate_in(G.table, tb->buf, (uint64_t)nb);
    if (r < 0) return 0;
    if (nb == 0) return 1;
    if (t->n == 1) {
        if (tp != sp) memmove(tb->buf, sb->buf, (size_t)nb);
        return 1;
    }
    return team_reduce_rd(t, tb->buf, sp, nb / tb->itemsize, tb->format, op, nb, (int)(r >> 48),
                     (uint64_t)(r & VK_OFF_MASK));
}

/* Buffers of a collective: writable target, source of its type, the bytes to move. */
int fast_coll_buffers(PyObject **a, struct fast_view *t, struct fast_view *s,
                        Py_ssize_t *nb) {
    if (Py_TYPE(a[P_TARGET]) != G.ndarray || Py_TYPE(a[P_SOURCE]) != G.ndarray ||
        fast_view(a[P_TARGET], t, 1) < 0)
        return 0;
    if (fast_view(a[P_SOURCE], s, 0) < 0) {
        fast_release(t);
        return 0;
    }
    if (fast_same_format(t, s) && fast_count(a[P_SIZE], t, s, nb)) return 1;
    fast_release(s);
    fast_release(t);
    return 0;
}

int fast_finish(int r, PyObject **out) {
    if (r == 0) return 0;
    *out = r < 0 ? NULL : Py_NewRef(Py_None);
    return 1;
}

/* barrier_all is quiet + sync + the open memory domains' error checks: native while quiet is
 * a fence and no domain is open (op 1; op 0: sync_all) */
static int barrier_native(void) {
    if (!G.quiet_fence && G.nquiet < 0) return 0;
    return !fast_domains_open();
}

int fast_barrier(FastCall *self, PyObject **a, PyObject **out) {
    if (!team_valid(G.world) || (self->op && !barrier_native())) return 0;
    if (self->op) {  /* barrier_all: quiet first */
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        int r = G.quiet_fence ? 1 : fast_transports_quiet(0);
        if (r <= 0) return r < 0 ? fast_finish(-1, out) : 0;
    }
    return fast_finish(team_sync(G.world) < 0 ? -1 : 1, out);
}

int fast_sync(FastCall *self, PyObject **a, PyObject **out) {
    if (!fast_none(a[P_TEAM]) || !team_valid(G.world)) return 0;
    return fast_finish(team_sync(G.world) < 0 ? -1 : 1, out);
}

int fast_broadcast(FastCall *self, PyObject **a, PyObject **out) {
    struct fast_view t, s;
    Py_ssize_t nb;
    long root;
    if (!fast_none(a[P_TEAM]) || !team_valid(G.world) || !fast_long(a[P_ROOT], &root) ||
        !fast_coll_buffers(a, &t, &s, &nb))
        return 0;
    int r = team_broadcast(G.world, &t, &s, nb, (int)root);
    fast_release(&s);
    fast_release(&t);
    return fast_finish(r, out);
}

int fast_reduce(FastCall *self, PyObject **a, PyObject **out) {
    struct fast_view t, s;
    Py_ssize_t nb;
    int op = self->op;
    if (!fast_none(a[P_TEAM]) || !team_valid(G.world)) return 0;
    if (self->opmap != NULL && a[P_OP] != NULL) {
        PyObject *code = PyDict_GetItemWithError(self->opmap, a[P_OP]);
        if (code == NULL) {
            PyErr_Clear();
            return 0;
        }
        op = (int)PyLong_AsLong(code);
    }
    if (!fast_coll_buffers(a, &t, &s, &nb)) return 0;
    int r = team_reduce(G.world, &t, &s, nb, op);
    fast_release(&s);
    fast_release(&t);
    return fast_finish(r, out);
}

int fast_world_views(PyObject **a, struct fast_view *t, struct fast_view *s, long *cnt) {
    *cnt = -1;
    if (!fast_none(a[P_TEAM]) || !team_valid(G.world) || Py_TYPE(a[P_TARGET]) != G.ndarray ||
        Py_TYPE(a[P_SOURCE]) != G.ndarray || fast_view(a[P_TARGET], t, 1) < 0)
        return 0;
    if (fast_view(a[P_SOURCE], s, 0) < 0) {
        fast_release(t);
        return 0;
    }
    if (fast_none(a[P_SIZE])) *cnt = (long)(s->len / s->itemsize);
    else if (!fast_long(a[P_SIZE], cnt) || *cnt < 0 || *cnt > s->len / s->itemsize) *cnt = -1;
    if (*cnt >= 0 && !fast_same_format(t, s)) *cnt = -1;
    return 1;
}

int fast_fcollect(FastCall *self, PyObject **a, PyObject **out) {
    struct fast_view t, s;
    long cnt;
    int r = 0;
    if (!fast_world_views(a, &t, &s, &cnt)) return 0;
    if (cnt >= 0) r = team_fcollect(G.world, &t, &s, (Py_ssize_t)cnt * s.itemsize);
    fast_release(&s);
    fast_release(&t);
    return fast_finish(r, out);
}
