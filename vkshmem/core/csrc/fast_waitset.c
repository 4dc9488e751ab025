/* vkshmem.core._fast: test_/wait_until_ all/any/some (+ _vector) on a plain integer array of
 * a symmetric heap; the waits are fast_wait's (fast_wait.c) on a predicate over the set. */
#include "fast.h"
#include "fast_int.h"

#include <string.h>

/* -- test_/wait_until_ all/any/some (+ _vector) ------------------------------------------------
 * On a plain C-contiguous numpy integer array of live symmetric memory, a CMP, a plain int
 * value (or, _vector, a list/tuple of plain ints or an array of the same type), status None or
 * a list/tuple of ints or an integer/bool array. Everything else, and every error, takes the
 * Python functions (sync.py), whose semantics these keep: status nonzero excludes, entries
 * past the n-th are ignored; an empty set (status excluding every variable) answers at once;
 * *_any rotate through the satisfied indices using sync.py's table `_rotation`, which the
 * Python path (_pick) reads and writes too. A wait is fast_wait on a predicate of kind 's',
 * whose addr is a struct set: the wake board's copies evaluate it as well, so only the
 * waiting call's own checks (owner) record what they found. */

#define SET_ALL 0
#define SET_ANY 1
#define SET_SOME 2
#define SET_VECTOR 4
#define SET_WAIT 8
#define SET_INLINE 64          /* variables whose buffers fit on the stack */
#define ROT_SLOTS 4096         /* sync.py: _ROT_SLOTS, _ROT_PROBE */
#define ROT_PROBE 8

struct set {
    const char *base;
    Py_ssize_t n;
    int width, kind, cmp, mode;
    uint64_t value;             /* against every variable, unless values */
    const uint64_t *values;     /* [n] one value per variable (NULL: value) */
    const uint8_t *active;      /* [n] status: 1 in the set (NULL: every one) */
    Py_ssize_t start;           /* any: look from here on, then from 0 */
    const struct fast_pred *owner;  /* checks of this predicate record: */
    Py_ssize_t chosen;          /* any: the index found */
    Py_ssize_t *hits, nhits;    /* some: the indices that hold, how many */
};

static inline uint64_t load_at(const char *base, int width, Py_ssize_t i) {
    switch (width) {
    case 1: return __atomic_load_n((const uint8_t *)base + i, __ATOMIC_SEQ_CST);
    case 2: return __atomic_load_n((const uint16_t *)base + i, __ATOMIC_SEQ_CST);
    case 4: return __atomic_load_n((const uint32_t *)base + i, __ATOMIC_SEQ_CST);
    default: return __atomic_load_n((const uint64_t *)base + i, __ATOMIC_SEQ_CST);
    }
}

/* The first i in [i, to) in the set whose comparison is `want` (0 or 1), else `to`: a loop
 * per element type and comparison. */
#define SET_LOOP(T, OP)                                                                    \
    for (; i < to; i++) {                                                                  \
        if (act != NULL && !act[i]) continue;                                              \
        T v = __atomic_load_n((const T *)s->base + i, __ATOMIC_SEQ_CST);                   \
        T w = vals != NULL ? (T)vals[i] : (T)s->value;                                     \
        if ((v OP w) == want) return i;                                                    \
    }                                                                                      \
    return to;
#define SET_FIND(T)                                                                        \
    switch (s->cmp) {                                                                      \
    case 1: SET_LOOP(T, ==)                                                                \
    case 2: SET_LOOP(T, !=)                                                                \
    case 3: SET_LOOP(T, >)                                                                 \
    case 4: SET_LOOP(T, <=)                                                                \
    case 5: SET_LOOP(T, <)                                                                 \
    default: SET_LOOP(T, >=)                                                               \
    }

static Py_ssize_t set_find(const struct set *s, Py_ssize_t i, Py_ssize_t to, int want) {
    const uint8_t *act = s->active;
    const uint64_t *vals = s->values;
    switch (s->width * (s->kind == 'i' ? -1 : 1)) {
    case -1: SET_FIND(int8_t)
    case 1: SET_FIND(uint8_t)
    case -2: SET_FIND(int16_t)
    case 2: SET_FIND(uint16_t)
    case -4: SET_FIND(int32_t)
    case 4: SET_FIND(uint32_t)
    case -8: SET_FIND(int64_t)
    default: SET_FIND(uint64_t)
    }
}

/* some: every i in the set whose comparison holds into s->hits (ascending); how many */
#define SET_COLLECT_LOOP(T, OP)                                                            \
    for (i = 0; i < n; i++) {                                                              \
        if (act != NULL && !act[i]) continue;                                              \
        T v = __atomic_load_n((const T *)s->base + i, __ATOMIC_SEQ_CST);                   \
        T w = vals != NULL ? (T)vals[i] : (T)s->value;                                     \
        hits[k] = i;                                                                       \
        k += (v OP w);                                                                     \
    }                                                                                      \
    return k;
