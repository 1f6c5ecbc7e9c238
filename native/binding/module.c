/* collectives._native: a thin binding over native/. Normalizes arguments, makes one native
 * call with the GIL released, and turns a status into _native.Error(status, errno, text). The
 * Python layer above turns that into the typed errors of collectives.errors. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include "pt.h"

int pt_py_add_kernels(PyObject *module);

static PyObject *Error;

static PyObject *raise_status(pt_status_t st)
{
    int err = st == PT_ERR_SYS ? pt_last_errno() : 0;
    PyObject *args = Py_BuildValue("(iis)", (int)st, err, pt_status_str(st));
    if (args) {
        PyErr_SetObject(Error, args);
        Py_DECREF(args);
    }
    return NULL;
}

/* ---------------- Segment ---------------- */

typedef struct {
    PyObject_HEAD
    pt_segment_t *seg;
    Py_ssize_t exports;
} SegmentObject;

static int Segment_init(SegmentObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"nbytes", NULL};
    Py_ssize_t n;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "n", kwlist, &n))
        return -1;
    if (n <= 0) {
        PyErr_SetString(PyExc_ValueError, "segment size must be positive");
        return -1;
    }
    if (self->seg) {
        PyErr_SetString(PyExc_RuntimeError, "segment already created");
        return -1;
    }
    pt_status_t st;
    Py_BEGIN_ALLOW_THREADS
    st = pt_segment_create((size_t)n, &self->seg);
    Py_END_ALLOW_THREADS
    if (st != PT_OK) {
        if (st == PT_ERR_NOMEM)
            PyErr_NoMemory();
        else
            raise_status(st);
        return -1;
    }
    return 0;
}

