/* The collector's hot loop, compiled: bus/eventbus/codec.py's PubParser.
 *
 * A PUB whose topic, producer id and timestamp the parser has already found valid needs
 * only its sequence, uuid and data checked. In Python that pass (a 7-way unpacking, three
 * set lookups, the uuid's translate, msgpack's unpackb and a tuple) was the largest share
 * of the server's own code per event. Here:
 *
 * known(batch, start, topics, producers, timestamps, max_data, unpackb[, remember]) takes the
 * messages of ``batch`` (lists ``[identity, topic, sequence, producer, timestamp, uuid, data]``
 * of bytes) from ``start`` on, as long as each passes that shortest check, and returns their
 * ``(topic, producer, timestamp, uuid, data)`` tuples and the index of the first message it did
 * not take (``len(batch)`` when it took them all). The data is checked by calling
 * ``unpackb(data, raw=True, strict_map_key=False)`` itself, so msgpack decides exactly as in
 * Python, unless a walk of the bytes finds them surely whole and valid first (no object made:
 * unpackb made the whole value only for it to be dropped, 70 % of the check's instructions):
 * scalars, strings, binaries, arrays, maps whose keys are neither arrays nor maps, extension
 * types of codes 0 to 127 (msgpack refuses other negative codes, and checks a timestamp's (-1)
 * fields), at most 512 containers deep, nothing after the value. Anything else goes to unpackb.
 * With ``remember`` (and once ``checks`` gave the limits), a topic, producer id or timestamp
 * not in its set is checked here as the Python reference checks it (UTF-8 by Python's own
 * decoder, the timestamp's characters, then ``datetime.fromisoformat`` itself) and learned into
 * its set as PubParser._learn does (the set emptied once it holds ``remember``): without it
 * every PUB of a topic or timestamp not remembered (more topics than the sets hold, or a rate
 * below one PUB a millisecond, where each timestamp is new) took the Python reference, ~3 us
 * more. The Python loop takes the message it stopped at, with its own errors and what it
 * learns, and calls again after it: both give the same results for every input, and remember
 * the same (tests/test_eventbus_codec_fastpath.py).
 *
 * stream_items(fields, start, subjects) is a JetStream front-end's append, per event:
 * each event's ``(subject, uuid, body)`` for the stream, its subject looked up in the dict
 * ``subjects`` (topic -> subject) and its body msgpack's array of four ``bin`` (producer,
 * timestamp, uuid, data), the bytes msgpack's Packer(use_bin_type=True) makes. It stops at
 * the first event whose topic the dict does not hold (or that is not five bytes objects):
 * the Python code converts that one and calls again after it.
 *
 * stream_rows(sequences, topics, payloads, start) is the way back: the log's rows
 * ``(sequence, topic, producer, timestamp, uuid, data)`` of messages read from the stream,
 * each body read as that same array of four ``bin``; it stops at the first body of any
 * other form (msgpack's unpackb and the Python checks decide those). With two more
 * arguments, ``head`` (a tuple of bytes) and ``binary``, it makes a snapshot's messages
 * instead: ``[*head, topic, sequence, producer, timestamp, uuid, data]`` lists, the
 * sequence as ``broadcasts`` writes it (no row made only to be taken apart). With a
 * seventh, ``names`` (a dict from subjects to topics whose misses convert), the second list
 * holds the messages' subjects and each topic is looked up as it goes (no column of topics
 * made first); it stops at a subject that names none, for the Python code to leave out.
 *
 * broadcasts(first, fields, binary) makes the BROADCAST frames of consecutive events
 * from sequence ``first``: ``[topic, sequence, producer, timestamp, uuid, data]`` each, the
 * sequence as 8 bytes in network order (``binary``) or ASCII decimal; None when ``fields``
 * is not a list of five-tuples, for the Python function to make.
 *
 * Optional, like bus/transport/_frames.c: without a compiler the Python code does it all.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <string.h>

static PyObject *keyword_names; /* ("raw", "strict_map_key") */

/* Set by checks(): the reference's limits and datetime.fromisoformat; until then (NULL) a
 * value not remembered goes to the Python loop. */
static Py_ssize_t max_topic, max_producer, max_timestamp, max_remembered;
static PyObject *fromisoformat;

/* An exception the Python loop's reference would take as a refusal (1: cleared), or one to
 * propagate (0: KeyboardInterrupt, SystemExit...). */
