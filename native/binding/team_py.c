/* The Team binding: same-host collectives (native/src/team/team.c), GIL released around each
 * call. */
#include "binding.h"
#include "team_api.h"

/* ---------------- Team ---------------- */

typedef struct {
    PyObject_HEAD
    pt_team_t *team;
    PyObject *ctx;      /* keeps the context alive */
    int n;
} TeamObject;

static int Team_init(TeamObject *self, PyObject *args, PyObject *kw)
{
    ContextObject *ctx;
    PyObject *ranks, *keys;
    Py_ssize_t slot;
    int nslots;
    if (!PyArg_ParseTuple(args, "O!OOni", &ContextType, &ctx, &ranks, &keys, &slot, &nslots))
        return -1;
    if (!ctx->ctx) {
        pt_py_closed();
        return -1;
    }
    Py_ssize_t n = PySequence_Length(ranks);
    if (n <= 0 || n != PySequence_Length(keys)) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "ranks and keys must be equal, non-empty sequences");
        return -1;
    }
    int *r = PyMem_Malloc(sizeof(int) * (size_t)n);
    uint64_t *k = PyMem_Malloc(sizeof(uint64_t) * (size_t)n);
    int rc = -1;
    if (!r || !k) {
        PyErr_NoMemory();
        goto out;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *a = PySequence_GetItem(ranks, i), *b = PySequence_GetItem(keys, i);
        if (a)
            r[i] = (int)PyLong_AsLong(a);
        if (b)
            k[i] = PyLong_AsUnsignedLongLong(b);
        Py_XDECREF(a);
        Py_XDECREF(b);
        if (PyErr_Occurred())
            goto out;
    }
    pt_status_t st = pt_team_create(ctx->ctx, r, (int)n, k, (size_t)slot, nslots, &self->team);
    if (st != PT_OK) {
        raise_status(st);
        goto out;
    }
    Py_INCREF(ctx);
    self->ctx = (PyObject *)ctx;
    self->n = (int)n;
    rc = 0;
out:
    PyMem_Free(r);
    PyMem_Free(k);
    return rc;
}

