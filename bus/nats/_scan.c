/* The NATS wire's two hot loops, compiled: bus/nats/codec.py and ranged.py.
 *
 * A reader of a stream gets one MSG or HMSG per event. In Python each costs a find, a
 * split, a few int() and a NamedTuple, then a split of its reply subject: 3-4 us, more
 * than the nats-server spends sending it. Here:
 *
 * scan(buffer, position, Msg, Control[, controls[, run_sid, Run[, stamps[, subjects]]]])
 * parses whole MSG/HMSG messages and bare PING, PONG and +OK lines from ``position`` on (the
 * lines into ``controls`` when given, so that a reader of thousands of messages need not
 * look at each for a PING; JetStream deliveries on ``run_sid`` into one Run of columns a
 * run, as deliveries() would read them, so that no message, reply subject or header block is
 * made for each, their subjects one object a topic, kept in ``subjects`` from one scan to
 * the next), and stops at the first thing it does not take: an incomplete message, INFO,
 * -ERR, anything odd (a number that is not plain digits, a missing CRLF after a payload).
 * The Python parser takes that one item, with its own errors, so both give the same
 * results for every input (tests/test_natswire_scan.py).
 *
 * deliveries(messages, start, sid, limit) reads JetStream deliveries (reply subject
 * $JS.ACK.<...>) on subscription ``sid`` into columns: stream sequence, subject, payload,
 * time stored, messages pending. It skips other subscriptions' messages and stops at the
 * first other message of ``sid`` (a pull request's status) or at a reply subject it does
 * not read, for the Python loop to take.
 *
 * batch_publishes(messages, batch, reply) makes the HPUB commands of an atomic batch, the
 * same bytes as bus/nats/jsapi.py's function of that name (a front-end's writer makes one
 * per event): None when ``messages`` is not a list of (subject, id, body) bytes tuples,
 * for the Python function to make.
 *
 * Optional, like bus/transport/_frames.c: without a compiler the Python code does it all.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>

/* Plain ASCII digits below 2**64 into ``value`` (no sign, no space, no underscore: Python's
 * int() accepts those, and then the Python code decides); 0 when not. */
static int digits(const char *text, Py_ssize_t size, unsigned long long *value) {
    if (size <= 0 || size > 20) return 0;
    unsigned long long sum = 0;
    /* Up to 19 digits cannot pass 2**64; only a 20th is checked (a division per digit
     * was half of this module's work on a stream's deliveries). */
    Py_ssize_t plain = size < 20 ? size : 19;
    for (Py_ssize_t i = 0; i < plain; i++) {
        unsigned d = (unsigned)(unsigned char)text[i] - '0';
        if (d > 9) return 0;
        sum = sum * 10 + d;
    }
    if (size == 20) {
        unsigned d = (unsigned)(unsigned char)text[19] - '0';
        if (d > 9 || __builtin_mul_overflow(sum, 10ULL, &sum) ||
            __builtin_add_overflow(sum, (unsigned long long)d, &sum))
            return 0;
    }
    *value = sum;
    return 1;
}

/* Split ``text`` on every ``separator``, as bytes.split does: the parts' starts and sizes,
 * at most ``most``; the count, or ``most + 1`` when there are more. */
static int split(const char *text, Py_ssize_t size, char separator, const char **part,
                 Py_ssize_t *part_size, int most) {
    int count = 0;
    const char *from = text;
    const char *end = text + size;
    for (;;) {
        const char *found = memchr(from, separator, (size_t)(end - from));
        if (count == most) return most + 1;
        part[count] = from;
        part_size[count] = (found ? found : end) - from;
        count++;
        if (!found) return count;
        from = found + 1;
    }
}

/* An instance of a tuple subclass (a NamedTuple) holding ``items``, which it steals. Its
 * items are bytes and ints and, its type having no __dict__, nothing can be added to it: it
 * can be in no cycle, so the cyclic collector is told at once (a reader's thousand messages
 * a read otherwise each survive into the old generation, and its full collections were the
 * largest share of a stream reader's work). */
