/* The eMQP commands of every job, parsed in C: bus/emqp/codec.py's parse for its commonest
 * inputs (a client's REQUEST, a worker's REPLY and READY).
 *
 * A broker parses three messages a job, and in Python each costs 5,000-12,000 instructions
 * of checks, calls and tuple building. parse() here takes only a message every check of
 * codec.parse accepts, and builds the same named tuple; anything else (another command, a
 * header string not yet parsed, a JSON value with white space around it, any defect)
 * returns None and the Python parser decides, with its errors. The JSON of a body or result
 * is checked on its bytes (whole_json, below): a whole value, nothing after it.
 *
 * It also makes the broker's message ids (new_msgid) and a request's Job (Maker), and for
 * the job store packs its batches of requests (pack_jobs), keeps its pending changes
 * (Changes) and sorts and applies them at a commit (settle, committed): all below.
 *
 * Optional, like the other helpers (BUS_NATIVE_EMQP=0 turns it off); the property tests in
 * tests/test_emqp_codec_fastpath.py, test_emqp_store.py and test_emqp_core.py compare it
 * with the Python code.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <limits.h>
#include <string.h>

#define MAX_MSGID_BYTES 128
#define MAX_QUEUE_NAME_BYTES 256

static PyObject *ready_type, *request_type, *reply_type; /* codec's named tuples */
static PyObject *headers_seen; /* codec._HEADERS_SEEN: header frame -> Headers */
static PyObject *no_headers;   /* codec.NO_HEADERS, the empty frame's */

static int is_text(PyObject *frame, Py_ssize_t largest) {
    Py_ssize_t size = PyBytes_GET_SIZE(frame);
    if (size < 1 || size > largest) return 0;
    const unsigned char *data = (const unsigned char *)PyBytes_AS_STRING(frame);
    for (Py_ssize_t i = 0; i < size; i++)
        if (data[i] & 0x80) return 0;
    return 1;
}

static int equals(PyObject *frame, const char *text, Py_ssize_t size) {
    return PyBytes_GET_SIZE(frame) == size && memcmp(PyBytes_AS_STRING(frame), text, size) == 0;
}

/* The JSON of a body or result, judged on its bytes: the json module's scanner built the
 * value only for it to be dropped (9,000 instructions a job, a fifth of the broker's work).
 * It takes a subset of what codec._json takes whole (one value, no white space around it,
 * in UTF-8), and leaves the rest to it: NaN and the infinities, a number of more than
 * JSON_DIGITS characters (int() may refuse it), more than JSON_DEPTH levels. */
#define JSON_DEPTH 64
#define JSON_DIGITS 600 /* under the smallest int_max_str_digits Python allows (640) */

typedef struct {
    const unsigned char *at, *end;
    int depth;
} Scan;

static int json_value(Scan *s);

static void json_space(Scan *s) {
    while (s->at < s->end && (*s->at == ' ' || *s->at == '\t' || *s->at == '\n' || *s->at == '\r'))
        s->at++;
}

static int continuation(const unsigned char *at, int count) {
    for (int i = 0; i < count; i++)
        if ((at[i] & 0xC0) != 0x80) return 0;
    return 1;
}

/* One character of two to four bytes, as Python's strict UTF-8 decoder takes it (no
 * overlong form, no surrogate, nothing past U+10FFFF). */
static int json_utf8(Scan *s) {
    const unsigned char *at = s->at;
    Py_ssize_t left = s->end - at;
    unsigned char c = at[0];
    int more;
    unsigned char low = 0x80, high = 0xBF; /* the second byte's range */
    if (c >= 0xC2 && c <= 0xDF) more = 1;
    else if (c >= 0xE0 && c <= 0xEF) {
        more = 2;
        if (c == 0xE0) low = 0xA0;
        if (c == 0xED) high = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        more = 3;
        if (c == 0xF0) low = 0x90;
        if (c == 0xF4) high = 0x8F;
    } else return 0;
    if (left <= more || at[1] < low || at[1] > high || !continuation(at + 2, more - 1)) return 0;
    s->at += more + 1;
    return 1;
}

static int is_hex(unsigned char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

static int json_string(Scan *s) {
    s->at++; /* the opening quote */
    while (s->at < s->end) {
        unsigned char c = *s->at;
        if (c == '"') {
            s->at++;
            return 1;
        }
        if (c < 0x20) return 0; /* a control character: refused (strict) */
        if (c == '\\') {
            if (s->end - s->at < 2) return 0;
            c = s->at[1];
            if (c == 'u') {
                if (s->end - s->at < 6) return 0;
                for (int i = 2; i < 6; i++)
                    if (!is_hex(s->at[i])) return 0;
                s->at += 6; /* a lone surrogate too, as the scanner takes it */
            } else if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' ||
                       c == 'r' || c == 't') {
                s->at += 2;
            } else return 0;
        } else if (c < 0x80) s->at++;
        else if (!json_utf8(s)) return 0;
    }
    return 0;
}

