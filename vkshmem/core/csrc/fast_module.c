/* vkshmem.core._fast: the module, the FastCall type and the argument helpers (see fast.h). */
#include "fast.h"

#include <stddef.h>
#include <string.h>

struct fast_global G;

/* Parameter names that give an argument its role (a parameter of another name has none). */
static const char *const ROLE_NAMES[P_NROLES][3] = {
    [P_TARGET] = {"target", "ivar", "ivars"}, [P_SOURCE] = {"source"}, [P_PE] = {"pe", NULL},
    [P_SIZE] = {"size", NULL},       [P_CTX] = {"ctx", NULL},  [P_VALUE] = {"value", "values"},
    [P_COND] = {"cond", NULL},       [P_FETCH] = {"fetch", NULL},   [P_OP] = {"op", NULL},
    [P_CMP] = {"cmp", NULL},         [P_ROOT] = {"root", NULL},     [P_TEAM] = {"team", NULL},
    [P_SIGNAL] = {"signal", NULL},   [P_SIGOP] = {"sigop", NULL},   [P_TST] = {"tst", NULL},
    [P_SST] = {"sst", NULL},         [P_LOCK] = {"lock", NULL},     [P_STATUS] = {"status"},
};

/* -- FastCall -------------------------------------------------------------------------------- */

static int param_index(FastCall *self, PyObject *name) {
    for (int i = 0; i < self->nparams; i++)
        if (PyTuple_GET_ITEM(self->names, i) == name) return i;
    for (int i = 0; i < self->nparams; i++) {
        int r = PyUnicode_Compare(PyTuple_GET_ITEM(self->names, i), name);
        if (r == 0) return i;
        if (r == -1 && PyErr_Occurred()) PyErr_Clear();
    }
    return -1;
}

/* The argument of `role` in a call (borrowed), or NULL when not given. */
static PyObject *arg_of(FastCall *self, int role, PyObject *const *args, Py_ssize_t nargs,
                        PyObject *kwnames) {
    int s = self->slot[role];
    if (s < 0) return NULL;
    if (s < nargs) return args[s];
    for (Py_ssize_t k = 0; kwnames != NULL && k < PyTuple_GET_SIZE(kwnames); k++)
        if (PyUnicode_Compare(PyTuple_GET_ITEM(kwnames, k), PyTuple_GET_ITEM(self->names, s)) == 0)
            return args[nargs + k];
    return NULL;
}

/* The Python path raised: a transport's error on an operation addressed to a failed PE (the
 * `pe` argument, when a world PE: no context) becomes PeerFailedError. */
static void translate_fallback_error(FastCall *self, PyObject *const *args, Py_ssize_t nargs,
                                     PyObject *kwnames) {
    PyObject *type, *value, *tb, *ctx;
    long pe = -1;
    PyErr_Fetch(&type, &value, &tb);
    ctx = arg_of(self, P_CTX, args, nargs, kwnames);
    if ((ctx == NULL || ctx == Py_None) && !fast_long(arg_of(self, P_PE, args, nargs, kwnames),
                                                      &pe))
        pe = -1;
    PyErr_Clear();
    PyErr_Restore(type, value, tb);
    fast_translate_error(pe);
}

static PyObject *fc_vectorcall(PyObject *o, PyObject *const *args, size_t nargsf,
                               PyObject *kwnames) {
    FastCall *self = (FastCall *)o;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (G.enabled && nargs <= self->nparams) {
        PyObject *a[VK_MAX_PARAMS + 1] = {NULL};
        PyObject *slots[P_NROLES + 1];
        int ok = 1;
        for (Py_ssize_t i = 0; i < nargs; i++) a[i] = args[i];
        if (kwnames != NULL) {
            for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(kwnames); k++) {
                int i = param_index(self, PyTuple_GET_ITEM(kwnames, k));
                if (i < 0 || a[i] != NULL) { ok = 0; break; }
                a[i] = args[nargs + k];
            }
        }
        for (int i = 0; ok && i < self->nrequired; i++) ok = a[i] != NULL;
        if (ok) {
            PyObject *out = NULL;
            /* by role: a missing role reads a[VK_MAX_PARAMS], always NULL */
            for (int r = 0; r < P_NROLES; r++)
                slots[r] = a[self->slot[r] < 0 ? VK_MAX_PARAMS : self->slot[r]];
            if (self->impl(self, slots, &out)) return out;
        }
    }
    PyObject *r = PyObject_Vectorcall(self->fallback, args, nargsf, kwnames);
    if (r == NULL && G.failed != NULL)  /* the error path only */
        translate_fallback_error(self, args, nargs, kwnames);
    return r;
}

