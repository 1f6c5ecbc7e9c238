/* The stats binding: the snapshot of a context's counters (native/src/core/stats.c) as Python
 * tuples, recording from above (a collective the layers above run), link events, and the
 * histogram's arithmetic, so that percentiles are computed one way only (pt_hist_percentile). */
#include <stdlib.h>
#include <string.h>

#include "binding.h"

static int op_of(const char *name)
{
    for (int i = 0; i < PT_STAT_NOPS; i++)
        if (strcmp(pt_stat_op_name(i), name) == 0)
            return i;
    PyErr_Format(PyExc_ValueError, "unknown operation '%s'", name);
    return -1;
}

static int transport_of(const char *name)
{
    for (int i = 0; i < PT_STAT_NTRANSPORTS; i++)
        if (pt_stat_transport_name(i) && strcmp(pt_stat_transport_name(i), name) == 0)
            return i;
    PyErr_Format(PyExc_ValueError, "unknown transport '%s'", name);
    return -1;
}

static PyObject *name_or_none(const char *s)
{
    if (s)
        return PyUnicode_FromString(s);
    Py_RETURN_NONE;
}

/* The nonzero buckets as a tuple of (index, count). */
static PyObject *sparse(const pt_hist_t *h)
{
    Py_ssize_t k = 0;
    for (int i = 0; i < PT_HIST_BUCKETS; i++)
        k += h->buckets[i] != 0;
    PyObject *t = PyTuple_New(k);
    if (!t)
        return NULL;
    k = 0;
    for (int i = 0; i < PT_HIST_BUCKETS; i++)
        if (h->buckets[i]) {
            PyObject *p = Py_BuildValue("(iK)", i, (unsigned long long)h->buckets[i]);
            if (!p) {
                Py_DECREF(t);
                return NULL;
            }
            PyTuple_SET_ITEM(t, k++, p);
        }
    return t;
}

PyObject *pt_py_stats(ContextObject *self, PyObject *unused)
{
    CTX(self);
    pt_stat_entry_t *es;
    pt_stat_link_t *ls;
    size_t n, nl;
    pt_status_t st;
    pt_ctx_t *c = self->ctx;
    Py_BEGIN_ALLOW_THREADS
    st = pt_ctx_stats(c, &es, &n, &ls, &nl);
    Py_END_ALLOW_THREADS
    if (st != PT_OK)
        return raise_status(st);
    PyObject *entries = PyList_New(0), *links = PyList_New(0), *res = NULL;
    if (!entries || !links)
        goto out;
    for (size_t i = 0; i < n; i++) {
        pt_stat_entry_t *e = &es[i];
        PyObject *b = sparse(&e->hist);
        PyObject *t = b ? Py_BuildValue(
            "{s:i,s:N,s:s,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:N}", "peer", e->rank, "transport",
            name_or_none(pt_stat_transport_name(e->transport)), "op", pt_stat_op_name(e->op),
            "ops", (unsigned long long)e->ops, "bytes", (unsigned long long)e->bytes, "errors",
            (unsigned long long)e->errors, "timeouts", (unsigned long long)e->timeouts, "timed",
            (unsigned long long)e->timed, "count",
            (unsigned long long)e->hist.count, "sum_ns", (unsigned long long)e->hist.sum_ns,
            "min_ns", (unsigned long long)e->hist.min_ns, "max_ns",
            (unsigned long long)e->hist.max_ns, "buckets", b) : NULL;
        if (!t || PyList_Append(entries, t) < 0) {
            Py_XDECREF(t);
            goto out;
        }
        Py_DECREF(t);
    }
    static const char *states[] = {"unreached", "up", "lost"};
    for (size_t i = 0; i < nl; i++) {
        pt_stat_link_t *l = &ls[i];
        PyObject *ev = PyDict_New();
        for (int k = 0; ev && k < PT_STAT_NEVENTS; k++) {
            PyObject *v = PyLong_FromUnsignedLongLong(l->events[k]);
            if (!v || PyDict_SetItemString(ev, pt_stat_event_name(k), v) < 0) {
                Py_XDECREF(v);
                Py_CLEAR(ev);
                break;
            }
            Py_DECREF(v);
        }
        PyObject *t = ev ? Py_BuildValue(
            "{s:i,s:s,s:N,s:N,s:N,s:N,s:d}", "peer", l->rank, "state", states[l->state],
            "transport", name_or_none(l->transport ? pt_stat_transport_name(l->transport) : NULL),
            "events", ev, "last_error",
            l->last_status ? PyUnicode_FromString(pt_status_str(l->last_status)) : Py_NewRef(Py_None),
            "last_error_op", name_or_none(l->last_status ? pt_stat_op_name(l->last_op) : NULL),
            "last_error_time", l->last_time) : NULL;
        if (!t || PyList_Append(links, t) < 0) {
            Py_XDECREF(t);
            goto out;
        }
        Py_DECREF(t);
    }
    res = Py_BuildValue("(OO)", entries, links);
out:
    Py_XDECREF(entries);
    Py_XDECREF(links);
    free(es);
    free(ls);
    return res;
}

