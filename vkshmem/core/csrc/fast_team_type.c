/* vkshmem.core._fast: the NativeTeam type (made by vkshmem.core.teams.TeamState for a team
 * whose members all take the shm path, or, for its barrier, a transport's C data path). Its buffer is the team's counters (uint64): the
 * signal counts the collectives expect per flag, then the phase, then the barrier epoch. */
#include "fast.h"

#include <string.h>

/* fast_team.c: the Waiter of the native teams' waits (VKSHMEM_COLLECTIVE_TIMEOUT) */
void team_set_waiter(PyObject *waiter);

static PyObject *nt_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"pes", "me", "slot", "base", "internal", "scratch_off", "half",
                             "rd_fast", "ops", "waiter", NULL};  /* ops: b"" for none */
    PyObject *pes, *waiter = NULL;
    int me, slot;
    unsigned long long base, internal, scratch_off, half;
    Py_ssize_t rd_fast;
    Py_buffer ops = {0};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!iiKKKKn|y*O", kwlist, &PyTuple_Type, &pes,
                                     &me, &slot, &base, &internal, &scratch_off, &half,
                                     &rd_fast, &ops, &waiter))
        return NULL;
    if (waiter != NULL && waiter != Py_None) team_set_waiter(waiter);
    Py_ssize_t n = PyTuple_GET_SIZE(pes);
    if (n < 1 || me < 0 || me >= n || (ops.len && ops.len != n * (Py_ssize_t)sizeof(void *))) {
        PyBuffer_Release(&ops);
        return PyErr_Format(PyExc_ValueError, "member %d of a team of %zd (ops: %zd bytes)",
                            me, n, ops.len);
    }
    NativeTeam *t = (NativeTeam *)type->tp_alloc(type, 0);
    if (t != NULL && ops.len && (t->ops = PyMem_Malloc((size_t)ops.len)) != NULL)
        memcpy(t->ops, ops.buf, (size_t)ops.len);
    int no_ops = ops.len && (t == NULL || t->ops == NULL);
    PyBuffer_Release(&ops);
    if (t == NULL) return NULL;
    t->pes = PyMem_Calloc((size_t)n, sizeof(int));
    if (t->pes == NULL || no_ops) {
        Py_DECREF(t);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        long pe = PyLong_AsLong(PyTuple_GET_ITEM(pes, i));
        if (pe == -1 && PyErr_Occurred()) {
            Py_DECREF(t);
            return NULL;
        }
        t->pes[i] = (int)pe;
    }
    t->generation = G.generation;
    t->n = (int)n;
    t->me = me;
    t->slot = slot;
    t->base = base;
    t->internal = (uintptr_t)internal;
    t->scratch_off = scratch_off;
    t->half = half;
    t->rd_fast = rd_fast;
    /* collectives.py: _butterfly(n, me) */
    int k = 0, v;
    while ((2 << k) <= n) k++;
    int rem = (int)n - (1 << k);
    if (me < 2 * rem) {
        t->role = me & 1 ? 1 : 2;
        v = me & 1 ? me >> 1 : -1;
    } else {
        t->role = 0;
        v = me - rem;
    }
    t->rd_bytes = half / (uint64_t)(k + 2) / VK_ALIGN * VK_ALIGN;  /* teams.py: scratch_layout */
    t->nsteps = 0;
    if (t->role != 2) {
        for (int r = 0; r < k; r++) {
            int u = v ^ (1 << r);
            t->step_partner[r] = u < rem ? 2 * u + 1 : u + rem;
            t->step_flag[r] = F_RD + r;
            t->step_region[r] = 2 + r;
        }
        t->nsteps = k;
    }
    return (PyObject *)t;
}

static void nt_dealloc(PyObject *o) {
    PyMem_Free(((NativeTeam *)o)->pes);
    PyMem_Free(((NativeTeam *)o)->ops);
    Py_TYPE(o)->tp_free(o);
}

static int nt_getbuffer(PyObject *o, Py_buffer *view, int flags) {
    NativeTeam *t = (NativeTeam *)o;
    return PyBuffer_FillInfo(view, o, t->ctr, sizeof t->ctr, 0, flags);
}

static PyBufferProcs nt_as_buffer = {nt_getbuffer, NULL};

static PyObject *nt_sync(PyObject *o, PyObject *noargs) {
    NativeTeam *t = (NativeTeam *)o;
    if (!team_valid(t))
        return PyErr_Format(PyExc_RuntimeError, "this team's runtime was finalized");
    if (team_sync(t) < 0) return NULL;
    Py_RETURN_NONE;
}

/* Views of contiguous arrays of one type, the target `times` as long as the source (0: any
 * lengths). */
static int two_buffers(PyObject *tgt, PyObject *src, struct fast_view *t, struct fast_view *s,
                       int times) {
    if (fast_view(tgt, t, 1) < 0) return 0;
    if (fast_view(src, s, 0) < 0) {
        fast_release(t);
        return 0;
    }
    if (fast_same_format(t, s) && (times == 0 || t->len == s->len * times)) return 1;
    fast_release(s);
    fast_release(t);
    return 0;
}