static int json_digits(Scan *s) {
    const unsigned char *from = s->at;
    while (s->at < s->end && *s->at >= '0' && *s->at <= '9') s->at++;
    return s->at > from;
}

static int json_number(Scan *s) {
    const unsigned char *from = s->at;
    if (*s->at == '-') s->at++;
    if (s->at >= s->end) return 0;
    if (*s->at == '0') s->at++;
    else if (*s->at >= '1' && *s->at <= '9') json_digits(s);
    else return 0; /* -Infinity among them */
    if (s->at < s->end && *s->at == '.') {
        s->at++;
        if (!json_digits(s)) return 0;
    }
    if (s->at < s->end && (*s->at == 'e' || *s->at == 'E')) {
        s->at++;
        if (s->at < s->end && (*s->at == '+' || *s->at == '-')) s->at++;
        if (!json_digits(s)) return 0;
    }
    return s->at - from <= JSON_DIGITS;
}

static int json_word(Scan *s, const char *word, Py_ssize_t size) {
    if (s->end - s->at < size || memcmp(s->at, word, size) != 0) return 0;
    s->at += size;
    return 1;
}

/* An array or an object (``close``: its closing bracket), at its opening one. */
static int json_container(Scan *s, unsigned char close) {
    if (++s->depth > JSON_DEPTH) return 0;
    s->at++;
    json_space(s);
    if (s->at < s->end && *s->at == close) {
        s->at++;
        s->depth--;
        return 1;
    }
    for (;;) {
        if (close == '}') {
            if (s->at >= s->end || *s->at != '"' || !json_string(s)) return 0;
            json_space(s);
            if (s->at >= s->end || *s->at != ':') return 0;
            s->at++;
            json_space(s);
        }
        if (!json_value(s)) return 0;
        json_space(s);
        if (s->at >= s->end) return 0;
        if (*s->at == close) {
            s->at++;
            s->depth--;
            return 1;
        }
        if (*s->at != ',') return 0;
        s->at++;
        json_space(s);
    }
}

static int json_value(Scan *s) {
    if (s->at >= s->end) return 0;
    switch (*s->at) {
    case '"': return json_string(s);
    case '[': return json_container(s, ']');
    case '{': return json_container(s, '}');
    case 't': return json_word(s, "true", 4);
    case 'f': return json_word(s, "false", 5);
    case 'n': return json_word(s, "null", 4);
    default: return json_number(s);
    }
}

/* 1: the frame is one JSON value codec._json takes whole; 0: not, or not sure (the Python
 * parser judges the frame again, and raises its own errors). */
static int whole_json(PyObject *frame) {
    const unsigned char *data = (const unsigned char *)PyBytes_AS_STRING(frame);
    Scan s = {data, data + PyBytes_GET_SIZE(frame), 0};
    return json_value(&s) && s.at == s.end;
}

/* whole_json(frame) -> bool, for the tests. */
static PyObject *jobscan_whole_json(PyObject *module, PyObject *frame) {
    (void)module;
    if (!PyBytes_Check(frame)) {
        PyErr_SetString(PyExc_TypeError, "whole_json() takes bytes");
        return NULL;
    }
    return PyBool_FromLong(whole_json(frame));
}

/* A named tuple of ``type`` holding ``count`` new references to ``items``. */
static PyObject *command(PyObject *type, PyObject **items, Py_ssize_t count) {
    PyTypeObject *kind = (PyTypeObject *)type;
    PyObject *made = kind->tp_alloc(kind, count);
    if (made == NULL) return NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_INCREF(items[i]);
        PyTuple_SET_ITEM(made, i, items[i]);
    }
    return made;
}

/* The envelope codec.parse checks first: delimiter, protocol, a short ASCII message id,
 * every frame bytes, for the ``count`` frames at ``f``. The count, or 0 when any of it fails. */
static Py_ssize_t envelope_of(PyObject **f, Py_ssize_t count) {
    if (count < 4 || count > 7) return 0;
    for (Py_ssize_t i = 0; i < count; i++)
        if (!PyBytes_CheckExact(f[i])) return 0;
    if (PyBytes_GET_SIZE(f[0]) != 0) return 0;
    if (!equals(f[1], "eMQP/1.0", 8)) return 0;
    if (!is_text(f[3], MAX_MSGID_BYTES)) return 0;
    return count;
}

/* envelope_of a list of frames (0 for anything but a list). */
static Py_ssize_t envelope(PyObject *frames) {
    if (!PyList_CheckExact(frames)) return 0;
    return envelope_of(((PyListObject *)frames)->ob_item, PyList_GET_SIZE(frames));
}

static int check_setup(void) {
    if (ready_type == NULL) PyErr_SetString(PyExc_RuntimeError, "setup() was not called");
    return ready_type != NULL;
}