static int cleared(void) {
    if (!PyErr_ExceptionMatches(PyExc_Exception)) return 0;
    PyErr_Clear();
    return 1;
}

/* UTF-8 as Python's strict decoder takes it, within ``limit`` bytes: 1, 0, or -1. */
static int text_ok(PyObject *value, Py_ssize_t limit) {
    if (PyBytes_GET_SIZE(value) > limit) return 0;
    PyObject *text = PyUnicode_DecodeUTF8(PyBytes_AS_STRING(value), PyBytes_GET_SIZE(value),
                                          "strict");
    if (text == NULL) return cleared() ? 0 : -1;
    Py_DECREF(text);
    return 1;
}

/* codec.check_published_topic's verdict: 1, 0, or -1. */
static int topic_ok(PyObject *topic) {
    if (PyBytes_GET_SIZE(topic) == 0 || PyBytes_AS_STRING(topic)[0] == '$') return 0;
    return text_ok(topic, max_topic);
}

/* codec.check_producer's. */
static int producer_ok(PyObject *producer) { return text_ok(producer, max_producer); }

/* codec.check_timestamp's: ``[0-9A-Za-z:.,+\- ]{1,64}``, then fromisoformat. */
static int timestamp_ok(PyObject *timestamp) {
    Py_ssize_t size = PyBytes_GET_SIZE(timestamp);
    const char *at = PyBytes_AS_STRING(timestamp);
    if (size < 1 || size > max_timestamp) return 0;
    for (Py_ssize_t i = 0; i < size; i++) {
        char c = at[i];
        if (!((c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
              c == ':' || c == '.' || c == ',' || c == '+' || c == '-' || c == ' '))
            return 0;
    }
    PyObject *text = PyUnicode_DecodeASCII(at, size, "strict");
    if (text == NULL) return cleared() ? 0 : -1;
    PyObject *when = PyObject_CallOneArg(fromisoformat, text);
    Py_DECREF(text);
    if (when == NULL) return cleared() ? 0 : -1;
    Py_DECREF(when);
    return 1;
}

/* In ``set`` already (1), or not and found valid by ``check`` (2: to learn), or neither
 * (0), or -1. Without checks() or ``remember``: 1, 0 or -1. */
static int found_or_valid(PyObject *set, PyObject *value, int checking,
                          int (*check)(PyObject *)) {
    int found = PySet_Contains(set, value);
    if (found != 0 || !checking) return found;
    int valid = check(value);
    return valid > 0 ? 2 : valid;
}

/* The values known_one found valid but not remembered, as bits: PubParser._learn's. */
enum { NEW_TOPIC = 1, NEW_PRODUCER = 2, NEW_TIMESTAMP = 4 };

/* PubParser._learn of one value not in ``set``: the set emptied first when it holds
 * ``remember``. */
static int learn(PyObject *set, PyObject *value, Py_ssize_t remember) {
    if (PySet_GET_SIZE(set) >= remember && PySet_Clear(set) < 0) return -1;
    return PySet_Add(set, value);
}

static int is_hex(char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* 36 characters: dashes at 8, 13, 18 and 23, hex digits elsewhere (what the Python pass
 * checks: no version or variant digit is looked at). */
static int uuid_shaped(PyObject *uuid) {
    if (PyBytes_GET_SIZE(uuid) != 36) return 0;
    const char *text = PyBytes_AS_STRING(uuid);
    for (int i = 0; i < 36; i++) {
        if (i == 8 || i == 13 || i == 18 || i == 23) {
            if (text[i] != '-') return 0;
        } else if (!is_hex(text[i])) {
            return 0;
        }
    }
    return 1;
}

/* The unsigned number in network order in the ``size`` bytes at ``at`` (msgpack's lengths). */
static unsigned long long big_endian(const unsigned char *at, Py_ssize_t size) {
    unsigned long long value = 0;
    for (Py_ssize_t b = 0; b < size; b++) value = (value << 8) | at[b];
    return value;
}

/* Whether ``data`` is surely one whole msgpack value that unpackb(raw=True,
 * strict_map_key=False) takes (see the module's text); 0 means "ask unpackb". */
#define SURE_DEPTH 512
static int sure_msgpack(const unsigned char *data, Py_ssize_t size) {
    /* Values still owed by each open container; a map owes key, value, key, ... and a
     * key is the owed count's parity (even: a key comes next). */
    Py_ssize_t owed[SURE_DEPTH];
    int is_map[SURE_DEPTH];
    int depth = 0;
    Py_ssize_t at = 0;
    for (;;) {
        if (at >= size) return 0;
        int key = depth > 0 && is_map[depth - 1] && owed[depth - 1] % 2 == 0;
        unsigned char c = data[at++];
        Py_ssize_t skip = 0, count = -1;
        int map = 0;
        if (c <= 0x7f || c >= 0xe0 || (c >= 0xc2 && c <= 0xc3) || c == 0xc0) {
            skip = 0;
        } else if (c >= 0xa0 && c <= 0xbf) {
            skip = c & 0x1f;
        } else if (c >= 0x90 && c <= 0x9f) {
            count = c & 0x0f;
        } else if (c >= 0x80 && c <= 0x8f) {
            count = c & 0x0f;
            map = 1;
        } else {
            Py_ssize_t head;
            switch (c) {
            case 0xcc: case 0xd0: skip = 1; break;
            case 0xcd: case 0xd1: skip = 2; break;
            case 0xca: case 0xce: case 0xd2: skip = 4; break;
            case 0xcb: case 0xcf: case 0xd3: skip = 8; break;
            case 0xd4: case 0xd5: case 0xd6: case 0xd7: case 0xd8:
                /* fixext 1, 2, 4, 8, 16: the type byte, then the data */
                if (at >= size || (signed char)data[at] < 0) return 0;
                skip = 1 + ((Py_ssize_t)1 << (c - 0xd4));
                break;
            case 0xc4: case 0xd9: case 0xc7: head = 1; goto sized;
            case 0xc5: case 0xda: case 0xc8: head = 2; goto sized;
            case 0xc6: case 0xdb: case 0xc9: head = 4; goto sized;
            case 0xdc: case 0xde: head = 2; goto counted;
            case 0xdd: case 0xdf: head = 4; goto counted;
            default: return 0; /* 0xc1, never used */
            sized: {
                if (size - at < head) return 0;
                unsigned long long length = big_endian(data + at, head);
                at += head;
                if (c == 0xc7 || c == 0xc8 || c == 0xc9) { /* ext: its type byte */
                    if (at >= size || (signed char)data[at] < 0) return 0;
                    length += 1;
                }
                if (length > (unsigned long long)(size - at)) return 0;
                skip = (Py_ssize_t)length;
                break;
            }
            counted: {
                if (size - at < head) return 0;
                unsigned long long length = big_endian(data + at, head);
                at += head;
                if (length > (unsigned long long)(size - at)) return 0; /* each takes a byte */
                count = (Py_ssize_t)length;
                map = c == 0xde || c == 0xdf;
                break;
            }
            }
        }
        if (count >= 0) {
            if (key) return 0; /* an array or a map as a key: unhashable, unpackb says so */
            if (depth > 0) owed[depth - 1]--;
            if (count > 0) {
                if (depth == SURE_DEPTH) return 0;
                owed[depth] = map ? 2 * count : count;
                is_map[depth] = map;
                depth++;
            }
        } else {
            if (size - at < skip) return 0;
            at += skip;
            if (depth > 0) owed[depth - 1]--;
        }
        while (depth > 0 && owed[depth - 1] == 0) depth--;
        if (depth == 0) return at == size;
    }
}

static PyObject *sure(PyObject *module, PyObject *data) {
    (void)module;
    if (!PyBytes_Check(data)) {
        PyErr_SetString(PyExc_TypeError, "sure_msgpack() takes bytes");
        return NULL;
    }
    return PyBool_FromLong(sure_msgpack((const unsigned char *)PyBytes_AS_STRING(data),
                                        PyBytes_GET_SIZE(data)));
}

/* 1 when ``frames`` takes the shortest path (``*fresh``: the NEW_ bits of what it found
 * valid here, to learn), 0 when the Python loop must look at it, -1 on an exception that
 * must propagate (not an Exception: KeyboardInterrupt, MemoryError...). */
static int known_one(PyObject *frames, PyObject *topics, PyObject *producers,
                     PyObject *timestamps, Py_ssize_t max_data, PyObject *unpackb,
                     int checking, int *fresh) {
    *fresh = 0;
    if (!PyList_CheckExact(frames) || PyList_GET_SIZE(frames) != 7) return 0;
    PyObject **item = ((PyListObject *)frames)->ob_item;
    for (int i = 1; i < 7; i++)
        if (!PyBytes_CheckExact(item[i])) return 0;
    PyObject *sequence = item[2], *uuid = item[5], *data = item[6];
    Py_ssize_t sequence_size = PyBytes_GET_SIZE(sequence);
    if (!(sequence_size == 8 || sequence_size == 0 ||
          (sequence_size == 4 && memcmp(PyBytes_AS_STRING(sequence), "null", 4) == 0)))
        return 0;
    if (PyBytes_GET_SIZE(data) > max_data || !uuid_shaped(uuid)) return 0;
    /* Set membership as ``in`` answers it, or the reference's check: 2, 1, 0, or -1. */
    int found = found_or_valid(topics, item[1], checking, topic_ok);
    if (found <= 0) return found;
    int learn_bits = found == 2 ? NEW_TOPIC : 0;
    found = found_or_valid(producers, item[3], checking, producer_ok);
    if (found <= 0) return found;
    learn_bits |= found == 2 ? NEW_PRODUCER : 0;
    found = found_or_valid(timestamps, item[4], checking, timestamp_ok);
    if (found <= 0) return found;
    learn_bits |= found == 2 ? NEW_TIMESTAMP : 0;
    if (!sure_msgpack((const unsigned char *)PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data))) {
        PyObject *arguments[3] = {data, Py_True, Py_False};
        PyObject *value = PyObject_Vectorcall(unpackb, arguments, 1, keyword_names);
        /* A refusal: the Python loop's reference parser names the defect. */
        if (value == NULL) return cleared() ? 0 : -1;
        Py_DECREF(value);
    }
    *fresh = learn_bits;
    return 1;
}

static PyObject *known(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 7 && nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "known(batch, start, topics, producers, timestamps, "
                                         "max_data, unpackb[, remember])");
        return NULL;
    }
    PyObject *batch = args[0], *topics = args[2], *producers = args[3], *timestamps = args[4];
    PyObject *unpackb = args[6];
    if (!PyList_CheckExact(batch) || !PyAnySet_Check(topics) || !PyAnySet_Check(producers) ||
        !PyAnySet_Check(timestamps)) {
        PyErr_SetString(PyExc_TypeError, "known() takes a list and three sets");
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    Py_ssize_t max_data = PyLong_AsSsize_t(args[5]);
    if ((start == -1 || max_data == -1) && PyErr_Occurred()) return NULL;
    if (start < 0) start = 0;
    Py_ssize_t remember = 0;
    if (nargs == 8) {
        remember = PyLong_AsSsize_t(args[7]);
        if (remember == -1 && PyErr_Occurred()) return NULL;
    }
    int checking = fromisoformat != NULL && remember > 0;
    PyObject *taken = PyList_New(0);
    if (taken == NULL) return NULL;
    Py_ssize_t index = start;
    /* The size is read again each time: unpackb is any callable, in principle. */
    for (; index < PyList_GET_SIZE(batch); index++) {
        PyObject *frames = PyList_GET_ITEM(batch, index);
        Py_INCREF(frames);
        int fresh;
        int ok = known_one(frames, topics, producers, timestamps, max_data, unpackb, checking,
                           &fresh);
        PyObject *fields = NULL;
        if (ok > 0 && PyList_CheckExact(frames) && PyList_GET_SIZE(frames) == 7) {
            PyObject **item = ((PyListObject *)frames)->ob_item;
            fields = PyTuple_Pack(5, item[1], item[3], item[4], item[5], item[6]);
            /* As PubParser._learn: topic, producer id (each if short enough), timestamp. */
            if (fresh && fields != NULL &&
                ((fresh & NEW_TOPIC && PyBytes_GET_SIZE(item[1]) <= max_remembered &&
                  learn(topics, item[1], remember) < 0) ||
                 (fresh & NEW_PRODUCER && PyBytes_GET_SIZE(item[3]) <= max_remembered &&
                  learn(producers, item[3], remember) < 0) ||
                 (fresh & NEW_TIMESTAMP && learn(timestamps, item[4], remember) < 0)))
                Py_CLEAR(fields);
        }
        Py_DECREF(frames);
        if (ok > 0 && fields == NULL) {
            if (PyErr_Occurred()) goto failed;
            ok = 0; /* no longer the list it was: the Python loop looks again */
        }
        if (ok < 0) goto failed;
        if (ok == 0) break;
        int appended = PyList_Append(taken, fields);
        Py_DECREF(fields);
        if (appended < 0) goto failed;
    }
    return Py_BuildValue("(Nn)", taken, index);
failed:
    Py_DECREF(taken);
    return NULL;
}