static int fc_traverse(PyObject *o, visitproc visit, void *arg) {
    FastCall *self = (FastCall *)o;
    Py_VISIT(self->fallback);
    Py_VISIT(self->names);
    Py_VISIT(self->opmap);
    return 0;
}

static int fc_clear(PyObject *o) {
    FastCall *self = (FastCall *)o;
    Py_CLEAR(self->fallback);
    Py_CLEAR(self->names);
    Py_CLEAR(self->opmap);
    return 0;
}

static void fc_dealloc(PyObject *o) {
    PyObject_GC_UnTrack(o);
    fc_clear(o);
    Py_TYPE(o)->tp_free(o);
}

/* What a Python function shows (name, doc, signature through __wrapped__) is its fallback's. */
static PyObject *fc_getattro(PyObject *o, PyObject *name) {
    static const char *const forwarded[] = {"__doc__", "__name__", "__qualname__", "__module__",
                                            "__annotations__", "__defaults__",
                                            "__kwdefaults__", NULL};
    FastCall *self = (FastCall *)o;
    if (PyUnicode_Check(name)) {
        if (PyUnicode_CompareWithASCIIString(name, "__wrapped__") == 0)
            return Py_NewRef(self->fallback);
        for (int i = 0; forwarded[i]; i++)
            if (PyUnicode_CompareWithASCIIString(name, forwarded[i]) == 0)
                return PyObject_GetAttr(self->fallback, name);
    }
    PyObject *r = PyObject_GenericGetAttr(o, name);
    if (r == NULL && PyErr_ExceptionMatches(PyExc_AttributeError)) {
        PyErr_Clear();
        r = PyObject_GetAttr(self->fallback, name);
    }
    return r;
}

static PyObject *fc_repr(PyObject *o) {
    return PyUnicode_FromFormat("<vkshmem fast path of %R>", ((FastCall *)o)->fallback);
}

static PyTypeObject FastCallType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "vkshmem.core._fast.FastCall",
    .tp_basicsize = sizeof(FastCall),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "An API function: the shm hot path in C, else its Python implementation.",
    .tp_vectorcall_offset = offsetof(FastCall, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_traverse = fc_traverse,
    .tp_clear = fc_clear,
    .tp_dealloc = fc_dealloc,
    .tp_getattro = fc_getattro,
    .tp_repr = fc_repr,
};

static const struct { const char *kind; fast_impl impl; } KINDS[] = {
    {"put", fast_put},         {"get", fast_get},
    {"amo", fast_amo},         {"quiet", fast_quiet},
    {"wait_until", fast_wait_until}, {"test", fast_test},
    {"barrier_all", fast_barrier},   {"sync", fast_sync},
    {"broadcast", fast_broadcast},   {"reduce", fast_reduce},
    {"fcollect", fast_fcollect},
    {"put_signal", fast_put_signal}, {"signal_update", fast_signal_update},
    {"signal_fetch", fast_signal_fetch}, {"signal_wait", fast_signal_wait},
    {"alltoall", fast_alltoall},     {"collect", fast_collect},
    {"scan", fast_scan},             {"iput", fast_iput},
    {"iget", fast_iget},             {"set_lock", fast_set_lock},
    {"test_lock", fast_test_lock},   {"clear_lock", fast_clear_lock},
    {"wait_set", fast_wait_set},
    {NULL, NULL},
};