/* The command of the ``count`` frames at ``f`` (their envelope checked), or None. */
static PyObject *job_of(PyObject **f, Py_ssize_t count) {
    if (count == 0) Py_RETURN_NONE;
    PyObject *name = f[2];
    if (count == 4 && equals(name, "READY", 5)) return command(ready_type, &f[3], 1);
    if (count == 7 && equals(name, "REQUEST", 7)) {
        if (!is_text(f[4], MAX_QUEUE_NAME_BYTES)) Py_RETURN_NONE;
        PyObject *headers = no_headers;
        if (PyBytes_GET_SIZE(f[5]) > 0) {
            headers = PyDict_GetItemWithError(headers_seen, f[5]); /* borrowed */
            if (headers == NULL) {
                if (PyErr_Occurred()) return NULL;
                Py_RETURN_NONE; /* parsed (and remembered) by the Python code */
            }
        }
        if (!whole_json(f[6])) Py_RETURN_NONE;
        PyObject *items[4] = {f[3], f[4], headers, f[6]};
        return command(request_type, items, 4);
    }
    if (count == 6 && equals(name, "REPLY", 5)) {
        if (!is_text(f[5], MAX_MSGID_BYTES) || !whole_json(f[4])) Py_RETURN_NONE;
        return command(reply_type, &f[3], 3);
    }
    Py_RETURN_NONE;
}

/* parse(frames) -> the command codec.parse returns, or None: let codec.parse decide. */
static PyObject *jobscan_parse(PyObject *module, PyObject *frames) {
    (void)module;
    if (!check_setup()) return NULL;
    Py_ssize_t count = envelope(frames);
    return job_of(count ? ((PyListObject *)frames)->ob_item : NULL, count);
}

/* parse_routed(message) -> parse(message[1:]), without the copy: a message as a ROUTER
 * reads it, its peer's identity first (a broker parses three a job). */
static PyObject *jobscan_parse_routed(PyObject *module, PyObject *message) {
    (void)module;
    if (!check_setup()) return NULL;
    if (!PyList_CheckExact(message) || PyList_GET_SIZE(message) < 1) Py_RETURN_NONE;
    PyObject **f = ((PyListObject *)message)->ob_item + 1;
    return job_of(f, envelope_of(f, PyList_GET_SIZE(message) - 1));
}

/* is_ready(frames) -> bool: codec.is_ready. */
static PyObject *jobscan_is_ready(PyObject *module, PyObject *frames) {
    (void)module;
    Py_ssize_t count = envelope(frames);
    return PyBool_FromLong(count == 4 && equals(PyList_GET_ITEM(frames, 2), "READY", 5));
}

/* setup(Ready, Request, Reply, headers_seen, no_headers) */
static PyObject *jobscan_setup(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *ready, *request, *reply, *seen, *none;
    if (!PyArg_ParseTuple(args, "O!O!O!O!O", &PyType_Type, &ready, &PyType_Type, &request,
                          &PyType_Type, &reply, &PyDict_Type, &seen, &none))
        return NULL;
    PyObject *types[3] = {ready, request, reply};
    for (int i = 0; i < 3; i++) {
        if (!PyType_IsSubtype((PyTypeObject *)types[i], &PyTuple_Type)) {
            PyErr_SetString(PyExc_TypeError, "setup() takes tuple types");
            return NULL;
        }
    }
    Py_INCREF(ready);
    Py_XSETREF(ready_type, ready);
    Py_INCREF(request);
    Py_XSETREF(request_type, request);
    Py_INCREF(reply);
    Py_XSETREF(reply_type, reply);
    Py_INCREF(seen);
    Py_XSETREF(headers_seen, seen);
    Py_INCREF(none);
    Py_XSETREF(no_headers, none);
    Py_RETURN_NONE;
}

/* Message ids as codec.python_new_msgid makes them: a per-process UUID4 prefix of 24
 * characters, then 12 hex digits of a counter (its low 48 bits) from a random start. In
 * Python the format costs ~3,000 instructions an id, and a broker makes two a job. */
static char msgid_prefix[24];
static uint64_t msgid_next;
static int msgids_set = 0;

/* msgids(prefix, start): the next new_msgid() is prefix + "%012x" % (start & (2**48 - 1)). */
static PyObject *jobscan_msgids(PyObject *module, PyObject *args) {
    (void)module;
    const char *prefix;
    Py_ssize_t size;
    unsigned long long start;
    if (!PyArg_ParseTuple(args, "y#K", &prefix, &size, &start)) return NULL;
    if (size != (Py_ssize_t)sizeof(msgid_prefix)) {
        PyErr_SetString(PyExc_ValueError, "msgids() takes a prefix of 24 bytes");
        return NULL;
    }
    memcpy(msgid_prefix, prefix, sizeof(msgid_prefix));
    msgid_next = start;
    msgids_set = 1;
    Py_RETURN_NONE;
}

static PyObject *jobscan_new_msgid(PyObject *module, PyObject *unused) {
    (void)module;
    (void)unused;
    static const char digits[] = "0123456789abcdef";
    if (!msgids_set) {
        PyErr_SetString(PyExc_RuntimeError, "msgids() was not called");
        return NULL;
    }
    PyObject *made = PyBytes_FromStringAndSize(NULL, 36);
    if (made == NULL) return NULL;
    char *out = PyBytes_AS_STRING(made);
    memcpy(out, msgid_prefix, sizeof(msgid_prefix));
    uint64_t number = msgid_next++ & 0xFFFFFFFFFFFFull;
    for (int i = 35; i >= 24; i--, number >>= 4) out[i] = digits[number & 15];
    return made;
}