static PyObject *named(PyTypeObject *type, PyObject **items, Py_ssize_t count) {
    PyObject *made = type->tp_alloc(type, count);
    if (made == NULL) {
        for (Py_ssize_t i = 0; i < count; i++) Py_XDECREF(items[i]);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < count; i++) PyTuple_SET_ITEM(made, i, items[i]);
    if (type->tp_dictoffset == 0 && PyObject_GC_IsTracked(made)) PyObject_GC_UnTrack(made);
    return made;
}

/* Append to ``out`` an instance of ``type`` holding ``items``, which it steals (one that is
 * NULL, a failed allocation, fails it all); -1 with an exception set on failure. */
static int append_named(PyObject *out, PyTypeObject *type, PyObject **items, Py_ssize_t count) {
    for (Py_ssize_t i = 0; i < count; i++) {
        if (items[i] == NULL) {
            for (Py_ssize_t j = 0; j < count; j++) Py_XDECREF(items[j]);
            return -1;
        }
    }
    PyObject *made = named(type, items, count);
    if (made == NULL) return -1;
    int failed = PyList_Append(out, made);
    Py_DECREF(made);
    return failed;
}

static int tuple_type(PyObject *type) {
    if (!PyType_Check(type) || !PyType_IsSubtype((PyTypeObject *)type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "a tuple subclass is wanted");
        return 0;
    }
    return 1;
}

/* The tokens of a delivery's reply subject: $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>
 * .<dseq>.<ts>.<pending> (9) or, with a domain and an account hash, 12 (11 to 32 taken);
 * as ranged.py reads them: 9 tokens give 5, 7 and 8, the others 7, 9 and 10. */
#define MAX_TOKENS 32

static int read_reply(const char *reply, Py_ssize_t size, unsigned long long *sequence,
                      unsigned long long *stamp, unsigned long long *pending,
                      Py_ssize_t *head) {
    const char *token[MAX_TOKENS];
    Py_ssize_t token_size[MAX_TOKENS];
    int count = split(reply, size, '.', token, token_size, MAX_TOKENS);
    if (count > MAX_TOKENS) return 0;
    int s = 5, t = 7, p = 8;
    if (count != 9) {
        if (count < 11) return 0;
        s = 7, t = 9, p = 10;
    }
    if (!digits(token[s], token_size[s], sequence) || !digits(token[t], token_size[t], stamp) ||
        !digits(token[p], token_size[p], pending))
        return 0;
    /* The first four tokens and their dots, where read_tail can read the next one's. */
    *head = count == 9 ? token[4] - reply : 0;
    return 1;
}

/* The word reads below take a buffer's first byte as a word's lowest: elsewhere, byte by byte. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define LITTLE_ENDIAN_WORDS 1
#else
#define LITTLE_ENDIAN_WORDS 0
#endif

/* Eight ASCII bytes as a word, the first in the lowest byte: each byte that is not a digit
 * nonzero in what this gives (the first one exactly: a carry only goes up from it). */
static uint64_t not_digits(uint64_t word) {
    return ((word & 0xF0F0F0F0F0F0F0F0ull) |
            (((word + 0x0606060606060606ull) & 0xF0F0F0F0F0F0F0F0ull) >> 4)) ^
           0x3333333333333333ull;
}

/* The number eight digits' values in a word make (the first in the lowest byte, the most
 * significant): pairs, then fours, then all eight. */
static uint64_t eight_digits(uint64_t word) {
    word = (word * 10 + (word >> 8)) & 0x00FF00FF00FF00FFull;
    word = (word * 100 + (word >> 16)) & 0x0000FFFF0000FFFFull;
    return (word * 10000 + (word >> 32)) & 0xFFFFFFFFull;
}

/* One token of read_tail's: up to the next dot (``last``: to the end), at ``*at``; with
 * ``value``, its plain digits as digits() reads them. 0 when it is not that. ``limit`` is
 * where the buffer ends: a word read there may pass ``end`` (the reply is followed by the
 * message's size), never ``limit``. */
