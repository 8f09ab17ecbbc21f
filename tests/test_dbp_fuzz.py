"""Property-based fuzzing of a RUNNING DBP catalog through real sockets.

Each example sends garbage and near-valid messages (each from a fresh DEALER, so that one
peer's invalidity does not hide the next message), garbage UDP datagrams to the heartbeat
port, and valid info requests from a steady client. Afterwards: the catalog answers a probe,
every message got exactly the reply the oracle (the codec) says (o_O, OwO, DENIED,
DISCONNECT or none), the drop counters hold exactly the reasons expected, and the service
registered before the run is still there and active.
"""

from __future__ import annotations

import socket
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_twisted
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bus.dbp import codec
from bus.dbp.codec import DbpError, Invalid
from bus.dbp.config import CatalogConfig
from bus.dbp.server import CatalogService
from bus.testing import RawPeer, wait_until
from tests.test_dbp_codec import bodies, commands, messages, times

#: A valid registration that is safe to act on: the catalog beats it on 127.0.0.1:9 (discard).
SAFE = codec.json_frame(
    {"name": "fuzzed", "address": "127.0.0.1", "port": 9, "function": "f", "heartbeat": 30}
)


def outcome(frames: list[bytes]) -> tuple[bytes | None, str | None]:
    """(the reply command, the drop reason) for a message from a fresh peer."""
    try:
        message = codec.parse(frames)
        if message.command == codec.INFO_REQUEST:
            _ = message.text
    except DbpError as error:
        return None, error.reason
    command = message.command
    if command == codec.INFO_REQUEST:
        return codec.INFO_REPLY, None
    denied = codec.DENIED_ORIGINAL if message.time_size == 4 else codec.DENIED
    if command == codec.REGISTER:
        try:
            codec.registration(codec.json_object(message.body[0]))
        except (DbpError, Invalid, IndexError):
            return denied, None
        return codec.APPROVED, None
    if command == codec.UPDATE:
        return denied, None
    if command == codec.DISCONNECT:
        return None, None
    return codec.DISCONNECT, "unexpected"  # a beat from a stranger, or a catalog's command


fuzz_messages = st.one_of(
    messages,
    st.tuples(st.just(b""), commands, times, bodies).map(lambda t: [t[0], t[1], t[2], *t[3]]),
    st.tuples(st.sampled_from([b"\x00" * 8, b"\x00" * 4])).map(
        lambda t: [b"", codec.REGISTER, t[0], SAFE]
    ),
).filter(lambda frames: len(frames) > 0)


def udp_outcome(data: bytes) -> str:
    try:
        _, name = codec.parse_udp_heartbeat(data)
    except DbpError as error:
        return error.reason
    return "udp-address" if name == "steady" else "udp-unknown"


udp_garbage = st.one_of(
    st.binary(max_size=40),
    st.binary(max_size=12).map(lambda name: b"<3" + b"\x00" * 8 + name),
)

batches = st.lists(
    st.one_of(
        fuzz_messages.map(lambda frames: ("zmq", frames)),
        udp_garbage.map(lambda data: ("udp", data)),
        st.just(("info", [])),
    ),
    min_size=1,
    max_size=12,
)


@dataclass
class Fuzzed:
    catalog: CatalogService
    steady: RawPeer
    client: RawPeer
    udp: socket.socket
    examples: int = 0


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fuzzed]:
    from tests.zre_helpers import free_udp_port

    config = CatalogConfig(
        port=0,
        beacon_port=free_udp_port(),
        heartbeat_interval=0.05,
        data_dir=str(tmp_path_factory.mktemp("dbp-fuzz")),
    )
    catalog = CatalogService(config)
    catalog.startService()
    steady = RawPeer.dealer(catalog.endpoint)
    client = RawPeer.dealer(catalog.endpoint)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.connect(("127.0.0.1", catalog.port))
    steady_info = {
        "name": "steady",
        "address": "127.0.0.2",
        "port": 9,
        "function": "f",
        "heartbeat": 60,
    }
    steady.send(codec.encode(codec.REGISTER, 0.0, [codec.json_frame(steady_info)]))
    try:
        pytest_twisted.blockon(wait_until(lambda: steady.messages, what="steady registered"))
        yield Fuzzed(catalog, steady, client, udp)
    finally:
        udp.close()
        steady.close()
        client.close()
        pytest_twisted.blockon(catalog.stopService())


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=batches)
@pytest_twisted.inlineCallbacks
def test_catalog_survives_garbage_and_answers_exactly(
    fuzzed: Fuzzed, batch: list[tuple[str, Any]]
) -> Any:
    f = fuzzed
    catalog = f.catalog
    f.examples += 1
    drops_before = Counter(catalog.drops.counts)
    datagrams_before = catalog.udp_heartbeats
    client_before = len(f.client.messages)
    expected_drops: Counter[str] = Counter()
    peers: list[tuple[RawPeer, bytes | None]] = []
    infos = datagrams = 0
    try:
        for kind, item in batch:
            if kind == "zmq":
                peer = RawPeer.dealer(catalog.endpoint)
                peer.send(item)
                reply, reason = outcome(item)
                peers.append((peer, reply))
                if reason:
                    expected_drops[reason] += 1
            elif kind == "udp":
                f.udp.send(item)
                expected_drops[udp_outcome(item)] += 1
                datagrams += 1
            else:
                f.client.send(codec.encode(codec.INFO_REQUEST, 0.0, [b"steady"]))
                infos += 1
        f.client.send(codec.encode(codec.INFO_REQUEST, 0.0, [b""]))  # the probe
        yield wait_until(lambda: len(f.client.messages) == client_before + infos + 1, what="probe")
        yield wait_until(
            lambda: all(len(p.messages) == (r is not None) for p, r in peers), what="replies"
        )
        yield wait_until(
            lambda: catalog.udp_heartbeats - datagrams_before >= datagrams, what="datagrams"
        )
        for peer, reply in peers:
            assert [codec.parse(m).command for m in peer.messages] == ([reply] if reply else [])
        answers = [
            codec.json_object(codec.parse(m).body[0]) for m in f.client.messages[client_before:]
        ]
        assert all(a["steady"]["active"] for a in answers)

        def dropped() -> Counter[str]:
            drops = Counter(catalog.drops.counts) - drops_before
            drops.pop("peer-gone", None)  # a fresh peer may close before its DISCONNECT
            return drops

        # Peers that get no answer are on connections of their own: nothing orders their
        # messages before the probe's answer, so wait for as many drops as expected.
        yield wait_until(
            lambda: dropped().total() >= expected_drops.total(), what="the expected drops"
        )
        assert dropped() == expected_drops
        assert catalog.core.entries["steady"].active
    finally:
        for peer, _ in peers:
            peer.close()
