/* vkshmem.core._fast: set_lock / test_lock / clear_lock of a lock whose owner (lock.py:
 * the PE (offset // 64) % n_pes) is on the shm path: the ticket lock of lock.py on the
 * owner's word, with CPU atomics. The locks this PE holds stay in lock.py's `_held`
 * ((segment, offset) -> (ticket, thread id)), shared with the Python functions; a set_lock
 * that must queue takes its ticket here and waits in Python (lock.py: _wait_ticket: the
 * waiter's timeout, interrupts, withdrawing the ticket). Anything else, and every error, is
 * left to the Python functions.
 */
#include "fast.h"

#include "pythread.h"

#include <string.h>

#define LOW 0xffffffffull
#define TICKET (1ull << 32)
#define RELEASE_WRAP (1ull - TICKET)  /* +1 on serving at 2**32 - 1, the carry cancelled */

struct lock_word { uintptr_t addr; PyObject *key, *held; };

/* opmap's entries (interned names), and the key of the lock used last (a program mostly
 * takes the same few locks: the tuple is made once) */
static PyObject *held_name, *wait_name, *last_key;
static int last_seg = -1;
static uint64_t last_off;

static PyObject *opmap_item(FastCall *self, PyObject **name, const char *s) {
    if (*name == NULL && (*name = PyUnicode_InternFromString(s)) == NULL) return NULL;
    return PyDict_GetItemWithError(self->opmap, *name);
}

static PyObject *key_of(int seg, uint64_t off) {
    if (last_key == NULL || seg != last_seg || off != last_off) {
        PyObject *k = Py_BuildValue("(iK)", seg, (unsigned long long)off);
        if (k == NULL) return NULL;
        Py_XSETREF(last_key, k);
        last_seg = seg;
        last_off = off;
    }
    return Py_NewRef(last_key);
}

/* lock.py: _Where: the owner's word of `lock`; 1 with a new key, else 0 (left to Python) */
static int lock_word(FastCall *self, PyObject *lock, struct lock_word *w) {
    struct fast_view v;
    int ok = 0;
    if (lock == NULL || Py_TYPE(lock) != G.ndarray || self->opmap == NULL) return 0;
    w->held = opmap_item(self, &held_name, "held");
    if (w->held == NULL || !PyDict_Check(w->held) || fast_view(lock, &v, 0) < 0) {
        PyErr_Clear();
        return 0;
    }
    if (v.len == 8 && v.itemsize == 8 && v.format[0] != '\0' && v.format[1] == '\0' &&
        strchr("lLqQ", v.format[0]) != NULL) {
        int64_t r = vk_locate_in(G.table, v.buf, 8);
        if (r >= 0 && !(r & 7)) {
            uint64_t off = (uint64_t)(r & VK_OFF_MASK);
            int seg = (int)(r >> 48), owner = (int)((off >> 6) % (uint64_t)G.npes);
            uintptr_t base = G.direct[owner] && !fast_pe_failed(owner) ? fast_peer(seg, owner)
                                                                       : 0;
            if (base && (w->key = key_of(seg, off)) != NULL) {
                w->addr = base + off;
                ok = 1;
            }
            PyErr_Clear();
        }
    }
    fast_release(&v);
    return ok;
}

/* _held[key] = (ticket, this thread) */
static int hold(struct lock_word *w, uint64_t ticket) {
    PyObject *v = Py_BuildValue("(KK)", (unsigned long long)ticket,
                                (unsigned long long)PyThread_get_thread_ident());
    int r = v == NULL ? -1 : PyDict_SetItem(w->held, w->key, v);
    Py_XDECREF(v);
    return r;
}

/* set_lock(lock) */
int fast_set_lock(FastCall *self, PyObject **a, PyObject **out) {
    struct lock_word w;
    if (!lock_word(self, a[P_LOCK], &w)) return 0;
    PyObject *mine = PyDict_GetItemWithError(w.held, w.key);
    if (mine != NULL && PyTuple_Check(mine) && PyTuple_GET_SIZE(mine) == 2 &&
        PyLong_AsUnsignedLongLongMask(PyTuple_GET_ITEM(mine, 1)) ==
            (unsigned long long)PyThread_get_thread_ident()) {
        Py_DECREF(w.key);  /* this thread holds it: the Python path raises */
        return 0;
    }
    PyErr_Clear();
    uint64_t old = vk_amo_impl(w.addr, VK_ADD, 8, TICKET, 0), ticket = (old >> 32) & LOW;
    int r = 0;
    if ((old & LOW) != ticket) {  /* queued: wait in Python (timeout, interrupts, give up) */
        PyObject *wait = opmap_item(self, &wait_name, "wait");
        PyObject *got = wait == NULL ? NULL
                        : PyObject_CallFunction(wait, "OK", a[P_LOCK], (unsigned long long)ticket);
        if (got == NULL && !PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, "set_lock: no wait function");
        r = got == NULL ? -1 : 0;
        Py_XDECREF(got);
    }
    if (r == 0) {
        __atomic_thread_fence(__ATOMIC_SEQ_CST);  /* the critical section stays after this */
        r = hold(&w, ticket);
    }
    Py_DECREF(w.key);
    *out = r < 0 ? NULL : Py_NewRef(Py_None);
    return 1;
}

/* test_lock(lock): False when it took the lock */
int fast_test_lock(FastCall *self, PyObject **a, PyObject **out) {
    struct lock_word w;
    if (!lock_word(self, a[P_LOCK], &w)) return 0;
    uint64_t word = vk_amo_impl(w.addr, VK_FETCH, 8, 0, 0), serving = word & LOW;
    int r = 1;  /* held (or queued for), or somebody else got there first */
    if (((word >> 32) & LOW) == serving &&
        vk_amo_impl(w.addr, VK_CSWAP, 8, word + TICKET, word) == word) {
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        r = hold(&w, serving);
    }
    Py_DECREF(w.key);
    *out = r < 0 ? NULL : PyBool_FromLong(r);
    return 1;
}

/* clear_lock(lock): quiet (a fence while no transport is open), then serving + 1 */
int fast_clear_lock(FastCall *self, PyObject **a, PyObject **out) {
    struct lock_word w;
    unsigned long long ticket;
    if (!G.quiet_fence || !lock_word(self, a[P_LOCK], &w)) return 0;
    PyObject *mine = PyDict_GetItemWithError(w.held, w.key);
    if (mine == NULL || !PyTuple_Check(mine) || PyTuple_GET_SIZE(mine) != 2 ||
        ((ticket = PyLong_AsUnsignedLongLongMask(PyTuple_GET_ITEM(mine, 0))) == (unsigned long long)-1
         && PyErr_Occurred())) {
        PyErr_Clear();
        Py_DECREF(w.key);  /* not held here: the Python path raises */
        return 0;
    }
    int r = PyDict_DelItem(w.held, w.key);
    Py_DECREF(w.key);
    if (r == 0) {
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        vk_amo_impl(w.addr, VK_ADD, 8, ticket == LOW ? RELEASE_WRAP : 1, 0);
    }
    *out = r < 0 ? NULL : Py_NewRef(Py_None);
    return 1;
}
