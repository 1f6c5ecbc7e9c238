/* The kernels of pt.h as functions of collectives._native: a thin layer, no policy.
 *
 * Buffers come in through the buffer protocol (anything numpy, bytes, bytearray or memoryview
 * can export); dtype and op are the integer codes of pt_dtype_t and pt_op_t, which the Python
 * side (collectives/kernels.py) maps from numpy dtypes and op names. Sizes are checked here,
 * before any pointer reaches C, so a bad argument is a ValueError or TypeError, never a crash.
 * Every call that may move more than PT_PY_NOGIL_BYTES runs with the GIL released; the buffers
 * stay exported (and so alive and unresized) until it returns.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <stdint.h>

#include "pt.h"

int pt_py_add_kernels(PyObject *module);

/* Below this many bytes a kernel takes well under a microsecond: keep the GIL. */
#define PT_PY_NOGIL_BYTES 4096

#define PT_PY_MAYBE_NOGIL(bytes, stmt)                                                         \
    do {                                                                                       \
        if ((bytes) > PT_PY_NOGIL_BYTES) {                                                     \
            Py_BEGIN_ALLOW_THREADS stmt;                                                       \
            Py_END_ALLOW_THREADS                                                               \
        } else {                                                                               \
            stmt;                                                                              \
        }                                                                                      \
    } while (0)

static const char *const pt_py_op_names[PT_NOPS] = {"sum", "prod", "minimum", "maximum"};

/* Get a buffer; a refusal by the exporter (not contiguous, read-only) becomes a ValueError that
 * names the argument, an object without the buffer protocol a TypeError. */
static int pt_py_buffer(PyObject *obj, Py_buffer *view, int flags, const char *what)
{
    if (!PyObject_CheckBuffer(obj)) {
        PyErr_Format(PyExc_TypeError,
                     "%s must support the buffer protocol (numpy array, bytearray, memoryview), "
                     "not '%.200s'",
                     what, Py_TYPE(obj)->tp_name);
        return -1;
    }
    if (PyObject_GetBuffer(obj, view, flags) == 0)
        return 0;
#if PY_VERSION_HEX >= 0x030C0000
    PyObject *exc = PyErr_GetRaisedException();
    PyErr_Format(PyExc_ValueError, "%s: %S", what, exc);
    Py_XDECREF(exc);
#else
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    PyErr_Format(PyExc_ValueError, "%s: %S", what, value ? value : Py_None);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
#endif
    return -1;
}

static int pt_py_op_dtype(int op, int dtype)
{
    if (op < 0 || op >= PT_NOPS) {
        PyErr_Format(PyExc_ValueError, "op must be a pt_op_t code 0..%d, not %d", PT_NOPS - 1, op);
        return -1;
    }
    if (dtype < 0 || dtype >= PT_NDTYPES) {
        PyErr_Format(PyExc_ValueError, "dtype must be a pt_dtype_t code 0..%d, not %d",
                     PT_NDTYPES - 1, dtype);
        return -1;
    }
    return 0;
}

/* Shape and strides of a strided buffer as int64, in C order when it gave no strides. */
static void pt_py_layout(const Py_buffer *v, int64_t *shape, int64_t *strides)
{
    int64_t step = v->itemsize;
    for (int i = v->ndim - 1; i >= 0; i--) {
        shape[i] = v->shape ? v->shape[i] : v->len / v->itemsize;
        strides[i] = v->strides ? v->strides[i] : step;
        step *= shape[i];
    }
}

static PyObject *pt_py_kernels_isa(PyObject *self, PyObject *unused)
{
    return PyUnicode_FromString(pt_kernels_isa());
}

static PyObject *pt_py_dtype_size(PyObject *self, PyObject *args)
{
    int dtype;
    if (!PyArg_ParseTuple(args, "i:dtype_size", &dtype) || pt_py_op_dtype(PT_SUM, dtype) < 0)
        return NULL;
    return PyLong_FromSize_t(pt_dtype_size((pt_dtype_t)dtype));
}