/* Inlined: five calls a delivery, and the call itself cost a third of the reading. */
static inline __attribute__((always_inline)) int
tail_token(const char **at, const char *end, const char *limit, int last,
           unsigned long long *value) {
    const char *from = *at, *p = from;
    unsigned long long sum = 0;
    if (value == NULL) {
        while (p < end && *p != '.') p++;
    } else {
        if (LITTLE_ENDIAN_WORDS && limit - p >= 8) {
            /* Fewer than eight digits, the usual number (a sequence, a count): read in one
             * word, the first byte that is not a digit found in it. */
            uint64_t word;
            memcpy(&word, p, 8);
            uint64_t odd = not_digits(word);
            int count = odd ? __builtin_ctzll(odd) >> 3 : 8;
            if (count > 0 && count < 8 && count <= end - p) {
                p += count;
                if (last ? p != end : (p == end || *p != '.')) return 0;
                /* The digits moved to the top bytes, zeros before them. */
                *value = eight_digits((word - 0x3030303030303030ull) << (8 * (8 - count)));
                *at = p + 1;
                return 1;
            }
        }
        /* Eight digits at a time while they are (a time stored has 19): checked and summed
         * in a word, up to 19 digits in all (no overflow). */
        while (LITTLE_ENDIAN_WORDS && end - p >= 8 && p - from <= 11) {
            uint64_t word;
            memcpy(&word, p, 8);
            if (not_digits(word)) break; /* a byte that is not a digit: the loop below finds it */
            sum = sum * 100000000ull + eight_digits(word - 0x3030303030303030ull);
            p += 8;
        }
        for (; p < end && *p != '.'; p++) {
            unsigned d = (unsigned)(unsigned char)*p - '0';
            if (d > 9) return 0;
            sum = sum * 10 + d; /* wraps past 19 digits: read again below */
        }
        if (p - from >= 20 && !digits(from, p - from, &sum)) return 0;
        if (p == from) return 0;
        *value = sum;
    }
    if (last ? p != end : p == end) return 0;
    *at = p + 1;
    return 1;
}

static int read_tail(const char *rest, Py_ssize_t size, const char *limit,
                     unsigned long long *sequence, unsigned long long *stamp,
                     unsigned long long *pending) {
    const char *at = rest, *end = rest + size;
    return tail_token(&at, end, limit, 0, NULL) && tail_token(&at, end, limit, 0, sequence) &&
           tail_token(&at, end, limit, 0, NULL) && tail_token(&at, end, limit, 0, stamp) &&
           tail_token(&at, end, limit, 1, pending);
}

/* Subjects made during one scan, by a hash of their bytes: a stream's deliveries name a
 * few topics over and over, and one bytes object a topic spares an allocation each and,
 * its hash kept, the topic lookup's hashing (a delivery's largest costs after these). */
#define SUBJECT_SLOTS 64

typedef struct {
    PyObject *slot[SUBJECT_SLOTS];
} Subjects;

static PyObject *subject_of(Subjects *seen, const char *text, Py_ssize_t size) {
    /* Hashed by its size and last eight bytes, where topics' subjects differ (a collision
     * only costs a bytes object): no loop over every byte. */
    uint64_t tail = 0;
    Py_ssize_t take = size < 8 ? size : 8;
    memcpy(&tail, text + size - take, (size_t)take);
    uint64_t hash = (tail ^ (uint64_t)size) * 0x9E3779B97F4A7C15ull;
    PyObject **slot = &seen->slot[hash >> 58]; /* the top 6 bits: 64 slots */
    PyObject *known = *slot;
    if (known != NULL && PyBytes_GET_SIZE(known) == size &&
        memcmp(PyBytes_AS_STRING(known), text, (size_t)size) == 0)
        return Py_NewRef(known);
    PyObject *made = PyBytes_FromStringAndSize(text, size);
    if (made == NULL) return NULL;
    Py_XSETREF(*slot, Py_NewRef(made));
    return made;
}

/* The subjects a caller kept from its last scan (a list of SUBJECT_SLOTS bytes or None):
 * the same objects scan after scan, so that a dict keyed by them finds each by identity,
 * with no comparison of its bytes. 0, or -1 with an exception set. */
