"""DBP (the Core Catalog Service protocol) wire format, sans I/O.

A message after the ROUTER identity is ``['', command, time, body...]`` (REQ clients get the
empty frame from their socket, DEALER clients write it). ``time`` is the sender's epoch time:
4 octets (the original's ``struct.pack('f')``, a little-endian float32 on the machines it ran
on: worth about two minutes of precision today) or 8 octets (a little-endian double, what this
project sends unless it answers a 4-octet peer). Commands are three ASCII faces, see below.

UDP (this project's choice; the text gives none): a heartbeat datagram is ``<3``, the 8-octet
time, then the sender's name in UTF-8 (1-255 octets); the catalog's beacon is ``SHALOM <port>``
(the original's).

Every malformed input raises :class:`DbpError` (a ``ProtocolError``) with a ``reason``.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from bus.errors import ProtocolError

INFO_REQUEST: Final = b"u_U"
INFO_REPLY: Final = b"o_O"
REGISTER: Final = b"UwU"
APPROVED: Final = b"OwO"
DENIED: Final = b"(O_O)"  # the text
DENIED_ORIGINAL: Final = b"OmO"  # the original
UPDATE: Final = b"UoU"
ACKNOWLEDGED: Final = b"u.u"
HEARTBEAT: Final = b"<3"
DISCONNECT: Final = b"</3"

COMMANDS: Final = frozenset(
    {
        INFO_REQUEST,
        INFO_REPLY,
        REGISTER,
        APPROVED,
        DENIED,
        DENIED_ORIGINAL,
        UPDATE,
        ACKNOWLEDGED,
        HEARTBEAT,
        DISCONNECT,
    }
)
#: Commands a catalog receives; the others are sent by it (valid DBP, but unexpected here).
TO_CATALOG: Final = frozenset({INFO_REQUEST, REGISTER, UPDATE, HEARTBEAT, DISCONNECT})

TIME_FLOAT32: Final = 4
TIME_DOUBLE: Final = 8
_F32 = struct.Struct("<f")
_F64 = struct.Struct("<d")

#: Largest body frame accepted (a registration is a small JSON object).
MAX_BODY_BYTES: Final = 64 * 1024
MAX_NAME_BYTES: Final = 255

#: Registration forms (and client dialects): the spec's keys, or Hermes' ``interfaces``.
SPEC: Final = "spec"
HERMES: Final = "hermes"
DIALECTS: Final = (SPEC, HERMES)
#: The heartbeat assumed for a service registered in Hermes' form (it never beats), seconds.
HERMES_HEARTBEAT: Final = 10.0

UDP_HEARTBEAT: Final = b"<3"
BEACON_PREFIX: Final = b"SHALOM "


class DbpError(ProtocolError):
    """A frame or datagram that DBP does not allow."""


@dataclass(frozen=True, slots=True)
class DbpMessage:
    """One message after the ROUTER identity: its command face, the sender's time and the body."""

    command: bytes
    time: float
    #: 4 (the original's float32) or 8: replies use the same size.
    time_size: int
    body: tuple[bytes, ...]

    @property
    def text(self) -> str:
        """The first body frame as text (an info request's service name)."""
        if not self.body:
            return ""
        try:
            return self.body[0].decode("utf-8")
        except UnicodeDecodeError:
            raise DbpError("body is not UTF-8", "bad-text") from None


def encode_time(now: float, size: int = TIME_DOUBLE) -> bytes:
    """``now`` as a time frame: 4 octets (float32, for the original's peers) or 8 (a double)."""
    return _F32.pack(now) if size == TIME_FLOAT32 else _F64.pack(now)


def decode_time(frame: bytes) -> float:
    """A time frame of 4 or 8 octets; :class:`DbpError` for another size or a value that is not
    finite."""
    if len(frame) == TIME_FLOAT32:
        value: float = _F32.unpack(frame)[0]
    elif len(frame) == TIME_DOUBLE:
        value = _F64.unpack(frame)[0]
    else:
        raise DbpError(f"time frame of {len(frame)} octets (not 4 or 8)", "time-size")
    if not math.isfinite(value):
        raise DbpError("time is not a finite number", "time-value")
    return value


