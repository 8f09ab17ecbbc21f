"""What crosses the bridge of bench/zre_zyre_elections.py, on one clock: every beacon, TCP
connect and ZRE command between the hosts (not a benchmark itself).

``python bench/_zre_capture.py FILE`` runs inside the bridge's namespace (the bench starts
it there): an AF_PACKET socket on the switch's ports records each IPv4 frame as it enters
the switch, with the kernel's timestamp (no tcpdump needed). :func:`decode` turns the file
into ZRE events: each TCP stream reassembled, its ZMTP framing read, each message parsed by
:mod:`bus.zre.codec`. :func:`timeline` writes one run's events, the nodes named.
"""

from __future__ import annotations

import signal
import socket
import struct
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bus.zre import codec  # noqa: E402

_RECORD = struct.Struct("!dH")
_SO_TIMESTAMPNS = 35
_ETH_P_ALL = 0x0003
_BEACON_PORT = 5670
_ZMTP_GREETING = 64


@dataclass(frozen=True, slots=True)
class WireEvent:
    """``what``: BEACON (``target`` "*", ``detail`` the UUID's hex), SYN, FIN, or a ZRE
    command's name (``detail``: its sequence, group, challenger or leader)."""

    time: float
    source: str
    target: str
    what: str
    detail: tuple[str, ...] = ()


def record(path: str) -> None:
    """Record until SIGTERM (run inside the bridge's namespace)."""
    out = open(path, "wb", buffering=0)  # noqa: SIM115
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(_ETH_P_ALL))
    sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        data, ancillary, _, address = sock.recvmsg(65536, 64)
        # Each frame once: as it enters the switch from a host (not the bridge's own copy).
        if address[0] == "br0" or address[2] == socket.PACKET_OUTGOING:
            continue
        if data[12:14] != b"\x08\x00":
            continue
        stamp = 0.0
        for level, kind, value in ancillary:
            if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS:
                seconds, nanoseconds = struct.unpack("qq", value[:16])
                stamp = seconds + nanoseconds / 1e9
        out.write(_RECORD.pack(stamp, len(data)) + data)


class BridgeCapture:
    """The recorder, started in ``namespace`` and stopped (by its id) with :meth:`stop`."""

    def __init__(self, namespace: str, path: Path) -> None:
        self.path = path
        self.process = subprocess.Popen(
            ["ip", "netns", "exec", namespace, sys.executable, __file__, str(path)]
        )

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)


def _frames(path: Path) -> Iterator[tuple[float, bytes]]:
    data = path.read_bytes()
    offset = 0
    while offset + _RECORD.size <= len(data):
        stamp, size = _RECORD.unpack_from(data, offset)
        offset += _RECORD.size
        yield stamp, data[offset : offset + size]
        offset += size


@dataclass(slots=True)
class _Stream:
    """One direction of a TCP connection: bytes in order, then ZMTP frames."""

    next_sequence: int
    pending: dict[int, bytes] = field(default_factory=dict)
    buffer: bytes = b""
    greeted: bool = False
    parts: list[bytes] = field(default_factory=list)

    def add(self, sequence: int, payload: bytes) -> None:
        self.pending[sequence] = payload
        while True:
            for start, part in list(self.pending.items()):
                behind = (self.next_sequence - start) & 0xFFFFFFFF
                if behind >= 0x80000000:
                    continue  # ahead of what we have: wait for the gap to fill
                del self.pending[start]
                if behind < len(part):
                    self.buffer += part[behind:]
                    self.next_sequence = (self.next_sequence + len(part) - behind) & 0xFFFFFFFF
                break
            else:
                return

    def messages(self) -> Iterator[list[bytes]]:
        data = self.buffer
        if not self.greeted:
            if len(data) < _ZMTP_GREETING:
                return
            data, self.greeted = data[_ZMTP_GREETING:], True
        while len(data) >= 2:
            flags = data[0]
            if flags & 0x02:
                if len(data) < 9:
                    break
                size, head = struct.unpack_from("!Q", data, 1)[0], 9
            else:
                size, head = data[1], 2
            if len(data) < head + size:
                break
            body, data = data[head : head + size], data[head + size :]
            if flags & 0x04:
                continue  # a ZMTP command (READY): not ZRE
            self.parts.append(body)
            if not flags & 0x01:
                yield self.parts
                self.parts = []
        self.buffer = data