/* msgpack's ``bin`` head of ``size`` bytes at ``out``; its length. */
static Py_ssize_t bin_head(char *out, Py_ssize_t size) {
    unsigned char *o = (unsigned char *)out;
    if (size < 0x100) {
        o[0] = 0xc4;
        o[1] = (unsigned char)size;
        return 2;
    }
    if (size < 0x10000) {
        o[0] = 0xc5;
        o[1] = (unsigned char)(size >> 8);
        o[2] = (unsigned char)size;
        return 3;
    }
    o[0] = 0xc6;
    o[1] = (unsigned char)(size >> 24);
    o[2] = (unsigned char)(size >> 16);
    o[3] = (unsigned char)(size >> 8);
    o[4] = (unsigned char)size;
    return 5;
}

/* The body of ``item`` (its four parts after the topic), as msgpack packs the tuple. */
static PyObject *event_body(PyObject *const *item) {
    Py_ssize_t size = 1;
    for (int i = 1; i < 5; i++) {
        Py_ssize_t part = PyBytes_GET_SIZE(item[i]);
        if (part > 0xffffffffLL) return Py_NewRef(Py_None); /* msgpack refuses it: Python says why */
        size += part + (part < 0x100 ? 2 : part < 0x10000 ? 3 : 5);
    }
    PyObject *body = PyBytes_FromStringAndSize(NULL, size);
    if (body == NULL) return NULL;
    char *out = PyBytes_AS_STRING(body);
    *out++ = (char)0x94;
    for (int i = 1; i < 5; i++) {
        Py_ssize_t part = PyBytes_GET_SIZE(item[i]);
        out += bin_head(out, part);
        memcpy(out, PyBytes_AS_STRING(item[i]), (size_t)part);
        out += part;
    }
    return body;
}

