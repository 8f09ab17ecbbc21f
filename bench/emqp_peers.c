/* Lean eMQP load generators for bench/emqp_broker.py, in C over libzmq.

   The roles "workers" and "client" of _emqp_peers.py, with the same arguments, the same
   frames on the wire and the same lines on stdin and stdout, at a small fraction of their
   CPU: on a 2-core machine the load generators share the cores with what they measure,
   and the Python ones took as much CPU per job as the broker itself. The baseline (the
   raw pyzmq relay) is driven by the same generators in the same run.

   Built by bench/emqp_broker.py against the libzmq that pyzmq loads; only
   libzmq's stable public API is used, declared in zmq_peers.h.

   workers ENDPOINT COUNT SLOTS
       COUNT DEALERs in one process; each INFORMs (queue "default"), waits for the ACK and
       sends SLOTS READYs; then "READY" is printed. Each REQUEST is answered with a REPLY
       ({"value": body}) and a READY; each broker HEARTBEAT's arrival is timed. "REPORT" on
       stdin prints {"served": [...], "worst_heartbeat_gap_s": ...} and starts a new
       window; EOF ends the process.
   client ENDPOINT JOBS WINDOW HEADERS
       One DEALER: one warm-up job, "READY", waits for a line (GO), then keeps at most
       WINDOW requests outstanding until JOBS results (6-frame REPLYs) came back; prints
       {"jobs", "seconds", "rate", "cpu_s", "p50_us", "p99_us"}.
   paired ENDPOINT_A ENDPOINT_B PER_SIDE BLOCK HEADERS
       One DEALER to each of two targets (the relay and the broker, both up): one warm-up
       job to each, "READY", waits for a line (GO), then one request at a time in blocks of
       BLOCK, alternating A B B A A B ... until each side had PER_SIDE, so that both see the
       same moments of the machine; prints {"seconds", "cpu_s", "block", "order": [side of
       each block], "us": [[A's round trips], [B's]] (microseconds, in the order sent),
       "t0": the start (CLOCK_MONOTONIC, s), "sent_ms": [[A's sends], [B's]] (ms after t0)},
       so that a round trip can be set beside what the targets did at that moment. */

#define _GNU_SOURCE /* memmem */
#include "zmq_peers.h"

#define POOL 4096

static const char PROTOCOL[] = "eMQP/1.0";

static void *dealer(void *context, const char *endpoint) {
    void *sock = zmq_socket(context, ZMQ_DEALER);
    if (sock == NULL) die("zmq_socket");
    char identity[ID_BYTES + 1];
    make_id(identity, (uint64_t)rand());
    int unlimited = 0;
    zmq_setsockopt(sock, ZMQ_ROUTING_ID, identity, ID_BYTES);
    zmq_setsockopt(sock, ZMQ_SNDHWM, &unlimited, sizeof unlimited);
    zmq_setsockopt(sock, ZMQ_RCVHWM, &unlimited, sizeof unlimited);
    curve_client(sock);
    if (zmq_connect(sock, endpoint) != 0) die("zmq_connect");
    return sock;
}

/* A message's first four frames; `more` when frames follow the message id. */
static void header(void *sock, const char *command, const char *id, int more) {
    send_frame(sock, "", 0, 1);
    SEND_TEXT(sock, PROTOCOL, 1);
    SEND_TEXT(sock, command, 1);
    send_frame(sock, id, ID_BYTES, more);
}

/* -- workers -------------------------------------------------------------------------- */

typedef struct {
    void *sock;
    long served;
    double last_beat;
    double worst_gap;
} worker_t;

static char pool[POOL][ID_BYTES + 1];
static unsigned pool_next;

static const char *pool_id(void) { return pool[pool_next++ % POOL]; }

