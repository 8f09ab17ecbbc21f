"""CURVE on a service's server sockets, one way for every service: options, keys, ZAP, counts.

A service that serves ZeroMQ ports takes :data:`bus.transport.curve_settings.CURVE_OPTIONS`
(``--server-cert FILE``: CURVE on; ``--client-certs DIR``: only the keys of the ``*.key``
certificates in DIR, re-read when they change; mc0 takes them from
:func:`bus.transport.curve_settings.curve_options` and, without ``--server-cert``, keeps a key
pair in its data directory, :attr:`CurveSettings.key_dir`), builds its
:class:`bus.transport.curve_settings.CurveSettings`, and gives each
server socket to :meth:`ServerCurve.secure` before binding it. What a key may do is in the
metadata of its certificate in DIR (see docs/security.md); a service reads it for a message
with :meth:`ServerCurve.metadata` of the message's ``User-Id`` (``SocketOptions.peer_user_ids``)
and may refuse a key per socket at the handshake with a ZAP policy.

Refusals are counted by reason: ``unknown-key`` (not in the allow-list), a policy's reason
(``role``), and handshakes that failed before ZAP was asked (``handshake``: a wrong server
key, a plain-text client, a broken CURVE hello).
"""

from __future__ import annotations

import ipaddress
import weakref
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import zmq
from twisted.logger import Logger

from bus.errors import StartupError
from bus.transport.certs import check_key, refuse_certificates
from bus.transport.curve import (
    ClientCurve,
    CurveKeyPair,
    KeyFileError,
    ZapHandler,
    ZapPolicy,
    load_key_pair,
    make_curve_server,
    public_keys_in,
    server_key_pair,
)
from bus.transport.curve_settings import CurveSettings
from bus.util.metrics import Metric, counters_by, gauge

log = Logger(namespace="bus.transport.security")

T = TypeVar("T")

# Handshakes that failed before ZAP was asked; ZAP's own refusals (FAILED_AUTH) are
# counted by the ZAP handler, with their reason.
_FAILED_HANDSHAKE = zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL


class ServerCurve:
    """The CURVE side of one service: its key pair, the ZAP handler of its sockets' context,
    the allow-list's reloads, and the refusals, for ``status()`` and ``metrics()``.

    ``service`` names the metrics (``<service>_curve_refusals``) and log lines. With
    settings that are not :attr:`CurveSettings.enabled` everything is a no-op and
    :meth:`secure` leaves sockets in plain text.
    """

    def __init__(
        self,
        service: str,
        settings: CurveSettings,
        clock: Callable[[], float],
        policy: ZapPolicy | None = None,
        options: tuple[str, str] = ("server-cert", "client-certs"),
    ) -> None:
        """``options``: how the service spells its two options, for start-up errors."""
        self.service = service
        self._options = options
        self.settings = settings
        self._clock = clock
        self._policy = policy
        self.keys: CurveKeyPair | None = None
        self.zap: ZapHandler | None = None
        self.handshake_failures = 0
        self._rights: dict[tuple[Callable[[Mapping[str, str]], Any], str], Any] = {}
        self._rights_of: object = None
        #: Called after the allow-list was re-read (a service may look at its rights anew).
        self.on_reload: list[Callable[[], None]] = []
        #: Whether the allow-list is re-read periodically.
        self._reloading = False
        #: The sockets :meth:`secure` made CURVE servers, with their ZAP domains.
        self.secured: list[tuple[Any, str]] = []

    @property
    def enabled(self) -> bool:
        """The service's ports speak CURVE."""
        return self.settings.enabled

    def load(self) -> None:
        """Read the server's key pair (or the kept one, made on first start) and check the
        allow-list: a StartupError naming the option at fault. Call before :meth:`start`."""
        settings = self.settings
        if settings.server_cert is not None:
            try:
                self.keys = load_key_pair(settings.server_cert)
            except KeyFileError as error:
                raise StartupError(self._options[0], str(error)) from None
        elif settings.key_dir is not None:
            self.keys = self._kept_keys(settings.key_dir)
        else:
            return
        directory = settings.client_certs
        if directory is None:
            return
        if not directory.is_dir():
            raise StartupError(self._options[1], f"{directory} is not a directory")
        if not public_keys_in(directory):
            log.warn(
                "{service}: --client-certs {directory} holds no *.key certificate: no client "
                "can connect until one is added",
                service=self.service,
                directory=str(directory),
            )

    def _kept_keys(self, directory: Path) -> CurveKeyPair:
        """The key pair kept in ``directory``, made (and said) on first start."""
        try:
            keys, created = server_key_pair(directory)
        except (KeyFileError, OSError) as error:
            # key_dir is only ever a service's --data-dir.
            raise StartupError("data-dir", f"server key pair: {error}") from None
        if created:
            log.info(
                "created the {service} server key pair {path}.key[_secret]; public key {public}",
                service=self.service,
                path=str(directory / "server"),
                public=keys.public.decode("ascii"),
            )
        return keys

    def start(self, factory: Any, periodic: Any) -> None:
        """Bind the ZAP handler in ``factory``'s context (before any secured socket binds)
        and re-read the allow-list every ``reload_interval`` through ``periodic``."""
        if self.keys is None:
            return
        self.zap = ZapHandler(
            factory,
            self.settings.client_certs,
            self._clock,
            policy=self._policy,
            trusted=self.keys.public,
        )
        if self.settings.client_certs is not None:
            self._reloading = True
            periodic.every(self.settings.reload_interval, self._reload)
        _SERVING.add(self)

    def _reload(self) -> None:
        if self.zap is not None and self.zap.reload():
            for callback in list(self.on_reload):
                callback()

    def reread(self) -> None:
        """Read the allow-list again now, if it changed (a SIGHUP)."""
        self._reload()

    def change_client_certs(self, directory: Path | None, periodic: Any) -> bool:
        """Take the allow-list from ``directory`` from now on (None: any client key, each
        with every right), re-read at once; False when CURVE is off (it changes at the
        next start). Connections already made stay."""
        if self.zap is None:
            return False
        self.settings = replace(self.settings, client_certs=directory)
        self.zap.allowed_dir = directory
        if directory is None:
            self.zap.certificates, self.zap.allowed_keys = {}, 0
        self.zap.configure()
        log.info(
            "{service}: client certificates now {directory}: {count} keys allowed",
            service=self.service,
            directory=str(directory) if directory is not None else "any key",
            count=self.zap.allowed_keys if directory is not None else "any",
        )
        if directory is not None and not self._reloading:
            self._reloading = True
            periodic.every(self.settings.reload_interval, self._reload)
        for callback in list(self.on_reload):
            callback()
        return True

    def uses(self, entry: str) -> bool:
        """Whether a certificate of the allow-list has ``entry`` in its metadata: where
        none has, no message needs its key's rights. Asked at start and after a re-read."""
        certificates = self.zap.certificates if self.zap is not None else {}
        return any(entry in metadata for metadata in certificates.values())

    def own_client(self) -> ClientCurve | None:
        """CURVE for a client in this process (the composed Spark bridge): the server's
        own key pair, which ZAP lets in with every right; None when CURVE is off."""
        if self.keys is None:
            return None
        return ClientCurve(self.keys.public, self.keys)

    def secure(self, sock: Any, domain: str) -> None:
        """Make ``sock`` a CURVE server whose handshakes ZAP decides as ``domain``, and
        count its failed handshakes; call before binding it. Plain text when CURVE is off."""
        if self.keys is None:
            return
        assert self.zap is not None, "start() binds ZAP before sockets are secured"
        self.zap.add_domain(domain)
        make_curve_server(sock, self.keys, zap_domain=domain)
        sock.watch_connections(on_event=self._on_event)
        self.secured.append((sock, domain))

    def refuse(self, public: bytes) -> dict[str, Any]:
        """Refuse the client key ``public`` (Z85) from now on, and close the connections it
        holds: an operator's action (see :func:`refuse_everywhere`). Its certificates are
        moved out of the allow-list (``DIR/refused/``: the list, which other processes and
        hosts may read, says it too, and moving one back allows the key again); the key
        is refused in this process until it restarts all the same, whether or not the list
        could be changed. On each port the key was let in on since the start, the
        connections from the addresses it came from are cut (libzmq cannot tell which
        connection is the key's: others from the same address connect again at once,
        through ZAP again). What was done, as JSON."""
        zap = self.zap
        if self.keys is None or zap is None:
            return {"curve": False}
        if public == self.keys.public:
            raise ValueError("that is the server's own key, which is always let in")
        done: dict[str, Any] = {"curve": True, "was_refused": public in zap.denied_keys}
        zap.denied_keys.add(public)
        if zap.allowed_dir is not None:
            try:
                moved = refuse_certificates(zap.allowed_dir, public)
            except OSError as error:
                done["allow_list_error"] = f"{error.filename}: {error.strerror}"
                moved = []
            done["moved"] = [str(path) for path in moved]
            self._reload()  # the list re-read now, not at its next look
            if "allow_list_error" not in done and public not in zap.certificates:
                # The list refuses it too (moved here, or by another service of the
                # process sharing the list): a certificate of it back there allows it.
                zap.denied_by_list.add(public)
        on = zap.accepted_on.pop(public, {}) if zap.accepted_on is not None else None
        cut: dict[str, int] = {}
        for sock, domain in self.secured:
            if sock.closed:
                continue
            if on is None:  # too many keys to know where this one is: every connection
                count = sock.cut_connections()
            else:
                count = sum(sock.cut_connections(address) for address in on.get(domain, ()))
            if count:
                cut[sock.name] = cut.get(sock.name, 0) + count
        done["connections_cut"] = cut
        log.warn(
            "{service}: CURVE key {key} refused by an operator; certificates moved: {moved}; "
            "connections cut: {cut}",
            service=self.service,
            key=public.decode("ascii"),
            moved=", ".join(done.get("moved", [])) or "none",
            cut=", ".join(f"{n} on {name}" for name, n in cut.items()) or "none",
        )
        return done

    def _on_event(self, event: int) -> None:
        if event & _FAILED_HANDSHAKE:
            self.handshake_failures += 1

    def metadata(self, user_id: str) -> Mapping[str, str]:
        """What the certificate of the key behind ``user_id`` (a message's User-Id) says;
        empty without an allow-list (the key may do everything)."""
        if self.zap is None or not user_id:
            return {}
        return self.zap.metadata(user_id)

    def rights(self, user_id: str, read: Callable[[Mapping[str, str]], T]) -> T:
        """``read(metadata)`` of the key behind ``user_id``, kept until the allow-list is
        re-read: a service's per-message check is then one dictionary lookup."""
        certificates = self.zap.certificates if self.zap is not None else None
        if certificates is not self._rights_of:
            self._rights.clear()
            self._rights_of = certificates
        try:
            return self._rights[read, user_id]  # type: ignore[no-any-return]
        except KeyError:
            value = self._rights[read, user_id] = read(self.metadata(user_id))
            return value

    @property
    def refusals(self) -> dict[str, int]:
        """Refused peers by reason (see the module's docstring)."""
        counts: Counter[str] = Counter(self.zap.refusals if self.zap is not None else {})
        if self.handshake_failures:
            counts["handshake"] += self.handshake_failures
        return dict(counts)

    def log_security(self, endpoints: Sequence[str]) -> None:
        """What a started service's operator should know: its public key (what clients
        need as ``--server-key``) and whom it lets in."""
        if self.keys is None:
            return
        log.info(
            "{service} on {endpoints} speaks CURVE; server public key {public}",
            service=self.service,
            endpoints=", ".join(endpoints),
            public=self.keys.public.decode("ascii"),
        )
        if self.zap is None or self.zap.allowed_dir is None:
            log.warn(
                "{service}: any CURVE client key is accepted (no --client-certs allow-list); "
                "traffic is still encrypted",
                service=self.service,
            )
        else:
            log.info(
                "{service}: only the {count} client keys in {directory} are accepted",
                service=self.service,
                count=self.zap.allowed_keys,
                directory=str(self.zap.allowed_dir),
            )

    def warn_if_open(self, bind: str, ports: Sequence[str]) -> None:
        """One warning line when ``bind`` is not a loopback address and CURVE is off."""
        if self.keys is not None or is_loopback(bind):
            return
        log.warn(
            "{service}: {ports} on {bind} WITHOUT CURVE: open to anyone who can reach them "
            "(give --server-cert and --client-certs)",
            service=self.service,
            ports=", ".join(ports),
            bind=bind,
        )

    def status(self) -> dict[str, Any]:
        """Security, server key, allow-list and refusals, for ``/status``."""
        zap = self.zap
        return {
            "security": "curve" if self.keys is not None else "plain",
            "server_public_key": self.keys.public.decode() if self.keys is not None else None,
            "allow_list": str(self.settings.client_certs) if self.settings.client_certs else None,
            "allowed_keys": zap.allowed_keys if zap is not None and zap.allowed_dir else None,
            "accepted": zap.accepted if zap is not None else 0,
            "refused": self.refusals,
            "refused_keys": self.refused_keys(),
            "denied_keys": sorted(k.decode("ascii") for k in zap.denied_keys) if zap else [],
        }

    def refused_keys(self) -> list[dict[str, Any]]:
        """The keys refused most recently, the latest first."""
        if self.zap is None:
            return []
        return [dict(entry) for entry in reversed(self.zap.recent_refusals.values())]

    def metrics(self) -> list[Metric]:
        """Whether CURVE is on, and the handshakes refused by reason, for ``/metrics``."""
        service = self.service.replace("-", "_")
        return [
            gauge(
                f"{service}_curve",
                "1 when the service's ports speak CURVE",
                float(self.keys is not None),
            ),
            counters_by(
                f"{service}_curve_refusals",
                "Peers refused at the CURVE handshake, by reason (unknown-key, role, "
                "handshake: a wrong server key or plain text)",
                "reason",
                self.refusals,
            ),
        ]

    def stop(self) -> None:
        """Close the ZAP socket (the factory closes the rest)."""
        _SERVING.discard(self)
        self.secured.clear()
        if self.zap is not None:
            self.zap.shutdown()
            self.zap = None


def is_loopback(bind: str) -> bool:
    """Whether ``bind`` (an address, ``localhost`` or an interface name) is loopback only."""
    host = bind.strip("[]")
    if host in ("localhost", "lo"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # an interface name or "*": assume reachable from elsewhere


#: The CURVE sides of the services started in this process.
_SERVING: weakref.WeakSet[ServerCurve] = weakref.WeakSet()


def curve_serving() -> bool:
    """Whether a service of this process speaks CURVE now."""
    return any(curve.keys is not None for curve in _SERVING)


def refuse_everywhere(key: str) -> dict[str, Any]:
    """Refuse a client key (Z85) on every CURVE port of this process now (see
    :meth:`ServerCurve.refuse`), by service; ValueError for a key that is not one, or the
    server's own, and LookupError when no service of the process speaks CURVE."""
    try:
        public = check_key(key.strip(), "the key")
    except KeyFileError as error:
        raise ValueError(str(error).removeprefix("<key>: ")) from None
    curves = sorted((c for c in _SERVING if c.keys is not None), key=lambda c: c.service)
    if not curves:
        raise LookupError("no service of this process speaks CURVE")
    return {curve.service: curve.refuse(public) for curve in curves}