static PyObject *stream_items(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "stream_items(fields, start, subjects)");
        return NULL;
    }
    PyObject *fields = args[0], *subjects = args[2];
    if (!PyList_CheckExact(fields) || !PyDict_Check(subjects)) {
        PyErr_SetString(PyExc_TypeError, "stream_items() takes a list and a dict");
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    if (start == -1 && PyErr_Occurred()) return NULL;
    if (start < 0) start = 0;
    PyObject *items = PyList_New(0);
    if (items == NULL) return NULL;
    Py_ssize_t index = start;
    for (; index < PyList_GET_SIZE(fields); index++) {
        PyObject *event = PyList_GET_ITEM(fields, index);
        if (!PyTuple_CheckExact(event) || PyTuple_GET_SIZE(event) != 5) break;
        PyObject **item = ((PyTupleObject *)event)->ob_item;
        int all_bytes = 1;
        for (int i = 0; i < 5; i++)
            if (!PyBytes_CheckExact(item[i])) all_bytes = 0;
        if (!all_bytes) break;
        PyObject *subject = PyDict_GetItemWithError(subjects, item[0]); /* borrowed */
        if (subject == NULL) {
            if (PyErr_Occurred()) goto failed;
            break;
        }
        /* Both held while the body is made: an allocation may run a collection, and a
         * finalizer any code (the dict's entry, the list's item, replaced). */
        Py_INCREF(subject);
        Py_INCREF(event);
        PyObject *body = event_body(item);
        if (body == Py_None) {
            Py_DECREF(body);
            Py_DECREF(event);
            Py_DECREF(subject);
            break;
        }
        PyObject *made = body == NULL ? NULL : PyTuple_Pack(3, subject, item[3], body);
        Py_DECREF(event);
        Py_DECREF(subject);
        Py_XDECREF(body);
        if (made == NULL) goto failed;
        int appended = PyList_Append(items, made);
        Py_DECREF(made);
        if (appended < 0) goto failed;
    }
    return Py_BuildValue("(Nn)", items, index);
failed:
    Py_DECREF(items);
    return NULL;
}

