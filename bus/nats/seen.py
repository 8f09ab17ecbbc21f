"""The cluster as a client sees it, for ``/status`` and ``/metrics``: each NATS server
(named by the cluster now, connected to by us, in lame-duck mode), each stream's leader
and replicas with their lag, and the service's consumers.

Nothing here asks the servers: :func:`stream_cluster` reads the ``cluster`` field of an
answer to ``$JS.API.STREAM.INFO.<stream>`` (or ``CONSUMER.INFO``: a consumer of a
replicated stream has a leader and replicas of its own) the service asks every stats
interval, :func:`consumer_seen` the rest of a ``CONSUMER.INFO``, and
:func:`servers_seen` reads the INFOs its connections already hold (a server sends a new
one as the cluster's routes come and go, and when it enters lame-duck mode). Any service
on JetStream (the Event BUS front-end, eMQP) shows them the same way
(:func:`cluster_status`, :meth:`ConsumerSeen.status`, :func:`cluster_metrics`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from bus.nats.credentials import shown
from bus.nats.handshake import ConnectError
from bus.nats.rotation import server_key
from bus.util.metrics import Metric, gauges_by, gauges_by_labels

__all__ = [
    "ConsumerSeen",
    "Replica",
    "ServerSeen",
    "StreamCluster",
    "cluster_metrics",
    "cluster_status",
    "consumer_seen",
    "servers_seen",
    "stream_cluster",
    "unread",
]


@dataclass(frozen=True, slots=True)
class Replica:
    """A follower of the stream's leader, as the leader reports it."""

    #: The server's name (``server_name`` in its configuration).
    name: str
    #: Whether it holds everything the leader committed.
    current: bool
    #: Seconds since the leader last heard from it.
    active_s: float
    #: Operations it is behind the leader.
    lag: int
    #: Whether the leader takes it for gone.
    offline: bool = False


@dataclass(frozen=True, slots=True)
class StreamCluster:
    """A stream's (or a consumer's) leader (None: none elected now) and its followers."""

    leader: str | None = None
    replicas: tuple[Replica, ...] = ()
    #: Whether a stream's state was read at all (nothing is said before).
    known: bool = False
    #: Why the last read got no answer (None: it did): no leader answers, as far as the
    #: client can tell.
    unread: str | None = None


def unread(reason: str) -> StreamCluster:
    """What a read of a stream's (or consumer's) state that got no answer says: no leader
    to give one, as far as the client can tell (what the replicas were is not known
    either)."""
    return StreamCluster(known=True, unread=reason or "no answer")


def stream_cluster(info: Mapping[str, Any]) -> StreamCluster:
    """The ``cluster`` field of a ``STREAM.INFO`` or ``CONSUMER.INFO`` answer (``active``
    is nanoseconds)."""
    cluster = info.get("cluster")
    if not isinstance(cluster, Mapping):
        return StreamCluster(known=True)
    replicas = []
    for each in cluster.get("replicas") or ():
        if not isinstance(each, Mapping) or not isinstance(each.get("name"), str):
            continue
        replicas.append(
            Replica(
                name=each["name"],
                current=bool(each.get("current")),
                active_s=round(int(each.get("active") or 0) / 1e9, 3),
                lag=int(each.get("lag") or 0),
                offline=bool(each.get("offline")),
            )
        )
    leader = cluster.get("leader")
    return StreamCluster(
        leader=leader if isinstance(leader, str) and leader else None,
        replicas=tuple(sorted(replicas, key=lambda r: r.name)),
        known=True,
    )


@dataclass(frozen=True, slots=True)
class ConsumerSeen:
    """One of a service's JetStream consumers, as it last heard of it."""

    #: What the service uses it for (``feed``, ``snapshot``, ``queue``, ``schedules``).
    role: str
    #: Its name in its stream.
    name: str
    #: The stream it reads.
    stream: str
    #: What it serves, as the service names it (a queue's name), if anything.
    serves: str | None = None
    #: The last stream sequence it delivered (None: not known).
    delivered: int | None = None
    #: Messages it holds past the last delivered (None: not known).
    pending: int | None = None
    #: Delivered and not yet acknowledged (None: not known, or nothing is acknowledged).
    ack_pending: int | None = None
    #: Its leader and replicas (None: not read; a consumer of one replica has none).
    cluster: StreamCluster | None = None

    def status(self) -> dict[str, Any]:
        """As ``/status`` shows it: each field by its name, the cluster as
        :func:`cluster_status` shows a stream's."""
        shown = {each.name: getattr(self, each.name) for each in fields(self)}
        shown["cluster"] = cluster_status(self.cluster) if self.cluster is not None else None
        return shown


