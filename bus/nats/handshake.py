"""What a client says when it connects: the server addresses it is given (with their
``user:password@`` or ``token@``, which :attr:`Server.shown` hides) and the ``CONNECT``
options for the server's ``INFO``.

Both clients use it: :mod:`bus.nats.blocking` (threads, Spark's executors) and
:mod:`bus.nats.client` (the reactor).
"""

from __future__ import annotations

from typing import Any, NamedTuple
from urllib.parse import urlsplit

from bus.nats.credentials import Credentials, CredentialsError, shown, userinfo

DEFAULT_PORT = 4222
#: nats-server's ``max_payload`` unless configured, for a server whose INFO does not say.
DEFAULT_MAX_PAYLOAD = 1024 * 1024


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

    @property
    def shown(self) -> str:
        """The URL as it may be printed (a password or token as ``***``)."""
        return shown(self.url)


def server(url: str) -> Server:
    """One address of ``--nats`` (``[nats|tls]://[user:password@|token@]host[:port]``) parsed;
    :class:`ConnectError` when it has no host or a bad port."""
    parts = urlsplit(url if "://" in url else "nats://" + url)
    user, password, token = userinfo(url)
    try:
        port = parts.port or DEFAULT_PORT
    except ValueError as error:
        raise ConnectError(f"{shown(url)}: {error}") from None
    if not parts.hostname:
        raise ConnectError(f"{shown(url)}: no host")
    return Server(url, parts.hostname, port, parts.scheme == "tls", user, password, token)


def wants_tls(address: Server, info: dict[str, Any], configured: bool) -> bool:
    """Whether to start TLS: asked for in the options or the URL, or required by the server."""
    return configured or address.tls or bool(info.get("tls_required"))


def connect_options(
    address: Server,
    info: dict[str, Any],
    name: str,
    tls: bool,
    credentials: Credentials | None,
    echo: bool = True,
) -> dict[str, Any]:
    """``CONNECT``'s JSON for the server that sent ``info``: the credentials given, else
    those of the address's URL. ``echo=False``: the server does not deliver this
    connection's own messages to its subscriptions (nats-py's ``no_echo``)."""
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
        "echo": echo,
    }
    if credentials is not None and credentials.given:
        try:
            options.update(credentials.fields(str(info.get("nonce", ""))))
        except CredentialsError as error:
            raise ConnectError(str(error)) from None
    elif address.user is not None:
        options["user"] = address.user
        options["pass"] = address.password
    elif address.token is not None:
        options["auth_token"] = address.token
    return options