static void serve(worker_t *worker, message_t *msg) {
    void *sock = worker->sock;
    for (int n = 0; n < 1000; n++) {
        if (!receive(sock, msg, ZMQ_DONTWAIT)) return;
        if (frame_is(msg, 2, "REQUEST") && msg->count == 7) {
            worker->served++;
            char result[FRAME_BYTES + 16];
            int size = snprintf(result, sizeof result, "{\"value\": %.*s}",
                                (int)msg->size[6], msg->data[6]);
            header(sock, "REPLY", pool_id(), 1);
            send_frame(sock, result, (size_t)size, 1);
            send_frame(sock, msg->data[3], msg->size[3], 0);
            header(sock, "READY", pool_id(), 0);
        } else if (frame_is(msg, 2, "HEARTBEAT")) {
            double now = now_s(CLOCK_MONOTONIC);
            if (worker->last_beat > 0 && now - worker->last_beat > worker->worst_gap)
                worker->worst_gap = now - worker->last_beat;
            worker->last_beat = now;
        }
    }
}

static int workers(const char *endpoint, int count, int slots) {
    void *context = zmq_ctx_new();
    worker_t *team = calloc((size_t)count, sizeof *team);
    message_t *msg = malloc(sizeof *msg);
    zmq_pollitem_t *items = calloc((size_t)count + 1, sizeof *items);
    for (int i = 0; i < POOL; i++) make_id(pool[i], (uint64_t)i);
    for (int i = 0; i < count; i++) {
        void *sock = team[i].sock = dealer(context, endpoint);
        header(sock, "INFORM", pool_id(), 1);
        SEND_TEXT(sock, "[[10, \"default\"]]", 1);
        SEND_TEXT(sock, "worker", 0);
        do receive(sock, msg, 0);
        while (!frame_is(msg, 2, "ACK"));
        for (int s = 0; s < slots; s++) header(sock, "READY", pool_id(), 0);
        items[i].socket = sock;
        items[i].events = ZMQ_POLLIN;
    }
    items[count].fd = 0;
    items[count].events = ZMQ_POLLIN;
    ready();
    char line[256];
    for (;;) {
        if (zmq_poll(items, count + 1, 1000) < 0) {
            if (zmq_errno() == EINTR) continue;
            die("zmq_poll");
        }
        for (int i = 0; i < count; i++)
            if (items[i].revents & ZMQ_POLLIN) serve(&team[i], msg);
        if (items[count].revents & (ZMQ_POLLIN | ZMQ_POLLERR)) { /* a line, or EOF */
            if (!read_line(line, sizeof line)) return 0;
            if (strncmp(line, "REPORT", 6) == 0) {
                double worst = 0;
                printf("{\"served\": [");
                for (int i = 0; i < count; i++) {
                    printf("%s%ld", i ? ", " : "", team[i].served);
                    if (team[i].worst_gap > worst) worst = team[i].worst_gap;
                    team[i].worst_gap = 0;
                    team[i].last_beat = 0;
                }
                printf("], \"worst_heartbeat_gap_s\": %.6f}\n", worst);
                fflush(stdout);
            }
        }
    }
}

/* -- client --------------------------------------------------------------------------- */