/* pack_jobs(rows) -> bytes: bus/emqp/jobbatch.py's pack, byte for byte, for rows that are
 * tuples of nine (StoredJob) of exact bytes, ints and a float. Anything else is a TypeError
 * (the caller packs in Python and decides); a value the format cannot hold, OverflowError.
 * Sized first, written once: in Python a request's header and join cost ~2,000 instructions. */
#define JOB_FIELDS 9
#define JOB_HEAD 52 /* int64 position, float64 received, int64 attempts, retries; 5 uint32 */

static char *put_le(char *out, uint64_t value, int width) {
    for (int i = 0; i < width; i++) *out++ = (char)(value >> (8 * i));
    return out;
}

static const int job_blobs[5] = {0, 2, 3, 4, 5}; /* msgid, client, queue, headers, body */

static PyObject *jobscan_pack_jobs(PyObject *module, PyObject *given) {
    (void)module;
    PyObject *rows = PySequence_Fast(given, "pack_jobs() takes a sequence of rows");
    if (rows == NULL) return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(rows);
    Py_ssize_t size = 1;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *row = PySequence_Fast_GET_ITEM(rows, i);
        if (!PyTuple_Check(row) || PyTuple_GET_SIZE(row) != JOB_FIELDS ||
            !PyLong_CheckExact(PyTuple_GET_ITEM(row, 1)) ||
            !PyFloat_CheckExact(PyTuple_GET_ITEM(row, 6)) ||
            !PyLong_CheckExact(PyTuple_GET_ITEM(row, 7)) ||
            !PyLong_CheckExact(PyTuple_GET_ITEM(row, 8)))
            goto not_mine;
        size += JOB_HEAD;
        for (int j = 0; j < 5; j++) {
            PyObject *value = PyTuple_GET_ITEM(row, job_blobs[j]);
            if (!PyBytes_CheckExact(value)) goto not_mine;
            if (PyBytes_GET_SIZE(value) > 0xffffffffLL) {
                Py_DECREF(rows);
                PyErr_SetString(PyExc_OverflowError, "pack_jobs(): a value is too large");
                return NULL;
            }
            size += PyBytes_GET_SIZE(value);
        }
    }
    PyObject *result = PyBytes_FromStringAndSize(NULL, size);
    if (result == NULL) {
        Py_DECREF(rows);
        return NULL;
    }
    char *out = PyBytes_AS_STRING(result);
    *out++ = 1; /* the format */
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *row = PySequence_Fast_GET_ITEM(rows, i);
        long long position = PyLong_AsLongLong(PyTuple_GET_ITEM(row, 1));
        long long attempts = PyLong_AsLongLong(PyTuple_GET_ITEM(row, 7));
        long long retries = PyLong_AsLongLong(PyTuple_GET_ITEM(row, 8));
        if (PyErr_Occurred()) { /* beyond int64: OverflowError */
            Py_DECREF(result);
            Py_DECREF(rows);
            return NULL;
        }
        double received = PyFloat_AS_DOUBLE(PyTuple_GET_ITEM(row, 6));
        uint64_t bits;
        memcpy(&bits, &received, sizeof bits);
        out = put_le(out, (uint64_t)position, 8);
        out = put_le(out, bits, 8);
        out = put_le(out, (uint64_t)attempts, 8);
        out = put_le(out, (uint64_t)retries, 8);
        for (int j = 0; j < 5; j++)
            out = put_le(out, (uint64_t)PyBytes_GET_SIZE(PyTuple_GET_ITEM(row, job_blobs[j])), 4);
        for (int j = 0; j < 5; j++) {
            PyObject *value = PyTuple_GET_ITEM(row, job_blobs[j]);
            memcpy(out, PyBytes_AS_STRING(value), (size_t)PyBytes_GET_SIZE(value));
            out += PyBytes_GET_SIZE(value);
        }
    }
    Py_DECREF(rows);
    return result;
not_mine:
    Py_DECREF(rows);
    PyErr_SetString(PyExc_TypeError, "pack_jobs() takes StoredJob rows of bytes, ints and a float");
    return NULL;
}

/* settle(pending, slots) -> (kept, marked, dropped): bus/emqp/jobbatch.py's settle_python,
 * the job store's commit sorting its pending changes. ``pending`` maps a msgid to its new row
 * or None (removed), ``slots`` a committed msgid to ``batch << 8 | index``. ``kept``: the
 * rows, in order; ``marked``: batch -> the bits of its requests removed or put again (bit
 * ``index``), as an int; ``dropped``: the committed msgids removed. In Python a commit spent
 * ~30 instructions of bytecode a change on it (two changes a guaranteed job). */
typedef struct {
    long long batch;
    uint64_t bits[4];
} Marks;