PyObject *pt_py_stats_record(ContextObject *self, PyObject *args)
{
    int rank, status;
    const char *tname, *oname;
    unsigned long long bytes;
    double seconds;
    if (!PyArg_ParseTuple(args, "issKid", &rank, &tname, &oname, &bytes, &status, &seconds))
        return NULL;
    CTX(self);
    int tr = transport_of(tname), op = tr < 0 ? -1 : op_of(oname);
    if (op < 0)
        return NULL;
    if (rank < -1 || status < 0 || !(seconds >= 0)) {
        PyErr_SetString(PyExc_ValueError, "rank >= -1, status >= 0 and seconds >= 0 expected");
        return NULL;
    }
    pt_stats_record(self->ctx, rank, tr, (pt_stat_op_t)op, bytes, (pt_status_t)status,
                    (uint64_t)(seconds * 1e9 + 0.5));
    Py_RETURN_NONE;
}

PyObject *pt_py_stats_count(ContextObject *self, PyObject *args)
{
    int rank;
    const char *name;
    if (!PyArg_ParseTuple(args, "is", &rank, &name))
        return NULL;
    CTX(self);
    for (int i = 0; i < PT_STAT_NEVENTS; i++)
        if (strcmp(pt_stat_event_name(i), name) == 0) {
            pt_stats_count(self->ctx, rank, (pt_stat_event_t)i);
            Py_RETURN_NONE;
        }
    PyErr_Format(PyExc_ValueError, "unknown event '%s'", name);
    return NULL;
}

static PyObject *mod_stats_enable(PyObject *m, PyObject *args)
{
    int on = -1;
    if (!PyArg_ParseTuple(args, "|p", &on))
        return NULL;
    if (on < 0) {  /* a query: set it back as it was */
        int was = pt_stats_enable(1);
        pt_stats_enable(was);
        return PyBool_FromLong(was);
    }
    return PyBool_FromLong(pt_stats_enable(on));
}

static PyObject *mod_hist_bucket(PyObject *m, PyObject *args)
{
    unsigned long long ns;
    if (!PyArg_ParseTuple(args, "K", &ns))
        return NULL;
    return PyLong_FromLong(pt_hist_bucket(ns));
}

static PyObject *mod_hist_bounds(PyObject *m, PyObject *unused)
{
    PyObject *lo = PyList_New(PT_HIST_BUCKETS), *hi = PyList_New(PT_HIST_BUCKETS);
    for (int i = 0; lo && hi && i < PT_HIST_BUCKETS; i++) {
        PyList_SET_ITEM(lo, i, PyLong_FromUnsignedLongLong(pt_hist_low(i)));
        PyList_SET_ITEM(hi, i, PyLong_FromUnsignedLongLong(pt_hist_high(i)));
    }
    if (!lo || !hi || PyErr_Occurred()) {
        Py_XDECREF(lo);
        Py_XDECREF(hi);
        return NULL;
    }
    return Py_BuildValue("(NN)", lo, hi);
}

