/* Shared by the binding's files: the Context object and turning a status into an exception. */
#ifndef PT_BINDING_H
#define PT_BINDING_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "pt.h"

typedef struct {
    PyObject_HEAD
    pt_ctx_t *ctx;
    pt_ctx_t *zombie;       /* closed while attachments lived: destroyed with the object */
    Py_ssize_t attachments;
} ContextObject;

extern PyTypeObject ContextType;

/* Set _native.Error(status, errno, text, who) and return NULL. */
PyObject *pt_py_raise(pt_status_t st, int who);

/* A status that no one peer is to blame for, as an exception; NULL. */
static inline PyObject *raise_status(pt_status_t st) { return pt_py_raise(st, -1); }

/* None for PT_OK, else the status as an exception (who: the peer to blame, or -1). */
static inline PyObject *pt_py_none_or_raise(pt_status_t st, int who)
{
    if (st != PT_OK)
        return pt_py_raise(st, who);
    Py_RETURN_NONE;
}

/* ValueError("context is closed"); NULL. */
static inline PyObject *pt_py_closed(void)
{
    PyErr_SetString(PyExc_ValueError, "context is closed");
    return NULL;
}

/* In a method of ContextObject: return NULL with ValueError once the context is closed. */
#define CTX(self)                                                                   \
    do {                                                                            \
        if (!(self)->ctx)                                                           \
            return pt_py_closed();                                                  \
    } while (0)

/* An "O&" converter for keys and offsets: a Python integer in [0, 2**64) into the unsigned long
 * long at `out`. The "K" format would take any integer modulo 2**64, so 2**64 + 8 would silently
 * name offset 8; here it is an OverflowError, as is a negative value. */
int pt_py_u64(PyObject *obj, void *out);

int pt_py_add_kernels(PyObject *module);

/* segment_py.c: the Segment type, what segments are made of */
extern PyTypeObject pt_py_SegmentType;
pt_segment_t *pt_py_segment(PyObject *segment);   /* segment: a pt_py_SegmentType object */
PyObject *pt_py_segment_kind(PyObject *m, PyObject *unused);

/* tcp_py.c: Context methods for the tcp transport, and module functions */
PyObject *pt_py_set_secret(ContextObject *self, PyObject *args);
PyObject *pt_py_set_timeout(ContextObject *self, PyObject *args);
PyObject *pt_py_listen(ContextObject *self, PyObject *args);
PyObject *pt_py_connect_tcp(ContextObject *self, PyObject *args);
PyObject *pt_py_connect_tcp_served(ContextObject *self, PyObject *args);
PyObject *pt_py_tcp_stats(ContextObject *self, PyObject *unused);
PyObject *pt_py_tcp_peer_stats(ContextObject *self, PyObject *args);
PyObject *pt_py_tcp_rejoin(ContextObject *self, PyObject *args);
PyObject *pt_py_tcp_open(ContextObject *self, PyObject *args);
PyObject *pt_py_put_notify_quiet(ContextObject *self, PyObject *args);
PyObject *pt_py_transport(ContextObject *self, PyObject *args);
PyObject *pt_py_hmac_sha256(PyObject *m, PyObject *args);
PyObject *pt_py_sha256(PyObject *m, PyObject *args);
int pt_py_add_team(PyObject *module);

/* channel_py.c: the window channel's one-exchange allreduce, and the largest tcp frames'
 * payloads: TCP_FRAME (gets and puts), TCP_QUIET_FRAME (unanswered puts: the channel's) */
extern PyTypeObject pt_py_ChannelType;
int pt_py_add_channel(PyObject *module);

/* stats_py.c: the native counters */
PyObject *pt_py_stats(ContextObject *self, PyObject *unused);
PyObject *pt_py_stats_record(ContextObject *self, PyObject *args);
PyObject *pt_py_stats_count(ContextObject *self, PyObject *args);
int pt_py_add_stats(PyObject *module);
/* verbs_py.c: Context methods for the verbs transport, and the probe */
PyObject *pt_py_verbs_local(ContextObject *self, PyObject *args);
PyObject *pt_py_connect_verbs(ContextObject *self, PyObject *args);
PyObject *pt_py_verbs_info(ContextObject *self, PyObject *unused);
PyObject *pt_py_verbs_probe(PyObject *m, PyObject *unused);

#endif
