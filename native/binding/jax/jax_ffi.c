/* collectives._jaxffi: the XLA FFI handler behind collectives.jax, written in C against the
 * headers of the installed jaxlib (jax.ffi.include_dir()), and a small module to set it up.
 *
 * Built by setup.py only where jax is installed, as an extension of its own: collectives._native
 * never needs jax. It reaches the team engine linked into collectives._native through the table
 * that module exports (team_api.h), so the engine exists once per process.
 *
 * One handler serves every collective; its attributes say which (kind, op, dtype, root, algo,
 * sig). Operands are [ordering token, input], results [ordering token, output]; the tokens carry
 * no data, they are what keeps XLA from reordering the calls (collectives/jax/primitives.py).
 *
 * The fast path, taken when a same-machine team spans every rank and nothing is pending on the
 * world's board of given-up calls: number the call on the board (word 1, as Calls.begin does),
 * run the team collective, check the board again (as Calls.end does). No Python, no GIL. Any
 * other case takes the GIL and calls the Python function given to bind(): the first call
 * before the team exists, worlds whose collectives are not the team's (tcp, several hosts,
 * a forced algorithm), a call a peer has given up, and turning a failure into the error the
 * eager collectives raise (and giving the call up on every rank).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include <xla/ffi/api/c_api.h>

#include "team_api.h"

enum { K_ALLREDUCE = 1, K_ALLGATHER = 2, K_REDUCE_SCATTER = 3, K_BROADCAST = 4, K_BARRIER = 5 };
/* why the Python side is called: the whole call, the end check of a call done here, or the
 * failure of a call done here */
enum { P_WHOLE = 0, P_END = 1, P_FAILED = 2 };

typedef struct {
    int64_t kind, op, dtype, root, algo, isroot;
    int64_t avg;            /* > 0: divide the reduction by this many ranks (op 'avg') */
    uint64_t sig, tsig;     /* the call's digest; the team's (sig mixed with the algorithm) */
} attrs_t;

static struct {
    pthread_mutex_t lock;
    const pt_team_api_t *api;
    pt_team_t *team;            /* NULL: every call goes to Python */
    _Atomic int64_t *board;     /* the calls board: [0] records written, [1] this rank's call */
    int64_t seen;               /* board[0] when Python last read the board */
    double timeout;
    PyObject *slow;             /* the Python side (bind()) */
    _Atomic uint64_t fast_calls, slow_calls;
} S = {.lock = PTHREAD_MUTEX_INITIALIZER};

static XLA_FFI_Error *ffi_error(const XLA_FFI_Api *api, XLA_FFI_Error_Code code, const char *msg)
{
    XLA_FFI_Error_Create_Args a;
    memset(&a, 0, sizeof a);
    a.struct_size = XLA_FFI_Error_Create_Args_STRUCT_SIZE;
    a.message = msg;
    a.errc = code;
    return api->XLA_FFI_Error_Create(&a);
}

static int span_is(const XLA_FFI_ByteSpan *s, const char *name)
{
    size_t n = strlen(name);
    return s->len == n && memcmp(s->ptr, name, n) == 0;
}

static int64_t scalar_i64(const XLA_FFI_Scalar *s)
{
    switch (s->dtype) {
    case XLA_FFI_DataType_S64:
    case XLA_FFI_DataType_U64:
        return *(const int64_t *)s->value;
    case XLA_FFI_DataType_S32:
    case XLA_FFI_DataType_U32:
        return *(const int32_t *)s->value;
    default:
        return -1;
    }
}

static int parse_attrs(const XLA_FFI_Attrs *at, attrs_t *out)
{
    memset(out, 0, sizeof *out);
    out->kind = -1;
    for (int64_t i = 0; i < at->size; i++) {
        if (at->types[i] != XLA_FFI_AttrType_SCALAR)
            return -1;
        const XLA_FFI_ByteSpan *name = at->names[i];
        int64_t v = scalar_i64((const XLA_FFI_Scalar *)at->attrs[i]);
        if (span_is(name, "kind"))
            out->kind = v;
        else if (span_is(name, "op"))
            out->op = v;
        else if (span_is(name, "dtype"))
            out->dtype = v;
        else if (span_is(name, "root"))
            out->root = v;
        else if (span_is(name, "algo"))
            out->algo = v;
        else if (span_is(name, "isroot"))
            out->isroot = v;
        else if (span_is(name, "avg"))
            out->avg = v;
        else if (span_is(name, "sig"))
            out->sig = (uint64_t)v;
        else if (span_is(name, "tsig"))
            out->tsig = (uint64_t)v;
    }
    return out->kind >= K_ALLREDUCE && out->kind <= K_BARRIER ? 0 : -1;
}