static PyObject *marks_int(const uint64_t *bits) {
    PyObject *value = PyLong_FromUnsignedLongLong(bits[3]);
    for (int word = 2; word >= 0 && value != NULL; word--) {
        PyObject *shift = PyLong_FromLong(64);
        PyObject *shifted = shift ? PyNumber_Lshift(value, shift) : NULL;
        PyObject *low = PyLong_FromUnsignedLongLong(bits[word]);
        Py_XDECREF(shift);
        Py_DECREF(value);
        value = shifted && low ? PyNumber_Or(shifted, low) : NULL;
        Py_XDECREF(shifted);
        Py_XDECREF(low);
    }
    return value;
}

static PyObject *jobscan_settle(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *pending, *slots;
    if (!PyArg_ParseTuple(args, "O!O!", &PyDict_Type, &pending, &PyDict_Type, &slots))
        return NULL;
    PyObject *kept = PyList_New(0), *dropped = PyList_New(0), *marked = PyDict_New();
    Marks *marks = NULL;
    Py_ssize_t used = 0, room = 0;
    if (kept == NULL || dropped == NULL || marked == NULL) goto fail;
    Py_ssize_t position = 0;
    PyObject *msgid, *row;
    while (PyDict_Next(pending, &position, &msgid, &row)) {
        if (row != Py_None && PyList_Append(kept, row) < 0) goto fail;
        PyObject *slot = PyDict_GetItemWithError(slots, msgid); /* borrowed */
        if (slot == NULL) {
            if (PyErr_Occurred()) goto fail;
            continue;
        }
        if (row == Py_None && PyList_Append(dropped, msgid) < 0) goto fail;
        long long number = PyLong_AsLongLong(slot);
        if (number == -1 && PyErr_Occurred()) goto fail;
        if (number < 0) {
            PyErr_SetString(PyExc_ValueError, "a slot is not negative");
            goto fail;
        }
        long long batch = number >> 8;
        int index = (int)(number & 255);
        Py_ssize_t at = 0;
        while (at < used && marks[at].batch != batch) at++;
        if (at == used) {
            if (used == room) {
                room = room ? room * 2 : 4;
                Marks *more = PyMem_Realloc(marks, (size_t)room * sizeof(Marks));
                if (more == NULL) {
                    PyErr_NoMemory();
                    goto fail;
                }
                marks = more;
            }
            marks[used].batch = batch;
            memset(marks[used].bits, 0, sizeof(marks[used].bits));
            used++;
        }
        marks[at].bits[index >> 6] |= (uint64_t)1 << (index & 63);
    }
    for (Py_ssize_t i = 0; i < used; i++) {
        PyObject *key = PyLong_FromLongLong(marks[i].batch);
        PyObject *value = key ? marks_int(marks[i].bits) : NULL;
        int set = value ? PyDict_SetItem(marked, key, value) : -1;
        Py_XDECREF(key);
        Py_XDECREF(value);
        if (set < 0) goto fail;
    }
    PyMem_Free(marks);
    return Py_BuildValue("(NNN)", kept, marked, dropped);
fail:
    PyMem_Free(marks);
    Py_XDECREF(kept);
    Py_XDECREF(dropped);
    Py_XDECREF(marked);
    return NULL;
}

/* committed(slots, dropped, batches, first): bus/emqp/jobbatch.py's committed_python, the
 * job store's slots once a commit succeeded: the msgids removed go, the requests of the
 * batches written (batch first + n, a list of rows each) get theirs. */
static PyObject *jobscan_committed(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *slots, *dropped, *batches;
    long long first;
    if (!PyArg_ParseTuple(args, "O!O!O!L", &PyDict_Type, &slots, &PyList_Type, &dropped,
                          &PyList_Type, &batches, &first))
        return NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(dropped); i++)
        if (PyDict_DelItem(slots, PyList_GET_ITEM(dropped, i)) < 0) return NULL;
    for (Py_ssize_t n = 0; n < PyList_GET_SIZE(batches); n++) {
        PyObject *rows = PyList_GET_ITEM(batches, n);
        if (!PyList_Check(rows) || PyList_GET_SIZE(rows) > 256 || first + n > (LLONG_MAX >> 8)) {
            PyErr_SetString(PyExc_ValueError, "committed() takes lists of at most 256 rows");
            return NULL;
        }
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(rows); i++) {
            PyObject *row = PyList_GET_ITEM(rows, i);
            if (!PyTuple_Check(row) || PyTuple_GET_SIZE(row) < 1) {
                PyErr_SetString(PyExc_TypeError, "committed() takes rows that are tuples");
                return NULL;
            }
            PyObject *slot = PyLong_FromLongLong((first + n) << 8 | (long long)i);
            int set = slot ? PyDict_SetItem(slots, PyTuple_GET_ITEM(row, 0), slot) : -1;
            Py_XDECREF(slot);
            if (set < 0) return NULL;
        }
    }
    Py_RETURN_NONE;
}