/* The four parts of ``body`` if it is msgpack's array of four ``bin`` and nothing else:
 * their starts and sizes; 0 otherwise. */
static int four_bins(const unsigned char *body, Py_ssize_t size, Py_ssize_t *start,
                     Py_ssize_t *part_size) {
    if (size < 1 || body[0] != 0x94) return 0;
    Py_ssize_t at = 1;
    for (int i = 0; i < 4; i++) {
        if (at >= size) return 0;
        unsigned char kind = body[at];
        Py_ssize_t head = kind == 0xc4 ? 1 : kind == 0xc5 ? 2 : kind == 0xc6 ? 4 : 0;
        if (head == 0 || size - at - 1 < head) return 0;
        unsigned long long length = big_endian(body + at + 1, head);
        at += 1 + head;
        if (length > (unsigned long long)(size - at)) return 0;
        start[i] = at;
        part_size[i] = (Py_ssize_t)length;
        at += (Py_ssize_t)length;
    }
    return at == size;
}

/* Tell the cyclic collector that ``made`` (a row, or a message's list of frames, which
 * nothing changes once made: the sender drops it whole) holds only bytes and ints and so
 * can be in no cycle. A snapshot's chunk of a thousand otherwise survives into the old
 * generation while it waits to be sent, and the collector walks it again and again. */
