/* Rows for an INSERT, compiled: bus/util/sqlitewal.py's bindable_rows, and the Event BUS
 * log's batches packed (bus/eventbus/logbatch.py).
 *
 * Python's sqlite3 looks every parameter up as a type to adapt, except int, float, str and
 * bytearray: even with bytes' adapter registered (bind_bytes_directly), each blob costs a
 * key tuple, a registry lookup and a call, the largest share of an event's insert
 * (callgrind: ~5,300 of ~15,000 instructions for a row of five blobs). A bytearray made here
 * costs a tenth of that; in Python, bytearray(value) costs as much as it saves. SQLite binds
 * both through the buffer protocol and copies them (SQLITE_TRANSIENT): the same BLOB is
 * stored, and read back as bytes.
 *
 * bindable(rows) -> [tuple(rows[0]), tuple(rows[1]), ...], with each non-empty exact bytes
 * of a row as a bytearray of the same bytes; every other value as it is.
 *
 * pack_arrays(items) -> the msgpack of a list of arrays of bin, what msgpack's Packer
 * (use_bin_type) makes of a list of tuples of bytes, byte for byte: items are tuples or lists
 * of exact bytes (anything else: TypeError, and the caller packs with msgpack). It sizes the
 * result first and writes it once, where the Packer looks each value's type up and grows
 * its buffer (0.28 us an event of five fields, measured).
 *
 * topics(packed) -> the first field of each array in such a msgpack list (each a bin: a
 * str, which msgpack reads as str, raises ValueError), as bytes: what latest-per-topic
 * compaction reads of a batch, without making the other four fields of every event
 * (msgpack.unpackb makes them all).
 *
 * keep(packed, kept) -> such a msgpack list with only the arrays whose byte in `kept` is not
 * zero, their bytes copied as they are: a batch written again without its superseded events,
 * without unpacking and packing again those it keeps.
 *
 * Both read only lists of arrays of bin (and str) with lengths inside the bytes given; any
 * other form raises ValueError, and the caller takes msgpack's way.
 *
 * Optional, like bus/transport/_frames.c: without a compiler the rows keep their bytes.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static PyObject *bindable(PyObject *value) {
    if (PyBytes_CheckExact(value) && PyBytes_GET_SIZE(value) > 0)
        return PyByteArray_FromStringAndSize(PyBytes_AS_STRING(value), PyBytes_GET_SIZE(value));
    Py_INCREF(value);
    return value;
}

/* msgpack's headers: a tag, then the length big-endian in `width` bytes (none: the length is
 * in the tag, a fixarray's). */
static char *put_tagged(char *out, unsigned char tag, Py_ssize_t length, int width) {
    *out++ = (char)tag;
    for (int shift = 8 * (width - 1); shift >= 0; shift -= 8) *out++ = (char)(length >> shift);
    return out;
}

static Py_ssize_t array_header_size(Py_ssize_t n) { return n < 16 ? 1 : n <= 0xffff ? 3 : 5; }
static Py_ssize_t bin_header_size(Py_ssize_t n) { return n < 256 ? 2 : n <= 0xffff ? 3 : 5; }

static char *put_array(char *out, Py_ssize_t n) {
    if (n < 16) return put_tagged(out, (unsigned char)(0x90 | n), 0, 0);
    return n <= 0xffff ? put_tagged(out, 0xdc, n, 2) : put_tagged(out, 0xdd, n, 4);
}

static char *put_bin(char *out, Py_ssize_t n) {
    if (n < 256) return put_tagged(out, 0xc4, n, 1);
    return n <= 0xffff ? put_tagged(out, 0xc5, n, 2) : put_tagged(out, 0xc6, n, 4);
}

