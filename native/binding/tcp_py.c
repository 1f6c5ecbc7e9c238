/* The tcp methods of Context (listed in module.c's method table) and the HMAC helper. */
#include "binding.h"

PyObject *pt_py_set_secret(ContextObject *self, PyObject *args)
{
    Py_buffer b;
    if (!PyArg_ParseTuple(args, "y*", &b))
        return NULL;
    if (!self->ctx) {
        PyBuffer_Release(&b);
        return pt_py_closed();
    }
    if (b.len < 16) {
        PyBuffer_Release(&b);
        PyErr_Format(PyExc_ValueError, "the secret must be at least 16 bytes, not %zd", b.len);
        return NULL;
    }
    pt_status_t st = pt_ctx_set_secret(self->ctx, b.buf, (size_t)b.len);
    PyBuffer_Release(&b);
    return pt_py_none_or_raise(st, -1);
}

PyObject *pt_py_set_timeout(ContextObject *self, PyObject *args)
{
    double t;
    if (!PyArg_ParseTuple(args, "d", &t))
        return NULL;
    CTX(self);
    if (!(t > 0)) {
        PyErr_SetString(PyExc_ValueError, "timeout must be positive");
        return NULL;
    }
    pt_status_t st = pt_ctx_set_timeout(self->ctx, t);
    return pt_py_none_or_raise(st, -1);
}

PyObject *pt_py_listen(ContextObject *self, PyObject *args)
{
    const char *host;
    int port;
    if (!PyArg_ParseTuple(args, "si", &host, &port))
        return NULL;
    CTX(self);
    if (port < 0 || port > 65535) {
        PyErr_Format(PyExc_ValueError, "port %d outside 0..65535", port);
        return NULL;
    }
    pt_status_t st;
    int bound = 0;
    pt_ctx_t *c = self->ctx;
    Py_BEGIN_ALLOW_THREADS
    st = pt_ctx_listen(c, host, port, &bound);
    Py_END_ALLOW_THREADS
    if (st != PT_OK)
        return raise_status(st);
    return PyLong_FromLong(bound);
}

PyObject *pt_py_connect_tcp(ContextObject *self, PyObject *args)
{
    int rank, port;
    const char *host;
    if (!PyArg_ParseTuple(args, "isi", &rank, &host, &port))
        return NULL;
    CTX(self);
    pt_status_t st = pt_ctx_connect_tcp(self->ctx, rank, host, port);
    return pt_py_none_or_raise(st, -1);
}

PyObject *pt_py_connect_tcp_served(ContextObject *self, PyObject *args)
{
    int rank, port;
    const char *host;
    if (!PyArg_ParseTuple(args, "isi", &rank, &host, &port))
        return NULL;
    CTX(self);
    pt_status_t st = pt_ctx_connect_tcp_served(self->ctx, rank, host, port);
    return pt_py_none_or_raise(st, -1);
}

PyObject *pt_py_tcp_open(ContextObject *self, PyObject *args)
{
    int rank;
    if (!PyArg_ParseTuple(args, "i", &rank))
        return NULL;
    CTX(self);
    pt_status_t st;
    pt_ctx_t *c = self->ctx;
    Py_BEGIN_ALLOW_THREADS
    st = pt_ctx_tcp_open(c, rank);
    Py_END_ALLOW_THREADS
    return pt_py_none_or_raise(st, -1);
}

PyObject *pt_py_tcp_stats(ContextObject *self, PyObject *unused)
{
    CTX(self);
    pt_tcp_stats_t s;
    pt_ctx_tcp_stats(self->ctx, &s);
    return Py_BuildValue("{sKsKsKsKsKsKsKsKsKsK}", "accepted", (unsigned long long)s.accepted,
                         "active", (unsigned long long)s.active, "auth_failures",
                         (unsigned long long)s.auth_failures, "bad_frames",
                         (unsigned long long)s.bad_frames, "requests",
                         (unsigned long long)s.requests, "bytes_in",
                         (unsigned long long)s.bytes_in, "bytes_out",
                         (unsigned long long)s.bytes_out, "refused",
                         (unsigned long long)s.refused, "quiet_refused",
                         (unsigned long long)s.quiet_refused, "helped",
                         (unsigned long long)s.helped);
}

