"""The ZRE codec: exact bytes of both dialects (checked against pyre's own encoder), round
trips, and property-based fuzzing: any input parses or raises ZreError, nothing else."""

from __future__ import annotations

import dataclasses
import struct
import uuid
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bus.zre import codec
from bus.zre.codec import (
    VERSION_20,
    VERSION_36,
    Elect,
    Goodbye,
    Hello,
    Join,
    Leader,
    Leave,
    LogRecord,
    Ping,
    PingOk,
    Shout,
    Unknown,
    Whisper,
    ZreError,
)

NODE = uuid.UUID("0123456789abcdef0123456789abcdef").bytes


def test_beacon_is_22_octets_with_the_port_in_network_order() -> None:
    data = codec.encode_beacon(NODE, 0xC001)
    assert data == b"ZRE\x01" + NODE + b"\xc0\x01"
    assert codec.parse_beacon(data) == codec.Beacon(NODE, 0xC001)
    assert codec.parse_beacon(codec.encode_beacon(NODE, 0)).leaving
    with pytest.raises(ZreError) as error:
        codec.parse_beacon(codec.encode_beacon(NODE, 0), VERSION_20)
    assert error.value.reason == "beacon-port"
    for bad, reason in [(data[:-1], "beacon-size"), (b"ZRE\x02" + data[4:], "beacon-header")]:
        with pytest.raises(ZreError) as error:
            codec.parse_beacon(bad)
        assert error.value.reason == reason


def pyre_frames(message: object) -> list[bytes]:
    """What pyre's own ZreMsg encoder sends for the same message."""
    import zmq
    from pyre.zre_msg import ZreMsg

    class Capture:
        type = zmq.DEALER

        def __init__(self) -> None:
            self.frames: list[bytes] = []

        def send(self, frame: bytes, flags: int = 0) -> None:
            self.frames.append(frame)

        def send_multipart(self, frames: list[bytes]) -> None:
            self.frames.extend(frames)

    kinds = {Hello: 1, Whisper: 2, Shout: 3, Join: 4, Leave: 5, Ping: 6, PingOk: 7}
    msg = ZreMsg(kinds[type(message)])
    msg.set_sequence(message.sequence)  # type: ignore[attr-defined]
    if isinstance(message, Hello):
        msg.set_endpoint(message.endpoint)
        msg.set_groups(message.groups)
        msg.set_status(message.status)
        msg.set_name(message.name)
        msg.set_headers(dict(message.headers))
    if isinstance(message, Shout | Join | Leave):
        msg.set_group(message.group)
    if isinstance(message, Join | Leave):
        msg.set_status(message.status)
    if isinstance(message, Whisper | Shout):
        msg.content = list(message.content)
    out = Capture()
    msg.send(out)
    return out.frames


MESSAGES_36 = [
    Hello(1, "tcp://10.0.0.1:49152", ("A", "B-2"), 3, "node", {"K": "v", "X-ZRELOG": "tcp://x:1"}),
    Hello(1, "tcp://127.0.0.1:50000", (), 0, "", {}),
    Whisper(2, (b"one",)),
    Whisper(3, (b"one", b"", b"\xff\x00")),
    Shout(4, "G", (b"a", b"b")),
    Join(5, "G", 4),
    Leave(6, "G", 5),
    Ping(7),
    PingOk(65535),
]


MESSAGES_20 = [
    Hello(1, "tcp://10.0.0.1:49152", ("A",), 2, "", {"K": "v"}),
    Whisper(2, (b"x",)),
    Shout(3, "G", (b"y",)),
    Join(4, "G", 1),
    Leave(5, "G", 2),
    Ping(6),
    PingOk(7),
]


@pytest.mark.parametrize("message", MESSAGES_36, ids=lambda m: type(m).__name__)
def test_36zre_frames_are_exactly_pyres_and_round_trip(message: codec.Message) -> None:
    frames = codec.encode(message, VERSION_36)
    assert frames == pyre_frames(message)
    assert codec.parse(frames, VERSION_36) == message
    assert codec.sniff_version(frames[0]) == VERSION_36