/* The first buffer that is not a token, or NULL. */
static XLA_FFI_Buffer *data_buffer(int64_t n, void **bufs)
{
    for (int64_t i = 0; i < n; i++) {
        XLA_FFI_Buffer *b = bufs[i];
        if (b && b->dtype != XLA_FFI_DataType_TOKEN)
            return b;
    }
    return NULL;
}

static size_t elements(const XLA_FFI_Buffer *b)
{
    size_t n = 1;
    for (int64_t i = 0; i < b->rank; i++)
        n *= (size_t)b->dims[i];
    return n;
}

static pt_status_t run_team(const pt_team_api_t *api, pt_team_t *t, const attrs_t *a,
                            XLA_FFI_Buffer *in, XLA_FFI_Buffer *out, double timeout, int *who)
{
    size_t isz = api->dtype_size((pt_dtype_t)a->dtype);
    switch (a->kind) {
    case K_ALLREDUCE:
        return api->allreduce(t, (pt_op_t)a->op, (pt_dtype_t)a->dtype, in->data, out->data,
                              elements(in), (int)a->algo, a->tsig, timeout, who);
    case K_ALLGATHER:
        return api->allgather(t, in->data, out->data, elements(in) * isz, a->tsig, timeout, who);
    case K_REDUCE_SCATTER:
        return api->reduce_scatter(t, (pt_op_t)a->op, (pt_dtype_t)a->dtype, in->data, out->data,
                                   elements(out), a->tsig, timeout, who);
    case K_BROADCAST: {
        size_t nb = elements(out) * isz;
        if (a->isroot && nb && out->data != in->data)
            memcpy(out->data, in->data, nb);
        return api->broadcast(t, (int)a->root, out->data, nb, a->tsig, timeout, who);
    }
    default:
        return api->barrier(t, timeout, who);
    }
}

/* Bytes per element of an XLA buffer's type; 0 where not a whole number of bytes or unknown. */
static size_t xla_size(XLA_FFI_DataType t)
{
    switch (t) {
    case XLA_FFI_DataType_PRED:
    case XLA_FFI_DataType_S8:
    case XLA_FFI_DataType_U8:
        return 1;
    case XLA_FFI_DataType_S16:
    case XLA_FFI_DataType_U16:
    case XLA_FFI_DataType_F16:
    case XLA_FFI_DataType_BF16:
        return 2;
    case XLA_FFI_DataType_S32:
    case XLA_FFI_DataType_U32:
    case XLA_FFI_DataType_F32:
        return 4;
    case XLA_FFI_DataType_S64:
    case XLA_FFI_DataType_U64:
    case XLA_FFI_DataType_F64:
    case XLA_FFI_DataType_C64:
        return 8;
    case XLA_FFI_DataType_C128:
        return 16;
    default:
        return 0;
    }
}

/* op 'avg': the sum divided by the number of ranks, rounded as numpy rounds it (the eager
 * collective divides with numpy; XLA's CPU division is not correctly rounded). 16-bit floats
 * come here widened to float32. */
static void divide(const attrs_t *a, XLA_FFI_Buffer *out)
{
    size_t n = elements(out);
    if (a->dtype == PT_F32) {
        float *p = out->data, d = (float)a->avg;
        for (size_t i = 0; i < n; i++)
            p[i] = p[i] / d;
    } else if (a->dtype == PT_F64) {
        double *p = out->data, d = (double)a->avg;
        for (size_t i = 0; i < n; i++)
            p[i] = p[i] / d;
    }
}