static void Segment_dealloc(SegmentObject *self)
{
    pt_segment_destroy(self->seg);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int Segment_getbuffer(SegmentObject *self, Py_buffer *view, int flags)
{
    if (!self->seg) {
        PyErr_SetString(PyExc_ValueError, "segment not created");
        return -1;
    }
    int rc = PyBuffer_FillInfo(view, (PyObject *)self, pt_segment_base(self->seg),
                               (Py_ssize_t)pt_segment_len(self->seg), 0, flags);
    if (rc == 0)
        self->exports++;
    return rc;
}

static void Segment_releasebuffer(SegmentObject *self, Py_buffer *view) { self->exports--; }

static PyObject *Segment_get_nbytes(SegmentObject *self, void *c)
{
    return PyLong_FromSize_t(self->seg ? pt_segment_len(self->seg) : 0);
}

static PyObject *Segment_get_address(SegmentObject *self, void *c)
{
    return PyLong_FromVoidPtr(self->seg ? pt_segment_base(self->seg) : NULL);
}

static PyObject *Segment_get_fd(SegmentObject *self, void *c)
{
    return PyLong_FromLong(self->seg ? pt_segment_fd(self->seg) : -1);
}

static PyGetSetDef Segment_getset[] = {
    {"nbytes", (getter)Segment_get_nbytes, NULL, "size in bytes (whole pages)", NULL},
    {"address", (getter)Segment_get_address, NULL, "base address in this process", NULL},
    {"fd", (getter)Segment_get_fd, NULL, "memfd through which same-host peers map it", NULL},
    {NULL}};

static PyBufferProcs Segment_as_buffer = {(getbufferproc)Segment_getbuffer,
                                          (releasebufferproc)Segment_releasebuffer};

static PyTypeObject SegmentType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "collectives._native.Segment",
    .tp_basicsize = sizeof(SegmentObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Segment(nbytes): page-aligned shared memory that same-host peers can map.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Segment_init,
    .tp_dealloc = (destructor)Segment_dealloc,
    .tp_as_buffer = &Segment_as_buffer,
    .tp_getset = Segment_getset,
};

/* ---------------- Request ---------------- */

typedef struct {
    PyObject_HEAD
    pt_req_t *req;
    Py_buffer buf;      /* held until the request is done */
    int has_buf;
    int finished;
    pt_status_t status;
} RequestObject;

static PyTypeObject RequestType;

static void Request_finish(RequestObject *self, pt_status_t st)
{
    self->finished = 1;
    self->status = st;
    pt_req_release(self->req);
    self->req = NULL;
    if (self->has_buf) {
        PyBuffer_Release(&self->buf);
        self->has_buf = 0;
    }
}

static PyObject *Request_wait(RequestObject *self, PyObject *args)
{
    double timeout = -1;
    PyObject *t = Py_None;
    if (!PyArg_ParseTuple(args, "|O", &t))
        return NULL;
    if (t != Py_None && (timeout = PyFloat_AsDouble(t)) < 0 && PyErr_Occurred())
        return NULL;
    if (!self->finished) {
        pt_status_t st, fin;
        int done;
        Py_BEGIN_ALLOW_THREADS
        st = pt_req_wait(self->req, timeout);
        done = pt_req_test(self->req, &fin);
        Py_END_ALLOW_THREADS
        if (!done)
            return raise_status(st);
        Request_finish(self, fin);
    }
    if (self->status != PT_OK)
        return raise_status(self->status);
    Py_RETURN_NONE;
}

static PyObject *Request_test(RequestObject *self, PyObject *unused)
{
    if (!self->finished) {
        pt_status_t st;
        if (!pt_req_test(self->req, &st))
            Py_RETURN_FALSE;
        Request_finish(self, st);
    }
    if (self->status != PT_OK)
        return raise_status(self->status);
    Py_RETURN_TRUE;
}

static void Request_dealloc(RequestObject *self)
{
    if (!self->finished && self->req) {
        /* The buffer must outlive the transfer: wait for it before letting go. */
        pt_status_t st = PT_OK;
        Py_BEGIN_ALLOW_THREADS
        pt_req_wait(self->req, -1);
        pt_req_test(self->req, &st);
        Py_END_ALLOW_THREADS
        Request_finish(self, st);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef Request_methods[] = {
    {"wait", (PyCFunction)Request_wait, METH_VARARGS,
     "wait(timeout=None): block until done; raises on the operation's error or on timeout."},
    {"test", (PyCFunction)Request_test, METH_NOARGS, "test() -> bool: done yet (raises on error)."},
    {NULL}};

static PyTypeObject RequestType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "collectives._native.Request",
    .tp_basicsize = sizeof(RequestObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "An asynchronous get or put in flight.",
    .tp_dealloc = (destructor)Request_dealloc,
    .tp_methods = Request_methods,
};

/* ---------------- Context ---------------- */

typedef struct {
    PyObject_HEAD
    pt_ctx_t *ctx;
} ContextObject;

static int Context_init(ContextObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"rank", "size", "threads", NULL};
    int rank, size, threads = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "ii|i", kwlist, &rank, &size, &threads))
        return -1;
    if (self->ctx) {
        PyErr_SetString(PyExc_RuntimeError, "context already created");
        return -1;
    }
    pt_status_t st;
    Py_BEGIN_ALLOW_THREADS
    st = pt_ctx_create(rank, size, threads, &self->ctx);
    Py_END_ALLOW_THREADS
    if (st != PT_OK) {
        raise_status(st);
        return -1;
    }
    return 0;
}

