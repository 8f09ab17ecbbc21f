/* Batch reads and sends of whole ZeroMQ messages for bus.transport.zmqsocket.
 *
 * pyzmq costs about a microsecond per frame in Python objects (a Frame to learn whether
 * more frames follow, or an enum conversion per getsockopt(RCVMORE)); the Event BUS's
 * collector reads 7 frames per event and sends 6. This module does the same libzmq calls
 * as pyzmq, a batch per call, creating nothing but the bytes of each frame.
 *
 * It uses the libzmq that pyzmq itself loaded: bind() is given the path of pyzmq's
 * extension module, opens it without loading anything new (RTLD_NOLOAD) and looks the
 * functions up among its dependencies, so a socket handle from pyzmq is a handle of the
 * same library. Optional: without it (no compiler at install time) the transport reads
 * and sends through pyzmq as before.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>

/* libzmq's ABI (zmq.h, stable since libzmq 4.0): a message is 64 opaque octets aligned
 * for a pointer; the flags below are ZMQ_DONTWAIT and ZMQ_SNDMORE. */
typedef struct {
    unsigned char _[64] __attribute__((aligned(sizeof(void *))));
} zmq_msg_t;

#define ZMQ_DONTWAIT 1
#define ZMQ_SNDMORE 2
#define ZMQ_EVENTS 15
#define ZMQ_POLLIN 1

static int (*msg_init)(zmq_msg_t *);
static int (*msg_recv)(zmq_msg_t *, void *, int);
static int (*msg_close)(zmq_msg_t *);
static void *(*msg_data)(zmq_msg_t *);
static size_t (*msg_size)(const zmq_msg_t *);
static int (*msg_more)(const zmq_msg_t *);
static const char *(*msg_gets)(const zmq_msg_t *, const char *);
static int (*zmq_errno_)(void);
static int (*zmq_send_)(void *, const void *, size_t, int);
static int (*zmq_getsockopt_)(void *, int, void *, size_t *);

static int bound = 0;

static PyObject *frames_bind(PyObject *self, PyObject *args) {
    (void)self;
    const char *path;
    if (!PyArg_ParseTuple(args, "s", &path)) return NULL;
    void *library = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (library == NULL) {
        PyErr_Format(PyExc_ImportError, "%s is not loaded: %s", path, dlerror());
        return NULL;
    }
    struct { void **slot; const char *name; } wanted[] = {
        {(void **)&msg_init, "zmq_msg_init"},   {(void **)&msg_recv, "zmq_msg_recv"},
        {(void **)&msg_close, "zmq_msg_close"}, {(void **)&msg_data, "zmq_msg_data"},
        {(void **)&msg_size, "zmq_msg_size"},   {(void **)&msg_more, "zmq_msg_more"},
        {(void **)&msg_gets, "zmq_msg_gets"},   {(void **)&zmq_errno_, "zmq_errno"},
        {(void **)&zmq_send_, "zmq_send"},     {(void **)&zmq_getsockopt_, "zmq_getsockopt"},
    };
    for (size_t i = 0; i < sizeof(wanted) / sizeof(wanted[0]); i++) {
        void *function = dlsym(library, wanted[i].name);
        if (function == NULL) {
            PyErr_Format(PyExc_ImportError, "%s not found beside %s", wanted[i].name, path);
            return NULL;  /* the library stays open: others may already point into it */
        }
        *wanted[i].slot = function;
    }
    bound = 1;
    Py_RETURN_NONE;
}

static int check_bound(void) {
    if (!bound) PyErr_SetString(PyExc_RuntimeError, "bind() was not called");
    return bound;
}

/* Append a message property to ``list`` as text, None (or "") where libzmq has none;
 * -1 with a Python exception set when that fails. */
static int append_property(PyObject *list, zmq_msg_t *msg, const char *name, int none) {
    const char *value = msg_gets(msg, name);
    PyObject *text;
    if (value == NULL || value[0] == '\0') {
        text = none ? (Py_INCREF(Py_None), Py_None) : PyUnicode_FromStringAndSize("", 0);
    } else {
        text = PyUnicode_DecodeUTF8(value, (Py_ssize_t)strlen(value), "replace");
    }
    if (text == NULL) return -1;
    int appended = PyList_Append(list, text);
    Py_DECREF(text);
    return appended;
}

/* The next frame into ``msg`` (initialised here) without blocking, again when a signal
 * interrupted it: 0, or the errno (``msg`` is then closed). */