static int recall_subjects(Subjects *seen, PyObject *kept) {
    if (!PyList_CheckExact(kept) || PyList_GET_SIZE(kept) != SUBJECT_SLOTS) {
        PyErr_SetString(PyExc_ValueError, "subjects: a list of 64 is wanted");
        return -1;
    }
    for (int i = 0; i < SUBJECT_SLOTS; i++) {
        PyObject *known = PyList_GET_ITEM(kept, i);
        seen->slot[i] = PyBytes_CheckExact(known) ? Py_NewRef(known) : NULL;
    }
    return 0;
}

/* Forget the subjects, into ``kept`` first when given (where recall_subjects takes them). */
static void forget_subjects(Subjects *seen, PyObject *kept) {
    for (int i = 0; i < SUBJECT_SLOTS; i++) {
        if (kept != NULL && seen->slot[i] != NULL)
            PyList_SetItem(kept, i, Py_NewRef(seen->slot[i])); /* steals; cannot fail here */
        Py_CLEAR(seen->slot[i]);
    }
}

#define MAX_PARTS 6

/* A run of deliveries being made: each one's five values one after another (a list a
 * column is made once, at its size, when the run ends: an append a value cost a fifth of
 * a delivery's scan), and the bytes of their headers and payloads (what a connection's
 * pending limits count). */
typedef struct {
    PyObject **values;
    Py_ssize_t count, room; /* deliveries held, and room for */
    unsigned long long bytes;
} Run;

static void drop_run(Run *run) {
    for (Py_ssize_t i = 0; i < 5 * run->count; i++) Py_DECREF(run->values[i]);
    PyMem_Free(run->values);
    run->values = NULL;
    run->count = run->room = 0;
    run->bytes = 0;
}

/* The run made so far, as one ``run_type`` item appended to ``out``; none when empty. */
static int end_run(Run *run, PyObject *out, PyTypeObject *run_type) {
    Py_ssize_t count = run->count;
    if (count == 0) return 0;
    PyObject *items[6] = {NULL, NULL, NULL, NULL, NULL, NULL};
    for (int c = 0; c < 5; c++)
        if ((items[c] = PyList_New(count)) == NULL) goto failed;
    items[5] = PyLong_FromUnsignedLongLong(run->bytes);
    if (items[5] == NULL) goto failed;
    /* The values move into the columns (no allocation from here: nothing can run). */
    for (Py_ssize_t i = 0; i < count; i++)
        for (int c = 0; c < 5; c++) PyList_SET_ITEM(items[c], i, run->values[5 * i + c]);
    run->count = 0;
    run->bytes = 0;
    /* The columns hold ints and bytes only and nothing adds anything else to them: out of
     * the collector's walks (a front-end's chunk of a thousand waits to be made into
     * messages, and each young collection walked every column item by item). The tuple
     * stays with the collector (one a run, not one a message). */
    for (int i = 0; i < 5; i++)
        if (PyObject_GC_IsTracked(items[i])) PyObject_GC_UnTrack(items[i]);
    PyObject *made = run_type->tp_alloc(run_type, 6);
    if (made == NULL) {
        for (int i = 0; i < 6; i++) Py_DECREF(items[i]);
        return -1;
    }
    for (int i = 0; i < 6; i++) PyTuple_SET_ITEM(made, i, items[i]);
    int appended = PyList_Append(out, made);
    Py_DECREF(made);
    return appended;
failed:
    /* The lists made so far hold NULLs only (PyList_New): they free alone. */
    for (int i = 0; i < 6; i++) Py_XDECREF(items[i]);
    return -1;
}

/* One delivery into ``run`` (it steals ``subject`` and ``payload``, either of which may be
 * NULL: a failed allocation); -1 with an exception set. */