#define SET_COLLECT(T)                                                                     \
    switch (s->cmp) {                                                                      \
    case 1: SET_COLLECT_LOOP(T, ==)                                                        \
    case 2: SET_COLLECT_LOOP(T, !=)                                                        \
    case 3: SET_COLLECT_LOOP(T, >)                                                         \
    case 4: SET_COLLECT_LOOP(T, <=)                                                        \
    case 5: SET_COLLECT_LOOP(T, <)                                                         \
    default: SET_COLLECT_LOOP(T, >=)                                                       \
    }

static Py_ssize_t set_collect(struct set *s) {
    const uint8_t *act = s->active;
    const uint64_t *vals = s->values;
    Py_ssize_t *hits = s->hits, i, k = 0, n = s->n;
    switch (s->width * (s->kind == 'i' ? -1 : 1)) {
    case -1: SET_COLLECT(int8_t)
    case 1: SET_COLLECT(uint8_t)
    case -2: SET_COLLECT(int16_t)
    case 2: SET_COLLECT(uint16_t)
    case -4: SET_COLLECT(int32_t)
    case 4: SET_COLLECT(uint32_t)
    case -8: SET_COLLECT(int64_t)
    default: SET_COLLECT(uint64_t)
    }
}

int fast_set_true(const struct fast_pred *p) {
    struct set *s = (struct set *)p->addr;
    Py_ssize_t i, n = s->n;
    switch (s->mode) {
    case SET_ALL:
        return set_find(s, 0, n, 0) == n;
    case SET_ANY:
        if ((i = set_find(s, s->start, n, 1)) == n && (i = set_find(s, 0, s->start, 1)) ==
            s->start)
            return 0;
        if (s->owner == p) s->chosen = i;
        return 1;
    default:
        if (s->owner != p) return set_find(s, 0, n, 1) < n;
        return (s->nhits = set_collect(s)) > 0;
    }
}

/* sync.py's rotation table (rows: address, length, index + 1), or NULL. Found once per
 * module dict of the fallback (sync.py binds `_rotation` once, at import). */
static uint64_t *rotation(FastCall *self) {
    static PyObject *name, *globals, *table;
    static uint64_t *rows;
    if (!PyFunction_Check(self->fallback)) return NULL;
    PyObject *g = PyFunction_GET_GLOBALS(self->fallback);
    if (g == globals) return rows;
    if (name == NULL && (name = PyUnicode_InternFromString("_rotation")) == NULL) {
        PyErr_Clear();
        return NULL;
    }
    PyObject *t = PyDict_GetItemWithError(g, name);
    struct fast_view v;
    if (t == NULL || Py_TYPE(t) != G.ndarray || fast_view(t, &v, 1) < 0) {
        PyErr_Clear();
        return NULL;
    }
    int ok = v.len == (ROT_SLOTS + ROT_PROBE) * 3 * 8 && v.itemsize == 8 &&
             ((uintptr_t)v.buf & 7) == 0;
    fast_release(&v);  /* (the table, held below, keeps its memory) */
    if (!ok) return NULL;
    Py_XSETREF(table, Py_NewRef(t));
    Py_XSETREF(globals, Py_NewRef(g));
    rows = (uint64_t *)v.buf;
    return rows;
}

static uint64_t *rot_home(uint64_t *rows, uint64_t addr, uint64_t n) {
    return rows + 3 * (((addr >> 3) * 0x9E3779B97F4A7C15ull + n) >> 52);
}

/* the index *_any returned last for the array (addr, n), or -1 */
static Py_ssize_t rot_get(uint64_t *rows, uint64_t addr, uint64_t n) {
    uint64_t *r = rot_home(rows, addr, n);
    for (int j = 0; j < ROT_PROBE; j++, r += 3)
        if (r[0] == addr && r[1] == n) return (Py_ssize_t)r[2] - 1;
    return -1;
}

static void rot_set(uint64_t *rows, uint64_t addr, uint64_t n, Py_ssize_t idx) {
    uint64_t *home = rot_home(rows, addr, n), *r = home, *free_ = NULL;
    for (int j = 0; j < ROT_PROBE; j++, r += 3) {
        if (r[0] == addr && r[1] == n) break;
        if (r[0] == 0 && free_ == NULL) free_ = r;
    }
    if (r == home + 3 * ROT_PROBE) r = free_ != NULL ? free_ : home;  /* full: forget home */
    r[0] = addr;
    r[1] = n;
    r[2] = (uint64_t)idx + 1;
}

/* values: a list/tuple of plain ints of the type (every entry: numpy converts them all) or a
 * C-contiguous array of the same type, with at least n entries */
