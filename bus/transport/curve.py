"""CURVE security for ZeroMQ sockets (RFC 25/ZMTP-CURVE, through libzmq): key files and ZAP.

Key files are zcert certificates as pyzmq's ``zmq.auth`` and CZMQ write them: ``NAME.key``
holds the public key, ``NAME.key_secret`` both keys (Z85 text in a ``curve`` section). A
server's secret key may also be a plain file holding the 40-character Z85 secret key (the
C++ mc0d's format); its public key is derived from it.

ZAP (RFC 27) authenticates clients: :class:`ZapHandler` binds ``inproc://zeromq.zap.01`` in
the context of the sockets it guards, reads requests on the reactor like any other socket,
and lets pyzmq's ``zmq.auth.Authenticator`` decide (an allow-list directory of client
``*.key`` files, or any key). No ZAP frame is parsed here, and no thread is started.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq
import zmq.auth
from twisted.logger import Logger
from zmq.utils import z85

from bus.droplog import RateLimit

log = Logger(namespace="bus.transport.curve")

ZAP_ENDPOINT = "inproc://zeromq.zap.01"
_Z85_KEY_LENGTH = 40


class KeyFileError(Exception):
    """A key file is missing, unreadable or not a CURVE key."""


@dataclass(frozen=True, slots=True)
class CurveKeyPair:
    """Z85-encoded keys (40 ASCII bytes each); ``secret`` is None for a public certificate."""

    public: bytes
    secret: bytes | None

    @classmethod
    def generate(cls) -> CurveKeyPair:
        public, secret = zmq.curve_keypair()
        return cls(public, secret)


def _check_key(key: bytes, what: str, path: Path) -> bytes:
    if len(key) != _Z85_KEY_LENGTH:
        raise KeyFileError(f"{path}: {what} is not a 40-character Z85 CURVE key")
    try:
        z85.decode(key)
    except (ValueError, KeyError, TypeError):
        raise KeyFileError(f"{path}: {what} is not valid Z85") from None
    return key


def create_key_pair(directory: Path | str, name: str) -> tuple[Path, Path]:
    """Write ``NAME.key`` and ``NAME.key_secret`` (readable by its owner only) in
    ``directory``, creating it; refuse to overwrite an existing pair."""
    directory = Path(directory)
    public, secret = directory / f"{name}.key", directory / f"{name}.key_secret"
    for path in (public, secret):
        if path.exists():
            raise KeyFileError(f"{path} exists: not overwriting a key")
    directory.mkdir(parents=True, exist_ok=True)
    old_umask = os.umask(0o077)  # the secret file is never readable by others, even briefly
    try:
        made_public, made_secret = zmq.auth.create_certificates(str(directory), name)
    finally:
        os.umask(old_umask)
    os.chmod(made_public, 0o644)
    return Path(made_public), Path(made_secret)


def load_key_pair(path: Path | str) -> CurveKeyPair:
    """A secret key from ``NAME.key_secret``, from ``NAME.key`` (its ``.key_secret`` sibling
    is read), or from a plain file holding the 40-character Z85 secret key."""
    path = Path(path)
    text = _read(path)
    stripped = text.strip()
    if len(stripped) == _Z85_KEY_LENGTH and b"\n" not in stripped:
        secret = _check_key(stripped, "the secret key", path)
        return CurveKeyPair(zmq.curve_public(secret), secret)
    if b"secret-key" not in text and path.suffix == ".key":
        path = path.with_name(path.name + "_secret")  # a public certificate: its sibling
        _read(path)
    try:
        public, maybe_secret = zmq.auth.load_certificate(str(path))
    except (ValueError, OSError) as error:
        raise KeyFileError(f"{path}: not a CURVE certificate ({error})") from None
    if maybe_secret is None:
        raise KeyFileError(f"{path}: holds no secret key")
    _check_key(public, "the public key", path)
    _check_key(maybe_secret, "the secret key", path)
    if zmq.curve_public(maybe_secret) != public:
        raise KeyFileError(f"{path}: the public key does not match the secret key")
    return CurveKeyPair(public, maybe_secret)


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as error:
        raise KeyFileError(f"{path}: {error.strerror or error}") from None


def load_public_key(value: str | Path) -> bytes:
    """A public key given as its 40 Z85 characters, or as a certificate file (``.key``)."""
    text = str(value)
    if len(text) == _Z85_KEY_LENGTH and not Path(text).exists():
        return _check_key(text.encode("ascii", "replace"), "the key", Path("<argument>"))
    path = Path(value)
    try:
        public, _secret = zmq.auth.load_certificate(str(path))
    except (ValueError, OSError) as error:
        raise KeyFileError(f"{path}: not a CURVE public key or certificate ({error})") from None
    return _check_key(public, "the public key", path)


def server_key_pair(data_dir: Path, name: str = "server") -> tuple[CurveKeyPair, bool]:
    """The key pair kept in ``data_dir`` (made on first use); True when it was just made."""
    secret = data_dir / f"{name}.key_secret"
    if secret.exists():
        return load_key_pair(secret), False
    create_key_pair(data_dir, name)
    return load_key_pair(secret), True


def public_keys_in(directory: Path) -> list[bytes]:
    """The public keys of the ``*.key`` certificates in ``directory``."""
    return sorted(zmq.auth.load_certificates(str(directory)))


# -- sockets ----------------------------------------------------------------------------------


def make_curve_server(sock: Any, keys: CurveKeyPair) -> None:
    """Make a socket a CURVE server; call before bind."""
    if keys.secret is None:
        raise ValueError("a CURVE server needs its secret key")
    raw = sock.socket
    raw.curve_server = True
    raw.curve_secretkey = keys.secret
    raw.curve_publickey = keys.public


def make_curve_client(sock: Any, server_public: bytes, keys: CurveKeyPair) -> None:
    """Make a socket a CURVE client of the server with ``server_public``; call before connect."""
    if keys.secret is None:
        raise ValueError("a CURVE client needs its secret key")
    raw = sock.socket
    raw.curve_serverkey = server_public
    raw.curve_publickey = keys.public
    raw.curve_secretkey = keys.secret


# -- ZAP --------------------------------------------------------------------------------------


class _LoggerBridge:
    """What ``zmq.auth`` logs (printf style, stdlib-like) goes to the Twisted logger; its
    per-request debug lines are dropped (the handler counts and logs decisions itself)."""

    def debug(self, message: str, *args: Any) -> None:
        pass

    def info(self, message: str, *args: Any) -> None:
        log.info("{line}", line=message % args if args else message)

    def warning(self, message: str, *args: Any) -> None:
        log.warn("{line}", line=message % args if args else message)

    def error(self, message: str, *args: Any) -> None:
        log.error("{line}", line=message % args if args else message)


class _ReplyChannel:
    """Stands in for the Authenticator's ``zap_socket``: its reply goes back through the
    ROUTER envelope of the request being decided."""

    def __init__(self, handler: ZapHandler) -> None:
        self._handler = handler

    def send_multipart(self, frames: Sequence[bytes]) -> None:
        self._handler._reply(list(frames))


class ReactorAuthenticator(zmq.auth.Authenticator):
    """pyzmq's authenticator, fed by :class:`ZapHandler` instead of its own REP socket."""

    def start(self) -> None:
        """Nothing to start: the ZapHandler owns the socket (pyzmq's would start a thread)."""

    def stop(self) -> None:
        """Nothing to stop: the ZapHandler closes the socket."""


