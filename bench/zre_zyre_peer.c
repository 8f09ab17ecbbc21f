/*  zre_zyre_peer.c - a zyre node (the reference ZRE implementation, C) driven like
    tests/zre_peers/bus_peer.py: it prints one JSON object a line for each event and reads
    one command a line on stdin, so tests and benches drive zyre and our node the same way.

    Usage: zre_zyre_peer NAME [options]
      --interface IF          beacon on IF (zyre_set_interface)
      --port N                UDP beacon port (zyre_set_port)
      --interval MS           beacon interval (zyre_set_interval)
      --contest GROUP         zyre_set_contest_in_group (repeatable)
      --join GROUP            join at start (repeatable)
      --endpoint EP           zyre_set_endpoint (gossip mode: the mailbox, e.g. tcp://10.1.2.3:*)
      --gossip-bind EP        zyre_gossip_bind (the hub)
      --gossip-connect EP     zyre_gossip_connect; with --curve: EP|SERVERKEY
      --curve                 a fresh certificate: zyre_set_zcert (beacon v3, CURVE mailbox)
      --evasive MS --expired MS
      --verbose               zyre's own log on stderr
    Commands on stdin: "join G", "leave G", "shout G TEXT", "whisper UUID TEXT", "stop";
    SIGTERM stops it too.
    Lines: {"event": "READY", "peer", "name", "endpoint", "public_key"}, then
    {"event", "peer" (lower-case hex), "name", and "group", "content", "endpoint"} as they
    apply; LEADER names the elected node as "peer" (zyre's event) and its id as "leader".
    Build: see bench/README.md (zyre built with -DENABLE_DRAFTS=ON).
    Written against zyre's public API (zyre.h, zyre_event.h).
*/

#include <zyre.h>
#include <ctype.h>

static void
json_string (const char *text)
{
    putchar ('"');
    for (const unsigned char *c = (const unsigned char *) (text ? text : ""); *c; c++) {
        if (*c == '"' || *c == '\\')
            printf ("\\%c", *c);
        else
        if (*c < 0x20)
            printf ("\\u%04x", *c);
        else
            putchar (*c);
    }
    putchar ('"');
}

static void
json_field (const char *key, const char *value)
{
    printf (", ");
    json_string (key);
    printf (": ");
    json_string (value);
}

static char *
lower (const char *text)
{
    char *copy = strdup (text ? text : "");
    for (char *c = copy; *c; c++)
        *c = (char) tolower ((unsigned char) *c);
    return copy;
}

static void
print_event (zyre_event_t *event)
{
    const char *type = zyre_event_type (event);
    char *peer = lower (zyre_event_peer_uuid (event));
    printf ("{\"event\": ");
    json_string (streq (type, "STOP") ? "STOPPED" : type);
    json_field ("peer", peer);
    json_field ("name", zyre_event_peer_name (event));
    if (zyre_event_group (event))
        json_field ("group", zyre_event_group (event));
    if (streq (type, "ENTER") && zyre_event_peer_addr (event))
        json_field ("endpoint", zyre_event_peer_addr (event));
    if (streq (type, "LEADER"))
        json_field ("leader", zyre_event_peer_uuid (event));
    zmsg_t *msg = zyre_event_msg (event);
    if ((streq (type, "SHOUT") || streq (type, "WHISPER")) && msg) {
        printf (", \"content\": [");
        zframe_t *frame = zmsg_first (msg);
        bool first = true;
        while (frame) {
            char *text = zframe_strdup (frame);
            printf (first ? "" : ", ");
            json_string (text);
            free (text);
            first = false;
            frame = zmsg_next (msg);
        }
        printf ("]");
    }
    printf ("}\n");
    fflush (stdout);
    free (peer);
}

static bool
command (zyre_t *node, char *line)
{
    line [strcspn (line, "\r\n")] = 0;
    char *verb = strtok (line, " ");
    if (!verb)
        return true;
    if (streq (verb, "stop"))
        return false;
    char *arg = strtok (NULL, " ");
    char *rest = strtok (NULL, "");
    if (streq (verb, "join") && arg)
        zyre_join (node, arg);
    else
    if (streq (verb, "leave") && arg)
        zyre_leave (node, arg);
    else
    if (streq (verb, "shout") && arg)
        zyre_shouts (node, arg, "%s", rest ? rest : "");
    else
    if (streq (verb, "whisper") && arg) {
        char upper [64];
        snprintf (upper, sizeof upper, "%s", arg);
        for (char *c = upper; *c; c++)
            *c = (char) toupper ((unsigned char) *c);
        zyre_whispers (node, upper, "%s", rest ? rest : "");
    }
    return true;
}