static PyObject *mod_entry(PyObject *mod, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"kind", "fallback", "op", "fetch", "ints_only", "opmap", NULL};
    const char *kind;
    PyObject *fallback, *opmap = Py_None, *code = NULL, *defaults = NULL;
    int op = -1, fetch = 0, ints_only = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "sO|ippO", kwlist, &kind, &fallback, &op,
                                     &fetch, &ints_only, &opmap))
        return NULL;
    fast_impl impl = NULL;
    for (int i = 0; KINDS[i].kind; i++)
        if (strcmp(KINDS[i].kind, kind) == 0) impl = KINDS[i].impl;
    if (impl == NULL) return PyErr_Format(PyExc_ValueError, "unknown fast path %s", kind);
    code = PyObject_GetAttrString(fallback, "__code__");
    if (code == NULL) return NULL;
    PyObject *varnames = PyObject_GetAttrString(code, "co_varnames");
    PyObject *argc = PyObject_GetAttrString(code, "co_argcount");
    Py_DECREF(code);
    defaults = PyObject_GetAttrString(fallback, "__defaults__");
    FastCall *self = NULL;
    if (varnames == NULL || argc == NULL || defaults == NULL) goto done;
    long nparams = PyLong_AsLong(argc);
    if (nparams > VK_MAX_PARAMS) {
        PyErr_SetString(PyExc_ValueError, "too many parameters for a fast path");
        goto done;
    }
    self = PyObject_GC_New(FastCall, &FastCallType);
    if (self == NULL) goto done;
    self->vectorcall = fc_vectorcall;
    self->impl = impl;
    self->fallback = Py_NewRef(fallback);
    self->names = PyTuple_GetSlice(varnames, 0, nparams);
    self->opmap = opmap == Py_None ? NULL : Py_NewRef(opmap);
    self->nparams = (int)nparams;
    self->nrequired = (int)nparams - (defaults == Py_None ? 0 : (int)PyTuple_Size(defaults));
    self->op = op;
    self->fetch = fetch;
    self->ints_only = ints_only;
    for (int r = 0; r < P_NROLES; r++) {
        self->slot[r] = -1;
        for (int i = 0; self->names && i < self->nparams; i++) {
            PyObject *nm = PyTuple_GET_ITEM(self->names, i);
            for (int j = 0; j < 3 && ROLE_NAMES[r][j]; j++)
                if (PyUnicode_CompareWithASCIIString(nm, ROLE_NAMES[r][j]) == 0)
                    self->slot[r] = i;
        }
    }
    PyObject_GC_Track((PyObject *)self);
    if (self->names == NULL) Py_CLEAR(self);
done:
    Py_XDECREF(varnames);
    Py_XDECREF(argc);
    Py_XDECREF(defaults);
    return (PyObject *)self;
}

/* -- configuration ------------------------------------------------------------------------- */

static PyObject *mod_bind(PyObject *mod, PyObject *args) {
    unsigned long long table;
    PyObject *ndarray, *probes;
    if (!PyArg_ParseTuple(args, "KO!O!", &table, &PyType_Type, &ndarray, &PyTuple_Type,
                          &probes))
        return NULL;
    G.table = (struct vk_table *)(uintptr_t)table;
    Py_INCREF(ndarray);
    Py_XDECREF((PyObject *)G.ndarray);
    G.ndarray = (PyTypeObject *)ndarray;
    G.struct_ok = PyTuple_GET_SIZE(probes) > 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(probes); i++) {
        PyObject *p = PyTuple_GET_ITEM(probes, i);
        G.struct_ok &= Py_TYPE(p) == G.ndarray && fast_layout_agrees(p);
    }
    return PyBool_FromLong(G.struct_ok);
}

static void clear_world(void) {
    PyObject *w = (PyObject *)G.world;
    G.world = NULL;
    Py_XDECREF(w);
}

