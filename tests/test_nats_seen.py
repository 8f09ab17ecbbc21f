"""The cluster as a client sees it (bus.nats.seen), without servers: what STREAM.INFO's
``cluster`` field and the connections' INFOs say, and what is never shown."""

from __future__ import annotations

from bus.nats.seen import (
    ConsumerSeen,
    Replica,
    ServerSeen,
    StreamCluster,
    cluster_metrics,
    cluster_status,
    consumer_seen,
    servers_seen,
    stream_cluster,
    unread,
)


def test_a_stream_info_gives_its_leader_and_replicas_with_their_lag() -> None:
    info = {
        "cluster": {
            "name": "C",
            "leader": "n1",
            "replicas": [
                {"name": "n3", "current": False, "active": 7_500_000_000, "lag": 42},
                {"name": "n2", "current": True, "active": 120_000_000, "lag": 0},
            ],
        }
    }
    seen = stream_cluster(info)
    assert seen.leader == "n1"
    assert seen.replicas == (Replica("n2", True, 0.12, 0), Replica("n3", False, 7.5, 42))
    assert cluster_status(seen)["replicas"][1]["lag"] == 42
    # A lone server leads its stream and has no replicas; an election has no leader.
    assert stream_cluster({"cluster": {"leader": "n1"}}).replicas == ()
    assert stream_cluster({"cluster": {"name": "C", "replicas": []}}).leader is None


def test_servers_are_in_the_cluster_as_the_live_connection_hears_it_never_with_secrets() -> None:
    given = ["nats://u:pw@h1:4222", "nats://u:pw@h2:4222", "nats://u:pw@h3:4222"]
    live = {"connect_urls": ["h1:4222", "h2:4222"], "ldm": False}
    idle = {"ldm": True}  # a blocking connection on h3: lame duck, but not live
    seen = servers_seen(
        given, [("management", given[0], live, True), ("append", given[2], idle, False)]
    )
    assert [(s.connected, s.lame_duck, s.ours) for s in seen] == [
        (True, False, ["management"]),
        (True, False, []),
        (False, True, ["append"]),
    ]
    assert all("pw" not in s.url for s in seen)


def test_a_consumer_info_gives_what_it_holds_and_its_own_leader() -> None:
    info = {
        "name": "q_default",
        "delivered": {"consumer_seq": 9, "stream_seq": 12},
        "num_pending": 5,
        "num_ack_pending": 2,
        "cluster": {"leader": "n2", "replicas": [{"name": "n1", "current": True, "lag": 0}]},
    }
    seen = consumer_seen("queue", "EMQP", info, "default")
    assert (seen.name, seen.delivered, seen.pending, seen.ack_pending) == ("q_default", 12, 5, 2)
    shown = seen.status()
    assert (shown["serves"], shown["cluster"]["leader"]) == ("default", "n2")
    assert [r["name"] for r in shown["cluster"]["replicas"]] == ["n1"]
    # One not read: nothing said of its leader.
    assert ConsumerSeen("feed", "f1", "EVENTBUS").status()["cluster"] is None
    assert unread("") == unread("no answer") and unread("").leader is None


def test_the_families_label_each_stream_and_each_replica_by_name() -> None:
    led = stream_cluster(
        {"cluster": {"leader": "n1", "replicas": [
            {"name": "n2", "current": True, "lag": 0},
            {"name": "n3", "current": False, "lag": 20_000},
        ]}}
    )  # fmt: skip
    clusters = {"EMQP": led, "KV_EMQP_SCHEDULES": unread("timeout")}
    clusters["NOT_READ"] = StreamCluster()  # never read: not reported
    servers = [ServerSeen("nats://h1:4222", True), ServerSeen("nats://h2:4222", False, True)]
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in cluster_metrics("emqp", clusters, servers)
        for sample in family.samples
    }
    assert samples == {
        ("emqp_jetstream_servers", (("state", "known"),)): 2,
        ("emqp_jetstream_servers", (("state", "connected"),)): 1,
        ("emqp_jetstream_servers", (("state", "lame_duck"),)): 1,
        ("emqp_jetstream_stream_leader", (("stream", "EMQP"),)): 1,
        ("emqp_jetstream_stream_leader", (("stream", "KV_EMQP_SCHEDULES"),)): 0,
        ("emqp_jetstream_replica_lag", (("replica", "n2"), ("stream", "EMQP"))): 0,
        ("emqp_jetstream_replica_lag", (("replica", "n3"), ("stream", "EMQP"))): 20_000,
        ("emqp_jetstream_replica_current", (("replica", "n2"), ("stream", "EMQP"))): 1,
        ("emqp_jetstream_replica_current", (("replica", "n3"), ("stream", "EMQP"))): 0,
    }
