"""The NATS client protocol, for the paths where a message per event makes nats-py's
per-message cost the bound (see docs/cluster.md, "Where the time goes").

- :mod:`bus.natswire.codec`: the wire, sans-I/O: a parser that turns bytes into
  messages and the commands a client sends.
- :mod:`bus.natswire.jsapi`: JetStream's requests and what its replies and reply
  subjects carry.
- :mod:`bus.natswire.blocking`: one connection over a plain socket, driven
  synchronously (Spark's executors, threads), with the servers, credentials and TLS the
  front-ends take.
- :mod:`bus.natswire.ranged`: an ordered read of a stream's sequence range through a pull
  consumer with subject filters, batch after batch.

Nothing here imports Twisted or asyncio: Spark's executors use it as it is.
"""