/* Forget the configuration (not the teams made under it). */
static void clear_config(void) {
    G.enabled = 0;
    G.npes = 0;
    PyMem_Free(G.direct);
    G.direct = NULL;
    PyMem_Free(G.ops);
    G.ops = NULL;
    Py_CLEAR(G.transports);
    PyMem_Free(G.quiet_ops);
    G.quiet_ops = NULL;
    PyMem_Free(G.fence_quiet);
    G.fence_quiet = NULL;
    G.nquiet = -1;
    fast_watch_set(NULL, 0);
    Py_CLEAR(G.quiet_transports);
    Py_CLEAR(G.seg_heaps);
    clear_world();
    Py_CLEAR(G.waiter);
    G.failed = NULL;
}

static PyObject *mod_reset(PyObject *mod, PyObject *noargs) {
    clear_config();
    G.generation++;  /* the teams of this runtime are gone */
    Py_RETURN_NONE;
}

static PyObject *mod_configure(PyObject *mod, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"my_pe", "direct", "ops", "transports", "quiet_fence",
                             "native_waits", "crowded", "waiter", "seg_heaps", "failed",
                             "quiet_ops", "fence_quiet", "quiet_transports", "watch_ops",
                             NULL};
    int my_pe, quiet_fence, native_waits, crowded, npes;
    unsigned long long failed = 0;
    Py_buffer direct, ops, qops = {0}, fq = {0}, wops = {0};
    PyObject *waiter, *transports, *seg_heaps, *qts = NULL;
    if (G.table == NULL || G.ndarray == NULL)
        return PyErr_Format(PyExc_RuntimeError, "vkshmem.core._fast is not bound");
    if (!PyArg_ParseTupleAndKeywords(args, kw, "iy*y*O!pppOO!|Ky*y*O!y*", kwlist,
                                     &my_pe, &direct, &ops, &PyTuple_Type, &transports,
                                     &quiet_fence, &native_waits, &crowded, &waiter,
                                     &PyList_Type, &seg_heaps, &failed, &qops, &fq,
                                     &PyTuple_Type, &qts, &wops))
        return NULL;
    struct vk_native_ops *wo[VK_MAX_WATCH];  /* the wake board's transports */
    int nw = fast_watch_take(&wops, wo);
    /* quiet/fence in C: every open transport's ops (none zero, each offering both) */
    Py_ssize_t nq = qts == NULL ? -1 : PyTuple_GET_SIZE(qts);
    if (nq >= 0 && (qops.len != nq * (Py_ssize_t)sizeof(void *) || fq.len != nq)) {
        PyBuffer_Release(&direct);
        PyBuffer_Release(&ops);
        PyBuffer_Release(&qops);
        PyBuffer_Release(&fq);
        return PyErr_Format(PyExc_ValueError, "configure: quiet_ops, fence_quiet and "
                            "quiet_transports differ in length");
    }
    for (Py_ssize_t i = 0; i < nq; i++) {
        struct vk_native_ops *o = ((struct vk_native_ops **)qops.buf)[i];
        if (o == NULL || o->quiet == NULL || o->fence == NULL) nq = -1;
    }
    npes = G.table->npes;
    if (direct.len != npes || ops.len != npes * (Py_ssize_t)sizeof(void *) ||
        PyTuple_GET_SIZE(transports) != npes) {
        PyBuffer_Release(&direct);
        PyBuffer_Release(&ops);
        PyBuffer_Release(&qops);
        PyBuffer_Release(&fq);
        return PyErr_Format(PyExc_ValueError, "configure: routes do not match the %d PEs",
                            npes);
    }
    clear_config();
    G.direct = PyMem_Malloc(npes ? npes : 1);
    G.ops = PyMem_Malloc(npes ? ops.len : 1);
    G.quiet_ops = PyMem_Malloc(nq > 0 ? qops.len : 1);
    G.fence_quiet = PyMem_Malloc(nq > 0 ? fq.len : 1);
    if (G.direct == NULL || G.ops == NULL || G.quiet_ops == NULL || G.fence_quiet == NULL) {
        PyBuffer_Release(&direct);
        PyBuffer_Release(&ops);
        PyBuffer_Release(&qops);
        PyBuffer_Release(&fq);
        clear_config();
        return PyErr_NoMemory();
    }
    memcpy(G.direct, direct.buf, direct.len);
    memcpy(G.ops, ops.buf, ops.len);
    if (nq > 0) {
        memcpy(G.quiet_ops, qops.buf, qops.len);
        memcpy(G.fence_quiet, fq.buf, fq.len);
    }
    G.nquiet = (int)nq;
    G.quiet_transports = nq > 0 ? Py_NewRef(qts) : NULL;
    PyBuffer_Release(&direct);
    PyBuffer_Release(&ops);
    PyBuffer_Release(&qops);
    PyBuffer_Release(&fq);
    G.transports = Py_NewRef(transports);
    G.my_pe = my_pe;
    G.npes = G.table->npes;
    G.quiet_fence = quiet_fence;
    G.native_waits = native_waits;
    G.crowded = crowded;
    G.seg_heaps = Py_NewRef(seg_heaps);
    G.waiter = Py_NewRef(waiter);
    G.failed = (volatile uint64_t *)(uintptr_t)failed;
    fast_watch_set(wo, nw);
    G.enabled = 1;
    Py_RETURN_NONE;
}