/* The Python side: None when the call is done, else the error's text. */
static XLA_FFI_Error *call_python(const XLA_FFI_Api *fapi, int path, const attrs_t *a,
                                  XLA_FFI_Buffer *in, XLA_FFI_Buffer *out, int status, int who)
{
    char msg[1024] = "";
    if (!Py_IsInitialized())
        return ffi_error(fapi, XLA_FFI_Error_Code_FAILED_PRECONDITION,
                         "pooltensor collective: the interpreter is gone");
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *shape = PyTuple_New(in ? (Py_ssize_t)in->rank : 0);
    if (shape && in)
        for (int64_t i = 0; i < in->rank; i++)
            PyTuple_SET_ITEM(shape, i, PyLong_FromLongLong(in->dims[i]));
    PyObject *slow = S.slow;
    Py_XINCREF(slow);
    PyObject *r = NULL;
    if (!slow)
        snprintf(msg, sizeof msg, "pooltensor collective: collectives.jax is not set up");
    else if (shape)
        r = PyObject_CallFunction(slow, "iiiiiiKnnnnOiii", path, (int)a->kind, (int)a->op,
                                  (int)a->dtype, (int)a->root, (int)a->algo,
                                  (unsigned long long)a->sig,
                                  (Py_ssize_t)(in ? (intptr_t)in->data : 0),
                                  (Py_ssize_t)(in ? elements(in) : 0),
                                  (Py_ssize_t)(out ? (intptr_t)out->data : 0),
                                  (Py_ssize_t)(out ? elements(out) : 0), shape, status, who,
                                  (int)a->avg);
    if (!r && !msg[0]) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyObject *s = value ? PyObject_Str(value) : NULL;
        const char *text = s ? PyUnicode_AsUTF8(s) : NULL;
        snprintf(msg, sizeof msg, "pooltensor collective: %s: %s",
                 type ? ((PyTypeObject *)type)->tp_name : "error", text ? text : "?");
        Py_XDECREF(s);
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        PyErr_Clear();
    } else if (r && r != Py_None) {
        const char *text = PyUnicode_Check(r) ? PyUnicode_AsUTF8(r) : NULL;
        snprintf(msg, sizeof msg, "%s", text ? text : "pooltensor collective failed");
        PyErr_Clear();
    }
    Py_XDECREF(r);
    Py_XDECREF(shape);
    Py_XDECREF(slow);
    PyGILState_Release(g);
    atomic_fetch_add(&S.slow_calls, 1);
    return msg[0] ? ffi_error(fapi, XLA_FFI_Error_Code_ABORTED, msg) : NULL;
}

static XLA_FFI_Error *pt_collective(XLA_FFI_CallFrame *cf)
{
    XLA_FFI_Extension_Base *ext = cf->extension_start;
    if (ext && ext->type == XLA_FFI_Extension_Metadata) {
        XLA_FFI_Metadata *md = ((XLA_FFI_Metadata_Extension *)ext)->metadata;
        md->api_version.major_version = XLA_FFI_API_MAJOR;
        md->api_version.minor_version = XLA_FFI_API_MINOR;
        md->traits = 0;
        return NULL;
    }
    if (cf->stage != XLA_FFI_ExecutionStage_EXECUTE)
        return NULL;
    attrs_t a;
    if (parse_attrs(&cf->attrs, &a) < 0)
        return ffi_error(cf->api, XLA_FFI_Error_Code_INVALID_ARGUMENT,
                         "pooltensor collective: bad attributes");
    XLA_FFI_Buffer *in = data_buffer(cf->args.size, cf->args.args);
    XLA_FFI_Buffer *out = data_buffer(cf->rets.size, cf->rets.rets);
    if (a.kind != K_BARRIER && (!in || !out))
        return ffi_error(cf->api, XLA_FFI_Error_Code_INVALID_ARGUMENT,
                         "pooltensor collective: missing operand or result");

    pthread_mutex_lock(&S.lock);
    pt_team_t *team = S.team;
    const pt_team_api_t *api = S.api;
    _Atomic int64_t *board = S.board;
    int64_t seen = S.seen;
    double timeout = S.timeout;
    pthread_mutex_unlock(&S.lock);

    if (!team || !api || !board || atomic_load(&board[0]) != seen)
        return call_python(cf->api, P_WHOLE, &a, in, out, 0, -1);
    if (out)   /* XLA gives every run fresh buffers: see pt_prefault */
        api->prefault(out->data, elements(out) * xla_size(out->dtype));
    atomic_fetch_add(&board[1], 1);           /* Calls.begin: this rank's call number */
    int who = -1;
    pt_status_t st = run_team(api, team, &a, in, out, timeout, &who);
    if (st != PT_OK)
        return call_python(cf->api, P_FAILED, &a, in, out, (int)st, who);
    if (a.avg > 0)
        divide(&a, out);
    if (atomic_load(&board[0]) != seen)       /* Calls.end: a peer may have given it up */
        return call_python(cf->api, P_END, &a, in, out, 0, -1);
    atomic_fetch_add(&S.fast_calls, 1);
    return NULL;
}

