"""The DBP codec and the catalog's state machine on a Clock; property-based fuzzing of both."""

from __future__ import annotations

import struct
from collections import Counter
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from twisted.internet.task import Clock

from bus.dbp import codec
from bus.dbp.codec import DbpError, Invalid
from bus.dbp.core import CatalogCore, CatalogSettings


def test_messages_and_both_time_sizes() -> None:
    frames = codec.encode(codec.INFO_REQUEST, 1_700_000_000.5, [b"thermo"])
    assert frames[:2] == [b"", b"u_U"] and frames[2] == struct.pack("<d", 1_700_000_000.5)
    message = codec.parse(frames)
    assert (message.command, message.time, message.time_size, message.text) == (
        b"u_U",
        1_700_000_000.5,
        8,
        "thermo",
    )
    original = codec.parse([b"", b"UwU", struct.pack("f", 1.7e9), b"{}"])
    assert original.time_size == 4 and abs(original.time - 1.7e9) < 128  # float32: ~2 min
    assert codec.encode_time(1.0, 4) == struct.pack("<f", 1.0)


@pytest.mark.parametrize(
    ("frames", "reason"),
    [
        ([b"", b"u_U"], "frames"),
        ([b"x", b"u_U", b"\x00" * 8], "delimiter"),
        ([b"", b"o.O", b"\x00" * 8], "command"),
        ([b"", b"u_U", b"\x00" * 5], "time-size"),
        ([b"", b"u_U", struct.pack("<d", float("nan"))], "time-value"),
        ([b"", b"UwU", b"\x00" * 8, b"x" * (codec.MAX_BODY_BYTES + 1)], "oversized"),
    ],
)
def test_malformed_messages(frames: list[bytes], reason: str) -> None:
    with pytest.raises(DbpError) as error:
        codec.parse(frames)
    assert error.value.reason == reason


def test_registration_rules_and_the_originals_keys() -> None:
    info = codec.registration(
        {"name": "a", "address": "10.0.0.1", "port": 1, "function": "f", "heartbeat": 2, "x": [1]}
    )
    assert info == {
        "name": "a",
        "address": "10.0.0.1",
        "port": 1,
        "function": "f",
        "heartbeat": 2,
        "x": [1],
    }
    original = codec.registration(
        {"name": "Rohan", "ip_addr": "h", "port": 5, "liveliness": 1000, "token": "t"}
    )
    assert (original["address"], original["heartbeat"], original["function"]) == ("h", 1.0, "")
    assert "token" not in original and "ip_addr" not in original
    with pytest.raises(Invalid) as error:
        codec.registration({"name": "", "address": "h", "port": True, "heartbeat": 0})
    assert len(error.value.reasons) == 4  # name, port, function, heartbeat
    assert codec.merged(info, {"port": 9})["port"] == 9
    with pytest.raises(Invalid):
        codec.merged(info, {"heartbeat": "soon"})


def test_udp_datagrams_and_beacon() -> None:
    datagram = codec.encode_udp_heartbeat("thermo", 12.5)
    assert datagram[:2] == b"<3" and codec.parse_udp_heartbeat(datagram) == (12.5, "thermo")
    for bad, reason in [
        (b"<3" + b"\x00" * 8, "udp-size"),
        (b"hi", "udp-command"),
        (b"<3" + b"\x00" * 8 + b"\xff", "bad-text"),
    ]:
        with pytest.raises(DbpError) as error:
            codec.parse_udp_heartbeat(bad)
        assert error.value.reason == reason
    assert codec.encode_beacon(5246) == b"SHALOM 5246"
    assert codec.parse_beacon(b"SHALOM 5246") == 5246
    for bad in (b"SHALOM ", b"SHALOM 0", b"SHALOM 99999", b"HELLO 5246", b"SHALOM 12a"):
        with pytest.raises(DbpError):
            codec.parse_beacon(bad)


# -- the state machine ---------------------------------------------------------------------


