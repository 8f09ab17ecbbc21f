/* Rows for an INSERT, compiled: bus/util/sqlitewal.py's numbered_rows.
 *
 * Python's sqlite3 looks every parameter up as a type to adapt, except int, float, str and
 * bytearray: even with bytes' adapter registered (bind_bytes_directly), each blob costs a
 * key tuple, a registry lookup and a call, the largest share of an event's insert
 * (callgrind: ~5,300 of ~15,000 instructions for a row of five blobs). A bytearray made here
 * costs a tenth of that; in Python, bytearray(value) costs as much as it saves. SQLite binds
 * both through the buffer protocol and copies them (SQLITE_TRANSIENT): the same BLOB is
 * stored, and read back as bytes.
 *
 * rows(first, fields, tail) -> [(first, *fields[0], tail), (first + 1, *fields[1], tail), ...]
 * with each non-empty exact bytes of a row as a bytearray of the same bytes; every other
 * value as it is. bindable(rows) -> [tuple(rows[0]), tuple(rows[1]), ...], the same way.
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

static PyObject *rows(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "rows(first, fields, tail)");
        return NULL;
    }
    PyObject *first = args[0], *tail = args[2];
    if (!PyLong_Check(first)) {
        PyErr_SetString(PyExc_TypeError, "rows() takes an int first");
        return NULL;
    }
    PyObject *fields = PySequence_Fast(args[1], "rows() takes a sequence of rows");
    if (fields == NULL) return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(fields);
    PyObject *result = PyList_New(count);
    PyObject *sequence = first;
    Py_INCREF(sequence);
    PyObject *one = PyLong_FromLong(1);
    if (result == NULL || one == NULL) goto failed;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *values = PySequence_Fast(PySequence_Fast_GET_ITEM(fields, i),
                                           "rows() takes rows that are sequences");
        if (values == NULL) goto failed;
        Py_ssize_t width = PySequence_Fast_GET_SIZE(values);
        PyObject *row = PyTuple_New(width + 2);
        if (row == NULL) {
            Py_DECREF(values);
            goto failed;
        }
        PyList_SET_ITEM(result, i, row); /* owned by the list from here on */
        Py_INCREF(sequence);
        PyTuple_SET_ITEM(row, 0, sequence);
        for (Py_ssize_t j = 0; j < width; j++) {
            PyObject *value = bindable(PySequence_Fast_GET_ITEM(values, j));
            if (value == NULL) {
                Py_DECREF(values);
                goto failed;
            }
            PyTuple_SET_ITEM(row, j + 1, value);
        }
        Py_DECREF(values);
        Py_INCREF(tail);
        PyTuple_SET_ITEM(row, width + 1, tail);
        PyObject *next = PyNumber_Add(sequence, one);
        if (next == NULL) goto failed;
        Py_SETREF(sequence, next);
    }
    Py_DECREF(sequence);
    Py_DECREF(one);
    Py_DECREF(fields);
    return result;
failed:
    Py_XDECREF(result);
    Py_DECREF(sequence);
    Py_XDECREF(one);
    Py_DECREF(fields);
    return NULL;
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
    {"rows", (PyCFunction)(void (*)(void))rows, METH_FASTCALL,
     "rows(first, fields, tail) -> [(first + i, *fields[i], tail)], bytes as bytearray"},
    {"bindable", bindable_rows, METH_O, "bindable(rows) -> [tuple(row)], bytes as bytearray"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_definition = {
    PyModuleDef_HEAD_INIT, "bus.util._sqlrows",
    "Rows for an INSERT, compiled (see bus/util/sqlitewal.py).", -1, methods,
};

PyMODINIT_FUNC PyInit__sqlrows(void) { return PyModule_Create(&module_definition); }
