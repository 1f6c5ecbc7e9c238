/* The Segment type: memory this process can share (a memfd, a file in the private huge-page
 * tmpfs, or shm_open), exposed to Python as a buffer. Apart from module.c to keep each file
 * of the binding small. */
#include "binding.h"

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

PyTypeObject pt_py_SegmentType = {
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

PyObject *pt_py_segment_kind(PyObject *m, PyObject *unused)
{
    const char *kind;
    Py_BEGIN_ALLOW_THREADS
    kind = pt_segment_kind();        /* the first call may make the tmpfs */
    Py_END_ALLOW_THREADS
    return PyUnicode_FromString(kind);
}


pt_segment_t *pt_py_segment(PyObject *obj) { return ((SegmentObject *)obj)->seg; }
