"""The CURVE settings every ZeroMQ service takes, as options and as plain data (imported at
option-parsing time: no ZeroMQ import here). :mod:`bus.transport.security` applies them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Options of every service that serves ZeroMQ ports (prefixed when composed:
#: ``--emqp-server-cert``; ``EMQP_SERVER_CERT``; ``server-cert`` in the ``[emqp]`` table).
CURVE_OPTIONS: list[list[Any]] = [
    [
        "server-cert",
        None,
        None,
        "Serve over CURVE with this secret key (NAME.key_secret as bus-keys writes it, or a "
        "file of the 40-character Z85 secret key). Off by default.",
    ],
    [
        "client-certs",
        None,
        None,
        "With --server-cert: accept only the client keys of the *.key certificates in this "
        "directory (re-read when it changes); their metadata says what each key may do.",
    ],
]


@dataclass(frozen=True, slots=True)
class CurveSettings:
    """``server_cert`` None: plain text (no encryption, any peer)."""

    server_cert: Path | None = None
    client_certs: Path | None = None
    reload_interval: float = 2.0

    @property
    def enabled(self) -> bool:
        return self.server_cert is not None


def curve_settings(options: Mapping[str, Any]) -> CurveSettings:
    """The CURVE settings of a service's parsed options (:data:`CURVE_OPTIONS`)."""
    from twisted.python import usage

    cert, certs = options.get("server-cert"), options.get("client-certs")
    if certs and not cert:
        raise usage.UsageError("--client-certs needs --server-cert (CURVE)")
    return CurveSettings(Path(cert) if cert else None, Path(certs) if certs else None)


#: Options of a client run by twistd (the worker, the Spark bridge) that connects over CURVE.
CLIENT_CURVE_OPTIONS: list[list[Any]] = [
    [
        "server-key",
        None,
        None,
        "Connect over CURVE to a server with this public key (40 Z85 characters, or its "
        ".key file).",
    ],
    [
        "cert",
        None,
        None,
        "With --server-key: this client's secret key (NAME.key_secret); without it a fresh "
        "key, which only a server without an allow-list accepts.",
    ],
]


def client_curve_from(options: Mapping[str, Any]) -> Any:
    """The :class:`bus.transport.curve.ClientCurve` of parsed
    :data:`CLIENT_CURVE_OPTIONS`, or None (plain text); a usage error names a bad key file."""
    from twisted.python import usage

    from bus.transport.curve import KeyFileError, client_curve

    try:
        return client_curve(options.get("server-key"), options.get("cert"))
    except KeyFileError as error:
        raise usage.UsageError(str(error)) from None


def add_client_curve_arguments(parser: Any) -> None:
    """``--server-key`` and ``--cert`` on an argparse (sub)parser (the command-line tools)."""
    parser.add_argument(
        "--server-key",
        default=None,
        help="the server's CURVE public key (Z85 or its .key file): connect over CURVE",
    )
    parser.add_argument(
        "--cert",
        default=None,
        help="with --server-key: this client's secret key file (NAME.key_secret)",
    )
