/* Lean Event BUS load generators for bench/eventbus_throughput.py (--peers c), in C over
   libzmq.

   The roles "publish" and "subscribe" of _workers.py, with the same arguments, the same
   frames on the wire and the same lines on stdin and stdout, at a fraction of their CPU:
   on a 2-core machine the generators share the cores with the server they measure, and
   the Python ones took 18-20 us per event between them, more than the server. Built by
   the bench against the libzmq that pyzmq loads (zmq_peers.h).

   publish ENDPOINT EVENTS
       A DEALER (SNDHWM 1000, blocking sends: the HWM is the backpressure) connected to a
       collector. "READY", waits for a line (GO), sends EVENTS PUBs, closes (waiting until
       all were handed to TCP) and prints {"sent", "cpu_seconds", "t_start", "t_sent",
       "t_flushed", "send_rate"}.
   subscribe ENDPOINT EVENTS
       A SUB (RCVHWM 0) to everything; "READY" once a first message came (the server's
       heartbeat: the subscription reached the PUB socket); counts BROADCASTs, checks
       their sequences are contiguous, and prints the same JSON line as _workers.py's.

   Events as _workers.py makes them: topics /bench/topic-NN/ (16 in turn), an 8-byte zero
   sequence, producer "bench-publisher", one timestamp, a UUID4 text unique in the run,
   and a 100-byte msgpack payload {"n": <uint32>, "pad": <bin>}. Times are
   CLOCK_MONOTONIC, the clock of Python's time.monotonic(). */

#include "zmq_peers.h"

static const char HEARTBEAT[] = "$heartbeat";
static const char PRODUCER[] = "bench-publisher";
static const char TIMESTAMP[] = "2026-11-21T10:00:00.123Z";
#define PAYLOAD_BYTES 100
#define TOPICS 16

/* The payload: fixmap(2), "n", uint32 (big-endian n), "pad", bin8 of 'x' up to 100 bytes. */
static void payload(unsigned char *out, uint32_t n) {
    static const unsigned char head[] = {0x82, 0xa1, 'n', 0xce};
    static const unsigned char pad_head[] = {0xa3, 'p', 'a', 'd', 0xc4};
    size_t at = 0;
    memcpy(out, head, sizeof head);
    at += sizeof head;
    out[at++] = (unsigned char)(n >> 24);
    out[at++] = (unsigned char)(n >> 16);
    out[at++] = (unsigned char)(n >> 8);
    out[at++] = (unsigned char)n;
    memcpy(out + at, pad_head, sizeof pad_head);
    at += sizeof pad_head;
    size_t pad = PAYLOAD_BYTES - at - 1;
    out[at++] = (unsigned char)pad;
    memset(out + at, 'x', pad);
}

/* The last 12 hex digits of a UUID text set to `n` (its first 24 characters stay). */
static void set_counter(char *uuid, uint64_t n) {
    static const char hex[] = "0123456789abcdef";
    for (int i = ID_BYTES - 1; i >= ID_BYTES - 12; i--) {
        uuid[i] = hex[n & 0xf];
        n >>= 4;
    }
}

static int publish(const char *endpoint, long events) {
    void *context = zmq_ctx_new();
    void *sock = zmq_socket(context, ZMQ_DEALER);
    if (sock == NULL) die("zmq_socket");
    set_int(sock, ZMQ_SNDHWM, 1000);
    set_int(sock, ZMQ_LINGER, -1); /* closing waits until everything was handed to TCP */
    curve_client(sock);
    if (zmq_connect(sock, endpoint) != 0) die("zmq_connect");
    char topics[TOPICS][32];
    for (int i = 0; i < TOPICS; i++) snprintf(topics[i], sizeof topics[i], "/bench/topic-%02d/", i);
    static const char zero_sequence[8];
    char uuid[ID_BYTES + 1];
    make_id(uuid, 0);
    unsigned char data[PAYLOAD_BYTES];
    payload(data, 0);
    ready();
    char line[256];
    if (!read_line(line, sizeof line) || strncmp(line, "GO", 2) != 0) return 0;
    double cpu = now_s(CLOCK_PROCESS_CPUTIME_ID), started = now_s(CLOCK_MONOTONIC);
    for (long n = 0; n < events; n++) {
        const char *topic = topics[n % TOPICS];
        set_counter(uuid, (uint64_t)n);
        data[4] = (unsigned char)(n >> 24);
        data[5] = (unsigned char)(n >> 16);
        data[6] = (unsigned char)(n >> 8);
        data[7] = (unsigned char)n;
        SEND_TEXT(sock, topic, 1);
        send_frame(sock, zero_sequence, sizeof zero_sequence, 1);
        send_frame(sock, PRODUCER, sizeof PRODUCER - 1, 1);
        send_frame(sock, TIMESTAMP, sizeof TIMESTAMP - 1, 1);
        send_frame(sock, uuid, ID_BYTES, 1);
        send_frame(sock, data, sizeof data, 0);
    }
    double sent = now_s(CLOCK_MONOTONIC);
    zmq_close(sock);
    zmq_ctx_term(context);
    double flushed = now_s(CLOCK_MONOTONIC);
    cpu = now_s(CLOCK_PROCESS_CPUTIME_ID) - cpu;
    double span = sent - started > 1e-9 ? sent - started : 1e-9;
    printf("{\"sent\": %ld, \"cpu_seconds\": %.6f, \"t_start\": %.9f, \"t_sent\": %.9f, "
           "\"t_flushed\": %.9f, \"send_rate\": %.3f}\n",
           events, cpu, started, sent, flushed, (double)events / span);
    fflush(stdout);
    return 0;
}

