/* The floor for a native data path (issue 22): a client and an upstream asyncio Protocol written in C, on uvloop,
   calling Python once per request to route it and once when its answer is complete. Not a proxy to run: no limits,
   no errors, no pipelining beyond one request at a time, heads found by their blank line and Content-Length, a
   chunked answer ended by the read that ends in its last chunk. benchmarks/native_floor/serve.py builds and runs
   it; with "--route ours" the two Python calls are the router's own routing and bookkeeping, so
   benchmarks/proxy_cost.py shows what that Python costs per request with no Python data path around it. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <string.h>
#include <strings.h>

typedef struct ClientObject ClientObject;
typedef struct {
    PyObject_HEAD
    PyObject *write;      /* transport.write */
    PyObject *pool;       /* list this connection returns to */
    ClientObject *client;
    PyObject *token;      /* what route returned, handed to finish */
    char head[16384]; Py_ssize_t headlen; int in_head; Py_ssize_t need; int chunked;
} UpstreamObject;

struct ClientObject {
    PyObject_HEAD
    PyObject *write;
    PyObject *route;      /* route(key) -> (pool list, token) */
    PyObject *finish;     /* finish(token) */
    PyObject *connect;    /* connect(pool, client, request bytes): opens a connection (Python) */
    char *buf; Py_ssize_t len, cap;
    int busy;
};

static PyTypeObject UpstreamType, ClientType;

static const char *find_crlf2(const char *s, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i + 3 < n; i++)
        if (s[i] == '\r' && s[i+1] == '\n' && s[i+2] == '\r' && s[i+3] == '\n') return s + i;
    return NULL;
}

static Py_ssize_t header_value(const char *head, Py_ssize_t n, const char *name, const char **val) {
    size_t nl = strlen(name);
    const char *p = head, *end = head + n;
    while (p < end) {
        const char *eol = memchr(p, '\n', end - p);
        if (!eol) eol = end;
        if ((size_t)(eol - p) > nl && strncasecmp(p, name, nl) == 0 && p[nl] == ':') {
            const char *v = p + nl + 1;
            while (v < eol && *v == ' ') v++;
            const char *ve = eol;
            if (ve > v && ve[-1] == '\r') ve--;
            *val = v; return ve - v;
        }
        p = eol + 1;
    }
    return -1;
}

static PyObject *send_to(UpstreamObject *up, ClientObject *c, PyObject *token, const char *req, Py_ssize_t n) {
    up->client = c; Py_INCREF(c);
    up->token = token; Py_INCREF(token);
    up->in_head = 1; up->headlen = 0; up->need = 0;
    PyObject *b = PyBytes_FromStringAndSize(req, n);
    if (!b) return NULL;
    PyObject *r = PyObject_CallOneArg(up->write, b);
    Py_DECREF(b);
    return r;
}

static int client_next(ClientObject *c) {
    while (!c->busy) {
        const char *he = find_crlf2(c->buf, c->len);
        if (!he) return 0;
        Py_ssize_t hlen = he - c->buf + 4;
        const char *v; Py_ssize_t vl = header_value(c->buf, hlen, "content-length", &v);
        Py_ssize_t cl = 0;
        if (vl > 0) { char tmp[32]; memcpy(tmp, v, vl < 31 ? vl : 31); tmp[vl < 31 ? vl : 31] = 0; cl = atol(tmp); }
        if (c->len < hlen + cl) return 0;
        const char *k; Py_ssize_t kl = header_value(c->buf, hlen, "x-session-id", &k);
        PyObject *key = kl >= 0 ? PyBytes_FromStringAndSize(k, kl) : (Py_INCREF(Py_None), Py_None);
        PyObject *routed = PyObject_CallOneArg(c->route, key);
        Py_DECREF(key);
        if (!routed) return -1;
        PyObject *pool = PyTuple_GET_ITEM(routed, 0), *token = PyTuple_GET_ITEM(routed, 1);
        c->busy = 1;
        Py_ssize_t n = PyList_GET_SIZE(pool);
        PyObject *r;
        if (n > 0) {
            UpstreamObject *up = (UpstreamObject *)PyList_GET_ITEM(pool, n - 1);
            Py_INCREF(up);
            PyList_SetSlice(pool, n - 1, n, NULL);
            r = send_to(up, c, token, c->buf, hlen + cl);
            Py_DECREF(up);
        } else {
            PyObject *b = PyBytes_FromStringAndSize(c->buf, hlen + cl);
            r = PyObject_CallFunctionObjArgs(c->connect, pool, (PyObject *)c, token, b, NULL);
            Py_DECREF(b);
        }
        Py_DECREF(routed);
        memmove(c->buf, c->buf + hlen + cl, c->len - hlen - cl);
        c->len -= hlen + cl;
        if (!r) return -1;
        Py_DECREF(r);
    }
    return 0;
}