static void Team_dealloc(TeamObject *self)
{
    pt_team_destroy(self->team);
    Py_XDECREF(self->ctx);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

#define TEAM(self)                                                                  \
    do {                                                                            \
        if (!(self)->team || !((ContextObject *)(self)->ctx)->ctx) {                \
            PyErr_SetString(PyExc_ValueError, "team is closed");                    \
            return NULL;                                                            \
        }                                                                           \
    } while (0)

static PyObject *Team_barrier(TeamObject *self, PyObject *args)
{
    double timeout;
    if (!PyArg_ParseTuple(args, "d", &timeout))
        return NULL;
    TEAM(self);
    int who = -1;
    pt_status_t st;
    Py_BEGIN_ALLOW_THREADS
    st = pt_team_barrier(self->team, timeout, &who);
    Py_END_ALLOW_THREADS
    return pt_py_none_or_raise(st, who);
}

static int two_buffers(PyObject *a, PyObject *b, Py_buffer *in, Py_buffer *out, size_t need_in,
                       size_t need_out)
{
    if (PyObject_GetBuffer(a, in, PyBUF_SIMPLE) < 0)
        return -1;
    if (PyObject_GetBuffer(b, out, PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(in);
        return -1;
    }
    if ((size_t)in->len < need_in || (size_t)out->len < need_out) {
        PyBuffer_Release(in);
        PyBuffer_Release(out);
        PyErr_SetString(PyExc_ValueError, "buffer smaller than the count given");
        return -1;
    }
    return 0;
}

/* A reduction's buffers: count items of dtype dt out, parts times as many in. */
static int reduction_buffers(PyObject *a, PyObject *b, int dt, Py_ssize_t count, int parts,
                             Py_buffer *in, Py_buffer *out)
{
    if (dt < 0 || dt >= PT_NDTYPES || count < 0) {
        raise_status(PT_ERR_INVALID);
        return -1;
    }
    size_t nb = (size_t)count * pt_dtype_size((pt_dtype_t)dt);
    return two_buffers(a, b, in, out, nb * (size_t)parts, nb);
}

static PyObject *Team_allreduce(TeamObject *self, PyObject *args)
{
    int op, dt, algo;
    PyObject *a, *b;
    Py_ssize_t count;
    unsigned long long sig;
    double timeout;
    if (!PyArg_ParseTuple(args, "iiOOniKd", &op, &dt, &a, &b, &count, &algo, &sig, &timeout))
        return NULL;
    TEAM(self);
    Py_buffer in, out;
    if (reduction_buffers(a, b, dt, count, 1, &in, &out) < 0)
        return NULL;
    int who = -1;
    pt_status_t st;
    Py_BEGIN_ALLOW_THREADS
    st = pt_team_allreduce(self->team, (pt_op_t)op, (pt_dtype_t)dt, in.buf, out.buf,
                           (size_t)count, algo, sig, timeout, &who);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&in);
    PyBuffer_Release(&out);
    return pt_py_none_or_raise(st, who);
}

static PyObject *Team_reduce_scatter(TeamObject *self, PyObject *args)
{
    int op, dt;
    PyObject *a, *b;
    Py_ssize_t count;
    unsigned long long sig;
    double timeout;
    if (!PyArg_ParseTuple(args, "iiOOnKd", &op, &dt, &a, &b, &count, &sig, &timeout))
        return NULL;
    TEAM(self);
    Py_buffer in, out;
    if (reduction_buffers(a, b, dt, count, self->n, &in, &out) < 0)
        return NULL;
    int who = -1;
    pt_status_t st;
    Py_BEGIN_ALLOW_THREADS
    st = pt_team_reduce_scatter(self->team, (pt_op_t)op, (pt_dtype_t)dt, in.buf, out.buf,
                                (size_t)count, sig, timeout, &who);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&in);
    PyBuffer_Release(&out);
    return pt_py_none_or_raise(st, who);
}

static PyObject *Team_allgather(TeamObject *self, PyObject *args)
{
    PyObject *a, *b;
    Py_ssize_t nbytes;
    unsigned long long sig;
    double timeout;
    if (!PyArg_ParseTuple(args, "OOnKd", &a, &b, &nbytes, &sig, &timeout))
        return NULL;
    TEAM(self);
    if (nbytes < 0)
        return raise_status(PT_ERR_INVALID);
    Py_buffer in, out;
    if (two_buffers(a, b, &in, &out, (size_t)nbytes, (size_t)nbytes * (size_t)self->n) < 0)
        return NULL;
    int who = -1;
    pt_status_t st;
    Py_BEGIN_ALLOW_THREADS
    st = pt_team_allgather(self->team, in.buf, out.buf, (size_t)nbytes, sig, timeout, &who);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&in);
    PyBuffer_Release(&out);
    return pt_py_none_or_raise(st, who);
}

static PyObject *Team_broadcast(TeamObject *self, PyObject *args)
{
    int root;
    PyObject *a;
    Py_ssize_t nbytes;
    unsigned long long sig;
    double timeout;
    if (!PyArg_ParseTuple(args, "iOnKd", &root, &a, &nbytes, &sig, &timeout))
        return NULL;
    TEAM(self);
    Py_buffer b;
    if (PyObject_GetBuffer(a, &b, PyBUF_WRITABLE) < 0)
        return NULL;
    if (nbytes < 0 || nbytes > b.len) {
        PyBuffer_Release(&b);
        PyErr_SetString(PyExc_ValueError, "buffer smaller than the count given");
        return NULL;
    }
    int who = -1;
    pt_status_t st;
    Py_BEGIN_ALLOW_THREADS
    st = pt_team_broadcast(self->team, root, b.buf, (size_t)nbytes, sig, timeout, &who);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&b);
    return pt_py_none_or_raise(st, who);
}