PyObject *pt_py_tcp_peer_stats(ContextObject *self, PyObject *args)
{
    int rank;
    if (!PyArg_ParseTuple(args, "i", &rank))
        return NULL;
    CTX(self);
    pt_tcp_peer_stats_t s;
    pt_ctx_tcp_peer_stats(self->ctx, rank, &s);
    return Py_BuildValue("{sKsKsKsK}", "reconnects", (unsigned long long)s.reconnects,
                         "restarts", (unsigned long long)s.restarts, "retried",
                         (unsigned long long)s.retried, "indoubt",
                         (unsigned long long)s.indoubt);
}

PyObject *pt_py_tcp_rejoin(ContextObject *self, PyObject *args)
{
    int rank;
    if (!PyArg_ParseTuple(args, "i", &rank))
        return NULL;
    CTX(self);
    return pt_py_none_or_raise(pt_ctx_tcp_rejoin(self->ctx, rank), -1);
}

PyObject *pt_py_transport(ContextObject *self, PyObject *args)
{
    int rank;
    if (!PyArg_ParseTuple(args, "i", &rank))
        return NULL;
    CTX(self);
    static const char *names[] = {"none", "shm", "tcp", "verbs"};
    return PyUnicode_FromString(names[pt_ctx_transport(self->ctx, rank)]);
}

PyObject *pt_py_hmac_sha256(PyObject *m, PyObject *args)
{
    Py_buffer k, msg;
    if (!PyArg_ParseTuple(args, "y*y*", &k, &msg))
        return NULL;
    uint8_t out[32];
    pt_hmac_sha256(k.buf, (size_t)k.len, msg.buf, (size_t)msg.len, out);
    PyBuffer_Release(&k);
    PyBuffer_Release(&msg);
    return PyBytes_FromStringAndSize((const char *)out, 32);
}

PyObject *pt_py_sha256(PyObject *m, PyObject *args)
{
    Py_buffer msg;
    if (!PyArg_ParseTuple(args, "y*", &msg))
        return NULL;
    uint8_t out[32];
    pt_sha256(msg.buf, (size_t)msg.len, out);
    PyBuffer_Release(&msg);
    return PyBytes_FromStringAndSize((const char *)out, 32);
}

/* put_notify_quiet(rank, key, offset, data, notify_key, notify_offset, value[, head]):
 * returns once the frames are written (pt_put_notify_quiet_head: head, if given, lands at
 * offset and data right after it, without the caller copying them together). The GIL is let
 * go: a socket that a stopped peer filled may hold the call up to the timeout, and the other
 * threads (the heralds that tell the peers of a failure) must run meanwhile. */
PyObject *pt_py_put_notify_quiet(ContextObject *self, PyObject *args)
{
    int rank;
    unsigned long long key, off, nkey, noff;
    long long v;
    Py_buffer b, h = {0};
    if (!PyArg_ParseTuple(args, "iO&O&y*O&O&L|y*", &rank, pt_py_u64, &key, pt_py_u64, &off, &b,
                          pt_py_u64, &nkey, pt_py_u64, &noff, &v, &h))
        return NULL;
    pt_status_t st = PT_ERR_CLOSED;
    pt_ctx_t *c = self->ctx;
    if (c) {
        Py_BEGIN_ALLOW_THREADS
        st = pt_put_notify_quiet_head(c, rank, key, off, h.buf, (size_t)h.len, b.buf,
                                      (size_t)b.len, nkey, noff, v);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&b);
    if (h.obj)
        PyBuffer_Release(&h);
    return pt_py_none_or_raise(st, -1);
}
