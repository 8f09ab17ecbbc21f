"""The CURVE settings every ZeroMQ service takes, as options and as plain data (imported at
option-parsing time: no ZeroMQ import here). :mod:`bus.transport.security` applies them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def curve_options(kept_key: bool = False) -> list[list[Any]]:
    """``--server-cert`` and ``--client-certs``. ``kept_key``: the service speaks CURVE
    unless told ``--plain``, with a key pair it keeps in its data directory when no
    ``--server-cert`` is given (mc0); otherwise CURVE is off until ``--server-cert``."""
    if kept_key:
        cert = (
            "Serve over CURVE with this secret key (NAME.key_secret as bus-keys writes it, or "
            "a file of the 40-character Z85 secret key). Without it, the key pair kept in "
            "DATA-DIR (made on first start); --plain turns CURVE off."
        )
        certs = (
            "Accept only the client keys of the *.key certificates in this directory (re-read "
            "when it changes); without it any client key is accepted, still encrypted."
        )
    else:
        cert = (
            "Serve over CURVE with this secret key (NAME.key_secret as bus-keys writes it, or "
            "a file of the 40-character Z85 secret key). Off by default."
        )
        certs = (
            "With --server-cert: accept only the client keys of the *.key certificates in "
            "this directory (re-read when it changes); their metadata says what each key may do."
        )
    return [["server-cert", None, None, cert], ["client-certs", None, None, certs]]


#: Options of every service that serves ZeroMQ ports (prefixed when composed:
#: ``--emqp-server-cert``; ``EMQP_SERVER_CERT``; ``server-cert`` in the ``[emqp]`` table).
CURVE_OPTIONS: list[list[Any]] = curve_options()


@dataclass(frozen=True, slots=True)
class CurveSettings:
    """``server_cert`` and ``key_dir`` None: plain text (no encryption, any peer)."""

    server_cert: Path | None = None
    client_certs: Path | None = None
    reload_interval: float = 2.0
    #: Without ``server_cert``: CURVE with the key pair kept in this directory (made on
    #: first start).
    key_dir: Path | None = None

    @property
    def enabled(self) -> bool:
        """CURVE is on: a server certificate was given, or a key pair is kept in ``key_dir``."""
        return self.server_cert is not None or self.key_dir is not None


def curve_settings(options: Mapping[str, Any], key_dir: Path | None = None) -> CurveSettings:
    """The CURVE settings of a service's parsed options (:func:`curve_options`); with
    ``key_dir``, CURVE with the key pair kept there unless ``--server-cert`` names one."""
    from twisted.python import usage

    cert, certs = options.get("server-cert"), options.get("client-certs")
    if certs and not cert and key_dir is None:
        raise usage.UsageError("--client-certs needs --server-cert (CURVE)")
    return CurveSettings(
        Path(cert) if cert else None, Path(certs) if certs else None, key_dir=key_dir
    )


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