class Catalog:
    def __init__(self, **settings: Any) -> None:
        self.clock = Clock()
        self.activity: list[tuple[str, str]] = []
        self.drops: Counter[str] = Counter()
        self.core = CatalogCore(
            CatalogSettings(**settings),
            self.clock.seconds,
            lambda kind, name, value: self.activity.append((kind, name)),
            lambda reason, detail, peer: self.drops.update([reason]),
        )

    def send(self, identity: bytes, command: bytes, body: Any = None) -> list[codec.DbpMessage]:
        frames = codec.encode(command, 0.0, [] if body is None else [codec.json_frame(body)])
        return [codec.parse(reply[1:]) for reply in self.core.on_message(identity, frames)]


def info(name: str, heartbeat: float = 1.0) -> dict[str, Any]:
    return {
        "name": name,
        "address": "10.0.0.5",
        "port": 7000,
        "function": "f",
        "heartbeat": heartbeat,
    }


def test_beats_fallback_expiry_grace_on_the_clock() -> None:
    c = Catalog(heartbeat_interval=1.0, liveness=3, grace=10.0)
    [ok] = c.send(b"svc", codec.REGISTER, info("svc"))
    assert ok.command == codec.APPROVED
    entry = c.core.entries["svc"]
    c.clock.advance(1)
    c.core.on_udp_heartbeat(codec.encode_udp_heartbeat("svc", 0), "10.0.0.5")
    out = c.core.tick()
    assert out.datagrams[0][1] == ("10.0.0.5", 7000) and not out.messages

    def run(seconds: int) -> list[list[bytes]]:
        """A running catalog: a tick every interval (a late one judges nothing)."""
        messages = []
        for _ in range(seconds):
            c.clock.advance(1)
            messages += c.core.tick().messages
        return messages

    messages = run(2)  # two intervals without UDP: ZeroMQ beats too
    assert entry.path == "zmq" and messages[0][0] == b"svc"
    assert codec.parse(messages[0][1:]).command == codec.HEARTBEAT
    c.send(b"svc", codec.HEARTBEAT, None)  # its ZeroMQ beat keeps it
    run(2)
    assert entry.active
    c.core.on_udp_heartbeat(codec.encode_udp_heartbeat("svc", 0), "10.0.0.5")
    assert entry.path == "udp" and not c.core.tick().messages
    run(3)  # silent on both paths for liveness x heartbeat
    assert not entry.active and c.activity[-1] == ("expired", "svc")
    run(9)
    assert "svc" in c.core.entries
    run(1)
    assert "svc" not in c.core.entries and c.activity[-1] == ("removed", "svc")
    # A catalog that did not run for 20 s (a stall) beats but judges nothing at its first
    # tick: the service's beat waiting in its socket is read before the next one.
    c.send(b"svc", codec.REGISTER, info("svc"))
    entry, fallbacks = c.core.entries["svc"], c.core.counts["fallbacks"]
    c.clock.advance(20)
    out = c.core.tick()
    assert entry.active and out.datagrams and c.core.wakes.held == 1
    c.core.on_udp_heartbeat(codec.encode_udp_heartbeat("svc", 0), "10.0.0.5")
    run(1)
    assert entry.active and entry.path == "udp"
    assert c.core.counts["fallbacks"] == fallbacks  # none for the stall
    # A beat from a wrong address is not its beat.
    c.send(b"x", codec.REGISTER, info("x"))
    c.core.on_udp_heartbeat(codec.encode_udp_heartbeat("x", 0), "10.9.9.9")
    assert c.drops["udp-address"] == 1


