/*  zre_zyre_shout.c - SHOUT fan-out of the reference ZRE implementation (zyre, C),
    for comparison with bench/zre_mesh.py's "shout" figure.

    N zyre nodes in this process; nodes 1..N-1 join group "G"; once node 0 sees them
    all in "G", node 0 SHOUTs M one-frame messages ("shout %d") to "G" (from its own
    thread) while this thread counts the SHOUT events at the receivers. Prints one
    JSON line: {"nodes","shouts","deliveries","seconds","rate","zyre"}, seconds being
    from the first shout to the last delivery.

    Discovery: zyre's UDP beacons cannot be confined to loopback (CZMQ only beacons on
    interfaces that have a broadcast address, which "lo" has not), so this uses zyre's
    gossip discovery instead: no UDP at all. Node 0 runs the gossip hub on
    tcp://127.0.0.1:<port>, every node binds its ZRE endpoint on tcp://127.0.0.1:*.

    Usage: zre_zyre_shout <port> [nodes=50] [shouts=2000]
    Build: gcc -O2 -Wall -o zre_zyre_shout zre_zyre_shout.c \
               $(pkg-config --cflags --libs libzyre libczmq libzmq) -pthread
    (written against zyre's public API, zyre.h / zyre_event.h; needs zyre >= 2.0)
*/

#include <zyre.h>
#include <pthread.h>
#include <time.h>

#define SETUP_TIMEOUT 60.0      //  seconds for the mesh and the joins
#define SHOUT_TIMEOUT 120.0     //  seconds for all deliveries

static double
now (void)
{
    struct timespec ts;
    clock_gettime (CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void
die (const char *what)
{
    fprintf (stderr, "zre_zyre_shout: %s\n", what);
    exit (1);
}

//  The sender: node 0 shouts M messages to "G" as fast as zyre accepts them.
typedef struct {
    zyre_t *node;
    int shouts;
    double started;             //  time of the first shout (read after the join)
} sender_t;

static void *
sender_run (void *arg)
{
    sender_t *sender = (sender_t *) arg;
    sender->started = now ();
    for (int n = 0; n < sender->shouts; n++)
        zyre_shouts (sender->node, "G", "shout %d", n);
    return NULL;
}

//  Read every event waiting on one node's socket; return how many were SHOUTs.
static long
drain (zyre_t *node)
{
    long shouts = 0;
    while (zsock_events (zyre_socket (node)) & ZMQ_POLLIN) {
        zyre_event_t *event = zyre_event_new (node);
        if (!event)
            break;              //  interrupted
        if (streq (zyre_event_type (event), "SHOUT"))
            shouts++;
        zyre_event_destroy (&event);
    }
    return shouts;
}

static size_t
list_size_free (zlist_t *list)
{
    size_t size = list? zlist_size (list): 0;
    zlist_destroy (&list);
    return size;
}

int
main (int argc, char *argv [])
{
    if (argc < 2) {
        fprintf (stderr, "usage: %s <port> [nodes=50] [shouts=2000]\n", argv [0]);
        return 2;
    }
    int port = atoi (argv [1]);
    int nodes = argc > 2? atoi (argv [2]): 50;
    int shouts = argc > 3? atoi (argv [3]): 2000;
    if (port <= 0 || port > 65535 || nodes < 2 || shouts < 1)
        die ("bad arguments");

    //  N nodes need ~N*N sockets (one DEALER per peer): lift CZMQ's 1024 default.
    zsys_set_max_sockets (0);

    zyre_t **node = (zyre_t **) calloc (nodes, sizeof (zyre_t *));
    for (int i = 0; i < nodes; i++) {
        char name [16];
        snprintf (name, sizeof name, "n%d", i);
        node [i] = zyre_new (name);
        //  Setting an endpoint switches zyre to gossip discovery (no beacons).
        if (zyre_set_endpoint (node [i], "tcp://127.0.0.1:*"))
            die ("cannot bind a node endpoint on 127.0.0.1");
        if (i == 0)
            zyre_gossip_bind (node [i], "tcp://127.0.0.1:%d", port);
        else
            zyre_gossip_connect (node [i], "tcp://127.0.0.1:%d", port);
        if (zyre_start (node [i]))
            die ("zyre_start failed");
        if (i > 0)
            zyre_join (node [i], "G");
    }
    zpoller_t *poller = zpoller_new (NULL);
    for (int i = 0; i < nodes; i++)
        zpoller_add (poller, zyre_socket (node [i]));

    //  Wait for the full mesh, then for node 0 to see the N-1 others in "G";
    //  meanwhile read (and drop) the ENTER/JOIN events so no pipe fills up.
    double deadline = now () + SETUP_TIMEOUT, setup = now ();
    int ready = 0;
    while (!ready) {
        if (now () > deadline)
            die ("timeout: the mesh did not form / the joins did not arrive");
        if (zpoller_wait (poller, 50))
            for (int i = 0; i < nodes; i++)
                drain (node [i]);
        ready = list_size_free (zyre_peers_by_group (node [0], "G")) == (size_t) nodes - 1;
        for (int i = 0; ready && i < nodes; i++)
            ready = list_size_free (zyre_peers (node [i])) == (size_t) nodes - 1;
    }
    fprintf (stderr, "zre_zyre_shout: %d nodes meshed and joined in %.2f s\n",
             nodes, now () - setup);

    //  Shout from node 0's own thread; count SHOUT events here, over all nodes.
    sender_t sender = { node [0], shouts, 0.0 };
    pthread_t thread;
    if (pthread_create (&thread, NULL, sender_run, &sender))
        die ("cannot start the sender thread");
    long expected = (long) (nodes - 1) * shouts, delivered = 0;
    deadline = now () + SHOUT_TIMEOUT;
    while (delivered < expected) {
        if (now () > deadline) {
            fprintf (stderr, "zre_zyre_shout: timeout: %ld of %ld SHOUTs delivered\n",
                     delivered, expected);
            exit (1);
        }
        zsock_t *which = (zsock_t *) zpoller_wait (poller, 100);
        if (!which) {
            if (zpoller_terminated (poller))
                die ("interrupted");
            continue;
        }
        for (int i = 0; i < nodes; i++)
            if (zyre_socket (node [i]) == which)
                delivered += drain (node [i]);
    }
    double finished = now ();
    pthread_join (thread, NULL);
    double seconds = finished - sender.started;

    uint64_t v = zyre_version ();
    printf ("{\"nodes\":%d,\"shouts\":%d,\"deliveries\":%ld,\"seconds\":%.3f,"
            "\"rate\":%.0f,\"zyre\":\"%d.%d.%d\"}\n",
            nodes, shouts, delivered, seconds, delivered / seconds,
            (int) (v / 10000), (int) (v / 100 % 100), (int) (v % 100));
    fflush (stdout);

    zpoller_destroy (&poller);
    for (int i = nodes - 1; i >= 0; i--)
        zyre_destroy (&node [i]);
    free (node);
    return 0;
}
