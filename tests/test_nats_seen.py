"""The cluster as a client sees it (bus.nats.seen), without servers: what STREAM.INFO's
``cluster`` field and the connections' INFOs say, and what is never shown."""

from __future__ import annotations

from bus.nats.seen import Replica, cluster_status, servers_seen, stream_cluster


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