/* The engine's pt_team_t as an integer, for the FFI handler of collectives.jax, which holds
 * this object (and so the team) for as long as it uses the address. */
static PyObject *Team_handle(TeamObject *self, PyObject *unused)
{
    TEAM(self);
    return PyLong_FromVoidPtr(self->team);
}

static PyObject *Team_single_copy(TeamObject *self, PyObject *unused)
{
    TEAM(self);
    return PyLong_FromLong(pt_team_single_copy(self->team));
}

static PyMethodDef Team_methods[] = {
    {"single_copy", (PyCFunction)Team_single_copy, METH_NOARGS,
     "single_copy(): 1 when mid-sized allgathers read peers' memory directly (cross-memory "
     "attach), 0 when they go through the staging slots, -1 before the first such call"},
    {"handle", (PyCFunction)Team_handle, METH_NOARGS, "handle(): the native team's address"},
    {"barrier", (PyCFunction)Team_barrier, METH_VARARGS, "barrier(timeout)"},
    {"allreduce", (PyCFunction)Team_allreduce, METH_VARARGS,
     "allreduce(op, dtype, in, out, count, algo, sig, timeout)"},
    {"reduce_scatter", (PyCFunction)Team_reduce_scatter, METH_VARARGS,
     "reduce_scatter(op, dtype, in, out, count_each, sig, timeout); in holds n*count_each"},
    {"allgather", (PyCFunction)Team_allgather, METH_VARARGS,
     "allgather(in, out, nbytes_each, sig, timeout); out holds n*nbytes_each"},
    {"broadcast", (PyCFunction)Team_broadcast, METH_VARARGS,
     "broadcast(root_index, buffer, nbytes, sig, timeout)"},
    {NULL}};

static PyTypeObject TeamType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "collectives._native.Team",
    .tp_basicsize = sizeof(TeamObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Team(ctx, ranks, keys, slot_bytes, nslots): same-host collectives on staging memory.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Team_init,
    .tp_dealloc = (destructor)Team_dealloc,
    .tp_methods = Team_methods,
};

static PyObject *mod_stage_bytes(PyObject *m, PyObject *args)
{
    Py_ssize_t slot;
    int nslots;
    if (!PyArg_ParseTuple(args, "ni", &slot, &nslots))
        return NULL;
    return PyLong_FromSize_t(pt_team_stage_bytes((size_t)slot, nslots));
}

static PyObject *mod_prefault(PyObject *m, PyObject *arg)
{
    Py_buffer b;
    if (PyObject_GetBuffer(arg, &b, PyBUF_WRITABLE) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    pt_prefault(b.buf, (size_t)b.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&b);
    Py_RETURN_NONE;
}

static PyMethodDef team_functions[] = {
    {"prefault", mod_prefault, METH_O,
     "prefault(buffer): what the JAX handler does to a result of 1 MiB or more before the team "
     "call: map its pages unless its first and last are mapped (smaller: nothing)."},
    {"stage_bytes", mod_stage_bytes, METH_VARARGS,
     "stage_bytes(slot_bytes, nslots): staging each team member registers."},
    {NULL}};

static const pt_team_api_t team_api = {
    .version = PT_TEAM_API_VERSION,
    .barrier = pt_team_barrier,
    .allreduce = pt_team_allreduce,
    .allgather = pt_team_allgather,
    .reduce_scatter = pt_team_reduce_scatter,
    .broadcast = pt_team_broadcast,
    .dtype_size = pt_dtype_size,
    .prefault = pt_prefault,
};

int pt_py_add_team(PyObject *m)
{
    PyObject *api = PyCapsule_New((void *)&team_api, "collectives._native.team_api", NULL);
    int bad = !api || PyModule_AddObjectRef(m, "team_api", api) < 0;
    Py_XDECREF(api);
    if (bad)
        return -1;
    if (PyType_Ready(&TeamType) < 0 ||
        PyModule_AddObjectRef(m, "Team", (PyObject *)&TeamType) < 0)
        return -1;
    return PyModule_AddFunctions(m, team_functions);
}