static PyObject *pt_py_copy(PyObject *self, PyObject *args)
{
    PyObject *dsto, *srco;
    Py_buffer dst, src;
    if (!PyArg_ParseTuple(args, "OO:copy", &dsto, &srco))
        return NULL;
    if (pt_py_buffer(dsto, &dst, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE, "dst") < 0)
        return NULL;
    if (pt_py_buffer(srco, &src, PyBUF_C_CONTIGUOUS, "src") < 0) {
        PyBuffer_Release(&dst);
        return NULL;
    }
    PyObject *ret = NULL;
    if (dst.len != src.len)
        PyErr_Format(PyExc_ValueError, "copy: dst has %zd bytes but src has %zd", dst.len, src.len);
    else {
        PT_PY_MAYBE_NOGIL(dst.len, pt_copy(dst.buf, src.buf, (size_t)dst.len));
        ret = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    return ret;
}

/* gather(dst, src) and scatter(dst, src): the strided side is whatever layout its buffer
 * describes; the other is C-contiguous with the same number of bytes. */
static PyObject *pt_py_strided(PyObject *args, int gather)
{
    const char *name = gather ? "gather" : "scatter";
    PyObject *dsto, *srco;
    Py_buffer dst, src;
    if (!PyArg_ParseTuple(args, gather ? "OO:gather" : "OO:scatter", &dsto, &srco))
        return NULL;
    int dflags = PyBUF_WRITABLE | (gather ? PyBUF_C_CONTIGUOUS : PyBUF_STRIDES);
    if (pt_py_buffer(dsto, &dst, dflags, "dst") < 0)
        return NULL;
    if (pt_py_buffer(srco, &src, gather ? PyBUF_STRIDES : PyBUF_C_CONTIGUOUS, "src") < 0) {
        PyBuffer_Release(&dst);
        return NULL;
    }
    PyObject *ret = NULL;
    const Py_buffer *s = gather ? &src : &dst; /* the strided side */
    int64_t shape[64], strides[64];
    if (dst.len != src.len)
        PyErr_Format(PyExc_ValueError, "%s: dst has %zd bytes but src has %zd", name, dst.len,
                     src.len);
    else if (s->ndim > 64 || s->itemsize <= 0)
        PyErr_Format(PyExc_ValueError, "%s: unsupported layout (ndim %d, itemsize %zd)", name,
                     s->ndim, s->itemsize);
    else {
        pt_py_layout(s, shape, strides);
        pt_status_t st;
        if (gather)
            PT_PY_MAYBE_NOGIL(dst.len, st = pt_gather(dst.buf, src.buf, s->ndim, shape, strides,
                                                      (size_t)s->itemsize));
        else
            PT_PY_MAYBE_NOGIL(dst.len, st = pt_scatter(dst.buf, src.buf, s->ndim, shape, strides,
                                                       (size_t)s->itemsize));
        if (st != PT_OK)
            PyErr_Format(PyExc_ValueError, "%s: invalid layout", name);
        else
            ret = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    return ret;
}

static PyObject *pt_py_gather(PyObject *self, PyObject *args)
{
    return pt_py_strided(args, 1);
}

static PyObject *pt_py_scatter(PyObject *self, PyObject *args)
{
    return pt_py_strided(args, 0);
}

static PyObject *pt_py_reduce(PyObject *self, PyObject *args)
{
    int op, dtype;
    PyObject *dsto, *srcso;
    if (!PyArg_ParseTuple(args, "iiOO:reduce", &op, &dtype, &dsto, &srcso) ||
        pt_py_op_dtype(op, dtype) < 0)
        return NULL;
    PyObject *seq = PySequence_Fast(srcso, "reduce: srcs must be a sequence of buffers");
    if (!seq)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n < 1 || n > INT_MAX) {
        PyErr_SetString(PyExc_ValueError, "reduce: srcs must hold at least one buffer");
        Py_DECREF(seq);
        return NULL;
    }
    Py_buffer dst;
    if (pt_py_buffer(dsto, &dst, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE, "dst") < 0) {
        Py_DECREF(seq);
        return NULL;
    }
    PyObject *ret = NULL;
    Py_ssize_t got = 0;
    Py_buffer *bufs = PyMem_Calloc((size_t)n, sizeof(Py_buffer));
    const void **ptrs = PyMem_Calloc((size_t)n, sizeof(void *));
    size_t size = pt_dtype_size((pt_dtype_t)dtype);
    if (!bufs || !ptrs) {
        PyErr_NoMemory();
        goto done;
    }
    if (dst.len % (Py_ssize_t)size) {
        PyErr_Format(PyExc_ValueError,
                     "reduce: dst has %zd bytes, not a whole number of %zu-byte elements", dst.len,
                     size);
        goto done;
    }
    for (; got < n; got++) {
        char what[32];
        snprintf(what, sizeof what, "srcs[%zd]", got);
        if (pt_py_buffer(PySequence_Fast_GET_ITEM(seq, got), &bufs[got], PyBUF_C_CONTIGUOUS,
                         what) < 0)
            goto done;
        if (bufs[got].len != dst.len) {
            PyErr_Format(PyExc_ValueError, "reduce: %s has %zd bytes but dst has %zd", what,
                         bufs[got].len, dst.len);
            got++;
            goto done;
        }
        ptrs[got] = bufs[got].buf;
    }
    pt_status_t st;
    size_t count = (size_t)dst.len / size;
    PT_PY_MAYBE_NOGIL(dst.len * (n + 1),
                      st = pt_reduce((pt_op_t)op, (pt_dtype_t)dtype, dst.buf, ptrs, (int)n, count));
    if (st != PT_OK)
        PyErr_SetString(PyExc_ValueError,
                        "reduce: dst overlaps a source partially (it may only be one of them)");
    else
        ret = Py_NewRef(Py_None);
done:
    while (got > 0)
        PyBuffer_Release(&bufs[--got]);
    PyMem_Free(ptrs);
    PyMem_Free(bufs);
    PyBuffer_Release(&dst);
    Py_DECREF(seq);
    return ret;
}

static PyObject *pt_py_reduce_all(PyObject *self, PyObject *args)
{
    int op, dtype;
    PyObject *srco;
    Py_buffer src;
    if (!PyArg_ParseTuple(args, "iiO:reduce_all", &op, &dtype, &srco) ||
        pt_py_op_dtype(op, dtype) < 0)
        return NULL;
    if (pt_py_buffer(srco, &src, PyBUF_C_CONTIGUOUS, "src") < 0)
        return NULL;
    PyObject *ret = NULL;
    size_t size = pt_dtype_size((pt_dtype_t)dtype);
    size_t count = (size_t)src.len / size;
    union {
        int64_t i;
        uint64_t u;
        float f;
        double d;
    } out;
    pt_status_t st;
    if (src.len % (Py_ssize_t)size) {
        PyErr_Format(PyExc_ValueError,
                     "reduce_all: src has %zd bytes, not a whole number of %zu-byte elements",
                     src.len, size);
        goto done;
    }
    if (count == 0 && (op == PT_MIN || op == PT_MAX)) {
        PyErr_Format(PyExc_ValueError,
                     "zero-size array to reduction operation %s which has no identity",
                     pt_py_op_names[op]);
        goto done;
    }
    PT_PY_MAYBE_NOGIL(src.len, st = pt_reduce_all((pt_op_t)op, (pt_dtype_t)dtype, src.buf, count,
                                                  &out));
    if (st != PT_OK) {
        PyErr_SetString(PyExc_ValueError, "reduce_all: invalid arguments");
        goto done;
    }
    switch (dtype) {
    case PT_I8: case PT_I16: case PT_I32: case PT_I64:
        ret = PyLong_FromLongLong(out.i);
        break;
    case PT_U8: case PT_U16: case PT_U32: case PT_U64:
        ret = PyLong_FromUnsignedLongLong(out.u);
        break;
    case PT_F64:
        ret = PyFloat_FromDouble(out.d);
        break;
    default: /* float16, bfloat16 and float32 accumulate in float32 */
        ret = PyFloat_FromDouble(out.f);
        break;
    }
done:
    PyBuffer_Release(&src);
    return ret;
}

static PyMethodDef pt_py_kernel_methods[] = {
    {"kernels_isa", pt_py_kernels_isa, METH_NOARGS,
     "kernels_isa($module, /)\n--\n\n"
     "Instruction set the kernels dispatched to: 'avx512', 'avx2', 'neon' or 'scalar'."},
    {"dtype_size", pt_py_dtype_size, METH_VARARGS,
     "dtype_size($module, dtype, /)\n--\n\nBytes per element of a pt_dtype_t code."},
    {"copy", pt_py_copy, METH_VARARGS,
     "copy($module, dst, src, /)\n--\n\n"
     "Copy the bytes of C-contiguous src into C-contiguous writable dst of the same size."},
    {"gather", pt_py_gather, METH_VARARGS,
     "gather($module, dst, src, /)\n--\n\n"
     "Copy the elements of strided src (any shape and strides, negative or zero included) in "
     "C order\ninto C-contiguous writable dst of the same byte size."},
    {"scatter", pt_py_scatter, METH_VARARGS,
     "scatter($module, dst, src, /)\n--\n\n"
     "Copy C-contiguous src into the elements of strided writable dst, in C order; the "
     "inverse of gather."},
    {"reduce", pt_py_reduce, METH_VARARGS,
     "reduce($module, op, dtype, dst, srcs, /)\n--\n\n"
     "dst = srcs[0] op srcs[1] op ... elementwise, left to right (pt_reduce). op and dtype are\n"
     "pt_op_t and pt_dtype_t codes; dst and every source are C-contiguous with the same size;\n"
     "dst may be one of the sources but must not overlap one partially."},
    {"reduce_all", pt_py_reduce_all, METH_VARARGS,
     "reduce_all($module, op, dtype, src, /)\n--\n\n"
     "Reduce C-contiguous src to one value (pt_reduce_all): an int for integer dtypes (int64 or\n"
     "uint64 arithmetic), a float for float dtypes (float32 arithmetic for float16, bfloat16\n"
     "and float32; float64 for float64)."},
    {NULL, NULL, 0, NULL},
};

int pt_py_add_kernels(PyObject *module)
{
    for (PyMethodDef *m = pt_py_kernel_methods; m->ml_name; m++)
        if (PyObject_HasAttrString(module, m->ml_name)) {
            PyErr_Format(PyExc_RuntimeError, "pt_py_add_kernels: the module already has '%s'",
                         m->ml_name);
            return -1;
        }
    return PyModule_AddFunctions(module, pt_py_kernel_methods);
}
