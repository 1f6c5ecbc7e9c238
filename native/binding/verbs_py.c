/* The verbs methods of Context (listed in module.c's method table) and the probe. */
#include "binding.h"

PyObject *pt_py_verbs_local(ContextObject *self, PyObject *args)
{
    int rank;
    if (!PyArg_ParseTuple(args, "i", &rank))
        return NULL;
    CTX(self);
    char info[256];
    size_t len = sizeof(info);
    pt_status_t st;
    pt_ctx_t *c = self->ctx;
    Py_BEGIN_ALLOW_THREADS
    st = pt_ctx_verbs_local(c, rank, info, &len);
    Py_END_ALLOW_THREADS
    if (st != PT_OK)
        return pt_py_raise(st, rank);
    return PyBytes_FromStringAndSize(info, (Py_ssize_t)len);
}

PyObject *pt_py_connect_verbs(ContextObject *self, PyObject *args)
{
    int rank;
    Py_buffer b;
    if (!PyArg_ParseTuple(args, "iy*", &rank, &b))
        return NULL;
    if (!self->ctx) {
        PyBuffer_Release(&b);
        return pt_py_closed();
    }
    pt_status_t st;
    pt_ctx_t *c = self->ctx;
    Py_BEGIN_ALLOW_THREADS
    st = pt_ctx_connect_verbs(c, rank, b.buf, (size_t)b.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&b);
    return pt_py_none_or_raise(st, rank);
}

PyObject *pt_py_verbs_info(ContextObject *self, PyObject *unused)
{
    CTX(self);
    const char *prof = pt_ctx_verbs_profile(self->ctx);
    if (!prof)
        Py_RETURN_NONE;
    return Py_BuildValue("(ss)", prof, pt_ctx_verbs_device(self->ctx));
}

PyObject *pt_py_verbs_probe(PyObject *m, PyObject *unused)
{
    char buf[16384];
    pt_status_t st;
    Py_BEGIN_ALLOW_THREADS
    st = pt_verbs_probe(buf, sizeof(buf));
    Py_END_ALLOW_THREADS
    if (st != PT_OK)
        return raise_status(st);
    return PyUnicode_DecodeUTF8(buf, (Py_ssize_t)strlen(buf), "replace");
}