def test_lengths_count_octets_not_characters() -> None:
    """pyre 0.3.4 writes a string's length in characters, garbling non-ASCII names (a defect
    not to copy): lengths here are in octets."""
    hello = Hello(1, "tcp://10.0.0.1:49152", ("Grüße",), 0, "nœud", {"clé": "välue"})
    frames = codec.encode(hello, VERSION_36)
    assert b"\x00\x00\x00\x07Gr\xc3\xbc\xc3\x9fe" in frames[0]
    assert codec.parse(frames, VERSION_36) == hello


def test_20zre_frames_follow_the_draft_grammar() -> None:
    hello = Hello(1, "tcp://10.0.0.1:49152", ("A",), 2, "", {"K": "v"})
    [frame] = codec.encode(hello, VERSION_20)
    assert frame == (
        b"\xaa\xa1" + b"\x00\x01" + b"\x01"  # signature, sequence, HELLO
        + b"\x0810.0.0.1" + b"\xc0\x00"  # ipaddress, mailbox
        + b"\x01\x01A" + b"\x02"  # groups, status
        + b"\x01\x03K=v"  # headers as name=value strings
    )  # fmt: skip
    assert codec.parse([frame], VERSION_20) == hello
    assert codec.encode(Join(9, "G", 3), VERSION_20) == [b"\xaa\xa1\x00\x09\x04\x01G\x03"]
    assert codec.encode(Whisper(2, (b"x",)), VERSION_20) == [b"\xaa\xa1\x00\x02\x02", b"x"]
    assert codec.sniff_version(frame) == VERSION_20
    for message in MESSAGES_20:
        assert codec.parse(codec.encode(message, VERSION_20), VERSION_20) == message


def test_each_dialect_rejects_the_others_frames() -> None:
    hello20 = codec.encode(Hello(1, "tcp://10.0.0.1:49152", (), 0, "", {}), VERSION_20)
    with pytest.raises(ZreError):
        codec.parse(hello20, VERSION_36)
    hello36 = codec.encode(Hello(1, "tcp://10.0.0.1:49152", (), 0, "n", {}), VERSION_36)
    with pytest.raises(ZreError):
        codec.parse(hello36, VERSION_20)


#: zyre's extensions (not pyre's: it dies on them), with their exact frames.
ZYRE_EXTENSIONS: list[tuple[codec.Message, list[bytes]]] = [
    (Elect(8, "G", "0123ABCD"), [b"\xaa\xa1\x08\x02\x00\x08\x01G\x080123ABCD"]),
    (Leader(9, "GROUP", "L"), [b"\xaa\xa1\x09\x02\x00\x09\x05GROUP\x01L"]),
    (Goodbye(65535), [b"\xaa\xa1\x0a\x02\xff\xff"]),
    (Unknown(3, 42), [b"\xaa\xa1\x2a\x02\x00\x03"]),
    (Unknown(4, 0, b"\x01body", (b"c1", b"")), [b"\xaa\xa1\x00\x02\x00\x04\x01body", b"c1", b""]),
]


@pytest.mark.parametrize(("message", "frames"), ZYRE_EXTENSIONS, ids=lambda m: type(m).__name__)
def test_zyre_extensions_and_unknown_commands_round_trip(
    message: codec.Message, frames: list[bytes]
) -> None:
    assert codec.encode(message, VERSION_36) == frames
    assert codec.parse(frames, VERSION_36) == message
    known = not isinstance(message, Unknown)
    assert codec.sniff_version(frames[0]) == (VERSION_36 if known else VERSION_20)