static int receive(zmq_msg_t *msg, void *handle) {
    for (;;) {
        msg_init(msg);
        if (msg_recv(msg, handle, ZMQ_DONTWAIT) >= 0) return 0;
        int failed = zmq_errno_();
        msg_close(msg);
        if (failed != EINTR) return failed;
    }
}

/* read(handle, budget, addresses, user_ids) -> (batch, error, addresses, user_ids)
 *
 * At most ``budget`` whole messages, each a list of bytes. ``error`` is 0 when the budget
 * ran out (more may wait), EAGAIN when the socket had no more, another errno when a
 * receive failed (the whole messages before it are in the batch). The two lists (the
 * Peer-Address of each message, or None; its User-Id, or "") are None unless asked for. */
static PyObject *frames_read(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long handle_number;
    Py_ssize_t budget;
    int want_addresses, want_user_ids;
    if (!PyArg_ParseTuple(args, "Knpp", &handle_number, &budget, &want_addresses,
                          &want_user_ids))
        return NULL;
    if (!check_bound()) return NULL;
    void *handle = (void *)(uintptr_t)handle_number;
    PyObject *batch = PyList_New(0);
    PyObject *addresses = want_addresses ? PyList_New(0) : (Py_INCREF(Py_None), Py_None);
    PyObject *user_ids = want_user_ids ? PyList_New(0) : (Py_INCREF(Py_None), Py_None);
    PyObject *message = NULL;
    int error = 0, more = 0;
    zmq_msg_t msg;
    if (batch == NULL || addresses == NULL || user_ids == NULL) goto fail;
    for (Py_ssize_t n = 0; n < budget; n++) {
        message = PyList_New(0);
        if (message == NULL) goto fail;
        int first = 1;
        more = 0;
        for (;;) {
            error = receive(&msg, handle);
            if (error) break;
            if (first) {
                first = 0;
                if ((want_addresses && append_property(addresses, &msg, "Peer-Address", 1) < 0) ||
                    (want_user_ids && append_property(user_ids, &msg, "User-Id", 0) < 0)) {
                    more = msg_more(&msg);
                    msg_close(&msg);
                    goto discard;
                }
            }
            PyObject *frame =
                PyBytes_FromStringAndSize((const char *)msg_data(&msg), (Py_ssize_t)msg_size(&msg));
            more = msg_more(&msg);
            msg_close(&msg);
            if (frame == NULL) goto discard;
            int appended = PyList_Append(message, frame);
            Py_DECREF(frame);
            if (appended < 0) goto discard;
            if (!more) break;
        }
        if (error) {
            /* Nothing of a message is handed over unless all of it was read; its
             * property entries (if its first frame came) go with it. */
            if (!first) {
                if (want_addresses) PySequence_DelItem(addresses, PyList_GET_SIZE(addresses) - 1);
                if (want_user_ids) PySequence_DelItem(user_ids, PyList_GET_SIZE(user_ids) - 1);
            }
            Py_CLEAR(message);
            break;
        }
        int appended = PyList_Append(batch, message);
        Py_CLEAR(message);
        if (appended < 0) goto fail;
    }
    return Py_BuildValue("(NiNN)", batch, error, addresses, user_ids);
discard:
    /* Out of memory in the middle of a message: the rest of it is read and dropped, so
     * that the next read starts at a message's first frame. */
    while (more && receive(&msg, handle) == 0) {
        more = msg_more(&msg);
        msg_close(&msg);
    }
fail:
    Py_XDECREF(message);
    Py_XDECREF(batch);
    Py_XDECREF(addresses);
    Py_XDECREF(user_ids);
    return NULL;
}

/* zmq_send, again when a signal interrupted it: 0, or the errno. */
static int send_buffer(void *handle, const void *data, size_t size, int flags) {
    int rc;
    do {
        rc = zmq_send_(handle, data, size, flags);
    } while (rc < 0 && zmq_errno_() == EINTR);
    return rc < 0 ? zmq_errno_() : 0;
}

/* One message: 0, the errno of the send that failed, or -1 with a Python exception set
 * (a frame without a buffer: then nothing of the message was sent). */
