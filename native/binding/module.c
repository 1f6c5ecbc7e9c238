/* collectives._native: a thin binding over native/. Normalizes arguments, makes one native
 * call with the GIL released, and turns a status into _native.Error(status, errno, text). The
 * Python layer above turns that into the typed errors of collectives.errors. */
#include "binding.h"

int pt_py_u64(PyObject *obj, void *out)
{
    PyObject *i = PyNumber_Index(obj);
    if (!i)
        return 0;
    unsigned long long v = PyLong_AsUnsignedLongLong(i);
    Py_DECREF(i);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_OverflowError, "%R is out of range for an offset or key "
                         "(0 <= value < 2**64)", obj);
        }
        return 0;
    }
    *(unsigned long long *)out = v;
    return 1;
}

static PyObject *Error;

PyObject *pt_py_raise(pt_status_t st, int who)
{
    int err = st == PT_ERR_SYS ? pt_last_errno() : 0;
    PyObject *args = Py_BuildValue("(iisi)", (int)st, err, pt_status_str(st), who);
    if (args) {
        PyErr_SetObject(Error, args);
        Py_DECREF(args);
    }
    return NULL;
}

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
    .tp_doc = "An asynchronous get, put or notify in flight.",
    .tp_dealloc = (destructor)Request_dealloc,
    .tp_methods = Request_methods,
};

/* ---------------- Context ---------------- */


/* A buffer over memory mapped from a peer: keeps its Context (and so the mapping) alive. */
typedef struct {
    PyObject_HEAD
    ContextObject *ctx;
    void *ptr;
    Py_ssize_t len;
    int readonly;
} AttachmentObject;