/* Changes(row_type, pending, next_position): bus/emqp/jobbatch.py's ChangesPython, the job
 * store's pending changes as a broker makes them, two a guaranteed job: put_new (a new
 * request's row at the next position) and remove. In Python each was a call of the store's
 * method, its frame and, for put_new, a named tuple built through tuple.__new__: ~1,500
 * instructions a job where these take a few hundred. */
typedef struct {
    PyObject_HEAD
    PyTypeObject *row_type; /* StoredJob: a tuple of nine */
    PyObject *pending;      /* msgid -> row, or None: removed */
    long long next;         /* the next position */
} Changes;

static void changes_dealloc(Changes *self) {
    Py_XDECREF(self->row_type);
    Py_XDECREF(self->pending);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *changes_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *row_type, *pending;
    long long next;
    static char *names[] = {"row_type", "pending", "next_position", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!O!L", names, &PyType_Type, &row_type,
                                     &PyDict_Type, &pending, &next))
        return NULL;
    if (!PyType_IsSubtype((PyTypeObject *)row_type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "Changes() takes a tuple type");
        return NULL;
    }
    Changes *self = (Changes *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    Py_INCREF(row_type);
    self->row_type = (PyTypeObject *)row_type;
    Py_INCREF(pending);
    self->pending = pending;
    self->next = next;
    return (PyObject *)self;
}

/* put_new(msgid, client, queue, headers, body, received, retries_left) -> its position */
static PyObject *changes_put_new(Changes *self, PyObject *const *args, Py_ssize_t count) {
    if (count != 7) {
        PyErr_SetString(PyExc_TypeError, "put_new() takes 7 arguments");
        return NULL;
    }
    if (self->next == LLONG_MAX) {
        PyErr_SetString(PyExc_OverflowError, "put_new(): no position left");
        return NULL;
    }
    PyObject *position = PyLong_FromLongLong(self->next);
    if (position == NULL) return NULL;
    PyObject *row = self->row_type->tp_alloc(self->row_type, JOB_FIELDS);
    if (row == NULL) {
        Py_DECREF(position);
        return NULL;
    }
    /* StoredJob's order: msgid, position, client, queue, headers, body, received, attempts,
     * retries_left */
    PyObject *values[JOB_FIELDS] = {args[0], position, args[1], args[2], args[3],
                                    args[4], args[5], NULL,     args[6]};
    values[7] = PyLong_FromLong(0); /* a cached small int */
    for (int i = 0; i < JOB_FIELDS; i++) {
        Py_INCREF(values[i]);
        PyTuple_SET_ITEM(row, i, values[i]);
    }
    Py_DECREF(values[7]);
    int set = PyDict_SetItem(self->pending, args[0], row);
    Py_DECREF(row);
    if (set < 0) {
        Py_DECREF(position);
        return NULL;
    }
    self->next++;
    return position;
}

/* remove(msgid): forget it at the next commit */
static PyObject *changes_remove(Changes *self, PyObject *msgid) {
    if (PyDict_SetItem(self->pending, msgid, Py_None) < 0) return NULL;
    Py_RETURN_NONE;
}

/* next_position() -> a new position */
static PyObject *changes_next_position(Changes *self, PyObject *unused) {
    (void)unused;
    if (self->next == LLONG_MAX) {
        PyErr_SetString(PyExc_OverflowError, "next_position(): no position left");
        return NULL;
    }
    return PyLong_FromLongLong(self->next++);
}

static PyMethodDef changes_methods[] = {
    {"put_new", (PyCFunction)(void (*)(void))changes_put_new, METH_FASTCALL,
     "put_new(msgid, client, queue, headers, body, received, retries_left) -> its position"},
    {"remove", (PyCFunction)changes_remove, METH_O, "remove(msgid): forget it"},
    {"next_position", (PyCFunction)changes_next_position, METH_NOARGS,
     "next_position() -> a new position"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject changes_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "bus.emqp._jobscan.Changes",
    .tp_basicsize = sizeof(Changes),
    .tp_dealloc = (destructor)changes_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Changes(row_type, pending, next_position): a job store's pending changes",
    .tp_methods = changes_methods,
    .tp_new = changes_new,
};

/* Maker(cls, fields, defaults): makes objects of a class of __slots__ (a dataclass of
 * slots=True, no __post_init__), each slot of ``fields`` (all of them, in order) set from the
 * call's positional arguments and then from ``defaults`` (the values of the last fields), as
 * the dataclass's __init__ would. A broker makes a Job a request: through type.__call__ and
 * the generated __init__, ~3,500 instructions where this takes a few hundred. */
#define MAKER_FIELDS 32

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyTypeObject *cls;
    PyObject *defaults;
    Py_ssize_t given; /* positional arguments taken */
    Py_ssize_t count; /* slots set */
    Py_ssize_t offsets[MAKER_FIELDS];
} Maker;