def parse(frames: Sequence[bytes]) -> DbpMessage:
    """A message without its ROUTER identity: ``['', command, time, body...]``."""
    if len(frames) < 3:
        raise DbpError(f"{len(frames)} frames (at least 3)", "frames")
    if frames[0] != b"":
        raise DbpError("no empty delimiter frame first", "delimiter")
    command = frames[1]
    if command not in COMMANDS:
        raise DbpError(f"unknown command {command[:16]!r}", "command")
    time = decode_time(frames[2])
    body = tuple(frames[3:])
    if any(len(frame) > MAX_BODY_BYTES for frame in body):
        raise DbpError(f"a body frame over {MAX_BODY_BYTES} octets", "oversized")
    return DbpMessage(command, time, len(frames[2]), body)


def encode(
    command: bytes, now: float, body: Sequence[bytes] = (), time_size: int = TIME_DOUBLE
) -> list[bytes]:
    """A message of ``command`` (the empty frame first), stamped ``now`` in ``time_size``
    octets."""
    return [b"", command, encode_time(now, time_size), *body]


def json_frame(value: Any) -> bytes:
    """``value`` as a compact JSON body frame, keys sorted."""
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode("utf-8")


def json_object(frame: bytes) -> dict[str, Any]:
    """A body frame that must hold a JSON object; :class:`DbpError` otherwise."""
    try:
        value = json.loads(frame.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise DbpError("body is not JSON", "json") from None
    if not isinstance(value, dict):
        raise DbpError(f"JSON body is a {type(value).__name__}, not an object", "not-object")
    return value


# -- registration -----------------------------------------------------------------------------


class Invalid(ValueError):
    """A registration or update that is JSON but not a valid one: the reasons go in DENIED."""

    def __init__(self, reasons: list[str]) -> None:
        super().__init__("; ".join(reasons))
        self.reasons = reasons


def service_name(value: Any) -> str:
    """``value`` checked as a service name: :class:`Invalid` unless it is 1-255 octets of text."""
    if not isinstance(value, str) or not value or len(value.encode("utf-8")) > MAX_NAME_BYTES:
        raise Invalid([f"name must be text of 1-{MAX_NAME_BYTES} octets"])
    return value


def registration_form(value: Mapping[str, Any]) -> str:
    """:data:`HERMES` for the form Hermes' Service sends (``interfaces``, no address), else
    :data:`SPEC` (which includes the older ``ip_addr``/``liveliness`` keys)."""
    if "interfaces" in value and "address" not in value and "ip_addr" not in value:
        return HERMES
    return SPEC


def registration(
    value: Mapping[str, Any],
    peer_address: str | None = None,
    hermes_heartbeat: float = HERMES_HEARTBEAT,
) -> dict[str, Any]:
    """The stored form of a registration: ``name``, ``address``, ``port``, ``function`` and
    ``heartbeat`` (seconds), plus every other key as sent (except ``token``). The original's
    keys are accepted where they differ: ``ip_addr`` for ``address``, ``liveliness`` (ms) for
    ``heartbeat``; with them ``function`` may be missing (the original has none).

    Hermes' form, ``{"name", "interfaces": {"router": {"ip", "port"}}, "reg_time", "topics"}``,
    gives address and port from ``interfaces.router``; it always says 127.0.0.1, so a loopback
    address there is replaced by ``peer_address`` (the connection's) when known, in ``address``
    and in ``interfaces.router.ip`` (where Hermes' Client connects). Its missing
    ``function`` is ``""`` and its missing ``heartbeat`` is ``hermes_heartbeat``."""
    if registration_form(value) == HERMES:
        value = _from_hermes(value, peer_address, hermes_heartbeat)
    reasons: list[str] = []
    info = {k: v for k, v in value.items() if k != "token"}
    try:
        info["name"] = service_name(value.get("name"))
    except Invalid as error:
        reasons += error.reasons
    original = "ip_addr" in value and "address" not in value
    address = value.get("address", value.get("ip_addr"))
    if not isinstance(address, str) or not address:
        reasons.append("address (or ip_addr) must be a host name or IP address")
    info["address"] = address
    info.pop("ip_addr", None)
    port = value.get("port")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        reasons.append("port must be a whole number 0-65535")
    function = value.get("function", "" if original else None)
    if not isinstance(function, str):
        reasons.append("function must be text")
    info["function"] = function
    heartbeat = value.get("heartbeat")
    if heartbeat is None and "liveliness" in value:
        liveliness = value["liveliness"]
        heartbeat = liveliness / 1000 if _number(liveliness) else None
    if not _number(heartbeat) or not 0.05 <= heartbeat <= 3600:  # type: ignore[operator]
        reasons.append("heartbeat must be seconds between 0.05 and 3600")
    info["heartbeat"] = heartbeat
    if "heartbeat_port" in value:
        hb_port = value["heartbeat_port"]
        if isinstance(hb_port, bool) or not isinstance(hb_port, int) or not 0 < hb_port <= 65535:
            reasons.append("heartbeat_port must be a whole number 1-65535")
    if reasons:
        raise Invalid(reasons)
    return info


def _hermes_router(value: Mapping[str, Any]) -> tuple[Any, Any]:
    interfaces = value.get("interfaces")
    router = interfaces.get("router") if isinstance(interfaces, dict) else None
    if not isinstance(router, dict):
        return None, None
    return router.get("ip"), router.get("port")


def _from_hermes(
    value: Mapping[str, Any], peer_address: str | None, heartbeat: float
) -> dict[str, Any]:
    address, port = _hermes_router(value)
    fields = dict(value)
    if peer_address and _loopback(address):
        address = peer_address
        # Hermes' Client connects to interfaces.router.ip, not to address: a client on
        # another host must be sent where the service really is (the connection's).
        interfaces = fields["interfaces"]
        fields["interfaces"] = {**interfaces, "router": {**interfaces["router"], "ip": address}}
    return {
        **fields,
        "address": address,
        "port": port,
        "function": value.get("function", ""),
        "heartbeat": value.get("heartbeat", heartbeat),
    }


def _loopback(address: Any) -> bool:
    return isinstance(address, str) and (address == "localhost" or address.startswith("127."))


def merged(info: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """An update's fields merged into a registration, checked as a registration. A new
    ``interfaces.router`` (Hermes' form) moves the port, and the address unless loopback."""
    changes = dict(update)
    if "ip_addr" in changes and "address" not in changes:
        changes["address"] = changes.pop("ip_addr")
    if "interfaces" in update:
        address, port = _hermes_router(update)
        if port is not None:
            changes.setdefault("port", port)
        if address is not None and not _loopback(address):
            changes.setdefault("address", address)
    return registration({**info, **changes})


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


# -- UDP ----------------------------------------------------------------------------------------


def encode_udp_heartbeat(name: str, now: float) -> bytes:
    """The UDP heartbeat datagram of service ``name``: ``<3``, the time, the name."""
    return UDP_HEARTBEAT + _F64.pack(now) + name.encode("utf-8")


def parse_udp_heartbeat(data: bytes) -> tuple[float, str]:
    """The time and the service name of a UDP heartbeat; :class:`DbpError` for anything else."""
    if not data.startswith(UDP_HEARTBEAT):
        raise DbpError("datagram is not a heartbeat", "udp-command")
    if len(data) < 11:
        raise DbpError("heartbeat datagram too short", "udp-size")
    if len(data) > 10 + MAX_NAME_BYTES:
        raise DbpError("heartbeat datagram too long", "udp-size")
    now: float = _F64.unpack_from(data, 2)[0]
    if not math.isfinite(now):
        raise DbpError("heartbeat time is not a finite number", "time-value")
    try:
        name = data[10:].decode("utf-8")
    except UnicodeDecodeError:
        raise DbpError("heartbeat name is not UTF-8", "bad-text") from None
    return now, name


def encode_beacon(port: int) -> bytes:
    """The catalog's beacon, ``SHALOM <port>``."""
    return BEACON_PREFIX + str(port).encode("ascii")


def parse_beacon(data: bytes) -> int:
    """The catalog's port from its beacon; :class:`DbpError` for anything else."""
    if not data.startswith(BEACON_PREFIX) or len(data) > 16:
        raise DbpError("not a SHALOM beacon", "beacon")
    digits = data[len(BEACON_PREFIX) :]
    if not digits.isdigit() or not 0 < int(digits) <= 65535:
        raise DbpError("SHALOM beacon without a port", "beacon")
    return int(digits)
