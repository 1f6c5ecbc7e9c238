/* The Channel binding: the window channel's one-exchange allreduce
 * (native/src/channel/direct.c), the GIL let go around each call. The object holds the
 * context, the window's buffer and the five state arrays the Python channel shares with it. */
#include "binding.h"
#include "transport/tcp/tcp_proto.h"

typedef struct {
    PyObject_HEAD
    pt_chan_t *chan;
    PyObject *ctx;          /* keeps the context alive */
    Py_buffer win;
    Py_buffer state[5];
    int nstate;
} ChannelObject;

static int u64s(PyObject *seq, uint64_t *out, Py_ssize_t n, const char *what)
{
    PyObject *f = PySequence_Fast(seq, what);
    if (!f)
        return -1;
    int rc = 0;
    if (PySequence_Fast_GET_SIZE(f) != n) {
        PyErr_Format(PyExc_ValueError, "%s: expected %zd values", what, n);
        rc = -1;
    }
    for (Py_ssize_t i = 0; rc == 0 && i < n; i++)
        rc = pt_py_u64(PySequence_Fast_GET_ITEM(f, i), &out[i]) ? 0 : -1;
    Py_DECREF(f);
    return rc;
}

static int Channel_init(ChannelObject *self, PyObject *args, PyObject *kw)
{
    ContextObject *ctx;
    PyObject *winobj, *keys, *bout, *bin, *state;
    int me, n, nslots;
    unsigned long long stride;
    if (!PyArg_ParseTuple(args, "O!iiOOOOiKO", &ContextType, &ctx, &me, &n, &winobj, &keys,
                          &bout, &bin, &nslots, &stride, &state))
        return -1;
    if (!ctx->ctx) {
        pt_py_closed();
        return -1;
    }
    if (n < 1 || PySequence_Length(state) != 5) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "Channel: n >= 1 and five state arrays");
        return -1;
    }
    if (self->chan)
        return 0;
    uint64_t *v = PyMem_Malloc(3 * sizeof(uint64_t) * (size_t)n);
    int rc = -1;
    if (!v) {
        PyErr_NoMemory();
        return -1;
    }
    if (u64s(keys, v, n, "keys") < 0 || u64s(bout, v + n, n, "base_out") < 0 ||
        u64s(bin, v + 2 * n, n, "base_in") < 0)
        goto out;
    if (PyObject_GetBuffer(winobj, &self->win, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
        goto out;
    int64_t *arrays[5];
    for (self->nstate = 0; self->nstate < 5; self->nstate++) {
        PyObject *a = PySequence_GetItem(state, self->nstate);
        int bad = !a || PyObject_GetBuffer(a, &self->state[self->nstate],
                                           PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0;
        Py_XDECREF(a);
        if (bad)
            goto out;
        Py_buffer *b = &self->state[self->nstate];
        if (b->len != 8 * (Py_ssize_t)n || ((uintptr_t)b->buf & 7)) {
            self->nstate++;
            PyErr_SetString(PyExc_ValueError, "Channel: each state array is n aligned int64");
            goto out;
        }
        arrays[self->nstate] = b->buf;
    }
    pt_status_t st = pt_chan_create(ctx->ctx, me, n, self->win.buf, (size_t)self->win.len, v,
                                    v + n, v + 2 * n, nslots, stride, arrays, &self->chan);
    if (st != PT_OK) {
        raise_status(st);
        goto out;
    }
    Py_INCREF(ctx);
    self->ctx = (PyObject *)ctx;
    rc = 0;
out:
    PyMem_Free(v);
    return rc;
}

static void Channel_dealloc(ChannelObject *self)
{
    pt_chan_destroy(self->chan);
    while (self->nstate > 0)
        PyBuffer_Release(&self->state[--self->nstate]);
    if (self->win.obj)
        PyBuffer_Release(&self->win);
    Py_XDECREF(self->ctx);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* allreduce(group, seq, algo, sig, op, dtype, src, dst, wait) -> PT_CHAN_* code; a failed
 * send or notify raises _native.Error whose fourth argument is the peer. */
static PyObject *Channel_allreduce(ChannelObject *self, PyObject *args)
{
    unsigned long long tag[4];
    int op, dtype;
    Py_buffer src, dst;
    double wait;
    if (!PyArg_ParseTuple(args, "KKKKiiy*w*d", &tag[0], &tag[1], &tag[2], &tag[3], &op, &dtype,
                          &src, &dst, &wait))
        return NULL;
    int rc = -PT_ERR_INVALID, peer = -1;
    if (!self->chan || !((ContextObject *)self->ctx)->ctx) {
        PyBuffer_Release(&src);
        PyBuffer_Release(&dst);
        return pt_py_closed();
    }
    if (src.len == dst.len && op >= 0 && op < PT_NOPS && dtype >= 0 && dtype < PT_NDTYPES) {
        uint64_t t[4] = {tag[0], tag[1], tag[2], tag[3]};
        Py_BEGIN_ALLOW_THREADS
        rc = pt_chan_allreduce(self->chan, t, (pt_op_t)op, (pt_dtype_t)dtype, src.buf, dst.buf,
                               (size_t)src.len, wait, &peer);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    if (rc < 0)
        return pt_py_raise((pt_status_t)-rc, peer);
    return PyLong_FromLong(rc);
}

static PyObject *Channel_counts(ChannelObject *self, PyObject *unused)
{
    uint64_t c[3] = {0, 0, 0};
    if (self->chan)
        pt_chan_counts(self->chan, c);
    return Py_BuildValue("{sKsKsK}", "done", (unsigned long long)c[0], "sent",
                         (unsigned long long)c[1], "unsent", (unsigned long long)c[2]);
}

static PyMethodDef Channel_methods[] = {
    {"allreduce", (PyCFunction)Channel_allreduce, METH_VARARGS,
     "allreduce(group, seq, algo, sig, op, dtype, src, dst, wait) -> 0 done, 1 sent (the "
     "receives are the caller's), 2 nothing done (a slot not free)."},
    {"counts", (PyCFunction)Channel_counts, METH_NOARGS,
     "counts() -> {'done', 'sent', 'unsent'}: how the calls so far ended."},
    {NULL}};

PyTypeObject pt_py_ChannelType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "collectives._native.Channel",
    .tp_basicsize = sizeof(ChannelObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Channel(ctx, me, n, window, keys, base_out, base_in, nslots, stride, state): "
              "the window channel's one-exchange allreduce over its window.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Channel_init,
    .tp_dealloc = (destructor)Channel_dealloc,
    .tp_methods = Channel_methods,
};

int pt_py_add_channel(PyObject *m)
{
    if (PyModule_AddObjectRef(m, "Channel", (PyObject *)&pt_py_ChannelType) < 0)
        return -1;
    if (PyModule_AddIntConstant(m, "TCP_FRAME", PT_TCP_CHUNK) < 0)
        return -1;
    if (PyModule_AddIntConstant(m, "TCP_QUICKACK_MIN", PT_TCP_QUICKACK_MIN) < 0)
        return -1;
    return PyModule_AddIntConstant(m, "TCP_QUIET_FRAME", PT_TCP_QUIET_FRAME);
}
