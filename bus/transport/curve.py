"""CURVE security for ZeroMQ sockets (RFC 25/ZMTP-CURVE, through libzmq): key files and ZAP.

Key files are zcert certificates as pyzmq's ``zmq.auth`` and CZMQ write them: ``NAME.key``
holds the public key, ``NAME.key_secret`` both keys (Z85 text in a ``curve`` section). A
server's secret key may also be a plain file holding the 40-character Z85 secret key (the
C++ mc0d's format); its public key is derived from it.

ZAP (RFC 27) authenticates clients: :class:`ZapHandler` binds ``inproc://zeromq.zap.01`` in
the context of the sockets it guards, reads requests on the reactor like any other socket,
and lets pyzmq's ``zmq.auth.Authenticator`` speak ZAP, deciding each key itself: against an
allow-list directory of client ``*.key`` certificates (their metadata says what each key may
do, :mod:`bus.transport.certs`) and a service's policy per socket, or any key. No ZAP frame is
parsed here, and no thread is started.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq
import zmq.auth
from twisted.logger import Logger
from zmq.utils import z85

# KeyFileError is defined with the certificates and raised here too: named from either module.
from bus.transport.certs import KeyFileError as KeyFileError
from bus.transport.certs import (
    certificates_in,
    check_key,
    directory_signature,
    generate_key_pair,
    write_certificate,
)
from bus.util.droplog import RateLimit

log = Logger(namespace="bus.transport.curve")

ZAP_ENDPOINT = "inproc://zeromq.zap.01"

#: How many keys a ZAP handler remembers the sockets of (see ``ZapHandler.accepted_on``).
ACCEPTED_MEMORY = 10_000
#: How many recently refused keys a ZAP handler remembers (for /status and the console).
RECENT_REFUSALS = 20
_Z85_KEY_LENGTH = 40
_NO_METADATA: Mapping[str, str] = {}


@dataclass(frozen=True, slots=True)
class CurveKeyPair:
    """Z85-encoded keys (40 ASCII bytes each); ``secret`` is None for a public certificate."""

    public: bytes
    secret: bytes | None

    @classmethod
    def generate(cls) -> CurveKeyPair:
        """A new key pair (its public key never begins with a zero octet: zyre-safe)."""
        public, secret = generate_key_pair()
        return cls(public, secret)


def _check_key(key: bytes, what: str, path: Path) -> bytes:
    return check_key(key, what, path)


def create_key_pair(
    directory: Path | str, name: str, metadata: Mapping[str, str] | None = None
) -> tuple[Path, Path]:
    """Write ``NAME.key`` and ``NAME.key_secret`` (readable by its owner only) in
    ``directory``, creating it, with ``metadata`` in both; refuse to overwrite a key. The
    public key never begins with a zero byte (zyre would ignore such a node's beacons)."""
    public, secret = generate_key_pair()
    public_path, secret_path = write_certificate(directory, name, public, secret, metadata or {})
    assert secret_path is not None
    return public_path, secret_path


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
    return sorted(certificates_in(directory))


# -- sockets ----------------------------------------------------------------------------------


def make_curve_server(sock: Any, keys: CurveKeyPair, zap_domain: str = "") -> None:
    """Make a socket a CURVE server; call before bind. ``zap_domain`` names the socket to
    the ZAP handler's policy (its ``add_domain`` must know it)."""
    if keys.secret is None:
        raise ValueError("a CURVE server needs its secret key")
    raw = sock.socket
    if zap_domain:
        raw.zap_domain = zap_domain.encode("ascii")
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


@dataclass(frozen=True, slots=True)
class ClientCurve:
    """What a client needs to speak CURVE to a server: its public key and our key pair."""

    server_key: bytes
    keys: CurveKeyPair
    #: Where ``keys`` came from, for messages: the ``--cert`` file, ``"fresh"`` for a key
    #: made because none was given, ``""`` when the caller gave the pair.
    origin: str = field(default="", compare=False)

    def apply(self, sock: Any) -> None:
        """Make ``sock`` a CURVE client of the server; call before connect."""
        make_curve_client(sock, self.server_key, self.keys)


def client_curve(server_key: str | Path | None, cert: str | Path | None) -> ClientCurve | None:
    """CURVE for a client given ``--server-key`` (40 Z85 characters or a ``.key`` file) and
    ``--cert`` (its secret certificate; without one a fresh key, which only a server without
    an allow-list accepts); None without a server key (plain text). Raises KeyFileError."""
    if not server_key:
        if cert:
            raise KeyFileError("--cert needs --server-key (the server's public key)")
        return None
    keys = load_key_pair(cert) if cert else CurveKeyPair.generate()
    return ClientCurve(load_public_key(server_key), keys, str(cert) if cert else "fresh")


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


#: Decides, after the allow-list, whether a key may use a socket of a ZAP domain: None lets
#: it in, a short reason (``"role"``) refuses it. Gets the domain, the Z85 key and the
#: metadata of the key's certificate (empty without an allow-list).
ZapPolicy = Callable[[str, bytes, Mapping[str, str]], "str | None"]


def role_policy(role_of_domain: Mapping[str, str]) -> ZapPolicy:
    """A key whose certificate names roles (``role = worker, client``) connects only to
    the ports of those roles (the ZAP domains of ``role_of_domain``), refused at the CURVE
    handshake as ``role``; a key without ``role`` to every port."""

    def policy(domain: str, key: bytes, metadata: Mapping[str, str]) -> str | None:
        roles = metadata.get("role")
        if roles is None:
            return None
        wanted = role_of_domain.get(domain)
        allowed = {part.strip() for part in roles.split(",")}
        return None if wanted is None or wanted in allowed else "role"

    return policy


class _KeyCheck:
    """The credentials provider zmq.auth calls for every CURVE handshake of a domain."""

    def __init__(self, handler: ZapHandler) -> None:
        self._handler = handler

    def callback(self, domain: str, key: bytes) -> bool:
        return self._handler._decide(domain, key)


class ZapHandler:
    """ZAP on the reactor for the sockets of one context (one ``SocketFactory``).

    ``allowed_dir`` None accepts any CURVE client key; otherwise only keys of the ``*.key``
    certificates in it (re-read by :meth:`reload`), whose metadata (:attr:`certificates`)
    says what each key may do. ``policy`` may refuse a key per ZAP domain (each socket's
    ``zap_domain``, see :func:`make_curve_server`). Decisions are counted in
    :attr:`accepted`, :attr:`denied` and :attr:`refusals` (by reason); denials are logged,
    rate-limited, with the key.
    """

    def __init__(
        self,
        factory: Any,
        allowed_dir: Path | None,
        clock: Callable[[], float],
        on_decision: Callable[[bool, bytes], None] | None = None,
        policy: ZapPolicy | None = None,
        trusted: bytes | None = None,
    ) -> None:
        from bus.transport.zmqsocket import SocketOptions

        self.allowed_dir = allowed_dir
        self.accepted = 0
        self.denied = 0
        self.refusals: Counter[str] = Counter()
        self.allowed_keys = 0
        #: The keys refused most recently (Z85 -> times, reason, when, from where), at most
        #: :data:`RECENT_REFUSALS`, the latest last: what an operator looks for first.
        self.recent_refusals: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._clock = clock
        #: Z85 public key -> its certificate's metadata, from the allow-list.
        self.certificates: dict[bytes, Mapping[str, str]] = {}
        self._policy = policy
        #: A key let in everywhere with every right: the server's own (whoever holds it
        #: holds the server's secret), for clients in the server's own process.
        self._trusted = trusted
        self._domains: set[str] = {"*"}
        #: Keys an operator refused (Z85): refused whatever the allow-list says, until the
        #: process restarts or (for one whose certificates were moved out of the list) the
        #: list holds its key again.
        self.denied_keys: set[bytes] = set()
        #: Of those, the keys whose certificates were moved out of the allow-list.
        self.denied_by_list: set[bytes] = set()
        #: Key (Z85) -> ZAP domain (socket) -> the addresses it was let in from there since
        #: the start, for at most :data:`ACCEPTED_MEMORY` keys (beyond: None, any key may
        #: be anywhere).
        self.accepted_on: dict[bytes, dict[str, set[str]]] | None = {}
        self._refusal = ""
        self._on_decision = on_decision
        self._limit = RateLimit(clock, 10.0)
        self._envelope: list[bytes] | None = None
        self._request: list[bytes] = []
        self._signature: tuple[object, ...] | None = None
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

    def add_domain(self, domain: str) -> None:
        """Decide handshakes of sockets whose ``zap_domain`` is ``domain`` too."""
        self._domains.add(domain)
        self.configure(reread=False)

    def configure(self, reread: bool = True) -> None:
        """Set the allow-list (a directory of client ``*.key`` files) or allow any key."""
        auth = self.authenticator
        if self.allowed_dir is None and self._policy is None:
            auth.configure_curve(domain="*", location=zmq.auth.CURVE_ALLOW_ANY)
            return
        if self.allowed_dir is not None and reread:
            self._signature = self._directory_signature()
            self.certificates = {
                key: cert.metadata for key, cert in certificates_in(self.allowed_dir).items()
            }
            self.allowed_keys = len(self.certificates)
            back = self.denied_by_list & self.certificates.keys()
            if back:  # an operator moved a refused key's certificate back: allowed again
                self.denied_keys -= back
                self.denied_by_list -= back
        check = _KeyCheck(self)
        for domain in self._domains:
            auth.configure_curve_callback(domain=domain, credentials_provider=check)

    def _decide(self, domain: str, key: bytes) -> bool:
        if key == self._trusted:
            return True
        if key in self.denied_keys:
            self._refusal = "refused"
            return False
        if self.allowed_dir is None:
            metadata: Mapping[str, str] = {}
        else:
            found = self.certificates.get(key)
            if found is None:
                self._refusal = "unknown-key"
                return False
            metadata = found
        if self._policy is not None:
            refusal = self._policy(domain, key, metadata)
            if refusal is not None:
                self._refusal = refusal
                return False
        return True

    def metadata(self, user_id: str) -> Mapping[str, str]:
        """The metadata of the certificate of the key ZAP accepted as ``user_id`` (a
        message's ``User-Id``): empty without an allow-list or for a key removed since."""
        return self.certificates.get(user_id.encode("ascii", "replace"), _NO_METADATA)

    def _directory_signature(self) -> tuple[object, ...]:
        assert self.allowed_dir is not None
        return directory_signature(self.allowed_dir)

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
            self._refusal = ""
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
            self._note_accepted(key)
        else:
            self.denied += 1
            why = self._refusal or (
                reply[3].decode("utf-8", "replace") if len(reply) > 3 else "refused"
            )
            self.refusals[why] += 1
            shown = z85.encode(key).decode("ascii") if len(key) == 32 else key.hex()
            address = self._request[3].decode("utf-8", "replace") if len(self._request) > 3 else ""
            self._remember_refusal(shown, why, address)
            count = self._limit.due("denied")
            if count is not None:
                log.warn(
                    "refused {count} CURVE client(s) ({why}); latest key {key} from {address}",
                    count=count,
                    why=why,
                    key=shown,
                    address=address,
                )
        if self._on_decision is not None:
            self._on_decision(accepted, key)
        self.socket.send_frames([*envelope, *reply])

    def _note_accepted(self, key: bytes) -> None:
        accepted_on = self.accepted_on
        if accepted_on is None or len(key) != 32:
            return
        request = self._request
        domain = request[2].decode("utf-8", "replace") if len(request) > 2 else ""
        address = request[3].decode("utf-8", "replace") if len(request) > 3 else ""
        on = accepted_on.setdefault(z85.encode(key), {})
        on.setdefault(domain, set()).add(address)
        if len(accepted_on) > ACCEPTED_MEMORY:
            self.accepted_on = None

    def _remember_refusal(self, key: str, why: str, address: str) -> None:
        recent = self.recent_refusals
        entry = recent.pop(key, None) or {"key": key, "times": 0}
        entry.update(times=entry["times"] + 1, reason=why, address=address, at=self._clock())
        recent[key] = entry
        while len(recent) > RECENT_REFUSALS:
            recent.popitem(last=False)

    def shutdown(self) -> None:
        """Close the ZAP socket and stop authenticating."""
        self.socket.shutdown()