static int add_to_run(Run *run, PyObject *subject, PyObject *payload, unsigned long long sequence,
                      unsigned long long stamp, int stamps, unsigned long long pending,
                      unsigned long long bytes) {
    /* Without stamps: 0, a small int Python keeps (no object made). */
    PyObject *values[5] = {PyLong_FromUnsignedLongLong(sequence), subject, payload,
                           PyLong_FromUnsignedLongLong(stamps ? stamp : 0),
                           PyLong_FromUnsignedLongLong(pending)};
    int failed = 0;
    for (int i = 0; i < 5; i++)
        if (values[i] == NULL) failed = -1;
    if (!failed && run->count == run->room) {
        Py_ssize_t room = run->room ? 2 * run->room : 256;
        PyObject **more = PyMem_Realloc(run->values, (size_t)room * 5 * sizeof(PyObject *));
        if (more == NULL) failed = -1;
        else run->values = more, run->room = room;
    }
    if (failed) {
        for (int i = 0; i < 5; i++) Py_XDECREF(values[i]);
        if (!PyErr_Occurred()) PyErr_NoMemory();
        return -1;
    }
    memcpy(run->values + 5 * run->count, values, sizeof(values));
    run->count++;
    run->bytes += bytes;
    return 0;
}

static PyObject *scan(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view;
    Py_ssize_t position;
    PyObject *msg_type, *control_type, *controls = NULL, *run_type = NULL, *kept = NULL;
    long long run_sid = -1;
    int stamps = 1;
    if (!PyArg_ParseTuple(args, "y*nOO|OLOpO", &view, &position, &msg_type, &control_type,
                          &controls, &run_sid, &run_type, &stamps, &kept))
        return NULL;
    if (controls == Py_None) controls = NULL;
    if (run_type == Py_None) run_type = NULL;
    if (kept == Py_None) kept = NULL;
    if (!tuple_type(msg_type) || !tuple_type(control_type) ||
        (run_type != NULL && !tuple_type(run_type))) {
        PyBuffer_Release(&view);
        return NULL;
    }
    if (controls != NULL && !PyList_Check(controls)) {
        PyErr_SetString(PyExc_TypeError, "controls: a list is wanted");
        PyBuffer_Release(&view);
        return NULL;
    }
    const char *data = view.buf;
    Py_ssize_t size = view.len;
    PyObject *out = NULL;
    Run run = {NULL, 0, 0, 0};
    Subjects seen = {{NULL}};
    /* The head of the last delivery's reply subject read (in ``data``), 0 bytes: none. */
    const char *head = NULL;
    Py_ssize_t head_size = 0;
    if (position < 0) {
        PyErr_SetString(PyExc_ValueError, "a position before the buffer");
        goto fail;
    }
    if (kept != NULL && recall_subjects(&seen, kept) < 0) {
        kept = NULL;
        goto fail;
    }
    out = PyList_New(0);
    if (out == NULL) goto fail;
    while (position < size) {
        const char *line = data + position;
        const char *cr = memchr(line, '\r', (size_t)(size - position));
        if (cr == NULL || cr + 1 >= data + size || cr[1] != '\n') break;
        Py_ssize_t length = cr - line;
        Py_ssize_t start = position + length + 2; /* the payload's first octet */
        if (length >= 4 && (memcmp(line, "MSG ", 4) == 0 || memcmp(line, "HMSG", 4) == 0)) {
            int headers = line[0] == 'H';
            const char *part[MAX_PARTS];
            Py_ssize_t part_size[MAX_PARTS];
            int parts = split(line, length, ' ', part, part_size, MAX_PARTS);
            if (headers ? (parts != 5 && parts != 6) : (parts != 4 && parts != 5)) break;
            if (part_size[0] != (headers ? 4 : 3)) break; /* "HMSGX ..." */
            int has_reply = parts == (headers ? 6 : 5);
            unsigned long long sid, total, header_size = 0;
            if (!digits(part[2], part_size[2], &sid) || sid > LLONG_MAX) break;
            if (!digits(part[parts - 1], part_size[parts - 1], &total)) break;
            if (headers && !digits(part[parts - 2], part_size[parts - 2], &header_size)) break;
            if (total < header_size || total > (unsigned long long)(size - start)) break;
            if (start + (Py_ssize_t)total + 2 > size) break; /* the rest is on its way */
            if (data[start + total] != '\r' || data[start + total + 1] != '\n') break;
            unsigned long long sequence, stamp, pending;
            if (run_type != NULL && has_reply && (long long)sid == run_sid &&
                part_size[3] >= 8 && memcmp(part[3], "$JS.ACK.", 8) == 0 &&
                (head_size > 0 && part_size[3] > head_size &&
                         memcmp(part[3], head, (size_t)head_size) == 0
                     ? read_tail(part[3] + head_size, part_size[3] - head_size, data + size,
                                 &sequence, &stamp, &pending) ||
                           read_reply(part[3], part_size[3], &sequence, &stamp, &pending,
                                      &head_size)
                     : read_reply(part[3], part_size[3], &sequence, &stamp, &pending,
                                  &head_size))) {
                if (head_size > 0) head = part[3]; /* where the next one is compared */
                /* A delivery: its reply subject read here, no message made for it. */
                if (add_to_run(&run, subject_of(&seen, part[1], part_size[1]),
                               PyBytes_FromStringAndSize(data + start + header_size,
                                                         (Py_ssize_t)(total - header_size)),
                               sequence, stamp, stamps, pending, total) < 0)
                    goto fail;
                position = start + (Py_ssize_t)total + 2;
                continue;
            }
            if (run_type != NULL && end_run(&run, out, (PyTypeObject *)run_type) < 0) goto fail;
            PyObject *items[5];
            items[0] = PyBytes_FromStringAndSize(part[1], part_size[1]);
            items[1] = PyLong_FromUnsignedLongLong(sid);
            items[2] = has_reply ? PyBytes_FromStringAndSize(part[3], part_size[3])
                                 : PyBytes_FromStringAndSize(NULL, 0);
            items[3] = PyBytes_FromStringAndSize(data + start, (Py_ssize_t)header_size);
            items[4] = PyBytes_FromStringAndSize(data + start + header_size,
                                                 (Py_ssize_t)(total - header_size));
            if (append_named(out, (PyTypeObject *)msg_type, items, 5)) goto fail;
            position = start + (Py_ssize_t)total + 2;
            continue;
        }
        const char *word = NULL;
        if (length == 4 && memcmp(line, "PING", 4) == 0) word = "PING";
        else if (length == 4 && memcmp(line, "PONG", 4) == 0) word = "PONG";
        else if (length == 3 && memcmp(line, "+OK", 3) == 0) word = "+OK";
        if (word == NULL) break; /* INFO, -ERR, lower case, arguments: Python's */
        if (controls == NULL && run_type != NULL &&
            end_run(&run, out, (PyTypeObject *)run_type) < 0)
            goto fail;
        PyObject *items[2] = {PyBytes_FromString(word), PyBytes_FromStringAndSize(NULL, 0)};
        if (append_named(controls ? controls : out, (PyTypeObject *)control_type, items, 2))
            goto fail;
        position = start;
    }
    if (run_type != NULL && end_run(&run, out, (PyTypeObject *)run_type) < 0) goto fail;
    drop_run(&run); /* its room */
    forget_subjects(&seen, kept);
    PyBuffer_Release(&view);
    return Py_BuildValue("Nn", out, position);
fail:
    forget_subjects(&seen, kept);
    drop_run(&run);
    Py_XDECREF(out);
    PyBuffer_Release(&view);
    return NULL;
}