static void untrack(PyObject *made) {
    if (PyObject_GC_IsTracked(made)) PyObject_GC_UnTrack(made);
}

/* A sequence's frame: 8 bytes in network order (``binary``) or ASCII decimal. */
static PyObject *sequence_frame(unsigned long long sequence, int binary) {
    if (binary) {
        char packed[8];
        for (int b = 0; b < 8; b++) packed[b] = (char)(sequence >> (56 - 8 * b));
        return PyBytes_FromStringAndSize(packed, 8);
    }
    char text[20];
    int at = 20;
    do {
        text[--at] = (char)('0' + sequence % 10);
        sequence /= 10;
    } while (sequence);
    return PyBytes_FromStringAndSize(text + at, 20 - at);
}

/* A snapshot's message of one stored event: ``[*head, topic, sequence, its four parts]``;
 * steals nothing. */
static PyObject *sync_message(PyObject *head, PyObject *topic, unsigned long long sequence,
                              int binary, const char *body, const Py_ssize_t *at,
                              const Py_ssize_t *size) {
    Py_ssize_t lead = PyTuple_GET_SIZE(head);
    PyObject *frames = PyList_New(lead + 6);
    if (frames == NULL) return NULL;
    for (Py_ssize_t i = 0; i < lead; i++)
        PyList_SET_ITEM(frames, i, Py_NewRef(PyTuple_GET_ITEM(head, i)));
    PyList_SET_ITEM(frames, lead, Py_NewRef(topic));
    PyObject *number = sequence_frame(sequence, binary);
    if (number == NULL) {
        Py_DECREF(frames);
        return NULL;
    }
    PyList_SET_ITEM(frames, lead + 1, number);
    for (int i = 0; i < 4; i++) {
        PyObject *part = PyBytes_FromStringAndSize(body + at[i], size[i]);
        if (part == NULL) {
            Py_DECREF(frames);
            return NULL;
        }
        PyList_SET_ITEM(frames, lead + 2 + i, part);
    }
    untrack(frames);
    return frames;
}

/* The topic of ``subject`` as ``names[subject]`` gives it (a dict whose misses convert,
 * bus/eventbus/stream_read.py's Topics): a new reference, None when it names none or is not
 * bytes (the Python code decides then), NULL with an exception set. */
static PyObject *topic_of(PyObject *names, PyObject *subject) {
    /* The dict's own lookup first: a subclass's [] goes through a Python-level
     * __getitem__ (a method call per event); only a miss converts through it. */
    PyObject *topic = PyDict_GetItemWithError(names, subject);
    if (topic != NULL) topic = Py_NewRef(topic);
    else if (!PyErr_Occurred()) topic = PyObject_GetItem(names, subject);
    if (topic != NULL && !PyBytes_CheckExact(topic)) Py_SETREF(topic, Py_NewRef(Py_None));
    return topic;
}