/* Client */
static int Client_init(ClientObject *self, PyObject *args, PyObject *kw) {
    if (!PyArg_ParseTuple(args, "OOO", &self->route, &self->finish, &self->connect)) return -1;
    Py_INCREF(self->route); Py_INCREF(self->finish); Py_INCREF(self->connect);
    self->cap = 65536; self->buf = PyMem_Malloc(self->cap); self->len = 0; self->busy = 0; self->write = NULL;
    return 0;
}
static void Client_dealloc(ClientObject *self) {
    Py_XDECREF(self->write); Py_XDECREF(self->route); Py_XDECREF(self->finish); Py_XDECREF(self->connect);
    PyMem_Free(self->buf); Py_TYPE(self)->tp_free((PyObject *)self);
}
static PyObject *Client_connection_made(ClientObject *self, PyObject *t) {
    Py_XSETREF(self->write, PyObject_GetAttrString(t, "write"));
    if (!self->write) return NULL;
    Py_RETURN_NONE;
}
static PyObject *Client_data_received(ClientObject *self, PyObject *data) {
    char *d; Py_ssize_t n;
    if (PyBytes_AsStringAndSize(data, &d, &n) < 0) return NULL;
    if (self->len + n > self->cap) {
        Py_ssize_t cap = self->cap; while (cap < self->len + n) cap *= 2;
        char *nb = PyMem_Realloc(self->buf, cap); if (!nb) return PyErr_NoMemory();
        self->buf = nb; self->cap = cap;
    }
    memcpy(self->buf + self->len, d, n); self->len += n;
    if (client_next(self) < 0) return NULL;
    Py_RETURN_NONE;
}
static PyObject *Client_noop(PyObject *self, PyObject *arg) { Py_RETURN_NONE; }
static PyObject *Client_noop0(PyObject *self, PyObject *unused) { Py_RETURN_NONE; }
static PyObject *Client_eof(PyObject *self, PyObject *unused) { Py_RETURN_FALSE; }
static PyObject *Client_answered(ClientObject *self, PyObject *unused) {
    self->busy = 0;
    if (client_next(self) < 0) return NULL;
    Py_RETURN_NONE;
}
static PyMethodDef Client_methods[] = {
    {"connection_made", (PyCFunction)Client_connection_made, METH_O, NULL},
    {"data_received", (PyCFunction)Client_data_received, METH_O, NULL},
    {"connection_lost", (PyCFunction)Client_noop, METH_O, NULL},
    {"eof_received", (PyCFunction)Client_eof, METH_NOARGS, NULL},
    {"pause_writing", (PyCFunction)Client_noop0, METH_NOARGS, NULL},
    {"resume_writing", (PyCFunction)Client_noop0, METH_NOARGS, NULL},
    {"answered", (PyCFunction)Client_answered, METH_NOARGS, NULL},
    {NULL}
};