static int compare(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static uint64_t id_number(const char *id, size_t size) {
    uint64_t number = 0;
    for (size_t i = size > 12 ? size - 12 : 0; i < size; i++) {
        char c = id[i];
        number = number * 16 + (uint64_t)(c <= '9' ? c - '0' : c - 'a' + 10);
    }
    return number;
}

static int client(const char *endpoint, long jobs, long window, const char *headers) {
    void *context = zmq_ctx_new();
    void *sock = dealer(context, endpoint);
    message_t *msg = malloc(sizeof *msg);
    char (*ids)[ID_BYTES + 1] = malloc((size_t)(jobs + 1) * sizeof *ids);
    double *sent_at = calloc((size_t)jobs + 1, sizeof *sent_at);
    double *times = malloc((size_t)jobs * sizeof *times);
    static const char body[] = "[\"bench\", {\"n\": 1}]";
    for (long i = 0; i <= jobs; i++) make_random_id(ids[i], (uint64_t)i);
    long next = 0, outstanding = 0, done = 0;

#define SEND_ONE()                                                   \
    do {                                                             \
        sent_at[next] = now_s(CLOCK_MONOTONIC);                      \
        header(sock, "REQUEST", ids[next], 1);                       \
        SEND_TEXT(sock, "default", 1);                               \
        SEND_TEXT(sock, headers, 1);                                 \
        send_frame(sock, body, sizeof body - 1, 0);                  \
        next++;                                                      \
        outstanding++;                                               \
    } while (0)

    /* A result: its round trip in seconds; < 0 for a dispatch acknowledgement. */
    double elapsed;
#define RECEIVE_ONE()                                                                  \
    do {                                                                               \
        receive(sock, msg, 0);                                                         \
        elapsed = -1;                                                                  \
        if (msg->count == 6 && frame_is(msg, 2, "REPLY")) {                            \
            if (memmem(msg->data[4], msg->size[4], "error", 5) != NULL) {              \
                fprintf(stderr, "%.*s\n", (int)msg->size[4], msg->data[4]);            \
                exit(1);                                                               \
            }                                                                          \
            uint64_t number = id_number(msg->data[5], msg->size[5]);                   \
            if (number > (uint64_t)jobs) {                                             \
                fprintf(stderr, "a REPLY for an id never sent\n");                     \
                exit(1);                                                               \
            }                                                                          \
            elapsed = now_s(CLOCK_MONOTONIC) - sent_at[number];                        \
            outstanding--;                                                             \
        }                                                                              \
    } while (0)

    SEND_ONE(); /* warm-up: the whole path works */
    do RECEIVE_ONE();
    while (elapsed < 0);
    ready();
    char line[256];
    read_line(line, sizeof line);
    double started = now_s(CLOCK_MONOTONIC), cpu_started = now_s(CLOCK_PROCESS_CPUTIME_ID);
    while (done < jobs) {
        while (next <= jobs && outstanding < window) SEND_ONE();
        RECEIVE_ONE();
        if (elapsed >= 0) times[done++] = elapsed;
    }
    double seconds = now_s(CLOCK_MONOTONIC) - started;
    double cpu = now_s(CLOCK_PROCESS_CPUTIME_ID) - cpu_started;
    qsort(times, (size_t)jobs, sizeof *times, compare);
    printf("{\"jobs\": %ld, \"seconds\": %.6f, \"rate\": %.3f, \"cpu_s\": %.6f, "
           "\"p50_us\": %.3f, \"p99_us\": %.3f}\n",
           jobs, seconds, (double)jobs / seconds, cpu, times[jobs / 2] * 1e6,
           times[(long)((double)jobs * 0.99)] * 1e6);
    fflush(stdout);
    return 0;
}

/* -- paired ----------------------------------------------------------------------------- */

/* One request, one at a time: its round trip to its result (6-frame REPLY), in seconds. */
static double round_trip(void *sock, message_t *msg, const char *id, const char *headers,
                         double *sent_at) {
    static const char body[] = "[\"bench\", {\"n\": 1}]";
    double sent = *sent_at = now_s(CLOCK_MONOTONIC);
    header(sock, "REQUEST", id, 1);
    SEND_TEXT(sock, "default", 1);
    SEND_TEXT(sock, headers, 1);
    send_frame(sock, body, sizeof body - 1, 0);
    for (;;) {
        receive(sock, msg, 0);
        if (msg->count != 6 || !frame_is(msg, 2, "REPLY")) continue; /* the dispatch ack */
        double elapsed = now_s(CLOCK_MONOTONIC) - sent;
        if (memmem(msg->data[4], msg->size[4], "error", 5) != NULL) {
            fprintf(stderr, "%.*s\n", (int)msg->size[4], msg->data[4]);
            exit(1);
        }
        if (msg->size[5] != ID_BYTES || memcmp(msg->data[5], id, ID_BYTES) != 0) {
            fprintf(stderr, "a REPLY for another request\n");
            exit(1);
        }
        return elapsed;
    }
}

static int paired(const char *endpoint_a, const char *endpoint_b, long per_side, long block,
                  const char *headers) {
    if (block < 1 || per_side % block != 0) {
        fprintf(stderr, "PER_SIDE must be a multiple of BLOCK\n");
        return 2;
    }
    void *context = zmq_ctx_new();
    void *socks[2] = {dealer(context, endpoint_a), dealer(context, endpoint_b)};
    message_t *msg = malloc(sizeof *msg);
    long blocks = 2 * (per_side / block), total = 2 * per_side;
    char (*ids)[ID_BYTES + 1] = malloc((size_t)(total + 2) * sizeof *ids);
    double *times[2], *sent[2];
    for (int side = 0; side < 2; side++) {
        times[side] = malloc((size_t)per_side * sizeof(double));
        sent[side] = malloc((size_t)per_side * sizeof(double));
    }
    double warm_up;
    int *order = malloc((size_t)blocks * sizeof *order);
    for (long i = 0; i < total + 2; i++) make_random_id(ids[i], (uint64_t)i);
    long next_id = 0;
    for (int side = 0; side < 2; side++) /* warm-up: both paths work */
        round_trip(socks[side], msg, ids[next_id++], headers, &warm_up);
    ready();
    char line[256];
    read_line(line, sizeof line);
    double started = now_s(CLOCK_MONOTONIC), cpu_started = now_s(CLOCK_PROCESS_CPUTIME_ID);
    long done[2] = {0, 0};
    for (long b = 0; b < blocks; b++) {
        /* A B B A A B ...: neither side always goes first after the other's block. */
        int side = (int)(((b + 1) / 2) % 2);
        order[b] = side;
        for (long i = 0; i < block; i++, done[side]++)
            times[side][done[side]] =
                round_trip(socks[side], msg, ids[next_id++], headers, &sent[side][done[side]]);
    }
    double seconds = now_s(CLOCK_MONOTONIC) - started;
    double cpu = now_s(CLOCK_PROCESS_CPUTIME_ID) - cpu_started;
    printf("{\"seconds\": %.6f, \"cpu_s\": %.6f, \"block\": %ld, \"order\": [", seconds, cpu,
           block);
    for (long b = 0; b < blocks; b++) printf("%s%d", b ? ", " : "", order[b]);
    printf("], \"us\": [");
    for (int side = 0; side < 2; side++) {
        printf("%s[", side ? ", " : "");
        for (long i = 0; i < per_side; i++)
            printf("%s%.2f", i ? ", " : "", times[side][i] * 1e6);
        printf("]");
    }
    printf("], \"t0\": %.6f, \"sent_ms\": [", started);
    for (int side = 0; side < 2; side++) {
        printf("%s[", side ? ", " : "");
        for (long i = 0; i < per_side; i++)
            printf("%s%.3f", i ? ", " : "", (sent[side][i] - started) * 1e3);
        printf("]");
    }
    printf("]}\n");
    fflush(stdout);
    return 0;
}

int main(int argc, char **argv) {
    srand((unsigned)getpid() ^ (unsigned)time(NULL));
    if (argc == 5 && strcmp(argv[1], "workers") == 0)
        return workers(argv[2], atoi(argv[3]), atoi(argv[4]));
    if (argc == 6 && strcmp(argv[1], "client") == 0)
        return client(argv[2], atol(argv[3]), atol(argv[4]), argv[5]);
    if (argc == 7 && strcmp(argv[1], "paired") == 0)
        return paired(argv[2], argv[3], atol(argv[4]), atol(argv[5]), argv[6]);
    fprintf(stderr,
            "usage: %s workers ENDPOINT COUNT SLOTS | client ENDPOINT JOBS WINDOW HEADERS | "
            "paired ENDPOINT_A ENDPOINT_B PER_SIDE BLOCK HEADERS\n",
            argv[0]);
    return 2;
}