static PyObject *stream_rows(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 4 && nargs != 6 && nargs != 7) {
        PyErr_SetString(PyExc_TypeError,
                        "stream_rows(sequences, topics, payloads, start[, head, binary[, names]])");
        return NULL;
    }
    PyObject *sequences = args[0], *topics = args[1], *payloads = args[2];
    if (!PyList_CheckExact(sequences) || !PyList_CheckExact(topics) ||
        !PyList_CheckExact(payloads)) {
        PyErr_SetString(PyExc_TypeError, "stream_rows() takes three lists");
        return NULL;
    }
    /* With names, ``topics`` holds the subjects, and names[subject] each one's topic. */
    PyObject *names = nargs == 7 ? args[6] : NULL;
    if (names != NULL && !PyDict_Check(names)) {
        PyErr_SetString(PyExc_TypeError, "stream_rows()'s names is a dict");
        return NULL;
    }
    PyObject *head = nargs >= 6 ? args[4] : NULL;
    int binary = 0;
    if (head != NULL) {
        if (!PyTuple_CheckExact(head)) {
            PyErr_SetString(PyExc_TypeError, "stream_rows()'s head is a tuple");
            return NULL;
        }
        binary = PyObject_IsTrue(args[5]);
        if (binary < 0) return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[3]);
    if (start == -1 && PyErr_Occurred()) return NULL;
    if (start < 0) start = 0;
    PyObject *rows = PyList_New(0);
    if (rows == NULL) return NULL;
    untrack(rows); /* its rows and messages are untracked, and so is it (see untrack) */
    Py_ssize_t index = start;
    /* The sizes are read again each time: an allocation may run any code. */
    for (; index < PyList_GET_SIZE(sequences) && index < PyList_GET_SIZE(topics) &&
           index < PyList_GET_SIZE(payloads);
         index++) {
        PyObject *payload = PyList_GET_ITEM(payloads, index);
        if (!PyBytes_CheckExact(payload)) break;
        Py_ssize_t at[4], size[4];
        const unsigned char *body = (const unsigned char *)PyBytes_AS_STRING(payload);
        if (!four_bins(body, PyBytes_GET_SIZE(payload), at, size)) break;
        PyObject *topic;
        if (names == NULL) {
            topic = Py_NewRef(PyList_GET_ITEM(topics, index));
        } else {
            /* A conversion may run any code: the payload is held, and looked at again. */
            Py_INCREF(payload);
            topic = topic_of(names, PyList_GET_ITEM(topics, index));
            int same = index < PyList_GET_SIZE(payloads) &&
                       PyList_GET_ITEM(payloads, index) == payload;
            Py_DECREF(payload);
            if (topic == NULL) goto failed;
            if (topic == Py_None || !same || index >= PyList_GET_SIZE(sequences)) {
                Py_DECREF(topic);
                break;
            }
        }
        if (head != NULL) {
            PyObject *number = PyList_GET_ITEM(sequences, index);
            unsigned long long sequence = 0;
            if (PyLong_CheckExact(number)) {
                sequence = PyLong_AsUnsignedLongLong(number);
                if (sequence == (unsigned long long)-1 && PyErr_Occurred()) {
                    PyErr_Clear(); /* not a sequence: the Python code says what it is */
                    number = NULL;
                }
            } else {
                number = NULL;
            }
            if (number == NULL) {
                Py_DECREF(topic);
                break;
            }
            /* All held while the message is made (a collection may run any code). */
            Py_INCREF(payload);
            PyObject *made = sync_message(head, topic, sequence, binary,
                                          PyBytes_AS_STRING(payload), at, size);
            Py_DECREF(topic);
            Py_DECREF(payload);
            if (made == NULL) goto failed;
            int appended = PyList_Append(rows, made);
            Py_DECREF(made);
            if (appended < 0) goto failed;
            continue;
        }
        /* All three held before anything is allocated (a collection may run any code). */
        PyObject *sequence = Py_NewRef(PyList_GET_ITEM(sequences, index));
        Py_INCREF(payload);
        PyObject *row = PyTuple_New(6);
        if (row == NULL) {
            Py_DECREF(sequence);
            Py_DECREF(topic);
            Py_DECREF(payload);
            goto failed;
        }
        PyTuple_SET_ITEM(row, 0, sequence);
        PyTuple_SET_ITEM(row, 1, topic);
        for (int i = 0; i < 4; i++) {
            PyObject *part = PyBytes_FromStringAndSize(PyBytes_AS_STRING(payload) + at[i], size[i]);
            if (part == NULL) {
                Py_DECREF(payload);
                Py_DECREF(row);
                goto failed;
            }
            PyTuple_SET_ITEM(row, 2 + i, part);
        }
        Py_DECREF(payload);
        untrack(row);
        int appended = PyList_Append(rows, row);
        Py_DECREF(row);
        if (appended < 0) goto failed;
    }
    return Py_BuildValue("(Nn)", rows, index);
failed:
    Py_DECREF(rows);
    return NULL;
}