/* which: 0 broadcast(target, source, root), 1 reduce(target, source, op), 2 fcollect(target,
 * source), 3 alltoall(target, source, count, tst, sst), 4 collect(target, source),
 * 5 scan(target, source, inclusive) */
static PyObject *nt_collective(PyObject *o, PyObject *args, int which) {
    static const char *const formats[] = {"OOi", "OOi", "OO", "OOnnn", "OO", "OOp"};
    NativeTeam *team = (NativeTeam *)o;
    PyObject *tgt, *src;
    Py_ssize_t cnt = 0, tst = 0, sst = 0;
    int arg = 0, r;
    struct fast_view t, s;
    if (!(which == 3 ? PyArg_ParseTuple(args, formats[which], &tgt, &src, &cnt, &tst, &sst)
                     : PyArg_ParseTuple(args, formats[which], &tgt, &src, &arg)))
        return NULL;
    /* the target's length: the source's, n times it (fcollect), or any (alltoall, collect) */
    if (!two_buffers(tgt, src, &t, &s, which == 2 ? team->n : which == 3 || which == 4 ? 0 : 1))
        Py_RETURN_FALSE;
    switch (which) {
    case 0: r = team_broadcast(team, &t, &s, t.len, arg); break;
    case 1: r = team_reduce(team, &t, &s, t.len, arg); break;
    case 2: r = team_fcollect(team, &t, &s, s.len); break;
    case 3: r = team_alltoall(team, &t, &s, cnt, tst, sst); break;
    case 4: r = team_collect(team, &t, s.buf, s.len / s.itemsize); break;
    default: r = team_scan(team, &t, s.buf, s.len / s.itemsize, arg); break;
    }
    fast_release(&s);
    fast_release(&t);
    if (r < 0) return NULL;
    return PyBool_FromLong(r);
}

static PyObject *nt_broadcast(PyObject *o, PyObject *args) { return nt_collective(o, args, 0); }

static PyObject *nt_reduce(PyObject *o, PyObject *args) { return nt_collective(o, args, 1); }

static PyObject *nt_fcollect(PyObject *o, PyObject *args) { return nt_collective(o, args, 2); }

static PyObject *nt_alltoall(PyObject *o, PyObject *args) { return nt_collective(o, args, 3); }

static PyObject *nt_collect(PyObject *o, PyObject *args) { return nt_collective(o, args, 4); }

static PyObject *nt_scan(PyObject *o, PyObject *args) { return nt_collective(o, args, 5); }

static PyObject *nt_valid(PyObject *o, void *closure) {
    return PyBool_FromLong(team_valid((NativeTeam *)o));
}

static PyMethodDef nt_methods[] = {
    {"sync", nt_sync, METH_NOARGS,
     "sync()\n--\n\nCollective over the team: dissemination barrier."},
    {"broadcast", nt_broadcast, METH_VARARGS,
     "broadcast(target, source, root)\n--\n\nCollective: push broadcast of flat arrays of one "
     "type and length (target symmetric). False when the Python algorithm must run."},
    {"reduce", nt_reduce, METH_VARARGS,
     "reduce(target, source, op)\n--\n\nCollective: all-reduce (one butterfly phase; larger: "
     "the ring or the butterfly in chunks; op: 1 sum, 2 prod, 3 min, 4 max, 5 and, 6 or, "
     "7 xor). False when the Python algorithm must run."},
    {"fcollect", nt_fcollect, METH_VARARGS,
     "fcollect(target, source)\n--\n\nCollective: dissemination allgather of a flat source "
     "into a flat target of n times its length. False when the Python algorithm must run."},
    {"alltoall", nt_alltoall, METH_VARARGS,
     "alltoall(target, source, count, tst, sst)\n--\n\nCollective: block j (count elements "
     "at stride sst of the flat source) to block me of member j's flat target (at stride "
     "tst). False when the Python algorithm must run."},
    {"collect", nt_collect, METH_VARARGS,
     "collect(target, source)\n--\n\nCollective: the members' flat sources (their lengths may "
     "differ) concatenated into the whole flat target; raises the Python path's errors after "
     "the counts' exchange. False when the Python algorithm must run."},
    {"scan", nt_scan, METH_VARARGS,
     "scan(target, source, inclusive)\n--\n\nCollective: prefix sums of flat arrays of one "
     "type and length. False when the Python algorithm must run."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef nt_getset[] = {
    {"valid", nt_valid, NULL, "Whether the runtime this team belongs to is running.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject NativeTeamType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "vkshmem.core._fast.NativeTeam",
    .tp_basicsize = sizeof(NativeTeam),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "NativeTeam(pes, me, slot, base, internal, scratch_off, half, rd_fast, ops=None, "
              "waiter=None)"
              "\n--\n\nA team whose members take the shm path (its barrier and small "
              "collectives) or a transport with a C data path (ops: per member, the address "
              "of its struct vk_native_ops, 0 where mapped; its barrier only). waiter: the "
              "Waiter of the waits of every native team of this runtime (its timeout and "
              "errors: VKSHMEM_COLLECTIVE_TIMEOUT), default the runtime's.",
    .tp_new = nt_new,
    .tp_dealloc = nt_dealloc,
    .tp_as_buffer = &nt_as_buffer,
    .tp_methods = nt_methods,
    .tp_getset = nt_getset,
};