static PyObject *pack_arrays(PyObject *module, PyObject *given) {
    (void)module;
    PyObject *items = PySequence_Fast(given, "pack_arrays() takes a sequence of sequences");
    if (items == NULL) return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(items);
    if (count > 0xffffffffLL) {
        Py_DECREF(items);
        PyErr_SetString(PyExc_ValueError, "pack_arrays(): too many items");
        return NULL;
    }
    /* First pass: check every value and size the result. */
    Py_ssize_t size = array_header_size(count);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(items, i);
        if (!PyTuple_CheckExact(item) && !PyList_CheckExact(item)) {
            Py_DECREF(items);
            PyErr_SetString(PyExc_TypeError, "pack_arrays() takes tuples or lists of bytes");
            return NULL;
        }
        Py_ssize_t width = PySequence_Fast_GET_SIZE(item);
        size += array_header_size(width);
        for (Py_ssize_t j = 0; j < width; j++) {
            PyObject *value = PySequence_Fast_GET_ITEM(item, j);
            if (!PyBytes_CheckExact(value)) {
                Py_DECREF(items);
                PyErr_SetString(PyExc_TypeError, "pack_arrays() takes tuples or lists of bytes");
                return NULL;
            }
            Py_ssize_t length = PyBytes_GET_SIZE(value);
            if (length > 0xffffffffLL) {
                Py_DECREF(items);
                PyErr_SetString(PyExc_ValueError, "pack_arrays(): a value is too large");
                return NULL;
            }
            size += bin_header_size(length) + length;
        }
    }
    PyObject *result = PyBytes_FromStringAndSize(NULL, size);
    if (result == NULL) {
        Py_DECREF(items);
        return NULL;
    }
    char *out = put_array(PyBytes_AS_STRING(result), count);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(items, i);
        Py_ssize_t width = PySequence_Fast_GET_SIZE(item);
        out = put_array(out, width);
        for (Py_ssize_t j = 0; j < width; j++) {
            PyObject *value = PySequence_Fast_GET_ITEM(item, j);
            Py_ssize_t length = PyBytes_GET_SIZE(value);
            out = put_bin(out, length);
            memcpy(out, PyBytes_AS_STRING(value), (size_t)length);
            out += length;
        }
    }
    Py_DECREF(items);
    return result;
}

/* A big-endian length of `width` bytes at `at`, or -1 past `end`. */
static Py_ssize_t read_length(const unsigned char *at, const unsigned char *end, int width) {
    if (end - at < width) return -1;
    Py_ssize_t length = 0;
    for (int i = 0; i < width; i++) length = (length << 8) | at[i];
    return length;
}

/* An array header at *at: its length (*at moved past the header), or -1. */
static Py_ssize_t read_array(const unsigned char **at, const unsigned char *end) {
    if (*at >= end) return -1;
    unsigned char tag = **at;
    int width = (tag & 0xf0) == 0x90 ? 0 : tag == 0xdc ? 2 : tag == 0xdd ? 4 : -1;
    if (width < 0) return -1;
    Py_ssize_t length = width ? read_length(*at + 1, end, width) : (Py_ssize_t)(tag & 0x0f);
    if (length < 0) return -1;
    *at += 1 + width;
    return length;
}

/* A bin or str at *at: where its bytes start (*at moved past them), *length set; or NULL. */
static const unsigned char *read_bytes(const unsigned char **at, const unsigned char *end,
                                       Py_ssize_t *length) {
    if (*at >= end) return NULL;
    unsigned char tag = **at;
    int width;
    if ((tag & 0xe0) == 0xa0) width = 0; /* fixstr */
    else if (tag == 0xc4 || tag == 0xd9) width = 1;
    else if (tag == 0xc5 || tag == 0xda) width = 2;
    else if (tag == 0xc6 || tag == 0xdb) width = 4;
    else return NULL;
    Py_ssize_t n = width ? read_length(*at + 1, end, width) : (Py_ssize_t)(tag & 0x1f);
    const unsigned char *start = *at + 1 + width;
    if (n < 0 || start > end || end - start < n) return NULL;
    *at = start + n;
    *length = n;
    return start;
}

/* Past the array of bytes values at *at (its first value's bytes in *first, *first_length);
 * 0 if it is no such array or has no value, else 1 when the first value is a bin (the
 * topic as bytes, as msgpack reads it back) and 2 when it is a str. */
static int skip_item(const unsigned char **at, const unsigned char *end,
                     const unsigned char **first, Py_ssize_t *first_length) {
    Py_ssize_t width = read_array(at, end);
    if (width < 1) return 0;
    int kind = (**at >= 0xc4 && **at <= 0xc6) ? 1 : 2;
    for (Py_ssize_t j = 0; j < width; j++) {
        Py_ssize_t length;
        const unsigned char *value = read_bytes(at, end, &length);
        if (value == NULL) return 0;
        if (j == 0) {
            *first = value;
            *first_length = length;
        }
    }
    return kind;
}

static PyObject *malformed(void) {
    PyErr_SetString(PyExc_ValueError, "not a list of arrays of bytes");
    return NULL;
}