static PyObject *deliveries(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *messages;
    Py_ssize_t start, limit;
    long long sid;
    if (!PyArg_ParseTuple(args, "O!nLn", &PyList_Type, &messages, &start, &sid, &limit))
        return NULL;
    Py_ssize_t count = PyList_GET_SIZE(messages);
    Py_ssize_t index = start < 0 ? count : start;
    /* Columns made at their largest and cut to what was taken: no append per delivery.
     * Nothing in the loop makes an object the cyclic collector follows, so no Python
     * code runs while they hold empty places. */
    Py_ssize_t most = index < count ? count - index : 0;
    if (limit < most) most = limit < 0 ? 0 : limit;
    PyObject *columns[5] = {NULL, NULL, NULL, NULL, NULL};
    for (int i = 0; i < 5; i++)
        if ((columns[i] = PyList_New(most)) == NULL) goto fail;
    Py_ssize_t taken = 0;
    for (; index < count && taken < limit; index++) {
        PyObject *msg = PyList_GET_ITEM(messages, index);
        if (!PyTuple_Check(msg) || PyTuple_GET_SIZE(msg) != 5) break;
        PyObject *msg_sid = PyTuple_GET_ITEM(msg, 1);
        if (!PyLong_Check(msg_sid)) break;
        long long its = PyLong_AsLongLong(msg_sid);
        if (its == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            break;
        }
        if (its != sid) continue;
        PyObject *reply = PyTuple_GET_ITEM(msg, 2);
        if (!PyBytes_Check(reply)) break;
        const char *text = PyBytes_AS_STRING(reply);
        Py_ssize_t size = PyBytes_GET_SIZE(reply);
        if (size < 8 || memcmp(text, "$JS.ACK.", 8) != 0) break;
        unsigned long long sequence, stamp, pending;
        Py_ssize_t head;
        if (!read_reply(text, size, &sequence, &stamp, &pending, &head)) break;
        PyObject *values[5] = {PyLong_FromUnsignedLongLong(sequence),
                               Py_NewRef(PyTuple_GET_ITEM(msg, 0)),
                               Py_NewRef(PyTuple_GET_ITEM(msg, 4)),
                               PyLong_FromUnsignedLongLong(stamp),
                               PyLong_FromUnsignedLongLong(pending)};
        if (!values[0] || !values[3] || !values[4]) {
            for (int i = 0; i < 5; i++) Py_XDECREF(values[i]);
            goto fail;
        }
        for (int i = 0; i < 5; i++) PyList_SET_ITEM(columns[i], taken, values[i]);
        taken++;
    }
    if (taken < most)
        for (int i = 0; i < 5; i++)
            if (PyList_SetSlice(columns[i], taken, most, NULL) < 0) goto fail;
    return Py_BuildValue("nNNNNN", index, columns[0], columns[1], columns[2], columns[3],
                         columns[4]);
fail:
    for (int i = 0; i < 5; i++) Py_XDECREF(columns[i]);
    return NULL;
}