def _describe(message: codec.Message) -> tuple[str, ...]:
    detail = [str(message.sequence)]
    if isinstance(message, codec.Hello):
        detail.append("groups=" + ",".join(message.groups))
    elif isinstance(message, codec.Elect):
        detail += [message.group, message.challenger]
    elif isinstance(message, codec.Leader):
        detail += [message.group, message.leader]
    elif isinstance(message, codec.Join | codec.Leave | codec.Shout):
        detail.append(message.group)
    return tuple(detail)


def decode(path: Path) -> list[WireEvent]:
    """Every beacon, connect, close and ZRE message in the capture, in time order."""
    streams: dict[tuple[str, int, str, int], _Stream] = {}
    events: list[WireEvent] = []
    for stamp, frame in _frames(path):
        ip = frame[14:]
        if len(ip) < 20 or ip[9] not in (6, 17):
            continue
        header = (ip[0] & 0x0F) * 4
        total = struct.unpack_from("!H", ip, 2)[0]
        source, target = socket.inet_ntoa(ip[12:16]), socket.inet_ntoa(ip[16:20])
        segment = ip[header:total]
        if ip[9] == 17:
            if struct.unpack_from("!H", segment, 2)[0] == _BEACON_PORT:
                try:
                    beacon = codec.parse_beacon(segment[8:])
                except codec.ZreError:
                    continue
                events.append(WireEvent(stamp, source, "*", "BEACON", (beacon.uuid.hex(),)))
            continue
        source_port, target_port, sequence = struct.unpack_from("!HHI", segment)
        flags, payload = segment[13], segment[(segment[12] >> 4) * 4 :]
        key = (source, source_port, target, target_port)
        if flags & 0x02:  # SYN
            streams[key] = _Stream((sequence + 1) & 0xFFFFFFFF)
            if not flags & 0x10:
                events.append(WireEvent(stamp, source, target, "SYN"))
            continue
        stream = streams.get(key)
        if stream is None:
            continue
        if flags & 0x05 and not payload:  # FIN or RST
            events.append(WireEvent(stamp, source, target, "FIN"))
            continue
        if not payload:
            continue
        stream.add(sequence, payload)
        for parts in stream.messages():
            try:
                message = codec.parse(parts)
            except codec.ZreError as error:
                events.append(WireEvent(stamp, source, target, "BAD", (error.reason,)))
                continue
            name = codec.command_name(message)
            events.append(WireEvent(stamp, source, target, name, _describe(message)))
    events.sort(key=lambda event: event.time)
    return events


def timeline(
    events: list[WireEvent],
    start: float,
    end: float,
    hosts: dict[str, str],
    nodes: dict[str, str],
    reports: Sequence[tuple[float, str, str]] = (),
) -> list[str]:
    """One run's lines, ms from its first event: ``hosts`` names addresses, ``nodes`` names
    UUIDs (upper-case hex, as ELECT and LEADER write them); ``reports`` adds what each node
    reported (time, node, text). Beacons after a node's first, and what the nodes said
    while stopping (from the first FIN on), are left out."""
    short = {uuid[:32].upper(): name for uuid, name in nodes.items()}
    seen: set[str] = set()
    lines: list[tuple[float, str]] = []
    for event in events:
        if not start <= event.time <= end:
            continue
        if event.what == "FIN":
            end = event.time
            break
        source = hosts.get(event.source, event.source)
        if event.what == "BEACON":
            if event.detail[0] in seen:
                continue
            seen.add(event.detail[0])
            lines.append((event.time, f"{source} beacon (first)"))
            continue
        if event.what in ("PING", "PING-OK"):
            continue
        detail = " ".join(short.get(part.upper(), part) for part in event.detail)
        target = hosts.get(event.target, event.target)
        lines.append((event.time, f"{source} -> {target} {event.what} {detail}".rstrip()))
    for when, node, leader in reports:
        if when <= end:
            lines.append((when, f"    [{node} reports LEADER {short.get(leader, leader)}]"))
    lines.sort(key=lambda line: line[0])
    origin = lines[0][0] if lines else start
    return [f"{(when - origin) * 1000:9.2f} {text}" for when, text in lines]


if __name__ == "__main__":
    record(sys.argv[1])