static PyObject *topics(PyObject *module, PyObject *given) {
    (void)module;
    Py_buffer view;
    if (PyObject_GetBuffer(given, &view, PyBUF_SIMPLE) < 0) return NULL;
    const unsigned char *at = view.buf, *end = at + view.len;
    PyObject *result = NULL;
    Py_ssize_t count = read_array(&at, end);
    if (count < 0 || count > view.len) {
        malformed();
        goto done;
    }
    result = PyList_New(count);
    if (result == NULL) goto done;
    for (Py_ssize_t i = 0; i < count; i++) {
        const unsigned char *first = NULL;
        Py_ssize_t length = 0;
        PyObject *topic;
        if (skip_item(&at, end, &first, &length) != 1 ||
            (topic = PyBytes_FromStringAndSize((const char *)first, length)) == NULL) {
            if (!PyErr_Occurred()) malformed();
            Py_CLEAR(result);
            goto done;
        }
        PyList_SET_ITEM(result, i, topic);
    }
    if (at != end) {
        malformed();
        Py_CLEAR(result);
    }
done:
    PyBuffer_Release(&view);
    return result;
}

static PyObject *keep(PyObject *module, PyObject *args) {
    (void)module;
    Py_buffer view, kept;
    if (!PyArg_ParseTuple(args, "y*y*:keep", &view, &kept)) return NULL;
    const unsigned char *at = view.buf, *end = at + view.len;
    const unsigned char *marks = kept.buf;
    PyObject *result = NULL;
    Py_ssize_t count = read_array(&at, end);
    if (count < 0 || count != kept.len) {
        if (count >= 0) PyErr_SetString(PyExc_ValueError, "keep(): one mark per item");
        else malformed();
        goto done;
    }
    /* First pass: check the list and size what is kept. */
    const unsigned char *items = at;
    Py_ssize_t size = 0, left = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        const unsigned char *start = at, *first;
        Py_ssize_t length;
        if (!skip_item(&at, end, &first, &length)) {
            malformed();
            goto done;
        }
        if (marks[i]) {
            size += at - start;
            left++;
        }
    }
    if (at != end) {
        malformed();
        goto done;
    }
    result = PyBytes_FromStringAndSize(NULL, array_header_size(left) + size);
    if (result == NULL) goto done;
    char *out = put_array(PyBytes_AS_STRING(result), left);
    at = items;
    for (Py_ssize_t i = 0; i < count; i++) {
        const unsigned char *start = at, *first;
        Py_ssize_t length;
        skip_item(&at, end, &first, &length);
        if (marks[i]) {
            memcpy(out, start, (size_t)(at - start));
            out += at - start;
        }
    }
done:
    PyBuffer_Release(&view);
    PyBuffer_Release(&kept);
    return result;
}

static PyObject *bindable_rows(PyObject *module, PyObject *given) {
    (void)module;
    PyObject *rows = PySequence_Fast(given, "bindable() takes a sequence of rows");
    if (rows == NULL) return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(rows);
    PyObject *result = PyList_New(count);
    if (result == NULL) goto failed;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *values = PySequence_Fast(PySequence_Fast_GET_ITEM(rows, i),
                                           "bindable() takes rows that are sequences");
        if (values == NULL) goto failed;
        Py_ssize_t width = PySequence_Fast_GET_SIZE(values);
        PyObject *row = PyTuple_New(width);
        if (row == NULL) {
            Py_DECREF(values);
            goto failed;
        }
        PyList_SET_ITEM(result, i, row); /* owned by the list from here on */
        for (Py_ssize_t j = 0; j < width; j++) {
            PyObject *value = bindable(PySequence_Fast_GET_ITEM(values, j));
            if (value == NULL) {
                Py_DECREF(values);
                goto failed;
            }
            PyTuple_SET_ITEM(row, j, value);
        }
        Py_DECREF(values);
    }
    Py_DECREF(rows);
    return result;
failed:
    Py_XDECREF(result);
    Py_DECREF(rows);
    return NULL;
}

static PyMethodDef methods[] = {
    {"pack_arrays", pack_arrays, METH_O,
     "pack_arrays(items) -> msgpack of a list of arrays of bin (items: tuples of bytes)"},
    {"bindable", bindable_rows, METH_O, "bindable(rows) -> [tuple(row)], bytes as bytearray"},
    {"topics", topics, METH_O, "topics(packed) -> the first field of each packed array"},
    {"keep", keep, METH_VARARGS, "keep(packed, kept) -> packed, the arrays marked in kept"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_definition = {
    PyModuleDef_HEAD_INIT, "bus.util._sqlrows",
    "Rows for an INSERT, compiled (see bus/util/sqlitewal.py).", -1, methods,
};

PyMODINIT_FUNC PyInit__sqlrows(void) { return PyModule_Create(&module_definition); }