static Py_ssize_t decimal_size(unsigned long long value) {
    Py_ssize_t size = 1;
    while (value >= 10) {
        value /= 10;
        size++;
    }
    return size;
}

static char *put(char *out, const char *text, Py_ssize_t size) {
    memcpy(out, text, (size_t)size);
    return out + size;
}

static char *put_decimal(char *out, unsigned long long value) {
    Py_ssize_t size = decimal_size(value);
    for (Py_ssize_t i = size - 1; i >= 0; i--) {
        out[i] = (char)('0' + value % 10);
        value /= 10;
    }
    return out + size;
}

#define LIT(text) text, (Py_ssize_t)(sizeof(text) - 1)
static const char MSG_ID[] = "NATS/1.0\r\nNats-Msg-Id: ";
static const char BATCH_ID[] = "\r\nNats-Batch-Id: ";
static const char BATCH_SEQ[] = "\r\nNats-Batch-Sequence: ";
static const char COMMIT[] = "\r\nNats-Batch-Commit: 1";

static PyObject *batch_publishes(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *messages;
    const char *batch, *reply;
    Py_ssize_t batch_size, reply_size;
    if (!PyArg_ParseTuple(args, "Oy#y#", &messages, &batch, &batch_size, &reply, &reply_size))
        return NULL;
    if (!PyList_CheckExact(messages)) Py_RETURN_NONE;
    /* A tuple of the same items: the list could change while the output is allocated (a
     * collection may run a finalizer), the tuples and bytes cannot. */
    PyObject *held = PyList_AsTuple(messages);
    if (held == NULL) return NULL;
    Py_ssize_t count = PyTuple_GET_SIZE(held);
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *message = PyTuple_GET_ITEM(held, i);
        PyObject **part = NULL;
        if (PyTuple_CheckExact(message) && PyTuple_GET_SIZE(message) == 3)
            part = ((PyTupleObject *)message)->ob_item;
        if (part == NULL || !PyBytes_CheckExact(part[0]) || !PyBytes_CheckExact(part[1]) ||
            !PyBytes_CheckExact(part[2])) {
            Py_DECREF(held);
            Py_RETURN_NONE;
        }
        int last = i == count - 1;
        Py_ssize_t headers = (Py_ssize_t)(sizeof(MSG_ID) - 1) + PyBytes_GET_SIZE(part[1]) +
                             (Py_ssize_t)(sizeof(BATCH_ID) - 1) + batch_size +
                             (Py_ssize_t)(sizeof(BATCH_SEQ) - 1) +
                             decimal_size((unsigned long long)(i + 1)) +
                             (last ? (Py_ssize_t)(sizeof(COMMIT) - 1) : 0) + 4;
        Py_ssize_t whole = headers + PyBytes_GET_SIZE(part[2]);
        total += 5 + PyBytes_GET_SIZE(part[0]) + (last && reply_size ? 1 + reply_size : 0) + 1 +
                 decimal_size((unsigned long long)headers) + 1 +
                 decimal_size((unsigned long long)whole) + 2 + whole + 2;
    }
    PyObject *made = PyBytes_FromStringAndSize(NULL, total);
    if (made == NULL) {
        Py_DECREF(held);
        return NULL;
    }
    char *out = PyBytes_AS_STRING(made);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject **part = ((PyTupleObject *)PyTuple_GET_ITEM(held, i))->ob_item;
        int last = i == count - 1;
        Py_ssize_t id_size = PyBytes_GET_SIZE(part[1]), body_size = PyBytes_GET_SIZE(part[2]);
        Py_ssize_t headers = (Py_ssize_t)(sizeof(MSG_ID) - 1) + id_size +
                             (Py_ssize_t)(sizeof(BATCH_ID) - 1) + batch_size +
                             (Py_ssize_t)(sizeof(BATCH_SEQ) - 1) +
                             decimal_size((unsigned long long)(i + 1)) +
                             (last ? (Py_ssize_t)(sizeof(COMMIT) - 1) : 0) + 4;
        out = put(out, LIT("HPUB "));
        out = put(out, PyBytes_AS_STRING(part[0]), PyBytes_GET_SIZE(part[0]));
        if (last && reply_size) {
            *out++ = ' ';
            out = put(out, reply, reply_size);
        }
        *out++ = ' ';
        out = put_decimal(out, (unsigned long long)headers);
        *out++ = ' ';
        out = put_decimal(out, (unsigned long long)(headers + body_size));
        out = put(out, LIT("\r\n"));
        out = put(out, LIT(MSG_ID));
        out = put(out, PyBytes_AS_STRING(part[1]), id_size);
        out = put(out, LIT(BATCH_ID));
        out = put(out, batch, batch_size);
        out = put(out, LIT(BATCH_SEQ));
        out = put_decimal(out, (unsigned long long)(i + 1));
        if (last) out = put(out, LIT(COMMIT));
        out = put(out, LIT("\r\n\r\n"));
        out = put(out, PyBytes_AS_STRING(part[2]), body_size);
        out = put(out, LIT("\r\n"));
    }
    Py_DECREF(held);
    return made;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS,
     "scan(buffer, position, Msg, Control[, controls[, run_sid, Run[, stamps[, subjects]]]]) -> "
     "(items, position): whole messages and bare PING/PONG/+OK lines (appended to the list controls "
     "instead, when given), up to the first item left to the Python parser; JetStream "
     "deliveries on run_sid as one Run (sequences, subjects, payloads, stamps, pending, "
     "bytes) a run, their stamps 0 when stamps is false, their subjects kept in the list "
     "subjects (64 places) from one scan to the next."},
    {"deliveries", deliveries, METH_VARARGS,
     "deliveries(messages, start, sid, limit) -> (index, sequences, subjects, payloads, "
     "stamps, pending): JetStream deliveries on sid as columns, up to the first other "
     "message of sid or limit deliveries."},
    {"batch_publishes", batch_publishes, METH_VARARGS,
     "batch_publishes(messages, batch, reply) -> bytes: an atomic batch's HPUB commands, or "
     "None when messages is not a list of (subject, id, body) bytes tuples."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_scan", NULL, -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__scan(void) { return PyModule_Create(&module); }