static int set_values(PyObject *o, const struct fast_view *b, int kind, Py_ssize_t n,
                      uint64_t *out) {
    if (PyList_CheckExact(o) || PyTuple_CheckExact(o)) {
        Py_ssize_t m = PySequence_Fast_GET_SIZE(o), i;
        PyObject **items = PySequence_Fast_ITEMS(o);
        uint64_t u;
        long long v, lo, hi;
        int width = (int)b->itemsize;
        if (m < n) return 0;
        int_range(kind, width, &lo, &hi);
        /* small ints read in place; the entries past the n-th are only checked */
        for (i = 0; i < n; i++) {
            if (small_int(items[i], &v)) {
                if (v < lo || v > hi) return 0;
                out[i] = (uint64_t)v;
            } else if (int_in_slow(items[i], kind, width, &u)) {
                out[i] = u;
            } else {
                return 0;
            }
        }
        for (; i < m; i++)
            if (!int_in(items[i], kind, width, &u)) return 0;
        return 1;
    }
    struct fast_view vb;
    if (Py_TYPE(o) != G.ndarray || fast_view(o, &vb, 0) < 0) return 0;
    int ok = fast_same_format(&vb, b) && vb.len >= n * b->itemsize;
    if (ok) {
        int shift = 64 - 8 * (int)b->itemsize;
        int sign = kind == 'i';
        for (Py_ssize_t i = 0; i < n; i++) {
            uint64_t v = load_at(vb.buf, (int)b->itemsize, i);
            out[i] = sign ? (uint64_t)((int64_t)(v << shift) >> shift) : v;
        }
    }
    fast_release(&vb);
    return ok;
}

/* status: a list/tuple of ints or an integer/bool array, at least n entries: active[i] = the
 * i-th is 0; *count: how many are. 0: take the Python path */
static int set_status(PyObject *o, Py_ssize_t n, uint8_t *active, Py_ssize_t *count) {
    Py_ssize_t c = 0;
    if (PyList_CheckExact(o) || PyTuple_CheckExact(o)) {
        PyObject **items = PySequence_Fast_ITEMS(o);
        int overflow;
        if (PySequence_Fast_GET_SIZE(o) < n) return 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            long long sv;
            if (small_int(items[i], &sv)) {  /* read in place */
                c += active[i] = (uint8_t)(sv == 0);
                continue;
            }
            if (!PyLong_Check(items[i])) return 0;
            long v = PyLong_AsLongAndOverflow(items[i], &overflow);
            if (v == -1 && PyErr_Occurred()) {
                PyErr_Clear();
                return 0;
            }
            c += active[i] = (uint8_t)(v == 0 && !overflow);
        }
        *count = c;
        return 1;
    }
    struct fast_view sb;
    if (Py_TYPE(o) != G.ndarray || fast_view(o, &sb, 0) < 0) return 0;
    int w = (int)sb.itemsize;
    int ok = sb.format[0] != '\0' && sb.format[1] == '\0' && strchr("?bBhHiIlLqQ", sb.format[0])
             && (w == 1 || w == 2 || w == 4 || w == 8) && ((uintptr_t)sb.buf & (uintptr_t)(w - 1)) == 0
             && sb.len >= n * w;
    if (ok)
        for (Py_ssize_t i = 0; i < n; i++) c += active[i] = load_at(sb.buf, w, i) == 0;
    fast_release(&sb);
    *count = c;
    return ok;
}

static const char *set_name(int op) {
    static const char *const names[] = {
        "wait_until_all", "wait_until_any", "wait_until_some", "",
        "wait_until_all_vector", "wait_until_any_vector", "wait_until_some_vector", ""};
    return names[op & 7];
}

struct set_what { const char *name; PyObject *cmp; };

static PyObject *what_set(const void *ctx) {
    const struct set_what *w = ctx;
    PyObject *empty = PyUnicode_FromString(""), *c = NULL, *r = NULL;
    if (empty != NULL && (c = PyObject_Format(w->cmp, empty)) != NULL)
        r = PyUnicode_FromFormat("%s(cmp %U)", w->name, c);
    Py_XDECREF(empty);
    Py_XDECREF(c);
    return r;
}

/* the list of the k indices hits[] (ascending) */
static PyObject *some_list(const Py_ssize_t *hits, Py_ssize_t k) {
    PyObject *r = PyList_New(k);
    for (Py_ssize_t j = 0; r != NULL && j < k; j++) {
        PyObject *x = PyLong_FromSsize_t(hits[j]);
        if (x == NULL) Py_CLEAR(r);
        else PyList_SET_ITEM(r, j, x);
    }
    return r;
}