def test_extensions_are_36zre_only_and_unknown_never_hides_a_known_command() -> None:
    for message, _ in ZYRE_EXTENSIONS:
        with pytest.raises(ValueError):
            codec.encode(message, VERSION_20)
    with pytest.raises(ValueError):
        codec.encode(Unknown(1, codec.WHISPER), VERSION_36)
    # 20/ZRE (the draft) knows commands 1-7 only: anything else is still an error there.
    with pytest.raises(ZreError) as error:
        codec.parse([b"\xaa\xa1\x00\x02\x08\x01G\x01C"], VERSION_20)
    assert error.value.reason == "command"
    assert codec.command_name(Unknown(1, 42)) == "command 42"
    assert codec.command_name(Leader(1, "G", "x")) == "LEADER"


@pytest.mark.parametrize(
    ("frames", "reason"),
    [
        ([], "empty"),
        ([b"\xaa\xa2\x01\x02\x00\x01"], "signature"),
        ([b"\xaa\xa1\x02\x01\x00\x01", b"x"], "version"),
        ([b"\xaa\xa1\x08\x02\x00\x01\x01G"], "truncated"),  # ELECT without challenger
        ([b"\xaa\xa1\x09\x02\x00\x01"], "truncated"),  # LEADER without fields
        ([b"\xaa\xa1\x09\x02\x00\x01\x01G\x01L\x00"], "trailing"),
        ([b"\xaa\xa1\x08\x02\x00\x01\x01G\x01C", b"x"], "extra-frames"),
        ([b"\xaa\xa1\x09\x02\x00\x01\x01\xff\x01L"], "bad-string"),
        ([b"\xaa\xa1\x0a\x02\x00\x01\x00"], "trailing"),  # GOODBYE has no fields
        ([b"\xaa\xa1\x0a\x02\x00\x01", b"x"], "extra-frames"),
        ([b"\xaa\xa1\x2a\x02\x00"], "truncated"),  # unknown, but the header is cut
        ([b"\xaa\xa1\x2a\x01\x00\x01"], "version"),
        ([b"\xaa\xa1\x02\x02\x00\x01"], "no-content"),
        ([b"\xaa\xa1\x06\x02\x00\x01", b"extra"], "extra-frames"),
        ([b"\xaa\xa1\x06\x02\x00\x01\x00"], "trailing"),
        ([b"\xaa\xa1\x04\x02\x00\x01\x05ab"], "truncated"),
        ([b"\xaa\xa1\x03\x02\x00\x01\x01\xff", b"x"], "bad-string"),
        ([b"\xaa\xa1\x01\x02\x00\x01\x00\xff\xff\xff\xff"], "truncated"),
    ],
)
def test_malformed_36zre_messages_raise_with_a_reason(frames: list[bytes], reason: str) -> None:
    with pytest.raises(ZreError) as error:
        codec.parse(frames, VERSION_36)
    assert error.value.reason == reason


def test_content_rules() -> None:
    with pytest.raises(ZreError):
        codec.encode(Whisper(1, ()), VERSION_36)
    with pytest.raises(ZreError):
        codec.encode(Whisper(1, (b"a", b"b")), VERSION_20)


def test_identities() -> None:
    assert codec.identity_of(NODE) == b"\x01" + NODE
    assert codec.uuid_of_identity(b"\x01" + NODE) == NODE
    assert codec.uuid_of_identity(NODE) == NODE
    with pytest.raises(ZreError):
        codec.uuid_of_identity(b"\x00\x6b\x8b\x45\x67")  # libzmq's generated identity


def test_zrelog_record() -> None:
    record = LogRecord(3, 1, 0x1234, 0xBEEF, 1_700_000_000_123, "JOIN alpha G")
    frame = codec.encode_log(record)
    assert frame[:3] == b"\xaa\xa2\x01"
    assert frame[3:9] == struct.pack(">BBHH", 3, 1, 0x1234, 0xBEEF)
    assert codec.parse_log([frame]) == record
    assert (record.level_name, record.event_name) == ("INFO", "JOIN")
    for bad in (
        [frame[:-1]],
        [frame, b""],
        [b"\xaa\xa1" + frame[2:]],
        [frame[:3] + b"\x09" + frame[4:]],
    ):
        with pytest.raises(ZreError):
            codec.parse_log(bad)
    assert codec.node_hash(b"\x00\x01" * 8) == 0  # eight equal words cancel out