/* hist_percentiles(buckets, min_ns, max_ns, quantiles) -> list of ns */
static PyObject *mod_hist_percentiles(PyObject *m, PyObject *args)
{
    PyObject *buckets, *qs;
    unsigned long long lo, hi;
    if (!PyArg_ParseTuple(args, "OKKO", &buckets, &lo, &hi, &qs))
        return NULL;
    pt_hist_t *h = PyMem_Calloc(1, sizeof(*h));
    if (!h)
        return PyErr_NoMemory();
    PyObject *res = NULL, *seq = PySequence_Fast(buckets, "buckets: a sequence of (index, count)");
    if (!seq)
        goto out;
    for (Py_ssize_t k = 0; k < PySequence_Fast_GET_SIZE(seq); k++) {
        int i;
        unsigned long long n;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, k), "iK", &i, &n))
            goto out;
        if (i < 0 || i >= PT_HIST_BUCKETS) {
            PyErr_Format(PyExc_ValueError, "bucket %d outside 0..%d", i, PT_HIST_BUCKETS - 1);
            goto out;
        }
        h->buckets[i] += n;
        h->count += n;
    }
    h->min_ns = lo;
    h->max_ns = hi;
    PyObject *q = PySequence_Fast(qs, "quantiles: a sequence of floats");
    if (!q)
        goto out;
    res = PyList_New(PySequence_Fast_GET_SIZE(q));
    for (Py_ssize_t k = 0; res && k < PySequence_Fast_GET_SIZE(q); k++) {
        double v = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(q, k));
        if (v == -1 && PyErr_Occurred()) {
            Py_CLEAR(res);
            break;
        }
        PyList_SET_ITEM(res, k, PyFloat_FromDouble(pt_hist_percentile(h, v)));
    }
    Py_DECREF(q);
out:
    Py_XDECREF(seq);
    PyMem_Free(h);
    return res;
}

static PyObject *mod_transports(PyObject *m, PyObject *unused)
{
    PyObject *out = PyList_New(0);
    for (int i = 1; out && i < PT_STAT_NTRANSPORTS; i++) {
        const char *name = pt_stat_transport_name(i);
        PyObject *s = name ? PyUnicode_FromString(name) : NULL;
        if (name && (!s || PyList_Append(out, s) < 0)) {
            Py_XDECREF(s);
            Py_CLEAR(out);
        }
        Py_XDECREF(s);
    }
    return out;
}

static PyMethodDef stats_functions[] = {
    {"transports", mod_transports, METH_NOARGS,
     "transports() -> [name]: the transports this build has, by id (shm, tcp, ...)."},
    {"stats_enable", mod_stats_enable, METH_VARARGS,
     "stats_enable([on]) -> bool: switch the native counters on or off (process-wide); "
     "returns the previous setting (no argument: only returns it)."},
    {"hist_bucket", mod_hist_bucket, METH_VARARGS, "hist_bucket(ns) -> the bucket index."},
    {"hist_bounds", mod_hist_bounds, METH_NOARGS,
     "hist_bounds() -> (lows, highs): the smallest and largest ns of every bucket."},
    {"hist_percentiles", mod_hist_percentiles, METH_VARARGS,
     "hist_percentiles(buckets, min_ns, max_ns, quantiles) -> [ns]: from sparse (index, "
     "count) buckets, as pt_hist_percentile."},
    {NULL}};

int pt_py_add_stats(PyObject *m)
{
    if (PyModule_AddIntConstant(m, "HIST_BUCKETS", PT_HIST_BUCKETS) < 0)
        return -1;
    return PyModule_AddFunctions(m, stats_functions);
}