int fast_wait_set(FastCall *self, PyObject **a, PyObject **out) {
    int mode = self->op & 3, vector = self->op & SET_VECTOR, wait = self->op & SET_WAIT;
    PyObject *ivars = a[P_TARGET], *code, *status = a[P_STATUS];
    struct fast_view b;
    struct set s;
    struct fast_pred p;
    uint64_t inl_values[SET_INLINE], *rows = NULL;
    uint8_t inl_active[SET_INLINE], *heap = NULL;
    Py_ssize_t inl_hits[SET_INLINE];
    Py_ssize_t count;
    int ok = 0;
    if ((wait && !G.native_waits) || ivars == NULL || Py_TYPE(ivars) != G.ndarray ||
        self->opmap == NULL || a[P_CMP] == NULL || a[P_VALUE] == NULL)
        return 0;
    code = PyDict_GetItemWithError(self->opmap, a[P_CMP]);
    if (code == NULL || !PyLong_CheckExact(code)) {
        PyErr_Clear();
        return 0;
    }
    if (fast_view(ivars, &b, 0) < 0) return 0;
    /* every field set one by one (a memset of the struct costs a rep stos) */
    s.values = NULL;
    s.active = NULL;
    s.value = 0;
    s.start = s.chosen = s.nhits = 0;
    s.owner = NULL;
    s.base = b.buf;
    s.width = (int)b.itemsize;
    s.kind = int_kind(&b);
    /* (a shift, not a division: the width is 1, 2, 4 or 8 where kind is not 0) */
    s.n = s.kind == 0 ? 0 : b.len >> (s.width == 1 ? 0 : s.width == 2 ? 1 : s.width == 4 ? 2 : 3);
    long long cmp;
    s.cmp = small_int(code, &cmp) ? (int)cmp : (int)PyLong_AsLong(code);
    s.mode = mode;
    /* an empty array (no address to check) takes the Python path; else only live symmetric
     * memory (a freed or private array: the Python path raises, as RMA does) */
    if (s.kind == 0 || s.n == 0 || ((uintptr_t)b.buf & (uintptr_t)(s.width - 1)) ||
        vk_locate_in(G.table, b.buf, (uint64_t)b.len) < 0)
        goto done;
    if (s.n > SET_INLINE) {
        heap = PyMem_Malloc((size_t)s.n * (8 + 8 + 1));  /* values, hits, active */
        if (heap == NULL) goto done;
    }
    uint64_t *values = heap ? (uint64_t *)heap : inl_values;
    s.hits = heap ? (Py_ssize_t *)(heap + 8 * s.n) : inl_hits;
    uint8_t *active = heap ? heap + 16 * s.n : inl_active;
    if (vector) {
        if (!set_values(a[P_VALUE], &b, s.kind, s.n, values)) goto done;
        s.values = values;
    } else if (!int_in(a[P_VALUE], s.kind, s.width, &s.value)) {
        goto done;
    }
    count = s.n;
    if (status != NULL && status != Py_None) {
        if (!set_status(status, s.n, active, &count)) goto done;
        if (count < s.n) s.active = active;
    }
    if (count == 0) {  /* an empty set: at once */
        ok = 1;
        *out = mode == SET_SOME ? PyList_New(0)
               : mode == SET_ANY || wait ? Py_NewRef(Py_None) : Py_NewRef(Py_True);
        goto done;
    }
    if (mode == SET_ANY) {
        if ((rows = rotation(self)) == NULL) goto done;
        Py_ssize_t last = rot_get(rows, (uint64_t)(uintptr_t)b.buf, (uint64_t)s.n);
        s.start = last + 1 < s.n && last >= 0 ? last + 1 : 0;
    }
    ok = 1;
    p.addr = &s;
    p.kind = 's';
    p.width = s.width;
    p.cmp = s.cmp;
    p.value = 0;
    p.seen = 0;
    s.owner = &p;
    int held;
    if (wait) {
        struct set_what w = {set_name(self->op), a[P_CMP]};
        if (fast_wait(&p, what_set, &w) < 0) {
            *out = NULL;
            goto done;
        }
        held = 1;
    } else {
        held = fast_pred_true(&p);
    }
    switch (mode) {
    case SET_ALL:
        *out = wait ? Py_NewRef(Py_None) : PyBool_FromLong(held);
        break;
    case SET_ANY:
        if (!held) {
            *out = Py_NewRef(Py_None);
            break;
        }
        rot_set(rows, (uint64_t)(uintptr_t)b.buf, (uint64_t)s.n, s.chosen);
        *out = PyLong_FromSsize_t(s.chosen);
        break;
    default:
        *out = some_list(s.hits, s.nhits);
    }
done:
    /* the caller keeps the array alive: the address stays valid while it waits */
    fast_release(&b);
    if (heap != NULL) PyMem_Free(heap);
    return ok;
}