static void Context_dealloc(ContextObject *self)
{
    if (self->ctx) {
        Py_BEGIN_ALLOW_THREADS
        pt_ctx_destroy(self->ctx);
        Py_END_ALLOW_THREADS
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

#define CTX(self)                                                                   \
    do {                                                                            \
        if (!(self)->ctx) {                                                         \
            PyErr_SetString(PyExc_ValueError, "context is closed");                 \
            return NULL;                                                            \
        }                                                                           \
    } while (0)

static PyObject *Context_close(ContextObject *self, PyObject *unused)
{
    if (self->ctx) {
        pt_ctx_t *c = self->ctx;
        self->ctx = NULL;
        Py_BEGIN_ALLOW_THREADS
        pt_ctx_destroy(c);
        Py_END_ALLOW_THREADS
    }
    Py_RETURN_NONE;
}

static PyObject *Context_addr(ContextObject *self, PyObject *unused)
{
    CTX(self);
    pt_addr_t a;
    pt_ctx_addr(self->ctx, &a);
    return Py_BuildValue("(iiK)", a.pid, a.ctrl_fd, (unsigned long long)a.ctrl_len);
}

static PyObject *Context_connect(ContextObject *self, PyObject *args)
{
    int rank;
    pt_addr_t a;
    unsigned long long len;
    if (!PyArg_ParseTuple(args, "i(iiK)", &rank, &a.pid, &a.ctrl_fd, &len))
        return NULL;
    CTX(self);
    a.ctrl_len = len;
    pt_status_t st = pt_ctx_connect(self->ctx, rank, &a);
    if (st != PT_OK)
        return raise_status(st);
    Py_RETURN_NONE;
}

static PyObject *Context_peer_lost(ContextObject *self, PyObject *args)
{
    int rank;
    if (!PyArg_ParseTuple(args, "i", &rank))
        return NULL;
    CTX(self);
    return PyBool_FromLong(pt_ctx_peer_lost(self->ctx, rank));
}

static PyObject *Context_barrier(ContextObject *self, PyObject *args)
{
    int root;
    PyObject *ranks;
    double timeout;
    if (!PyArg_ParseTuple(args, "iOd", &root, &ranks, &timeout))
        return NULL;
    CTX(self);
    PyObject *seq = PySequence_Fast(ranks, "ranks must be a sequence");
    if (!seq)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    int *r = PyMem_Malloc(sizeof(int) * (size_t)(n ? n : 1));
    if (!r) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++)
        r[i] = (int)PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, i));
    Py_DECREF(seq);
    if (PyErr_Occurred()) {
        PyMem_Free(r);
        return NULL;
    }
    pt_status_t st;
    Py_BEGIN_ALLOW_THREADS
    st = pt_ctx_barrier(self->ctx, root, r, (int)n, timeout);
    Py_END_ALLOW_THREADS
    PyMem_Free(r);
    if (st != PT_OK)
        return raise_status(st);
    Py_RETURN_NONE;
}

static PyObject *Context_add_segment(ContextObject *self, PyObject *args)
{
    SegmentObject *seg;
    if (!PyArg_ParseTuple(args, "O!", &SegmentType, &seg))
        return NULL;
    CTX(self);
    pt_status_t st = pt_ctx_add_segment(self->ctx, seg->seg);
    if (st != PT_OK)
        return raise_status(st);
    Py_RETURN_NONE;
}

static PyObject *Context_remove_segment(ContextObject *self, PyObject *args)
{
    SegmentObject *seg;
    if (!PyArg_ParseTuple(args, "O!", &SegmentType, &seg))
        return NULL;
    CTX(self);
    pt_status_t st = pt_ctx_remove_segment(self->ctx, seg->seg);
    if (st != PT_OK)
        return raise_status(st);
    Py_RETURN_NONE;
}

static PyObject *Context_register(ContextObject *self, PyObject *args)
{
    Py_buffer b;
    int access;
    if (!PyArg_ParseTuple(args, "y*i", &b, &access))
        return NULL;
    if (!self->ctx) {
        PyBuffer_Release(&b);
        PyErr_SetString(PyExc_ValueError, "context is closed");
        return NULL;
    }
    uint64_t key;
    pt_status_t st = pt_ctx_register(self->ctx, b.buf, (size_t)b.len, access, &key);
    PyBuffer_Release(&b);
    if (st != PT_OK)
        return raise_status(st);
    return PyLong_FromUnsignedLongLong(key);
}

static PyObject *Context_deregister(ContextObject *self, PyObject *args)
{
    unsigned long long key;
    if (!PyArg_ParseTuple(args, "K", &key))
        return NULL;
    CTX(self);
    pt_status_t st = pt_ctx_deregister(self->ctx, key);
    if (st != PT_OK)
        return raise_status(st);
    Py_RETURN_NONE;
}

/* Transfers below this many bytes run with the GIL held: releasing it costs more. */
#define PT_GIL_THRESHOLD 8192