static void maker_dealloc(Maker *self) {
    Py_XDECREF(self->cls);
    Py_XDECREF(self->defaults);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *maker_call(PyObject *callable, PyObject *const *args, size_t nargsf,
                            PyObject *kwnames) {
    Maker *self = (Maker *)callable;
    Py_ssize_t count = PyVectorcall_NARGS(nargsf);
    if (count != self->given || (kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0)) {
        PyErr_Format(PyExc_TypeError, "%s() takes %zd positional arguments", self->cls->tp_name,
                     self->given);
        return NULL;
    }
    PyObject *made = self->cls->tp_alloc(self->cls, 0);
    if (made == NULL) return NULL;
    for (Py_ssize_t i = 0; i < self->count; i++) {
        PyObject *value =
            i < count ? args[i] : PyTuple_GET_ITEM(self->defaults, i - self->given);
        Py_INCREF(value);
        *(PyObject **)((char *)made + self->offsets[i]) = value;
    }
    return made;
}

static PyObject *maker_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *cls, *fields, *defaults;
    static char *names[] = {"cls", "fields", "defaults", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!O!O!", names, &PyType_Type, &cls,
                                     &PyTuple_Type, &fields, &PyTuple_Type, &defaults))
        return NULL;
    PyTypeObject *made_type = (PyTypeObject *)cls;
    Py_ssize_t count = PyTuple_GET_SIZE(fields);
    /* The caller vouches for __init__ (bus/emqp/core.py's job_maker checks the dataclass);
     * a __new__ of the class's own would be skipped: refused. */
    if (count > MAKER_FIELDS || PyTuple_GET_SIZE(defaults) > count ||
        made_type->tp_new != PyBaseObject_Type.tp_new) {
        PyErr_SetString(PyExc_TypeError, "Maker() takes a class of slots, object's __new__");
        return NULL;
    }
    Maker *self = (Maker *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->vectorcall = maker_call;
    self->count = count;
    self->given = count - PyTuple_GET_SIZE(defaults);
    for (Py_ssize_t i = 0; i < count; i++) {
        /* Each field a slot of an object (a member descriptor of T_OBJECT_EX), written by
         * offset as the descriptor would; anything else is refused. */
        PyObject *descriptor = PyObject_GetAttr(cls, PyTuple_GET_ITEM(fields, i));
        if (descriptor == NULL) {
            Py_DECREF(self);
            return NULL;
        }
        int slot = Py_IS_TYPE(descriptor, &PyMemberDescr_Type) &&
                   ((PyMemberDescrObject *)descriptor)->d_common.d_type == made_type &&
                   ((PyMemberDescrObject *)descriptor)->d_member->type == T_OBJECT_EX &&
                   !(((PyMemberDescrObject *)descriptor)->d_member->flags & READONLY);
        if (slot) self->offsets[i] = ((PyMemberDescrObject *)descriptor)->d_member->offset;
        Py_DECREF(descriptor);
        if (!slot) {
            Py_DECREF(self);
            PyErr_SetString(PyExc_TypeError, "Maker() takes fields that are the class's slots");
            return NULL;
        }
    }
    Py_INCREF(cls);
    self->cls = made_type;
    Py_INCREF(defaults);
    self->defaults = defaults;
    return (PyObject *)self;
}

static PyTypeObject maker_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "bus.emqp._jobscan.Maker",
    .tp_basicsize = sizeof(Maker),
    .tp_dealloc = (destructor)maker_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(Maker, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_doc = "Maker(cls, fields, defaults): makes objects of a class of slots",
    .tp_new = maker_new,
};

/* open_ages(jobs, queue, received, now) -> {queue: [count, age_sum, oldest_age]}: the
 * broker's open requests by queue for eventmq's STATUS keys, from the slots ``queue`` and
 * ``received`` (member descriptors of the jobs' class) of every value of the dict ``jobs``.
 * A STATUS or /status of a broker with 40,000 requests open walked them in Python for
 * 10-11 ms, the reactor held; with this, 1.3-2.5 ms (~90 ns a request: a dict lookup and the
 * cache misses of three objects). None: a value not of the slots'
 * class, a slot unset or ``received`` not a float (the Python code decides). */
static Py_ssize_t slot_offset(PyObject *descriptor, PyTypeObject **owner) {
    if (!Py_IS_TYPE(descriptor, &PyMemberDescr_Type) ||
        ((PyMemberDescrObject *)descriptor)->d_member->type != T_OBJECT_EX)
        return -1;
    *owner = ((PyMemberDescrObject *)descriptor)->d_common.d_type;
    return ((PyMemberDescrObject *)descriptor)->d_member->offset;
}

typedef struct {
    Py_ssize_t count;
    double sum, oldest;
} Ages;

