/* What the C load generators of bench/ share (emqp_peers.c, eventbus_peers.c): libzmq's
   stable public API, declared here so that they build against the libzmq pyzmq loads
   (its wheel ships no header), and the plumbing every generator needs. Each program is one
   translation unit: everything here is static. */

#ifndef BUS_BENCH_ZMQ_PEERS_H
#define BUS_BENCH_ZMQ_PEERS_H

#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* libzmq's public API (zmq.h, stable since 4.x): the calls and constants used by bench/. */
typedef struct {
    void *socket;
    int fd;
    short events;
    short revents;
} zmq_pollitem_t;
void *zmq_ctx_new(void);
int zmq_ctx_term(void *context);
void *zmq_socket(void *context, int type);
int zmq_close(void *socket);
int zmq_setsockopt(void *socket, int option, const void *value, size_t length);
int zmq_getsockopt(void *socket, int option, void *value, size_t *length);
int zmq_connect(void *socket, const char *endpoint);
int zmq_send(void *socket, const void *buffer, size_t length, int flags);
int zmq_recv(void *socket, void *buffer, size_t length, int flags);
int zmq_poll(zmq_pollitem_t *items, int count, long timeout_ms);
int zmq_errno(void);
const char *zmq_strerror(int errnum);
enum {
    ZMQ_SUB = 2,
    ZMQ_DEALER = 5,
    ZMQ_ROUTING_ID = 5,
    ZMQ_SUBSCRIBE = 6,
    ZMQ_RCVMORE = 13,
    ZMQ_LINGER = 17,
    ZMQ_SNDHWM = 23,
    ZMQ_RCVHWM = 24,
    ZMQ_RCVTIMEO = 27,
    ZMQ_DONTWAIT = 1,
    ZMQ_SNDMORE = 2,
    ZMQ_POLLIN = 1,
    ZMQ_POLLERR = 4,
    ZMQ_CURVE_PUBLICKEY = 48,
    ZMQ_CURVE_SECRETKEY = 49,
    ZMQ_CURVE_SERVERKEY = 50,
};

#define MAX_FRAMES 16
#define FRAME_BYTES 4096
#define ID_BYTES 36

typedef struct {
    int count;
    size_t size[MAX_FRAMES];
    char data[MAX_FRAMES][FRAME_BYTES];
} message_t;

static void die(const char *what) {
    fprintf(stderr, "%s: %s\n", what, zmq_strerror(zmq_errno()));
    exit(1);
}

static double now_s(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* `count` random bytes from /dev/urandom into `out`. */
static void urandom(unsigned char *out, size_t count) {
    int fd = open("/dev/urandom", O_RDONLY);
    if (fd < 0 || read(fd, out, count) != (ssize_t)count) {
        perror("/dev/urandom");
        exit(1);
    }
    close(fd);
}

/* A UUID4 text of the 10 random bytes `r` whose last 12 hex digits are `counter`. */
static void format_id(char *out, const unsigned char *r, uint64_t counter) {
    snprintf(out, ID_BYTES + 1, "%02x%02x%02x%02x-%02x%02x-4%01x%02x-%01x%01x%02x-%012llx",
             r[0], r[1], r[2], r[3], r[4], r[5], r[6] & 0x0f, r[7], 8 | (r[8] & 0x3),
             r[8] >> 4, r[9], (unsigned long long)(counter & 0xffffffffffffULL));
}

/* A random UUID4 text whose last 12 hex digits are `counter` (ids must differ, not be
   secret: the random part, one per process, keeps two processes' ids apart). */
static void make_id(char *out, uint64_t counter) {
    static unsigned char random_part[10];
    static int seeded;
    if (!seeded) {
        urandom(random_part, sizeof random_part);
        seeded = 1;
    }
    format_id(out, random_part, counter);
}

/* The same with a random part of its own for each id, as a client's uuid4 msgids are: a
   store keyed by them sees random keys, not increasing ones. The counter still tells which
   request an answer is for. */
static void make_random_id(char *out, uint64_t counter) {
    static unsigned char pool[4096];
    static size_t left;
    if (left < 10) {
        urandom(pool, sizeof pool);
        left = sizeof pool;
    }
    format_id(out, pool + sizeof pool - left, counter);
    left -= 10;
}

/* One whole message; 0 when none came (ZMQ_DONTWAIT, or the socket's receive timeout). */
static int receive(void *sock, message_t *msg, int flags) {
    msg->count = 0;
    for (;;) {
        if (msg->count == MAX_FRAMES) {
            fprintf(stderr, "a message of more than %d frames\n", MAX_FRAMES);
            exit(1);
        }
        int size = zmq_recv(sock, msg->data[msg->count], FRAME_BYTES, flags);
        if (size < 0) {
            if (zmq_errno() == EAGAIN && msg->count == 0) return 0;
            if (zmq_errno() == EINTR) continue;
            die("zmq_recv");
        }
        if (size > FRAME_BYTES) {
            fprintf(stderr, "a frame of %d bytes, over %d\n", size, FRAME_BYTES);
            exit(1);
        }
        msg->size[msg->count++] = (size_t)size;
        int more = 0;
        size_t length = sizeof more;
        zmq_getsockopt(sock, ZMQ_RCVMORE, &more, &length);
        if (!more) return 1;
        flags = 0; /* the rest of a message is already there */
    }
}

static int frame_is(const message_t *msg, int index, const char *text) {
    size_t length = strlen(text);
    return msg->count > index && msg->size[index] == length &&
           memcmp(msg->data[index], text, length) == 0;
}

static void send_frame(void *sock, const void *data, size_t size, int more) {
    while (zmq_send(sock, data, size, more ? ZMQ_SNDMORE : 0) < 0) {
        if (zmq_errno() != EINTR) die("zmq_send");
    }
}

#define SEND_TEXT(sock, text, more) send_frame(sock, text, strlen(text), more)

/* BENCH_CURVE="SERVER_PUBLIC CLIENT_PUBLIC CLIENT_SECRET" (Z85, as bench/_curve.py reads
   it): connect as a CURVE client, so the same generator measures a CURVE server. */
static void curve_client(void *sock) {
    const char *keys = getenv("BENCH_CURVE");
    char server[41], public[41], secret[41];
    if (keys == NULL || sscanf(keys, "%40s %40s %40s", server, public, secret) != 3) return;
    zmq_setsockopt(sock, ZMQ_CURVE_SERVERKEY, server, 40);
    zmq_setsockopt(sock, ZMQ_CURVE_PUBLICKEY, public, 40);
    zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, secret, 40);
}

static void set_int(void *sock, int option, int value) {
    if (zmq_setsockopt(sock, option, &value, sizeof value) != 0) die("zmq_setsockopt");
}

/* Lines on stdin: 1 when one was read into `line`, 0 at EOF. */
static int read_line(char *line, size_t size) {
    if (fgets(line, (int)size, stdin) == NULL) return 0;
    return 1;
}

static void ready(void) {
    printf("READY\n");
    fflush(stdout);
}

#endif
