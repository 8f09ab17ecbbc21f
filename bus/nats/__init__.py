"""Everything NATS: our own client of its protocol and JetStream's API, the options that
put a service's storage on a cluster, and the ``nats-server`` processes this machine runs
for tests and ``bus-cluster``.

Ours rather than nats-py because nats-py is asyncio-only and its per-message cost is the
bound on the paths where a message goes per event (see docs/cluster.md, "Where the time
goes").

Sans-I/O, no Twisted (Spark's executors and threads use these as they are):

- :mod:`bus.nats.codec`: the wire: a parser that turns bytes into messages, and the
  commands a client sends.
- :mod:`bus.nats.jsapi`: JetStream's requests and what its replies and reply subjects
  carry.
- :mod:`bus.nats.handshake`, :mod:`bus.nats.settings`, :mod:`bus.nats.tokens`: servers,
  credentials and TLS; connection settings; topics as subject tokens.

Blocking, over a plain socket: :mod:`bus.nats.blocking` (one connection),
:mod:`bus.nats.failover` (moving to the next server), :mod:`bus.nats.publish` and
:mod:`bus.nats.ranged` (acknowledged appends; an ordered read of a sequence range).

On the reactor: :mod:`bus.nats.client`, and key-value buckets (:mod:`bus.nats.kv`). For services and operators:
:mod:`bus.nats.options` (``--store jetstream``), :mod:`bus.nats.servers` and
:mod:`bus.nats.cli` (``bus-cluster``).
"""