def consumer_seen(
    role: str, stream: str, info: Mapping[str, Any], serves: str | None = None
) -> ConsumerSeen:
    """A consumer as a ``CONSUMER.INFO`` answer describes it."""
    delivered = info.get("delivered")
    sequence = delivered.get("stream_seq") if isinstance(delivered, Mapping) else None
    return ConsumerSeen(
        role=role,
        name=str(info.get("name", "")),
        stream=stream,
        serves=serves,
        delivered=int(sequence) if isinstance(sequence, int) else None,
        pending=int(info.get("num_pending") or 0),
        ack_pending=int(info.get("num_ack_pending") or 0),
        cluster=stream_cluster(info),
    )


@dataclass(slots=True)
class ServerSeen:
    """One server of those a client knows (given or discovered)."""

    #: Its URL as it may be printed (a password or token as ``***``).
    url: str
    #: In the cluster now: the client that keeps its connection alive (it pings) is
    #: connected to it, or that server names it among its routed servers (INFO's
    #: ``connect_urls``, sent again as routes come and go).
    connected: bool = False
    #: Its INFO (to a connection of ours) says it is draining.
    lame_duck: bool = False
    #: Our connections open to it, by role (``management``, ``append``, ``feed``...).
    ours: list[str] = field(default_factory=list)

    def status(self) -> dict[str, Any]:
        """As ``/status`` shows it."""
        return {
            "url": self.url,
            "connected": self.connected,
            "lame_duck": self.lame_duck,
            "ours": list(self.ours),
        }


def _key(url: str) -> tuple[str, int] | None:
    """:func:`bus.nats.rotation.server_key`, for INFO's bare ``host:port`` too; None for a
    URL that does not parse."""
    try:
        return server_key(url if "://" in url else "nats://" + url)
    except ConnectError:
        return None


def servers_seen(
    servers: Sequence[str], connections: Iterable[tuple[str, str, Mapping[str, Any], bool]]
) -> list[ServerSeen]:
    """``servers`` (the URLs known) with what ``connections`` say of them: each open
    connection as (role, its server's URL, that server's latest INFO, whether it is
    kept alive). A connection not kept alive (a blocking one, idle) may not know yet
    that its server is gone: it says which server it uses and lame-duck mode, not
    what is in the cluster."""
    seen = {}
    order = []
    for url in servers:
        key = _key(url)
        if key is not None and key not in seen:
            seen[key] = ServerSeen(shown(url))
            order.append(key)
    for role, url, info, live in connections:
        key = _key(url)
        if key is None:
            continue
        if key not in seen:
            seen[key] = ServerSeen(shown(url))
            order.append(key)
        server = seen[key]
        server.ours.append(role)
        server.lame_duck = server.lame_duck or bool(info.get("ldm"))
        if not live:
            continue
        server.connected = True
        routed = info.get("connect_urls")
        for named in routed if isinstance(routed, list) else ():
            other = _key(named) if isinstance(named, str) else None
            if other is not None and other in seen:
                seen[other].connected = True
    return [seen[key] for key in order]


def cluster_status(cluster: StreamCluster) -> dict[str, Any]:
    """A stream's leader and replicas as ``/status`` shows them (``known``: read yet)."""
    return {
        "known": cluster.known,
        "unread": cluster.unread,
        "leader": cluster.leader,
        "replicas": [
            {
                "name": r.name,
                "current": r.current,
                "active_s": r.active_s,
                "lag": r.lag,
                "offline": r.offline,
            }
            for r in cluster.replicas
        ],
    }


def cluster_metrics(
    prefix: str, clusters: Mapping[str, StreamCluster], servers: Sequence[ServerSeen]
) -> list[Metric]:
    """The families of a service on JetStream (``prefix``: ``eventbus``, ``emqp``): its
    servers by state, and for each of its streams (``clusters``, by name) whose state was
    read, its leader and each replica's lag and currency, labelled ``stream`` (a lone
    server leads its streams and has no replicas)."""
    read = {name: cluster for name, cluster in clusters.items() if cluster.known}
    replicas = [(name, r) for name, cluster in read.items() for r in cluster.replicas]
    return [
        gauges_by(
            f"{prefix}_jetstream_servers",
            "NATS servers this service knows (given or learnt), connected (in the cluster "
            "now as its connections see it) and in lame-duck mode",
            "state",
            {
                "known": len(servers),
                "connected": sum(s.connected for s in servers),
                "lame_duck": sum(s.lame_duck for s in servers),
            },
        ),
        gauges_by(
            f"{prefix}_jetstream_stream_leader",
            "1 while a JetStream stream of the service has a leader (as last read), 0 while none",
            "stream",
            {name: int(cluster.leader is not None) for name, cluster in read.items()},
        ),
        gauges_by_labels(
            f"{prefix}_jetstream_replica_lag",
            "Operations each follower of a stream's leader is behind it",
            ("stream", "replica"),
            {(name, r.name): r.lag for name, r in replicas},
        ),
        gauges_by_labels(
            f"{prefix}_jetstream_replica_current",
            "1 while a follower of a stream's leader holds all it committed, 0 while not",
            ("stream", "replica"),
            {(name, r.name): int(r.current and not r.offline) for name, r in replicas},
        ),
    ]
