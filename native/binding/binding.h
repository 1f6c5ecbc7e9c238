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

int pt_py_add_kernels(PyObject *module);

/* tcp_py.c: Context methods for the tcp transport, and module functions */
PyObject *pt_py_set_secret(ContextObject *self, PyObject *args);
PyObject *pt_py_set_timeout(ContextObject *self, PyObject *args);
PyObject *pt_py_listen(ContextObject *self, PyObject *args);
PyObject *pt_py_connect_tcp(ContextObject *self, PyObject *args);
PyObject *pt_py_tcp_stats(ContextObject *self, PyObject *unused);
PyObject *pt_py_tcp_open(ContextObject *self, PyObject *args);
PyObject *pt_py_transport(ContextObject *self, PyObject *args);
PyObject *pt_py_hmac_sha256(PyObject *m, PyObject *args);
PyObject *pt_py_sha256(PyObject *m, PyObject *args);
int pt_py_add_team(PyObject *module);

#endif