static int send_message(void *handle, PyObject *message) {
    PyObject *inner = PySequence_Fast(message, "a message must be a sequence of frames");
    if (inner == NULL) return -1;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(inner);
    PyObject **items = PySequence_Fast_ITEMS(inner);
    int error = 0;
    if (count == 0) {
        PyErr_SetString(PyExc_ValueError, "a message has at least one frame");
        Py_DECREF(inner);
        return -1;
    }
    Py_ssize_t exact = 0;
    while (exact < count && PyBytes_CheckExact(items[exact])) exact++;
    if (exact == count) {  /* the usual case: bytes only */
        for (Py_ssize_t i = 0; i < count && !error; i++) {
            int flags = ZMQ_DONTWAIT | (i < count - 1 ? ZMQ_SNDMORE : 0);
            error = send_buffer(handle, PyBytes_AS_STRING(items[i]),
                                (size_t)PyBytes_GET_SIZE(items[i]), flags);
        }
        Py_DECREF(inner);
        return error;
    }
    /* Other buffers: all of them first, so that a bad frame sends nothing. */
    Py_buffer *views = PyMem_Calloc((size_t)count, sizeof(Py_buffer));
    if (views == NULL) {
        Py_DECREF(inner);
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t held = 0;
    for (; held < count; held++) {
        if (PyObject_GetBuffer(items[held], &views[held], PyBUF_SIMPLE) < 0) {
            error = -1;
            break;
        }
    }
    for (Py_ssize_t i = 0; i < count && !error; i++) {
        int flags = ZMQ_DONTWAIT | (i < count - 1 ? ZMQ_SNDMORE : 0);
        error = send_buffer(handle, views[i].buf, (size_t)views[i].len, flags);
    }
    for (Py_ssize_t i = 0; i < held; i++) PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    Py_DECREF(inner);
    return error;
}

/* send(handle, messages) -> (sent, error)
 *
 * Sends each message (a sequence of frames, bytes or buffers) without blocking, in order,
 * until one fails: ``sent`` whole messages went out, ``error`` is 0 or the errno of the
 * failed send (EAGAIN: the socket's high-water mark; libzmq takes a message's frames
 * whole or refuses the first). A message that is not a sequence of buffers raises, and
 * nothing of it is sent. */
static PyObject *frames_send(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long handle_number;
    PyObject *messages;
    if (!PyArg_ParseTuple(args, "KO", &handle_number, &messages)) return NULL;
    if (!check_bound()) return NULL;
    void *handle = (void *)(uintptr_t)handle_number;
    PyObject *outer = PySequence_Fast(messages, "messages must be a sequence");
    if (outer == NULL) return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(outer);
    Py_ssize_t sent = 0;
    int error = 0;
    for (; sent < count; sent++) {
        error = send_message(handle, PySequence_Fast_GET_ITEM(outer, sent));
        if (error) break;
    }
    Py_DECREF(outer);
    if (error < 0) return NULL;
    return Py_BuildValue("(ni)", sent, error);
}

/* readable(handle) -> bool
 *
 * Whether a message waits to be read (ZMQ_EVENTS has POLLIN). Asking processes the
 * socket's pending commands, as a send may have done without the descriptor signalling
 * again: when this says False, the descriptor signals the next message that comes. */
static PyObject *frames_readable(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long handle_number;
    if (!PyArg_ParseTuple(args, "K", &handle_number)) return NULL;
    if (!check_bound()) return NULL;
    void *handle = (void *)(uintptr_t)handle_number;
    int events = 0;
    size_t size = sizeof(events);
    int rc;
    do {
        rc = zmq_getsockopt_(handle, ZMQ_EVENTS, &events, &size);
    } while (rc < 0 && zmq_errno_() == EINTR);
    if (rc < 0) {
        /* A closed context or socket: say so as pyzmq would, by errno. */
        int error = zmq_errno_();
        return PyErr_Format(PyExc_OSError, "zmq_getsockopt(ZMQ_EVENTS) failed: errno %d", error);
    }
    return PyBool_FromLong(events & ZMQ_POLLIN);
}

static PyMethodDef methods[] = {
    {"bind", frames_bind, METH_VARARGS,
     "bind(path): use the libzmq that the extension module at ``path`` (pyzmq's) loaded."},
    {"read", frames_read, METH_VARARGS,
     "read(handle, budget, addresses, user_ids) -> (batch, error, addresses, user_ids)"},
    {"send", frames_send, METH_VARARGS, "send(handle, messages) -> (sent, error)"},
    {"readable", frames_readable, METH_VARARGS,
     "readable(handle) -> bool: a message waits (ZMQ_EVENTS has POLLIN)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "bus.transport._frames",
    "Batch reads and sends of whole ZeroMQ messages (see bus.transport.frames).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__frames(void) { return PyModule_Create(&module); }
