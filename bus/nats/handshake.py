"""What a client says when it connects: the server addresses it is given (with their
``user:password@`` or ``token@``) and the ``CONNECT`` options for the server's ``INFO``.

Both clients use it: :mod:`bus.nats.blocking` (threads, Spark's executors) and
:mod:`bus.nats.client` (the reactor).
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import unquote, urlsplit

from bus.util.extras import MissingExtra, require

DEFAULT_PORT = 4222


class ConnectError(Exception):
    """No server admitted the connection; the message names each one's reason."""


class Server(NamedTuple):
    """One address of ``--nats``: where it is and what it wants of us."""

    url: str
    host: str
    port: int
    #: ``tls://``: TLS whatever the server's INFO says.
    tls: bool
    user: str | None
    password: str | None
    token: str | None


def server(url: str) -> Server:
    """One address of ``--nats`` (``[nats|tls]://[user:password@|token@]host[:port]``) parsed;
    :class:`ConnectError` when it has no host or a bad port."""
    parts = urlsplit(url if "://" in url else "nats://" + url)
    user = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password is not None else None
    token = None
    if user is not None and password is None:
        user, token = None, user
    try:
        port = parts.port or DEFAULT_PORT
    except ValueError as error:
        raise ConnectError(f"{url}: {error}") from None
    if not parts.hostname:
        raise ConnectError(f"{url}: no host")
    return Server(url, parts.hostname, port, parts.scheme == "tls", user, password, token)


def credentials(path: Path) -> tuple[str, bytes]:
    """The user JWT and the nkey seed of a NATS credentials file."""
    blocks = []
    lines = path.read_text().splitlines()
    for index, line in enumerate(lines):
        if line.startswith("-----BEGIN"):
            blocks.append(lines[index + 1].strip())
    if len(blocks) < 2:
        raise ConnectError(f"{path}: not a NATS credentials file (a JWT and a seed)")
    return blocks[0], blocks[1].encode()


def sign(seed: bytes, nonce: str) -> str:
    """The server's ``nonce`` signed with the credentials' ``seed`` (``nkeys``, which the
    ``cluster`` extra installs)."""
    # The services ask for nkeys as their options are read; Spark's executors, here.
    try:
        nkeys = require("nkeys", "cluster", "a NATS credentials file")
    except MissingExtra as error:
        raise ConnectError(str(error)) from None
    signed = nkeys.from_seed(seed).sign(nonce.encode())
    return base64.urlsafe_b64encode(signed).decode().rstrip("=")


def wants_tls(address: Server, info: dict[str, Any], configured: bool) -> bool:
    """Whether to start TLS: asked for in the options or the URL, or required by the server."""
    return configured or address.tls or bool(info.get("tls_required"))


def connect_options(
    address: Server, info: dict[str, Any], name: str, tls: bool, creds: Path | None
) -> dict[str, Any]:
    """``CONNECT``'s JSON for the server that sent ``info``."""
    options: dict[str, Any] = {
        "verbose": False,
        "pedantic": False,
        "tls_required": tls,
        "name": name,
        "lang": "python-bus",
        "version": "1",
        "protocol": 1,
        "headers": True,
        "no_responders": True,
    }
    if address.user is not None:
        options["user"] = address.user
        options["pass"] = address.password
    elif address.token is not None:
        options["auth_token"] = address.token
    if creds is not None:
        jwt, seed = credentials(creds)
        options["jwt"] = jwt
        options["sig"] = sign(seed, info.get("nonce", ""))
    return options