/* Upstream */
static int Upstream_init(UpstreamObject *self, PyObject *args, PyObject *kw) {
    if (!PyArg_ParseTuple(args, "O", &self->pool)) return -1;
    Py_INCREF(self->pool); self->client = NULL; self->token = NULL; self->write = NULL; self->in_head = 1;
    return 0;
}
static void Upstream_dealloc(UpstreamObject *self) {
    Py_XDECREF(self->write); Py_XDECREF(self->pool); Py_XDECREF(self->client); Py_XDECREF(self->token);
    Py_TYPE(self)->tp_free((PyObject *)self);
}
static PyObject *Upstream_connection_made(UpstreamObject *self, PyObject *t) {
    Py_XSETREF(self->write, PyObject_GetAttrString(t, "write"));
    if (!self->write) return NULL;
    Py_RETURN_NONE;
}
static PyObject *Upstream_send(UpstreamObject *self, PyObject *args) {
    PyObject *client, *token, *req;
    if (!PyArg_ParseTuple(args, "OOS", &client, &token, &req)) return NULL;
    return send_to(self, (ClientObject *)client, token, PyBytes_AS_STRING(req), PyBytes_GET_SIZE(req));
}
static PyObject *Upstream_data_received(UpstreamObject *self, PyObject *data) {
    char *d; Py_ssize_t n;
    if (PyBytes_AsStringAndSize(data, &d, &n) < 0) return NULL;
    ClientObject *c = self->client;
    if (!c) Py_RETURN_NONE;
    PyObject *r = PyObject_CallOneArg(c->write, data);
    if (!r) return NULL;
    Py_DECREF(r);
    if (self->in_head) {
        Py_ssize_t take = n < (Py_ssize_t)sizeof(self->head) - self->headlen ? n : (Py_ssize_t)sizeof(self->head) - self->headlen;
        memcpy(self->head + self->headlen, d, take); self->headlen += take;
        const char *he = find_crlf2(self->head, self->headlen);
        if (!he) Py_RETURN_NONE;
        Py_ssize_t hlen = he - self->head + 4;
        const char *v; Py_ssize_t vl = header_value(self->head, hlen, "content-length", &v);
        Py_ssize_t cl = 0;
        if (vl > 0) { char tmp[32]; memcpy(tmp, v, vl < 31 ? vl : 31); tmp[vl < 31 ? vl : 31] = 0; cl = atol(tmp); }
        self->in_head = 0;
        self->chunked = vl < 0;
        self->need = cl - (self->headlen - hlen);
    } else {
        self->need -= n;
    }
    if (self->chunked ? (n >= 5 && memcmp(d + n - 5, "0\r\n\r\n", 5) == 0) : self->need <= 0) {
        PyObject *token = self->token; self->token = NULL;
        self->client = NULL;
        if (PyList_Append(self->pool, (PyObject *)self) < 0) return NULL;
        r = PyObject_CallOneArg(c->finish, token);
        Py_DECREF(token);
        if (!r) { Py_DECREF(c); return NULL; }
        Py_DECREF(r);
        c->busy = 0;
        int e = client_next(c);
        Py_DECREF(c);
        if (e < 0) return NULL;
    }
    Py_RETURN_NONE;
}
static PyObject *Upstream_connection_lost(UpstreamObject *self, PyObject *exc) {
    Py_ssize_t at = PySequence_Index(self->pool, (PyObject *)self);  /* an idle one the replica closed */
    if (at < 0) { PyErr_Clear(); Py_RETURN_NONE; }
    if (PyList_SetSlice(self->pool, at, at + 1, NULL) < 0) return NULL;
    Py_RETURN_NONE;
}
static PyMethodDef Upstream_methods[] = {
    {"connection_made", (PyCFunction)Upstream_connection_made, METH_O, NULL},
    {"data_received", (PyCFunction)Upstream_data_received, METH_O, NULL},
    {"connection_lost", (PyCFunction)Upstream_connection_lost, METH_O, NULL},
    {"eof_received", (PyCFunction)Client_eof, METH_NOARGS, NULL},
    {"pause_writing", (PyCFunction)Client_noop0, METH_NOARGS, NULL},
    {"resume_writing", (PyCFunction)Client_noop0, METH_NOARGS, NULL},
    {"send", (PyCFunction)Upstream_send, METH_VARARGS, NULL},
    {NULL}
};

static PyTypeObject ClientType = {
    PyVarObject_HEAD_INIT(NULL, 0) .tp_name = "native_floor.Client", .tp_basicsize = sizeof(ClientObject),
    .tp_flags = Py_TPFLAGS_DEFAULT, .tp_new = PyType_GenericNew, .tp_init = (initproc)Client_init,
    .tp_dealloc = (destructor)Client_dealloc, .tp_methods = Client_methods,
};
static PyTypeObject UpstreamType = {
    PyVarObject_HEAD_INIT(NULL, 0) .tp_name = "native_floor.Upstream", .tp_basicsize = sizeof(UpstreamObject),
    .tp_flags = Py_TPFLAGS_DEFAULT, .tp_new = PyType_GenericNew, .tp_init = (initproc)Upstream_init,
    .tp_dealloc = (destructor)Upstream_dealloc, .tp_methods = Upstream_methods,
};
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "native_floor", NULL, -1, NULL};
PyMODINIT_FUNC PyInit_native_floor(void) {
    if (PyType_Ready(&ClientType) < 0 || PyType_Ready(&UpstreamType) < 0) return NULL;
    PyObject *m = PyModule_Create(&mod);
    Py_INCREF(&ClientType); PyModule_AddObject(m, "Client", (PyObject *)&ClientType);
    Py_INCREF(&UpstreamType); PyModule_AddObject(m, "Upstream", (PyObject *)&UpstreamType);
    return m;
}