static PyObject *Context_get(ContextObject *self, PyObject *args)
{
    int rank;
    unsigned long long key, off;
    Py_buffer b;
    if (!PyArg_ParseTuple(args, "iKKw*", &rank, &key, &off, &b))
        return NULL;
    pt_status_t st = PT_ERR_CLOSED;
    if (self->ctx) {
        if (b.len < PT_GIL_THRESHOLD) {
            st = pt_get(self->ctx, rank, key, off, b.buf, (size_t)b.len);
        } else {
            Py_BEGIN_ALLOW_THREADS
            st = pt_get(self->ctx, rank, key, off, b.buf, (size_t)b.len);
            Py_END_ALLOW_THREADS
        }
    }
    PyBuffer_Release(&b);
    if (st != PT_OK)
        return raise_status(st);
    Py_RETURN_NONE;
}

static PyObject *Context_put(ContextObject *self, PyObject *args)
{
    int rank;
    unsigned long long key, off;
    Py_buffer b;
    if (!PyArg_ParseTuple(args, "iKKy*", &rank, &key, &off, &b))
        return NULL;
    pt_status_t st = PT_ERR_CLOSED;
    if (self->ctx) {
        if (b.len < PT_GIL_THRESHOLD) {
            st = pt_put(self->ctx, rank, key, off, b.buf, (size_t)b.len);
        } else {
            Py_BEGIN_ALLOW_THREADS
            st = pt_put(self->ctx, rank, key, off, b.buf, (size_t)b.len);
            Py_END_ALLOW_THREADS
        }
    }
    PyBuffer_Release(&b);
    if (st != PT_OK)
        return raise_status(st);
    Py_RETURN_NONE;
}

static PyObject *submit_async(ContextObject *self, PyObject *args, int is_put)
{
    int rank;
    unsigned long long key, off;
    RequestObject *r = PyObject_New(RequestObject, &RequestType);
    if (!r)
        return NULL;
    r->req = NULL;
    r->has_buf = 0;
    r->finished = 1;
    r->status = PT_OK;
    if (!PyArg_ParseTuple(args, is_put ? "iKKy*" : "iKKw*", &rank, &key, &off, &r->buf)) {
        Py_DECREF(r);
        return NULL;
    }
    r->has_buf = 1;
    if (!self->ctx) {
        Py_DECREF(r);
        PyErr_SetString(PyExc_ValueError, "context is closed");
        return NULL;
    }
    pt_status_t st = is_put ? pt_put_async(self->ctx, rank, key, off, r->buf.buf,
                                           (size_t)r->buf.len, &r->req)
                            : pt_get_async(self->ctx, rank, key, off, r->buf.buf,
                                           (size_t)r->buf.len, &r->req);
    if (st != PT_OK) {
        Py_DECREF(r);
        return raise_status(st);
    }
    r->finished = 0;
    return (PyObject *)r;
}

static PyObject *Context_get_async(ContextObject *self, PyObject *args)
{
    return submit_async(self, args, 0);
}

static PyObject *Context_put_async(ContextObject *self, PyObject *args)
{
    return submit_async(self, args, 1);
}

static PyObject *Context_fetch_add(ContextObject *self, PyObject *args)
{
    int rank;
    unsigned long long key, off;
    long long v;
    if (!PyArg_ParseTuple(args, "iKKL", &rank, &key, &off, &v))
        return NULL;
    CTX(self);
    int64_t old;
    pt_status_t st = pt_fetch_add(self->ctx, rank, key, off, v, &old);
    if (st != PT_OK)
        return raise_status(st);
    return PyLong_FromLongLong(old);
}

static PyObject *Context_compare_swap(ContextObject *self, PyObject *args)
{
    int rank;
    unsigned long long key, off;
    long long e, d;
    if (!PyArg_ParseTuple(args, "iKKLL", &rank, &key, &off, &e, &d))
        return NULL;
    CTX(self);
    int64_t old;
    pt_status_t st = pt_compare_swap(self->ctx, rank, key, off, e, d, &old);
    if (st != PT_OK)
        return raise_status(st);
    return PyLong_FromLongLong(old);
}