static PyObject *jobscan_open_ages(PyObject *module, PyObject *args) {
    PyObject *jobs, *queue_slot, *received_slot;
    double now;
    if (!PyArg_ParseTuple(args, "O!OOd", &PyDict_Type, &jobs, &queue_slot, &received_slot, &now))
        return NULL;
    PyTypeObject *cls = NULL, *other = NULL;
    Py_ssize_t queue_at = slot_offset(queue_slot, &cls);
    Py_ssize_t received_at = slot_offset(received_slot, &other);
    if (queue_at < 0 || received_at < 0 || cls != other) {
        PyErr_SetString(PyExc_TypeError, "open_ages() takes two slots of one class");
        return NULL;
    }
    /* queue -> its index in ``ages`` (few queues: the dict's lookup is the cost a job). */
    PyObject *index = PyDict_New(), *found = NULL;
    Ages *ages = NULL;
    Py_ssize_t queues = 0, room = 0, at = 0;
    PyObject *key, *job;
    if (index == NULL) return NULL;
    while (PyDict_Next(jobs, &at, &key, &job)) {
        if (!Py_IS_TYPE(job, cls)) goto unsure;
        PyObject *queue = *(PyObject **)((char *)job + queue_at);
        PyObject *received = *(PyObject **)((char *)job + received_at);
        if (queue == NULL || received == NULL || !PyFloat_CheckExact(received)) goto unsure;
        double age = now - PyFloat_AS_DOUBLE(received);
        PyObject *known = PyDict_GetItemWithError(index, queue);
        Py_ssize_t i;
        if (known != NULL) {
            i = PyLong_AsSsize_t(known);
        } else {
            if (PyErr_Occurred()) goto done;
            if (queues == room) {
                room = room ? room * 2 : 8;
                Ages *grown = PyMem_Realloc(ages, room * sizeof(Ages));
                if (grown == NULL) {
                    PyErr_NoMemory();
                    goto done;
                }
                ages = grown;
            }
            i = queues++;
            ages[i] = (Ages){0, 0.0, age};
            PyObject *number = PyLong_FromSsize_t(i);
            int set = number ? PyDict_SetItem(index, queue, number) : -1;
            Py_XDECREF(number);
            if (set < 0) goto done;
        }
        ages[i].count += 1;
        ages[i].sum += age;
        if (age > ages[i].oldest) ages[i].oldest = age;
    }
    found = PyDict_New();
    if (found == NULL) goto done;
    at = 0;
    PyObject *queue, *number;
    while (PyDict_Next(index, &at, &queue, &number)) {
        Ages *each = &ages[PyLong_AsSsize_t(number)];
        PyObject *entry = Py_BuildValue("[ndd]", each->count, each->sum, each->oldest);
        int set = entry ? PyDict_SetItem(found, queue, entry) : -1;
        Py_XDECREF(entry);
        if (set < 0) {
            Py_CLEAR(found);
            goto done;
        }
    }
    goto done;
unsure:
    found = Py_None;
    Py_INCREF(found);
done:
    PyMem_Free(ages);
    Py_DECREF(index);
    return found;
}

static PyMethodDef methods[] = {
    {"msgids", jobscan_msgids, METH_VARARGS, "msgids(prefix, start): where new_msgid() starts"},
    {"new_msgid", jobscan_new_msgid, METH_NOARGS, "new_msgid() -> the next message id"},
    {"setup", jobscan_setup, METH_VARARGS,
     "setup(Ready, Request, Reply, headers_seen, no_headers)"},
    {"parse", jobscan_parse, METH_O, "parse(frames) -> a job's command, or None: not sure"},
    {"parse_routed", jobscan_parse_routed, METH_O,
     "parse_routed(message) -> parse(message[1:]): a message with its ROUTER identity first"},
    {"is_ready", jobscan_is_ready, METH_O, "is_ready(frames) -> bool: a READY parse takes"},
    {"whole_json", jobscan_whole_json, METH_O,
     "whole_json(frame) -> bool: one JSON value codec._json takes (False: not sure)"},
    {"pack_jobs", jobscan_pack_jobs, METH_O, "pack_jobs(rows) -> bus.emqp.jobbatch's blob"},
    {"open_ages", jobscan_open_ages, METH_VARARGS,
     "open_ages(jobs, queue, received, now) -> {queue: [count, age_sum, oldest_age]}"},
    {"committed", jobscan_committed, METH_VARARGS,
     "committed(slots, dropped, batches, first): bus.emqp.jobbatch's committed"},
    {"settle", jobscan_settle, METH_VARARGS,
     "settle(pending, slots) -> (kept, marked, dropped): bus.emqp.jobbatch's settle"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_definition = {
    PyModuleDef_HEAD_INIT, "bus.emqp._jobscan",
    "The eMQP commands of every job, parsed in C (see bus/emqp/codec.py).", -1, methods,
};

PyMODINIT_FUNC PyInit__jobscan(void) {
    if (PyType_Ready(&changes_type) < 0 || PyType_Ready(&maker_type) < 0) return NULL;
    PyObject *module = PyModule_Create(&module_definition);
    if (module == NULL) return NULL;
    Py_INCREF(&changes_type);
    if (PyModule_AddObject(module, "Changes", (PyObject *)&changes_type) < 0) {
        Py_DECREF(&changes_type);
        Py_DECREF(module);
        return NULL;
    }
    Py_INCREF(&maker_type);
    if (PyModule_AddObject(module, "Maker", (PyObject *)&maker_type) < 0) {
        Py_DECREF(&maker_type);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