int
main (int argc, char *argv [])
{
    if (argc < 2) {
        fprintf (stderr, "usage: zre_zyre_peer NAME [options]\n");
        return 2;
    }
    zsys_init ();
    zsys_set_logstream (stderr);
    zyre_t *node = zyre_new (argv [1]);
    zcert_t *cert = NULL;
    //  The certificate first: zyre applies it to its mailbox when binding (--endpoint).
    for (int argn = 2; argn < argc; argn++)
        if (streq (argv [argn], "--curve") && !cert) {
            cert = zcert_new ();
            zyre_set_zcert (node, cert);
        }
    for (int argn = 2; argn < argc; argn++) {
        const char *opt = argv [argn];
        const char *value = argn + 1 < argc ? argv [argn + 1] : NULL;
        if (streq (opt, "--verbose")) {
            zyre_set_verbose (node);
            continue;
        }
        if (streq (opt, "--curve"))
            continue;               //  done above
        if (!value) {
            fprintf (stderr, "zre_zyre_peer: %s wants a value\n", opt);
            return 2;
        }
        argn++;
        if (streq (opt, "--interface"))
            zyre_set_interface (node, value);
        else
        if (streq (opt, "--port"))
            zyre_set_port (node, atoi (value));
        else
        if (streq (opt, "--interval"))
            zyre_set_interval (node, (size_t) atol (value));
        else
        if (streq (opt, "--evasive"))
            zyre_set_evasive_timeout (node, atoi (value));
        else
        if (streq (opt, "--expired"))
            zyre_set_expired_timeout (node, atoi (value));
        else
        if (streq (opt, "--contest"))
            zyre_set_contest_in_group (node, value);
        else
        if (streq (opt, "--join"))
            zyre_join (node, value);
        else
        if (streq (opt, "--endpoint")) {
            if (zyre_set_endpoint (node, "%s", value)) {
                fprintf (stderr, "zre_zyre_peer: cannot bind %s\n", value);
                return 1;
            }
        }
        else
        if (streq (opt, "--gossip-bind"))
            zyre_gossip_bind (node, "%s", value);
        else
        if (streq (opt, "--gossip-connect")) {
            char *copy = strdup (value);
            char *key = strchr (copy, '|');
            if (key) {
                *key++ = 0;
                zyre_gossip_connect_curve (node, key, "%s", copy);
            }
            else
                zyre_gossip_connect (node, "%s", copy);
            free (copy);
        }
        else {
            fprintf (stderr, "zre_zyre_peer: unknown option %s\n", opt);
            return 2;
        }
    }
    if (zyre_start (node)) {
        fprintf (stderr, "zre_zyre_peer: cannot start\n");
        return 1;
    }
    char *uuid = lower (zyre_uuid (node));
    printf ("{\"event\": \"READY\"");
    json_field ("peer", uuid);
    json_field ("name", zyre_name (node));
    json_field ("public_key", cert ? zcert_public_txt (cert) : "");
    printf ("}\n");
    fflush (stdout);
    free (uuid);

    zsock_t *events = zyre_socket (node);
    zmq_pollitem_t items [] = {
        { zsock_resolve (events), 0, ZMQ_POLLIN, 0 },
        { NULL, 0, ZMQ_POLLIN, 0 }
    };
    char line [4096];
    bool running = true;
    int polled = 2;                 //  1 once stdin is closed: run until killed
    while (running && !zsys_interrupted) {
        if (zmq_poll (items, polled, 1000) == -1)
            break;
        if (items [0].revents & ZMQ_POLLIN) {
            zyre_event_t *event = zyre_event_new (node);
            if (!event)
                break;
            print_event (event);
            zyre_event_destroy (&event);
        }
        if (polled == 2 && (items [1].revents & ZMQ_POLLIN)) {
            if (fgets (line, sizeof line, stdin))
                running = command (node, line);
            else
                polled = 1;
        }
    }
    zyre_stop (node);
    zyre_destroy (&node);
    zcert_destroy (&cert);
    return 0;
}