static void Attachment_dealloc(AttachmentObject *self)
{
    if (self->ctx) {
        self->ctx->attachments--;
        Py_DECREF(self->ctx);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int Attachment_getbuffer(AttachmentObject *self, Py_buffer *view, int flags)
{
    return PyBuffer_FillInfo(view, (PyObject *)self, self->ptr, self->len, self->readonly, flags);
}

static PyBufferProcs Attachment_as_buffer = {(getbufferproc)Attachment_getbuffer, NULL};

static PyTypeObject AttachmentType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "collectives._native.Attachment",
    .tp_basicsize = sizeof(AttachmentObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Memory of a peer mapped into this process (from Context.attach).",
    .tp_dealloc = (destructor)Attachment_dealloc,
    .tp_as_buffer = &Attachment_as_buffer,
};

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
    pt_ctx_t *c = self->ctx ? self->ctx : self->zombie;
    if (c) {
        Py_BEGIN_ALLOW_THREADS
        pt_ctx_destroy(c);
        Py_END_ALLOW_THREADS
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Context_close(ContextObject *self, PyObject *unused)
{
    if (self->ctx && self->attachments > 0) {
        /* peers' memory is still mapped under live buffers: unmap when the last one goes */
        self->zombie = self->ctx;
        self->ctx = NULL;
    } else if (self->ctx) {
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
    return pt_py_none_or_raise(st, -1);
}

static PyObject *Context_connected_all(ContextObject *self, PyObject *unused)
{
    CTX(self);
    return pt_py_none_or_raise(pt_ctx_connected_all(self->ctx), -1);
}

static PyObject *Context_peer_lost(ContextObject *self, PyObject *args)
{
    int rank;
    if (!PyArg_ParseTuple(args, "i", &rank))
        return NULL;
    CTX(self);
    return PyBool_FromLong(pt_ctx_peer_lost(self->ctx, rank));
}

static PyObject *Context_first_lost(ContextObject *self, PyObject *unused)
{
    CTX(self);
    return PyLong_FromLong(pt_ctx_first_lost(self->ctx));
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
    return pt_py_none_or_raise(st, -1);
}

static PyObject *Context_add_segment(ContextObject *self, PyObject *args)
{
    PyObject *obj;
    if (!PyArg_ParseTuple(args, "O!", &pt_py_SegmentType, &obj))
        return NULL;
    CTX(self);
    pt_status_t st = pt_ctx_add_segment(self->ctx, pt_py_segment(obj));
    return pt_py_none_or_raise(st, -1);
}

static PyObject *Context_remove_segment(ContextObject *self, PyObject *args)
{
    PyObject *obj;
    if (!PyArg_ParseTuple(args, "O!", &pt_py_SegmentType, &obj))
        return NULL;
    CTX(self);
    pt_status_t st;
    pt_segment_t *seg = pt_py_segment(obj);
    /* waits for tcp requests still being served from the segment: without the GIL */
    Py_BEGIN_ALLOW_THREADS
    st = pt_ctx_remove_segment(self->ctx, seg);
    Py_END_ALLOW_THREADS
    return pt_py_none_or_raise(st, -1);
}

static PyObject *Context_register(ContextObject *self, PyObject *args)
{
    Py_buffer b;
    int access;
    if (!PyArg_ParseTuple(args, "y*i", &b, &access))
        return NULL;
    if (!self->ctx) {
        PyBuffer_Release(&b);
        return pt_py_closed();
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
    if (!PyArg_ParseTuple(args, "O&", pt_py_u64, &key))
        return NULL;
    CTX(self);
    pt_status_t st;
    Py_BEGIN_ALLOW_THREADS            /* may wait for tcp requests in progress on it */
    st = pt_ctx_deregister(self->ctx, key);
    Py_END_ALLOW_THREADS
    return pt_py_none_or_raise(st, -1);
}

static PyObject *Context_limit(ContextObject *self, PyObject *args)
{
    unsigned long long key, len;
    if (!PyArg_ParseTuple(args, "O&O&", pt_py_u64, &key, pt_py_u64, &len))
        return NULL;
    CTX(self);
    pt_status_t st;
    Py_BEGIN_ALLOW_THREADS            /* may wait for tcp requests in progress on it */
    st = pt_ctx_limit(self->ctx, key, (size_t)len);
    Py_END_ALLOW_THREADS
    return pt_py_none_or_raise(st, -1);
}

/* Transfers below this many bytes run with the GIL held: releasing it costs more. Not so
 * for a peer over tcp: the call waits on the network. */
#define PT_GIL_THRESHOLD 8192
#define HOLD_GIL(c, rank, len) ((len) < PT_GIL_THRESHOLD && pt_ctx_transport((c), (rank)) != 2)

/* Runs CALL (which sets st) with the GIL held for a small transfer to a same-host peer,
 * released otherwise. */
#define CALL_MAYBE_RELEASED(c, rank, len, CALL)                                     \
    do {                                                                            \
        if (HOLD_GIL((c), (rank), (len))) {                                         \
            CALL;                                                                   \
        } else {                                                                    \
            Py_BEGIN_ALLOW_THREADS                                                  \
            CALL;                                                                   \
            Py_END_ALLOW_THREADS                                                    \
        }                                                                           \
    } while (0)

/* get (into a writable buffer) and put (from a readable one): the same call either way. */
static PyObject *transfer(ContextObject *self, PyObject *args, int is_put)
{
    int rank;
    unsigned long long key, off;
    Py_buffer b;
    if (!PyArg_ParseTuple(args, is_put ? "iO&O&y*" : "iO&O&w*", &rank, pt_py_u64, &key,
                          pt_py_u64, &off, &b))
        return NULL;
    pt_status_t st = PT_ERR_CLOSED;
    pt_ctx_t *c = self->ctx;
    if (c)
        CALL_MAYBE_RELEASED(c, rank, b.len,
                            st = is_put ? pt_put(c, rank, key, off, b.buf, (size_t)b.len)
                                        : pt_get(c, rank, key, off, b.buf, (size_t)b.len));
    PyBuffer_Release(&b);
    return pt_py_none_or_raise(st, -1);
}

static PyObject *Context_get(ContextObject *self, PyObject *args)
{
    return transfer(self, args, 0);
}

static PyObject *Context_put(ContextObject *self, PyObject *args)
{
    return transfer(self, args, 1);
}

/* A Request with nothing in flight yet (finished, so dealloc waits for nothing). */
static RequestObject *new_request(void)
{
    RequestObject *r = PyObject_New(RequestObject, &RequestType);
    if (!r)
        return NULL;
    r->req = NULL;
    r->has_buf = 0;
    r->finished = 1;
    r->status = PT_OK;
    return r;
}

/* r once its submit returned st: in flight, or dropped with the status raised. */
static PyObject *request_started(RequestObject *r, pt_status_t st)
{
    if (st != PT_OK) {
        Py_DECREF(r);
        return raise_status(st);
    }
    r->finished = 0;
    return (PyObject *)r;
}

static PyObject *submit_async(ContextObject *self, PyObject *args, int is_put)
{
    int rank;
    unsigned long long key, off;
    RequestObject *r = new_request();
    if (!r)
        return NULL;
    if (!PyArg_ParseTuple(args, is_put ? "iO&O&y*" : "iO&O&w*", &rank, pt_py_u64, &key,
                          pt_py_u64, &off, &r->buf)) {
        Py_DECREF(r);
        return NULL;
    }
    r->has_buf = 1;
    if (!self->ctx) {
        Py_DECREF(r);
        return pt_py_closed();
    }
    pt_ctx_t *c = self->ctx;
    pt_status_t st;
    /* over tcp a submit may make the connection or wait for a free slot */
    int slow = pt_ctx_transport(c, rank) == 2;
    PyThreadState *ts = slow ? PyEval_SaveThread() : NULL;
    st = is_put ? pt_put_async(c, rank, key, off, r->buf.buf, (size_t)r->buf.len, &r->req)
                : pt_get_async(c, rank, key, off, r->buf.buf, (size_t)r->buf.len, &r->req);
    if (ts)
        PyEval_RestoreThread(ts);
    return request_started(r, st);
}

static PyObject *Context_get_async(ContextObject *self, PyObject *args)
{
    return submit_async(self, args, 0);
}

static PyObject *Context_put_async(ContextObject *self, PyObject *args)
{
    return submit_async(self, args, 1);
}

/* fetch_add (add a) and compare_swap (a expected, b new): an int64 atomic, its old value back. */
static PyObject *atomic_op(ContextObject *self, PyObject *args, int cas)
{
    int rank;
    unsigned long long key, off;
    long long a, b = 0;
    if (!PyArg_ParseTuple(args, cas ? "iO&O&LL" : "iO&O&L", &rank, pt_py_u64, &key, pt_py_u64,
                          &off, &a, &b))
        return NULL;
    CTX(self);
    int64_t old;
    pt_status_t st;
    pt_ctx_t *c = self->ctx;
    CALL_MAYBE_RELEASED(c, rank, 0,
                        st = cas ? pt_compare_swap(c, rank, key, off, a, b, &old)
                                 : pt_fetch_add(c, rank, key, off, a, &old));
    if (st != PT_OK)
        return raise_status(st);
    return PyLong_FromLongLong(old);
}

static PyObject *Context_fetch_add(ContextObject *self, PyObject *args)
{
    return atomic_op(self, args, 0);
}

static PyObject *Context_compare_swap(ContextObject *self, PyObject *args)
{
    return atomic_op(self, args, 1);
}

static PyObject *Context_attach(ContextObject *self, PyObject *args)
{
    int rank, write;
    unsigned long long key, off;
    Py_ssize_t len;
    if (!PyArg_ParseTuple(args, "iO&O&np", &rank, pt_py_u64, &key, pt_py_u64, &off, &len,
                          &write))
        return NULL;
    CTX(self);
    if (len < 0)
        return raise_status(PT_ERR_INVALID);
    void *p;
    pt_status_t st = pt_attach(self->ctx, rank, key, off, (size_t)len, write, &p);
    if (st != PT_OK)
        return raise_status(st);
    AttachmentObject *a = PyObject_New(AttachmentObject, &AttachmentType);
    if (!a)
        return NULL;
    Py_INCREF(self);
    a->ctx = self;
    a->ptr = p;
    a->len = len;
    a->readonly = !write;
    self->attachments++;
    return (PyObject *)a;
}

static PyObject *Context_put_indexed(ContextObject *self, PyObject *args)
{
    int rank;
    unsigned long long key;
    Py_ssize_t itemsize;
    Py_buffer offs, src;
    if (!PyArg_ParseTuple(args, "iO&y*ny*", &rank, pt_py_u64, &key, &offs, &itemsize, &src))
        return NULL;
    pt_status_t st = PT_ERR_CLOSED;
    size_t n = (size_t)offs.len / 8;
    if (itemsize <= 0 || offs.len % 8 || (size_t)src.len < n * (size_t)itemsize) {
        PyBuffer_Release(&offs);
        PyBuffer_Release(&src);
        PyErr_SetString(PyExc_ValueError, "put_indexed: offsets must be uint64 and data hold "
                                          "one item per offset");
        return NULL;
    }
    if (self->ctx) {
        pt_ctx_t *c = self->ctx;
        Py_BEGIN_ALLOW_THREADS
        st = pt_put_indexed(c, rank, key, offs.buf, n, (size_t)itemsize, src.buf);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&offs);
    PyBuffer_Release(&src);
    return pt_py_none_or_raise(st, -1);
}

/* notify and notify_async: the same add-and-wake, waited for or handed back as a Request. */
static PyObject *notify_op(ContextObject *self, PyObject *args, int async)
{
    int rank;
    unsigned long long key, off;
    long long v;
    if (!PyArg_ParseTuple(args, "iO&O&L", &rank, pt_py_u64, &key, pt_py_u64, &off, &v))
        return NULL;
    CTX(self);
    RequestObject *r = NULL;
    if (async && !(r = new_request()))
        return NULL;
    pt_ctx_t *c = self->ctx;
    pt_status_t st;
    CALL_MAYBE_RELEASED(c, rank, 0,
                        st = async ? pt_notify_async(c, rank, key, off, v, &r->req)
                                   : pt_notify(c, rank, key, off, v));
    return async ? request_started(r, st) : pt_py_none_or_raise(st, -1);
}

static PyObject *Context_notify(ContextObject *self, PyObject *args)
{
    return notify_op(self, args, 0);
}

static PyObject *Context_put_notify(ContextObject *self, PyObject *args)
{
    int rank;
    unsigned long long key, off, nkey, noff;
    long long v;
    Py_buffer b;
    if (!PyArg_ParseTuple(args, "iO&O&y*O&O&L", &rank, pt_py_u64, &key, pt_py_u64, &off, &b,
                          pt_py_u64, &nkey, pt_py_u64, &noff, &v))
        return NULL;
    pt_status_t st = PT_ERR_CLOSED;
    pt_ctx_t *c = self->ctx;
    if (c)
        CALL_MAYBE_RELEASED(
            c, rank, b.len,
            st = pt_put_notify(c, rank, key, off, b.buf, (size_t)b.len, nkey, noff, v));
    PyBuffer_Release(&b);
    return pt_py_none_or_raise(st, -1);
}

/* put_notify in flight: the Request holds the data's buffer until it completes. */
static PyObject *Context_put_notify_async(ContextObject *self, PyObject *args)
{
    int rank;
    unsigned long long key, off, nkey, noff;
    long long v;
    RequestObject *r = new_request();
    if (!r)
        return NULL;
    if (!PyArg_ParseTuple(args, "iO&O&y*O&O&L", &rank, pt_py_u64, &key, pt_py_u64, &off,
                          &r->buf, pt_py_u64, &nkey, pt_py_u64, &noff, &v)) {
        Py_DECREF(r);
        return NULL;
    }
    r->has_buf = 1;
    if (!self->ctx) {
        Py_DECREF(r);
        return pt_py_closed();
    }
    pt_ctx_t *c = self->ctx;
    pt_status_t st;
    CALL_MAYBE_RELEASED(c, rank, r->buf.len,
                        st = pt_put_notify_async(c, rank, key, off, r->buf.buf,
                                                 (size_t)r->buf.len, nkey, noff, v, &r->req));
    return request_started(r, st);
}

static PyObject *Context_notify_async(ContextObject *self, PyObject *args)
{
    return notify_op(self, args, 1);
}

static PyObject *Context_wait_local(ContextObject *self, PyObject *args)
{
    Py_buffer b;
    Py_ssize_t off;
    long long value;
    int watch;
    double timeout;
    if (!PyArg_ParseTuple(args, "y*nLid", &b, &off, &value, &watch, &timeout))
        return NULL;
    pt_status_t st = PT_ERR_CLOSED;
    if (off < 0 || off + 8 > b.len) {
        PyBuffer_Release(&b);
        PyErr_SetString(PyExc_ValueError, "wait_local: offset outside the buffer");
        return NULL;
    }
    if (self->ctx) {
        pt_ctx_t *c = self->ctx;
        const int64_t *p = (const int64_t *)((const char *)b.buf + off);
        Py_BEGIN_ALLOW_THREADS
        st = pt_wait_local(c, p, value, watch, timeout);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&b);
    return pt_py_none_or_raise(st, -1);
}

static PyMethodDef Context_methods[] = {
    {"attach", (PyCFunction)Context_attach, METH_VARARGS,
     "attach(rank, key, offset, nbytes, writable) -> buffer mapped from a same-host peer."},
    {"put_indexed", (PyCFunction)Context_put_indexed, METH_VARARGS,
     "put_indexed(rank, key, offsets_u64, itemsize, data): element-precise scatter."},
    {"notify", (PyCFunction)Context_notify, METH_VARARGS,
     "notify(rank, key, offset, value): atomic add to an int64 and wake its waiters."},
    {"put_notify", (PyCFunction)Context_put_notify, METH_VARARGS,
     "put_notify(rank, key, offset, data, notify_key, notify_offset, value): put, then notify "
     "once the bytes are in place."},
    {"put_notify_async", (PyCFunction)Context_put_notify_async, METH_VARARGS,
     "put_notify_async(rank, key, offset, data, notify_key, notify_offset, value) -> Request: "
     "put_notify without waiting; data stays unchanged until it completes."},
    {"put_notify_quiet", (PyCFunction)pt_py_put_notify_quiet, METH_VARARGS,
     "put_notify_quiet(rank, key, offset, data, notify_key, notify_offset, value[, head]): "
     "put_notify that is not answered (tcp; others: put_notify), head then data."},
    {"notify_async", (PyCFunction)Context_notify_async, METH_VARARGS,
     "notify_async(rank, key, offset, value) -> Request: notify without waiting."},
    {"wait_local", (PyCFunction)Context_wait_local, METH_VARARGS,
     "wait_local(buffer, offset, value, watch_rank, timeout): until int64 >= value."},
    {"close", (PyCFunction)Context_close, METH_NOARGS, "Stop threads and unmap every peer."},
    {"addr", (PyCFunction)Context_addr, METH_NOARGS, "(pid, ctrl_fd, ctrl_len) for peers."},
    {"connect", (PyCFunction)Context_connect, METH_VARARGS, "connect(rank, addr): map a peer."},
    {"connected_all", (PyCFunction)Context_connected_all, METH_NOARGS,
     "connected_all(): every same-host peer is connected; names of segments all of them "
     "mapped can go."},
    {"peer_lost", (PyCFunction)Context_peer_lost, METH_VARARGS, "peer_lost(rank) -> bool"},
    {"first_lost", (PyCFunction)Context_first_lost, METH_NOARGS,
     "The first peer seen dead, or -1."},
    {"barrier", (PyCFunction)Context_barrier, METH_VARARGS,
     "barrier(root, ranks, timeout): same-host barrier on root's control block."},
    {"add_segment", (PyCFunction)Context_add_segment, METH_VARARGS, "Serve a segment directly."},
    {"remove_segment", (PyCFunction)Context_remove_segment, METH_VARARGS,
     "Stop serving a segment (its registrations end)."},
    {"register", (PyCFunction)Context_register, METH_VARARGS,
     "register(buffer, access) -> key; access 1 = r, 3 = rw."},
    {"deregister", (PyCFunction)Context_deregister, METH_VARARGS, "deregister(key)"},
    {"limit", (PyCFunction)Context_limit, METH_VARARGS,
     "limit(key, nbytes): serve only the first nbytes of registration key from now on."},
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
    {"set_secret", (PyCFunction)pt_py_set_secret, METH_VARARGS,
     "set_secret(secret: bytes, at least 16 long): the key tcp peers authenticate with."},
    {"set_timeout", (PyCFunction)pt_py_set_timeout, METH_VARARGS,
     "set_timeout(seconds): how long a tcp operation or connection may take."},
    {"listen", (PyCFunction)pt_py_listen, METH_VARARGS,
     "listen(host, port) -> bound port: serve this context's registrations over tcp."},
    {"connect_tcp", (PyCFunction)pt_py_connect_tcp, METH_VARARGS,
     "connect_tcp(rank, host, port): reach rank over tcp (connected on first use)."},
    {"connect_tcp_served", (PyCFunction)pt_py_connect_tcp_served, METH_VARARGS,
     "connect_tcp_served(rank, host, port): a same-machine rank serves at host:port what "
     "shared memory cannot reach (atomics outside its segments; gets and puts there without "
     "cross-memory attach)."},
    {"tcp_open", (PyCFunction)pt_py_tcp_open, METH_VARARGS,
     "tcp_open(rank): make the tcp connection to rank now instead of on first use."},
    {"tcp_peer_stats", (PyCFunction)pt_py_tcp_peer_stats, METH_VARARGS,
     "tcp_peer_stats(rank) -> dict: reconnects, restarts, retried, indoubt (what reconnect "
     "saw of that peer)."},
    {"tcp_rejoin", (PyCFunction)pt_py_tcp_rejoin, METH_VARARGS,
     "tcp_rejoin(rank): a tcp peer marked lost (a restarted memory server) is reached again."},
    {"tcp_stats", (PyCFunction)pt_py_tcp_stats, METH_NOARGS,
     "tcp_stats() -> dict: accepted, active, auth_failures, bad_frames, requests, bytes_in, "
     "bytes_out, refused (turned away at accept), quiet_refused of this context's tcp server."},
    {"transport", (PyCFunction)pt_py_transport, METH_VARARGS,
     "transport(rank) -> 'shm', 'tcp', 'verbs' or 'none': how rank is reached."},
    {"stats", (PyCFunction)pt_py_stats, METH_NOARGS,
     "stats() -> (entries, links): the native counters (dicts; see stats_py.c)."},
    {"stats_record", (PyCFunction)pt_py_stats_record, METH_VARARGS,
     "stats_record(peer, transport, op, bytes, status, seconds): count one operation."},
    {"stats_count", (PyCFunction)pt_py_stats_count, METH_VARARGS,
     "stats_count(peer, event): count one link event (connects, retries, ...)."},
    {"verbs_local", (PyCFunction)pt_py_verbs_local, METH_VARARGS,
     "verbs_local(rank) -> bytes: a queue pair for rank, what rank needs to connect to it."},
    {"connect_verbs", (PyCFunction)pt_py_connect_verbs, METH_VARARGS,
     "connect_verbs(rank, info): connect rank's queue pair; rank is reached over verbs."},
    {"verbs_info", (PyCFunction)pt_py_verbs_info, METH_NOARGS,
     "verbs_info() -> (profile, 'device port gid') once the device is open, else None."},
    {NULL}};

PyTypeObject ContextType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "collectives._native.Context",
    .tp_basicsize = sizeof(ContextObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Context(rank, size, threads=1): this process's endpoint in the native engine.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Context_init,
    .tp_dealloc = (destructor)Context_dealloc,
    .tp_methods = Context_methods,
};

static PyObject *mod_set_spin(PyObject *m, PyObject *args)
{
    double us;
    if (!PyArg_ParseTuple(args, "d", &us))
        return NULL;
    pt_set_spin(us * 1e-6);
    Py_RETURN_NONE;
}

static PyObject *mod_spin(PyObject *m, PyObject *noargs)
{
    return PyFloat_FromDouble(pt_spin() * 1e6);
}

static PyMethodDef module_methods[] = {
    {"set_spin", mod_set_spin, METH_VARARGS,
     "set_spin(microseconds): how long waits poll before they sleep."},
    {"spin", mod_spin, METH_NOARGS,
     "spin() -> microseconds a wait polls now: set_spin's, or a few while more threads are "
     "runnable than there are CPUs."},
    {"segment_kind", pt_py_segment_kind, METH_NOARGS,
     "segment_kind() -> 'memfd', 'tmpfs' (2 MiB pages where shared memory gets none "
     "otherwise) or 'shm_open': what this process's segments are made of."},
    {"hmac_sha256", pt_py_hmac_sha256, METH_VARARGS,
     "hmac_sha256(key, message) -> 32 bytes (the tcp transport's own HMAC)."},
    {"sha256", pt_py_sha256, METH_VARARGS, "sha256(message) -> 32 bytes."},
    {"verbs_probe", pt_py_verbs_probe, METH_NOARGS,
     "verbs_probe() -> text: the verbs library, devices, ports, GIDs, the choice."},
    {NULL}};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT,
    .m_name = "collectives._native",
    .m_doc = "The native data path of collectives: segments, one-sided transfers, kernels.",
    .m_size = -1,
    .m_methods = module_methods};

PyMODINIT_FUNC PyInit__native(void)
{
    if (PyType_Ready(&pt_py_SegmentType) < 0 || PyType_Ready(&RequestType) < 0 ||
        PyType_Ready(&ContextType) < 0 || PyType_Ready(&AttachmentType) < 0 ||
        PyType_Ready(&pt_py_ChannelType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (!m)
        return NULL;
    Error = PyErr_NewExceptionWithDoc("collectives._native.Error",
                                      "A native status: args are (status, errno, text).", NULL,
                                      NULL);
    if (!Error || PyModule_AddObjectRef(m, "Error", Error) < 0 ||
        PyModule_AddObjectRef(m, "Segment", (PyObject *)&pt_py_SegmentType) < 0 ||
        PyModule_AddObjectRef(m, "Request", (PyObject *)&RequestType) < 0 ||
        PyModule_AddObjectRef(m, "Context", (PyObject *)&ContextType) < 0 ||
        pt_py_add_channel(m) < 0 ||
        PyModule_AddStringConstant(m, "PLATFORM", pt_platform()) < 0 ||
        pt_py_add_team(m) < 0 || pt_py_add_stats(m) < 0 ||
        pt_py_add_kernels(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    static const char *names[] = {"OK", "ERR_INVALID", "ERR_NOMEM", "ERR_SYS", "ERR_KEY",
                                  "ERR_BOUNDS", "ERR_MODE", "ERR_ALIGN", "ERR_UNSUPPORTED",
                                  "ERR_TIMEOUT", "ERR_PEER_LOST", "ERR_CLOSED", "ERR_MISMATCH",
                                  "ERR_AUTH", "ERR_INDOUBT", "ERR_RESTARTED"};
    for (int i = 0; i < (int)(sizeof(names) / sizeof(names[0])); i++)
        if (PyModule_AddIntConstant(m, names[i], i) < 0) {
            Py_DECREF(m);
            return NULL;
        }
    return m;
}
