"""The options that put a service's storage in NATS JetStream (``--store jetstream
--nats URLS`` and the stream's name, replicas, credentials and TLS), the same for every
service that has them: the Event BUS's log and eMQP's guaranteed requests; and those of a
service that ``--nats`` alone puts on a cluster (:func:`cluster_options`: eMQP's PUBLISH
service, DBP's shared catalog).

Secrets come from files (``--nats-password-file``, ``--nats-token-file``, ``--nats-nkey``,
``--nats-creds``) or the environment (``BUS_NATS_PASSWORD``, ``BUS_NATS_TOKEN``), never
from the command line, where every user of the host reads them; a ``user:password@`` or
``token@`` in ``--nats`` still works, and is never printed
(:mod:`bus.nats.credentials`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from twisted.python import usage

from bus.errors import StartupError
from bus.nats.credentials import ENV_PASSWORD, ENV_TOKEN, Credentials, CredentialsError
from bus.nats.settings import NatsSettings
from bus.util.extras import require, require_tls

Settings = TypeVar("Settings", bound=NatsSettings)


def nats_options(kept: str, stream: str, prefix: str) -> list[list[Any]]:
    """twistd's option rows; ``kept``: what sqlite keeps, in words (``the log``)."""
    said = "With --store jetstream: "
    return [
        [
            "store",
            None,
            "sqlite",
            f"Where to keep {kept}: sqlite (this machine, in --data-dir) or jetstream (a NATS "
            "JetStream stream, --nats, that several servers share).",
        ],
        [
            "nats",
            None,
            None,
            f"{said}the NATS servers, nats://HOST:PORT[,nats://...].",
        ],
        ["nats-stream", None, stream, f"{said}the stream's name."],
        ["nats-subject-prefix", None, prefix, f"{said}the subjects' first token."],
        [
            "nats-replicas",
            None,
            1,
            f"{said}the stream's replicas when it is made (3 in a cluster).",
            int,
        ],
        *access_options(said),
    ]


def cluster_options(what: str) -> list[list[Any]]:
    """twistd's option rows of a service that ``--nats`` alone puts on a cluster (no
    ``--store``): the servers, then the credentials and TLS; ``what``: what the cluster
    does for it, in words (``publications reach the other brokers``)."""
    return [
        [
            "nats",
            None,
            None,
            f"NATS servers, nats://HOST:PORT[,nats://...]: {what} (default: none, this "
            "process alone).",
        ],
        *access_options("With --nats: "),
    ]


def access_options(said: str) -> list[list[Any]]:
    """The rows of the credentials and TLS to the NATS servers; ``said``: how each help
    text begins (when the option counts)."""
    return [
        [
            "nats-user",
            None,
            None,
            f"{said}the NATS user; its password from --nats-password-file or "
            f"{ENV_PASSWORD} in the environment.",
        ],
        ["nats-password-file", None, None, f"{said}a file holding the password."],
        [
            "nats-token-file",
            None,
            None,
            f"{said}a file holding the NATS token (or {ENV_TOKEN} in the environment).",
        ],
        ["nats-nkey", None, None, f"{said}a NATS user's NKEY seed file."],
        ["nats-creds", None, None, f"{said}a NATS credentials file (user JWT and seed)."],
        ["nats-tls-ca", None, None, f"{said}the CA that signed the servers."],
        ["nats-tls-cert", None, None, f"{said}this client's TLS certificate."],
        ["nats-tls-key", None, None, f"{said}its private key."],
    ]