# -- fuzzing -------------------------------------------------------------------------------------

frames_strategy = st.lists(st.binary(max_size=64), max_size=4)


@st.composite
def near_valid(draw: st.DrawFn) -> tuple[list[bytes], int]:
    """A valid message in one dialect with one octet of frame 0 changed, or cut short."""
    version = draw(st.sampled_from([VERSION_36, VERSION_20]))
    extensions = [message for message, _ in ZYRE_EXTENSIONS]
    message = draw(
        st.sampled_from(MESSAGES_36 + extensions if version == VERSION_36 else MESSAGES_20)
    )
    frames = codec.encode(message, version)
    head = bytearray(frames[0])
    if draw(st.booleans()):
        index = draw(st.integers(0, len(head) - 1))
        head[index] = draw(st.integers(0, 255))
    else:
        head = head[: draw(st.integers(0, len(head)))]
    return [bytes(head), *frames[1:]], version


@given(frames_strategy, st.sampled_from([VERSION_36, VERSION_20]))
def test_fuzz_any_frames_parse_or_raise_zre_error(frames: list[bytes], version: int) -> None:
    try:
        message = codec.parse(frames, version)
    except ZreError as error:
        assert error.reason
    else:
        # Whatever parses survives a round trip through the encoder.
        assert codec.parse(codec.encode(message, version), version) == message


@given(near_valid())
def test_fuzz_near_valid_messages(case: tuple[list[bytes], int]) -> None:
    frames, version = case
    try:
        message = codec.parse(frames, version)
    except ZreError as error:
        assert error.reason
    else:
        assert codec.parse(codec.encode(message, version), version) == message


@given(st.binary(max_size=40))
def test_fuzz_beacons_and_log_records(data: bytes) -> None:
    for parse in (codec.parse_beacon, lambda d: codec.parse_log([d])):
        try:
            parse(data)
        except ZreError as error:
            assert error.reason


@st.composite
def data_path_frames(draw: st.DrawFn) -> list[bytes]:
    """36/ZRE SHOUT and WHISPER frames, well formed or nearly: the parser's shortcut."""
    command = draw(st.sampled_from([codec.SHOUT, codec.WHISPER]))
    group = draw(st.one_of(st.text(max_size=6).map(str.encode), st.binary(max_size=6)))
    head = bytearray(codec.SIGNATURE + bytes((command, VERSION_36)))
    head += draw(st.binary(min_size=2, max_size=2))
    if command == codec.SHOUT:
        head += bytes((draw(st.integers(0, 8)),)) + group
    elif draw(st.booleans()):
        head += group
    if draw(st.booleans()):
        head[draw(st.integers(0, len(head) - 1))] = draw(st.integers(0, 255))
    content = draw(st.lists(st.binary(max_size=4), max_size=3))
    return [bytes(head), *content]


@given(data_path_frames())
def test_the_data_path_shortcut_reads_as_the_full_parser(frames: list[bytes]) -> None:
    def outcome(parse: Callable[[], codec.Message]) -> object:
        try:
            return parse()
        except ZreError as error:
            return error.reason

    assert outcome(lambda: codec.parse(frames)) == outcome(lambda: codec._parse(frames, 2))


@pytest.mark.parametrize("version", [VERSION_36, VERSION_20])
@pytest.mark.parametrize("sequence", [0, 1, 255, 256, 65535])
def test_a_message_encoded_once_takes_each_peers_sequence(version: int, sequence: int) -> None:
    for message in MESSAGES_36 if version == VERSION_36 else MESSAGES_20:
        once = codec.encode(message, version)
        renumbered = [codec.with_sequence(once[0], sequence, version), *once[1:]]
        assert codec.parse(renumbered, version) == dataclasses.replace(
            codec.parse(once, version), sequence=sequence
        )