static PyObject *broadcasts(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "broadcasts(first, fields, binary)");
        return NULL;
    }
    PyObject *fields = args[1];
    if (!PyLong_CheckExact(args[0]) || !PyList_CheckExact(fields)) Py_RETURN_NONE;
    unsigned long long sequence = PyLong_AsUnsignedLongLong(args[0]);
    if (sequence == (unsigned long long)-1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError)) return NULL;
        PyErr_Clear(); /* negative, or past 64 bits: the Python function says what it does */
        Py_RETURN_NONE;
    }
    if (ULLONG_MAX - sequence < (unsigned long long)PyList_GET_SIZE(fields)) Py_RETURN_NONE;
    int binary = PyObject_IsTrue(args[2]);
    if (binary < 0) return NULL;
    /* A tuple of the same items: nothing can change it while the frames are made. */
    PyObject *held = PyList_AsTuple(fields);
    if (held == NULL) return NULL;
    Py_ssize_t count = PyTuple_GET_SIZE(held);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *event = PyTuple_GET_ITEM(held, i);
        if (!PyTuple_CheckExact(event) || PyTuple_GET_SIZE(event) != 5) {
            Py_DECREF(held);
            Py_RETURN_NONE;
        }
    }
    PyObject *made = PyList_New(count);
    if (made == NULL) goto failed;
    for (Py_ssize_t i = 0; i < count; i++, sequence++) {
        PyObject **item = ((PyTupleObject *)PyTuple_GET_ITEM(held, i))->ob_item;
        PyObject *number = sequence_frame(sequence, binary);
        if (number == NULL) goto failed;
        PyObject *frames = PyList_New(6);
        if (frames == NULL) {
            Py_DECREF(number);
            goto failed;
        }
        PyList_SET_ITEM(frames, 0, Py_NewRef(item[0]));
        PyList_SET_ITEM(frames, 1, number);
        for (int f = 1; f < 5; f++) PyList_SET_ITEM(frames, f + 1, Py_NewRef(item[f]));
        PyList_SET_ITEM(made, i, frames);
    }
    Py_DECREF(held);
    return made;
failed:
    Py_XDECREF(made);
    Py_DECREF(held);
    return NULL;
}

static PyObject *checks(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 5 || !PyCallable_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, "checks(max_topic, max_producer, max_timestamp, "
                                         "max_remembered, fromisoformat)");
        return NULL;
    }
    Py_ssize_t limits[4];
    for (int i = 0; i < 4; i++) {
        limits[i] = PyLong_AsSsize_t(args[i]);
        if (limits[i] == -1 && PyErr_Occurred()) return NULL;
    }
    max_topic = limits[0], max_producer = limits[1], max_timestamp = limits[2];
    max_remembered = limits[3];
    Py_INCREF(args[4]);
    Py_XSETREF(fromisoformat, args[4]);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"sure_msgpack", sure, METH_O,
     "sure_msgpack(data) -> whether data is surely one whole value unpackb takes (False: "
     "ask unpackb)"},
    {"known", (PyCFunction)(void (*)(void))known, METH_FASTCALL,
     "known(batch, start, topics, producers, timestamps, max_data, unpackb[, remember]) -> "
     "(fields, next)"},
    {"checks", (PyCFunction)(void (*)(void))checks, METH_FASTCALL,
     "checks(max_topic, max_producer, max_timestamp, max_remembered, fromisoformat): the "
     "reference's limits, for known() to check what its sets do not hold"},
    {"stream_items", (PyCFunction)(void (*)(void))stream_items, METH_FASTCALL,
     "stream_items(fields, start, subjects) -> (items, next): each event's (subject, uuid, "
     "body) for a stream, up to the first whose topic subjects does not hold"},
    {"stream_rows", (PyCFunction)(void (*)(void))stream_rows, METH_FASTCALL,
     "stream_rows(sequences, topics, payloads, start[, head, binary[, names]]) -> (rows, "
     "next): the log's rows of messages read from a stream (with head: snapshot messages), "
     "up to the first body of another form; with names (subject -> topic), topics holds "
     "the subjects, and it stops at one that names no topic too"},
    {"broadcasts", (PyCFunction)(void (*)(void))broadcasts, METH_FASTCALL,
     "broadcasts(first, fields, binary) -> the BROADCAST frames of consecutive events, or "
     "None when fields is not a list of five-tuples"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_definition = {
    PyModuleDef_HEAD_INIT, "bus.eventbus._pubscan",
    "The collector's shortest PUB check, compiled (see bus/eventbus/codec.py).", -1, methods,
};

PyMODINIT_FUNC PyInit__pubscan(void) {
    keyword_names = Py_BuildValue("(ss)", "raw", "strict_map_key");
    if (keyword_names == NULL) return NULL;
    return PyModule_Create(&module_definition);
}