static uint64_t big_endian(const char *bytes) {
    uint64_t value = 0;
    for (int i = 0; i < 8; i++) value = value << 8 | (unsigned char)bytes[i];
    return value;
}

static int subscribe(const char *endpoint, long events) {
    void *context = zmq_ctx_new();
    void *sock = zmq_socket(context, ZMQ_SUB);
    if (sock == NULL) die("zmq_socket");
    set_int(sock, ZMQ_RCVHWM, 0);
    set_int(sock, ZMQ_LINGER, 0);
    if (zmq_setsockopt(sock, ZMQ_SUBSCRIBE, "", 0) != 0) die("zmq_setsockopt");
    curve_client(sock);
    if (zmq_connect(sock, endpoint) != 0) die("zmq_connect");
    message_t *msg = malloc(sizeof *msg);
    set_int(sock, ZMQ_RCVTIMEO, 30000);
    if (!receive(sock, msg, 0)) {
        fprintf(stderr, "the PUB side was silent for 30 s\n");
        return 1;
    }
    double cpu = now_s(CLOCK_PROCESS_CPUTIME_ID);
    ready();
    long count = 0, heartbeats = 0, gaps = 0, missing = 0, out_of_order = 0, malformed = 0;
    uint64_t first_sequence = 0, previous = 0;
    double first_at = 0, last_at = 0;
    set_int(sock, ZMQ_RCVTIMEO, 120000); /* until the first event */
    for (;;) {
        if (frame_is(msg, 0, HEARTBEAT)) {
            heartbeats++;
        } else if (msg->count != 6 || msg->size[1] != 8) {
            malformed++;
        } else {
            uint64_t sequence = big_endian(msg->data[1]);
            last_at = now_s(CLOCK_MONOTONIC);
            if (count == 0) {
                first_at = last_at;
                first_sequence = sequence;
                set_int(sock, ZMQ_RCVTIMEO, 10000);
            } else if (sequence != previous + 1) {
                if (sequence <= previous) {
                    out_of_order++;
                } else {
                    gaps++;
                    missing += (long)(sequence - previous - 1);
                }
            }
            previous = sequence;
            if (++count >= events) break;
        }
        if (!receive(sock, msg, 0)) break; /* silent for the idle timeout */
    }
    cpu = now_s(CLOCK_PROCESS_CPUTIME_ID) - cpu;
    zmq_close(sock);
    zmq_ctx_term(context);
    double span = last_at - first_at;
    long lost = (events > count ? events - count : 0) + out_of_order;
    printf("{\"cpu_seconds\": %.6f, \"received\": %ld, \"expected\": %ld, "
           "\"first_sequence\": %lld, \"last_sequence\": %lld, \"gaps\": %ld, "
           "\"missing_inside\": %ld, \"lost\": %ld, \"out_of_order\": %ld, \"malformed\": %ld, "
           "\"heartbeats\": %ld, \"t_first\": %.9f, \"t_last\": %.9f, \"rate\": %.3f}\n",
           cpu, count, events, count ? (long long)first_sequence : -1LL,
           count ? (long long)previous : -1LL, gaps, missing, lost, out_of_order, malformed,
           heartbeats, first_at, last_at,
           count > 1 && span > 0 ? (double)(count - 1) / span : 0.0);
    fflush(stdout);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 4 && strcmp(argv[1], "publish") == 0) return publish(argv[2], atol(argv[3]));
    if (argc == 4 && strcmp(argv[1], "subscribe") == 0) return subscribe(argv[2], atol(argv[3]));
    fprintf(stderr, "usage: %s publish|subscribe ENDPOINT EVENTS\n", argv[0]);
    return 2;
}