static PyMethodDef Context_methods[] = {
    {"close", (PyCFunction)Context_close, METH_NOARGS, "Stop threads and unmap every peer."},
    {"addr", (PyCFunction)Context_addr, METH_NOARGS, "(pid, ctrl_fd, ctrl_len) for peers."},
    {"connect", (PyCFunction)Context_connect, METH_VARARGS, "connect(rank, addr): map a peer."},
    {"peer_lost", (PyCFunction)Context_peer_lost, METH_VARARGS, "peer_lost(rank) -> bool"},
    {"barrier", (PyCFunction)Context_barrier, METH_VARARGS,
     "barrier(root, ranks, timeout): same-host barrier on root's control block."},
    {"add_segment", (PyCFunction)Context_add_segment, METH_VARARGS, "Serve a segment directly."},
    {"remove_segment", (PyCFunction)Context_remove_segment, METH_VARARGS,
     "Stop serving a segment (its registrations end)."},
    {"register", (PyCFunction)Context_register, METH_VARARGS,
     "register(buffer, access) -> key; access 1 = r, 3 = rw."},
    {"deregister", (PyCFunction)Context_deregister, METH_VARARGS, "deregister(key)"},
    {"get", (PyCFunction)Context_get, METH_VARARGS, "get(rank, key, offset, out)"},
    {"put", (PyCFunction)Context_put, METH_VARARGS, "put(rank, key, offset, data)"},
    {"get_async", (PyCFunction)Context_get_async, METH_VARARGS,
     "get_async(rank, key, offset, out) -> Request"},
    {"put_async", (PyCFunction)Context_put_async, METH_VARARGS,
     "put_async(rank, key, offset, data) -> Request"},
    {"fetch_add", (PyCFunction)Context_fetch_add, METH_VARARGS,
     "fetch_add(rank, key, offset, value) -> old int64"},
    {"compare_swap", (PyCFunction)Context_compare_swap, METH_VARARGS,
     "compare_swap(rank, key, offset, expected, new) -> old int64"},
    {NULL}};

static PyTypeObject ContextType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "collectives._native.Context",
    .tp_basicsize = sizeof(ContextObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Context(rank, size, threads=1): this process's endpoint in the native engine.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Context_init,
    .tp_dealloc = (destructor)Context_dealloc,
    .tp_methods = Context_methods,
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT,
    .m_name = "collectives._native",
    .m_doc = "The native data path of collectives: segments, one-sided transfers, kernels.",
    .m_size = -1};

PyMODINIT_FUNC PyInit__native(void)
{
    if (PyType_Ready(&SegmentType) < 0 || PyType_Ready(&RequestType) < 0 ||
        PyType_Ready(&ContextType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (!m)
        return NULL;
    Error = PyErr_NewExceptionWithDoc("collectives._native.Error",
                                      "A native status: args are (status, errno, text).", NULL,
                                      NULL);
    if (!Error || PyModule_AddObjectRef(m, "Error", Error) < 0 ||
        PyModule_AddObjectRef(m, "Segment", (PyObject *)&SegmentType) < 0 ||
        PyModule_AddObjectRef(m, "Request", (PyObject *)&RequestType) < 0 ||
        PyModule_AddObjectRef(m, "Context", (PyObject *)&ContextType) < 0 ||
        pt_py_add_kernels(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    static const char *names[] = {"OK", "ERR_INVALID", "ERR_NOMEM", "ERR_SYS", "ERR_KEY",
                                  "ERR_BOUNDS", "ERR_MODE", "ERR_ALIGN", "ERR_UNSUPPORTED",
                                  "ERR_TIMEOUT", "ERR_PEER_LOST", "ERR_CLOSED"};
    for (int i = 0; i < (int)(sizeof(names) / sizeof(names[0])); i++)
        if (PyModule_AddIntConstant(m, names[i], i) < 0) {
            Py_DECREF(m);
            return NULL;
        }
    return m;
}