def test_restored_services_are_inactive_until_they_beat() -> None:
    c = Catalog(grace=5.0)
    c.send(b"a", codec.REGISTER, info("a"))
    saved = c.core.snapshot()
    again = Catalog(grace=5.0)
    assert again.core.restore({**saved, "broken": {"info": {"name": 1}}}) == 1
    assert not again.core.entries["a"].active
    [reply] = again.send(b"who", codec.INFO_REQUEST, None)
    assert codec.json_object(reply.body[0]) == {}
    again.core.on_udp_heartbeat(codec.encode_udp_heartbeat("a", 0), "10.0.0.5")
    assert again.core.entries["a"].active and again.activity == [("active", "a")]


def test_a_peer_that_registers_under_a_new_name_gives_up_the_old_one() -> None:
    c = Catalog()
    c.send(b"p", codec.REGISTER, info("old"))
    c.send(b"p", codec.REGISTER, info("new"))
    assert list(c.core.entries) == ["new"] and ("disconnected", "old") in c.activity
    [denied] = c.send(b"p", codec.UPDATE, {"name": "other"})
    assert denied.command == codec.DENIED


# -- fuzzing ---------------------------------------------------------------------------------

commands = st.sampled_from([*sorted(codec.COMMANDS), b"", b"u_", b"<3<3"])
times = st.sampled_from(
    [b"\x00" * 4, b"\x00" * 8, b"", b"\x00" * 3, struct.pack("<d", float("inf"))]
)
bodies = st.lists(
    st.one_of(
        st.binary(max_size=30),
        st.sampled_from([b"{}", b"[]", b"null", b'{"name": 1}', codec.json_frame(info("z"))]),
    ),
    max_size=3,
)
messages = st.one_of(
    st.lists(st.binary(max_size=20), max_size=5),
    st.tuples(st.sampled_from([b"", b"x"]), commands, times, bodies).map(
        lambda t: [t[0], t[1], t[2], *t[3]]
    ),
)


@given(messages)
def test_fuzz_codec_parses_or_raises_dbp_error(frames: list[bytes]) -> None:
    try:
        message = codec.parse(frames)
    except DbpError as error:
        assert error.reason
    else:
        assert (
            codec.parse(
                codec.encode(message.command, message.time, message.body, message.time_size)
            )
            == message
        )


@given(st.lists(st.tuples(st.sampled_from([b"a", b"b", b"c"]), messages), max_size=20))
def test_fuzz_state_machine_never_raises_and_replies_well_formed(
    batch: list[tuple[bytes, list[bytes]]],
) -> None:
    c = Catalog()
    for identity, frames in batch:
        for reply in c.core.on_message(identity, frames):
            assert reply[0] == identity
            assert codec.parse(reply[1:]).command in codec.COMMANDS
        c.clock.advance(0.3)
        c.core.tick()
    for entry in c.core.entries.values():
        assert codec.registration(entry.info) == entry.info


@given(st.binary(max_size=300))
def test_fuzz_datagrams(data: bytes) -> None:
    c = Catalog()
    c.core.on_udp_heartbeat(data, "127.0.0.1")
    for parse in (codec.parse_udp_heartbeat, codec.parse_beacon):
        try:
            parse(data)
        except DbpError as error:
            assert error.reason


def test_hermes_form_takes_the_connections_address_where_hermes_clients_look_too() -> None:
    sent = {
        "name": "Rohan",
        "interfaces": {"router": {"ip": "127.0.0.1", "port": 5246}, "pub": {"port": 1}},
        "reg_time": "Mon Nov 23 22:57:47 2026",
        "topics": None,
    }
    info = codec.registration(sent, peer_address="10.231.77.2")
    # address for our clients, interfaces.router.ip for Hermes' Client (it connects there)
    assert info["address"] == "10.231.77.2"
    assert info["interfaces"] == {
        "router": {"ip": "10.231.77.2", "port": 5246},
        "pub": {"port": 1},
    }
    assert sent["interfaces"]["router"]["ip"] == "127.0.0.1"  # what it sent is not changed
    # Without the connection's address (or a real one advertised), nothing is rewritten.
    assert codec.registration(sent)["interfaces"]["router"]["ip"] == "127.0.0.1"