def _servers(options: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple(u.strip() for u in str(options.get("nats") or "").split(",") if u.strip())


def nats_settings(options: Mapping[str, Any], kind: type[Settings], **more: Any) -> Settings | None:
    """What the options ask, as ``kind`` (None: sqlite); a usage error for a wrong mix.
    ``more``: the service's own settings beside the shared ones."""
    store = options.get("store") or "sqlite"
    if store not in ("sqlite", "jetstream"):
        raise usage.UsageError("--store must be sqlite or jetstream")
    servers = _servers(options)
    if store == "sqlite":
        if servers:
            raise usage.UsageError("--nats needs --store jetstream")
        return None
    if not servers:
        raise usage.UsageError("--store jetstream needs --nats nats://HOST:PORT[,...]")
    named: dict[str, Any] = {
        key: str(options[option])
        for key, option in (("stream", "nats-stream"), ("subject_prefix", "nats-subject-prefix"))
        if options.get(option)
    }
    return _settings(
        options, servers, kind, replicas=int(options.get("nats-replicas") or 1), **named, **more
    )


def cluster_settings(
    options: Mapping[str, Any], kind: type[Settings], **more: Any
) -> Settings | None:
    """What :func:`cluster_options` ask, as ``kind`` (None: no ``--nats``, this process
    alone); a usage error for a wrong mix. ``more``: the service's own settings."""
    servers = _servers(options)
    if not servers:
        given = [
            n for n in ("nats-user", "nats-creds", "nats-nkey", "nats-tls-ca") if options.get(n)
        ]
        if given:
            raise usage.UsageError(f"--{given[0]} needs --nats")
        return None
    return _settings(options, servers, kind, **more)


def _settings(
    options: Mapping[str, Any], servers: tuple[str, ...], kind: type[Settings], **more: Any
) -> Settings:
    """The servers, credentials and TLS the options give, with ``more``, as ``kind``; the
    credentials' files read once now."""
    _require_extras(options, servers)

    def path(name: str) -> Path | None:
        value = options.get(name)
        return Path(value) if value else None

    try:
        credentials = Credentials.from_options(
            user=options.get("nats-user"),
            password_file=options.get("nats-password-file"),
            token_file=options.get("nats-token-file"),
            nkey=options.get("nats-nkey"),
            creds=options.get("nats-creds"),
        )
    except CredentialsError as error:
        raise usage.UsageError(str(error)) from None
    try:
        settings = kind(
            servers=servers,
            credentials=credentials,
            tls_ca=path("nats-tls-ca"),
            tls_cert=path("nats-tls-cert"),
            tls_key=path("nats-tls-key"),
            **more,
        )
    except ValueError as error:
        raise usage.UsageError(str(error)) from None
    _check_files(settings.credentials)
    return settings


def _check_files(credentials: Credentials) -> None:
    """The credentials' files read once now: one that is missing or not what it should be
    ends the start in one line, naming its option, instead of failing every connection."""
    option = (
        "nats-password-file"
        if credentials.password_file is not None
        else "nats-token-file"
        if credentials.token_file is not None
        else "nats-nkey"
        if credentials.nkey_file is not None
        else "nats-creds"
    )
    try:
        credentials.check()
    except CredentialsError as error:
        raise StartupError(option, str(error)) from None


def _require_extras(options: Mapping[str, Any], servers: tuple[str, ...]) -> None:
    """What the cluster extra brings, when these options need it: found now, one line at
    start (bus.util.extras), rather than when the first connection is refused."""
    if options.get("nats-creds"):
        require("nkeys", "cluster", "a NATS credentials file", "nats-creds")
    if options.get("nats-nkey"):
        require("nkeys", "cluster", "an NKEY seed", "nats-nkey")
    tls = [name for name in ("nats-tls-ca", "nats-tls-cert", "nats-tls-key") if options.get(name)]
    if not tls and any(url.startswith("tls://") for url in servers):
        tls = ["nats"]
    if tls:
        require_tls("TLS to the NATS servers", tls[0])


def add_nats_arguments(parser: Any, stream: str, prefix: str) -> None:
    """The same options for a command (argparse) that works on a service's stream: the
    servers (``--nats``, required), the stream's name, subject prefix and replicas, and
    the credentials and TLS, named and read as the services name and read them."""
    for name, _, default, text, *kind in nats_options("", stream, prefix):
        if name == "store":
            continue
        text = text.removeprefix("With --store jetstream: ")
        if name == "nats":
            parser.add_argument("--nats", required=True, metavar="URLS", help=text)
            continue
        if default is not None:
            text += " [%(default)s]"
        parser.add_argument(f"--{name}", default=default, type=kind[0] if kind else str, help=text)


def nats_settings_from_arguments(args: Any, kind: type[Settings], **more: Any) -> Settings:
    """:func:`nats_settings` of a command's parsed :func:`add_nats_arguments`; a wrong
    value raises ``usage.UsageError`` or :class:`bus.errors.StartupError` (a credentials
    file), each a sentence."""
    options = {"store": "jetstream"}
    for name, *_ in nats_options("", "", ""):
        if name != "store":
            options[name] = getattr(args, name.replace("-", "_"))
    settings = nats_settings(options, kind, **more)
    assert settings is not None
    return settings