/* ---------------- module ---------------- */

static PyObject *mod_handler(PyObject *m, PyObject *unused)
{
    return PyCapsule_New((void *)pt_collective, NULL, NULL);
}

static PyObject *mod_set_api(PyObject *m, PyObject *cap)
{
    const pt_team_api_t *api = PyCapsule_GetPointer(cap, "collectives._native.team_api");
    if (!api)
        return NULL;
    if (api->version != PT_TEAM_API_VERSION)
        return PyErr_Format(PyExc_RuntimeError, "collectives._native team api version %d, "
                            "this handler was built for %d: rebuild", api->version,
                            PT_TEAM_API_VERSION);
    pthread_mutex_lock(&S.lock);
    S.api = api;
    pthread_mutex_unlock(&S.lock);
    Py_RETURN_NONE;
}

static PyObject *mod_set_slow(PyObject *m, PyObject *fn)
{
    if (fn != Py_None && !PyCallable_Check(fn))
        return PyErr_Format(PyExc_TypeError, "expected a callable or None");
    PyObject *old = S.slow;
    Py_INCREF(fn);
    pthread_mutex_lock(&S.lock);
    S.slow = fn == Py_None ? NULL : fn;
    pthread_mutex_unlock(&S.lock);
    if (fn == Py_None)
        Py_DECREF(fn);
    Py_XDECREF(old);
    Py_RETURN_NONE;
}

/* bind(team_address, board_address, seen, timeout): the fast path's state; bind(0, 0, 0, 0)
 * sends every call to Python. The caller keeps the team and the board alive while bound. */
static PyObject *mod_bind(PyObject *m, PyObject *args)
{
    Py_ssize_t team, board;
    long long seen;
    double timeout;
    if (!PyArg_ParseTuple(args, "nnLd", &team, &board, &seen, &timeout))
        return NULL;
    pthread_mutex_lock(&S.lock);
    S.team = (pt_team_t *)(intptr_t)team;
    S.board = (_Atomic int64_t *)(intptr_t)board;
    S.seen = seen;
    S.timeout = timeout;
    pthread_mutex_unlock(&S.lock);
    Py_RETURN_NONE;
}

static PyObject *mod_stats(PyObject *m, PyObject *unused)
{
    return Py_BuildValue("{s:K,s:K,s:O}", "fast", (unsigned long long)atomic_load(&S.fast_calls),
                         "slow", (unsigned long long)atomic_load(&S.slow_calls), "bound",
                         S.team ? Py_True : Py_False);
}

static PyMethodDef functions[] = {
    {"handler", mod_handler, METH_NOARGS, "handler(): the XLA FFI handler, as a PyCapsule"},
    {"set_api", mod_set_api, METH_O, "set_api(capsule): collectives._native.team_api"},
    {"set_slow", mod_set_slow, METH_O, "set_slow(fn): the Python side of every slow call"},
    {"bind", mod_bind, METH_VARARGS, "bind(team, board, seen, timeout): the fast path's state"},
    {"stats", mod_stats, METH_NOARGS, "stats(): calls taken on the fast and the slow path"},
    {NULL}};

static struct PyModuleDef moddef = {
    PyModuleDef_HEAD_INIT,
    .m_name = "collectives._jaxffi",
    .m_doc = "The XLA FFI handler of collectives.jax.",
    .m_size = -1,
    .m_methods = functions,
};

PyMODINIT_FUNC PyInit__jaxffi(void) { return PyModule_Create(&moddef); }