static PyObject *mod_set_world(PyObject *mod, PyObject *team) {
    if (team != Py_None && !PyObject_TypeCheck(team, &NativeTeamType))
        return PyErr_Format(PyExc_TypeError, "set_world takes a NativeTeam or None");
    clear_world();
    if (team != Py_None) G.world = (struct native_team *)Py_NewRef(team);
    Py_RETURN_NONE;
}

static PyObject *mod_enabled(PyObject *mod, PyObject *noargs) {
    return PyBool_FromLong(G.enabled);
}

static PyMethodDef METHODS[] = {
    {"entry", (PyCFunction)(void (*)(void))mod_entry, METH_VARARGS | METH_KEYWORDS,
     "entry(kind, fallback, op=-1, fetch=False, ints_only=False, opmap=None)\n--\n\n"
     "The fast path of `kind` standing in for the Python function `fallback`."},
    {"bind", mod_bind, METH_VARARGS,
     "bind(table_address, ndarray, probes)\n--\n\nUse _native's peer table and numpy's array "
     "type; read arrays directly when every probe array's fields agree with its buffer."},
    {"configure", (PyCFunction)(void (*)(void))mod_configure, METH_VARARGS | METH_KEYWORDS,
     "configure(my_pe, direct, ops, transports, quiet_fence, native_waits, crowded, "
     "waiter, seg_heaps, failed=0, quiet_ops=b'', fence_quiet=b'', quiet_transports=None, "
     "watch_ops=b'')\n--\n\n"
     "Enable the fast paths for a running runtime (watch_ops: the wake board's transports)."},
    {"watch_stats", fast_watch_stats, METH_NOARGS,
     "watch_stats()\n--\n\nThe wake board: transports watched (0: waits poll), arms, "
     "futex sleeps, sleeps a transport's poke ended (counters, for tests)."},
    {"set_world", mod_set_world, METH_O,
     "set_world(team)\n--\n\nTEAM_WORLD's NativeTeam (or None)."},
    {"reset", mod_reset, METH_NOARGS, "reset()\n--\n\nDisable every fast path (finalize)."},
    {"enabled", mod_enabled, METH_NOARGS, "enabled()\n--\n\nWhether the fast paths run."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {
    PyModuleDef_HEAD_INIT, "vkshmem.core._fast",
    "The per-call hot path of vkshmem's shm route (see vkshmem.core.fast).", -1, METHODS,
};

PyMODINIT_FUNC PyInit__fast(void) {
    if (PyType_Ready(&FastCallType) < 0 || PyType_Ready(&NativeTeamType) < 0) return NULL;
    PyObject *m = PyModule_Create(&MODULE);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "FastCall", (PyObject *)&FastCallType) < 0 ||
        PyModule_AddObjectRef(m, "NativeTeam", (PyObject *)&NativeTeamType) < 0 ||
        PyModule_AddIntConstant(m, "N_COUNTERS", VK_N_CTRS) < 0 ||
        PyModule_AddIntConstant(m, "PHASE", VK_CTR_PHASE) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