class ZapHandler:
    """ZAP on the reactor for the sockets of one context (one ``SocketFactory``).

    ``allowed_dir`` None accepts any CURVE client key; otherwise only keys of the ``*.key``
    certificates in it (re-read by :meth:`reload`). Decisions are counted in
    :attr:`accepted` and :attr:`denied`; denials are logged, rate-limited.
    """

    def __init__(
        self,
        factory: Any,
        allowed_dir: Path | None,
        clock: Callable[[], float],
        on_decision: Callable[[bool, bytes], None] | None = None,
    ) -> None:
        from bus.transport.zmqsocket import SocketOptions

        self.allowed_dir = allowed_dir
        self.accepted = 0
        self.denied = 0
        self.allowed_keys = 0
        self._on_decision = on_decision
        self._limit = RateLimit(clock, 10.0)
        self._envelope: list[bytes] | None = None
        self._request: list[bytes] = []
        self._signature: tuple[tuple[str, float], ...] | None = None
        self.authenticator = ReactorAuthenticator(
            factory.txzmq_factory.context, log=_LoggerBridge()
        )
        self.authenticator.zap_socket = _ReplyChannel(self)  # type: ignore[assignment]
        self.configure()
        self.socket = factory.socket(
            zmq.ROUTER,
            self._on_requests,
            SocketOptions(linger_ms=0, tcp_keepalive_idle=None, send_hwm=10_000),
            name="zap",
        )
        self.socket.bind(ZAP_ENDPOINT)

    def configure(self) -> None:
        """Set the allow-list (a directory of client ``*.key`` files) or allow any key."""
        if self.allowed_dir is None:
            self.authenticator.configure_curve(domain="*", location=zmq.auth.CURVE_ALLOW_ANY)
            return
        self._signature = self._directory_signature()
        self.authenticator.configure_curve(domain="*", location=str(self.allowed_dir))
        self.allowed_keys = len(self.authenticator.certs.get("*", {}))

    def _directory_signature(self) -> tuple[tuple[str, float], ...]:
        assert self.allowed_dir is not None
        try:
            return tuple(
                sorted((p.name, p.stat().st_mtime) for p in self.allowed_dir.glob("*.key"))
            )
        except OSError:
            return ()

    def reload(self) -> bool:
        """Re-read the allow-list if a certificate was added, changed or removed."""
        if self.allowed_dir is None or self._directory_signature() == self._signature:
            return False
        self.configure()
        log.info(
            "client certificates in {directory} re-read: {count} keys allowed",
            directory=str(self.allowed_dir),
            count=self.allowed_keys,
        )
        return True

    def _on_requests(self, batch: list[list[bytes]]) -> None:
        for frames in batch:
            # [peer routing id, "", version, request id, domain, address, identity,
            #  mechanism, credentials...]: the envelope is ours, the rest zmq.auth's.
            try:
                split = frames.index(b"")
            except ValueError:
                continue
            self._envelope = frames[: split + 1]
            self._request = frames[split + 1 :]
            decision = self.authenticator.handle_zap_message(self._request)
            try:
                decision.send(None)
            except StopIteration:
                pass
            else:  # only an awaiting credentials provider suspends; none is configured
                decision.close()
                log.error("ZAP decision did not complete synchronously; request dropped")
            finally:
                self._envelope = None

    def _reply(self, reply: list[bytes]) -> None:
        envelope = self._envelope
        if envelope is None:
            return
        accepted = len(reply) > 2 and reply[2] == b"200"
        key = self._request[6] if len(self._request) > 6 else b""
        if accepted:
            self.accepted += 1
        else:
            self.denied += 1
            count = self._limit.due("denied")
            if count is not None:
                log.warn(
                    "refused {count} CURVE client(s) ({why}); latest key {key} from {address}",
                    count=count,
                    why=reply[3].decode("utf-8", "replace") if len(reply) > 3 else "",
                    key=z85.encode(key).decode("ascii") if len(key) == 32 else key.hex(),
                    address=self._request[3].decode("utf-8", "replace")
                    if len(self._request) > 3
                    else "",
                )
        if self._on_decision is not None:
            self._on_decision(accepted, key)
        self.socket.send_frames([*envelope, *reply])

    def shutdown(self) -> None:
        """Close the ZAP socket and stop authenticating."""
        self.socket.shutdown()
