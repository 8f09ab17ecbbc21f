"""Who a client is to the NATS servers, kept out of everything that is printed.

A secret is a :class:`Secret` (``***`` whichever way it is shown: log lines, ``/status``,
a dataclass's repr); files (``--nats-password-file``, ``--nats-token-file``,
``--nats-nkey``, ``--nats-creds``) are read each time a connection is made, so the command
line never carries the secret and a rotated file is read at the next reconnection. A
``user:password@`` or ``token@`` in a server URL is taken out of the URL
(:func:`split`) as the settings are made, so the servers can be printed as they are;
:func:`shown` and :func:`redacted` hide what a URL still carries, for what is printed
elsewhere.

Plain Python (no Twisted): Spark's executors use it as it is.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import SplitResult, unquote, urlsplit, urlunsplit

from bus.errors import redacted
from bus.util.extras import MissingExtra, require

__all__ = [
    "ENV_PASSWORD",
    "ENV_TOKEN",
    "Credentials",
    "CredentialsError",
    "Secret",
    "redacted",
    "shown",
    "split",
    "userinfo",
]

#: The environment's password (with ``--nats-user``) and token, for hosts that hand secrets
#: to services that way (systemd's ``LoadCredential``/``EnvironmentFile``, a container's
#: secrets): read as the options are, never printed.
ENV_PASSWORD = "BUS_NATS_PASSWORD"
ENV_TOKEN = "BUS_NATS_TOKEN"

HIDDEN = "***"


class CredentialsError(ValueError):
    """The credentials given cannot be used: a wrong mix, a file that cannot be read."""


class Secret:
    """A secret's text, shown as ``***`` by ``str``, ``repr`` and format; :meth:`reveal`
    gives it to the one place that sends it."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        """The secret itself: for the ``CONNECT`` that sends it, nothing else."""
        return self._value

    def __repr__(self) -> str:
        return HIDDEN

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return HIDDEN

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __reduce__(self) -> tuple[Any, ...]:
        # Spark pickles its sources' options to the executors, which connect too.
        return (Secret, (self._value,))


def _read(path: Path, what: str) -> str:
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise CredentialsError(f"{path}: cannot read {what}: {error}") from None
    return text


def _one_line(path: Path, what: str) -> str:
    """A file that holds one secret (trailing whitespace and newlines are no part of it)."""
    value = _read(path, what).strip()
    if not value or "\n" in value:
        raise CredentialsError(f"{path}: {what} files hold one line, the {what}")
    return value


def _seed(path: Path) -> bytes:
    """A bare NKEY seed file (``nk -gen user``: one line, ``SU...``), or the seed block of
    a decorated one."""
    lines = [line.strip() for line in _read(path, "an NKEY seed").splitlines()]
    for index, line in enumerate(lines):
        if line.startswith("-----BEGIN") and "SEED" in line and index + 1 < len(lines):
            return lines[index + 1].encode()
    seeds = [line for line in lines if line.startswith("S")]
    if len(seeds) != 1:
        raise CredentialsError(f"{path}: not an NKEY seed file (one line starting with S)")
    return seeds[0].encode()


def _jwt_and_seed(path: Path) -> tuple[str, bytes]:
    """The user JWT and the nkey seed of a NATS credentials file (``nsc``'s ``.creds``)."""
    lines = _read(path, "NATS credentials").splitlines()
    blocks = [
        lines[index + 1].strip()
        for index, line in enumerate(lines[:-1])
        if line.startswith("-----BEGIN")
    ]
    if len(blocks) < 2:
        raise CredentialsError(f"{path}: not a NATS credentials file (a JWT and a seed)")
    return blocks[0], blocks[1].encode()


def _keys() -> Any:
    # The services ask for nkeys as their options are read; Spark's executors, here.
    try:
        return require("nkeys", "cluster", "NKEY signatures")
    except MissingExtra as error:
        raise CredentialsError(str(error)) from None


def _signature(seed: bytes, nonce: str) -> tuple[str, str]:
    """The seed's public key, and its signature of the server's nonce (URL-safe base64)."""
    nkeys = _keys()
    try:
        pair = nkeys.from_seed(seed)
    except Exception as error:  # nkeys raises its own errors for a seed it cannot read
        raise CredentialsError(f"not an NKEY seed ({type(error).__name__})") from None
    signed = pair.sign(nonce.encode())
    return pair.public_key.decode(), base64.urlsafe_b64encode(signed).decode().rstrip("=")


@dataclass(frozen=True, slots=True)
class Credentials:
    """At most one way to authenticate: a user and its password (given, or in a file), a
    token (given, or in a file), an NKEY seed file, or a credentials file (a user JWT and
    its seed). None of them: the servers admit anyone."""

    user: str | None = None
    password: Secret | None = None
    password_file: Path | None = None
    token: Secret | None = None
    token_file: Path | None = None
    nkey_file: Path | None = None
    creds_file: Path | None = None

    def __post_init__(self) -> None:
        ways = [
            name
            for name, given in (
                ("a user and password", self.user is not None),
                ("a token", self.token is not None or self.token_file is not None),
                ("an NKEY seed", self.nkey_file is not None),
                ("a credentials file", self.creds_file is not None),
            )
            if given
        ]
        if len(ways) > 1:
            raise CredentialsError(
                f"give one way to authenticate to NATS, not {' and '.join(ways)}"
            )
        if self.password is not None and self.password_file is not None:
            raise CredentialsError(
                "a password given twice (in a URL or the environment, and a file)"
            )
        if self.token is not None and self.token_file is not None:
            raise CredentialsError("a token given twice (in a URL or the environment, and a file)")
        has_password = self.password is not None or self.password_file is not None
        if self.user is None and has_password:
            raise CredentialsError("a NATS password needs its user (--nats-user)")
        if self.user is not None and not has_password:
            raise CredentialsError(
                f"NATS user {self.user} needs its password: --nats-password-file, or "
                f"{ENV_PASSWORD} in the environment"
            )

    @property
    def given(self) -> bool:
        """Whether any way in was given (else the servers must admit anyone)."""
        return any(getattr(self, name) is not None for name in self.__slots__)

    @property
    def kind(self) -> str:
        """How this client authenticates, in words (for log lines and ``/status``)."""
        if self.user is not None:
            return f"user {self.user}"
        if self.token is not None or self.token_file is not None:
            return "a token"
        if self.nkey_file is not None:
            return "an NKEY"
        if self.creds_file is not None:
            return "a credentials file"
        return "none"

    @property
    def signs(self) -> bool:
        """Whether connecting signs the server's nonce (the nkeys package is needed)."""
        return self.nkey_file is not None or self.creds_file is not None

    def check(self) -> None:
        """Read what the files hold now, so that a missing or broken file ends the start in
        one line rather than failing every connection."""
        self.fields("")

    def fields(self, nonce: str) -> dict[str, Any]:
        """``CONNECT``'s fields that say who we are, files read now; ``nonce``: the one the
        server's INFO gave (signed by an NKEY)."""
        if self.user is not None:
            password = (
                self.password.reveal()
                if self.password is not None
                else _one_line(self.password_file, "password")  # type: ignore[arg-type]
            )
            return {"user": self.user, "pass": password}
        if self.token is not None:
            return {"auth_token": self.token.reveal()}
        if self.token_file is not None:
            return {"auth_token": _one_line(self.token_file, "token")}
        if self.nkey_file is not None:
            public, signature = _signature(_seed(self.nkey_file), nonce)
            return {"nkey": public, "sig": signature}
        if self.creds_file is not None:
            jwt, seed = _jwt_and_seed(self.creds_file)
            return {"jwt": jwt, "sig": _signature(seed, nonce)[1]}
        return {}

    def secrets(self) -> list[str]:
        """Every secret these credentials hold or name now (for tests that look for them)."""
        found = [self.password.reveal()] if self.password is not None else []
        if self.token is not None:
            found.append(self.token.reveal())
        return found

    @classmethod
    def from_options(
        cls,
        *,
        user: str | None = None,
        password_file: str | Path | None = None,
        token_file: str | Path | None = None,
        nkey: str | Path | None = None,
        creds: str | Path | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> Credentials:
        """What options name, with the environment's password (for ``user`` without a
        file) or token (when nothing else is named); :class:`CredentialsError` for a mix
        that cannot be used."""
        env = os.environ if environ is None else environ

        def path(value: str | Path | None) -> Path | None:
            return Path(value) if value else None

        password = None
        if user and not password_file and env.get(ENV_PASSWORD):
            password = Secret(env[ENV_PASSWORD])
        token = None
        if not (user or token_file or nkey or creds) and env.get(ENV_TOKEN):
            token = Secret(env[ENV_TOKEN])
        return cls(
            user=user or None,
            password=password,
            password_file=path(password_file),
            token=token,
            token_file=path(token_file),
            nkey_file=path(nkey),
            creds_file=path(creds),
        )


def _parts(url: str) -> SplitResult:
    return urlsplit(url if "://" in url else "nats://" + url)


def userinfo(url: str) -> tuple[str | None, str | None, str | None]:
    """A URL's user, password and token (``user:password@`` or ``token@``)."""
    parts = _parts(url)
    user = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password is not None else None
    if user is not None and password is None:
        return None, None, user
    return user, password, None


def _bare(url: str) -> str:
    """``url`` without its userinfo."""
    parts = _parts(url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))


def split(
    urls: Sequence[str], credentials: Credentials | None = None
) -> tuple[tuple[str, ...], Credentials]:
    """The servers without what their URLs carry (``user:password@``, ``token@``), and the
    credentials: those given, or the URLs' (the same in each URL that has any: one
    cluster, one identity). :class:`CredentialsError` when URLs disagree, or carry
    credentials besides those given."""
    given = credentials or Credentials()
    found: set[tuple[str | None, str | None, str | None]] = set()
    bare = []
    for url in urls:
        user, password, token = userinfo(url)
        if user is not None or token is not None:
            found.add((user, password, token))
            url = _bare(url)
        bare.append(url)
    if not found:
        return tuple(bare), given
    if len(found) > 1:
        raise CredentialsError("the NATS URLs carry different credentials: give them once")
    if given.given:
        raise CredentialsError(
            "credentials both in a NATS URL and in options or the environment: give them once"
        )
    user, password, token = found.pop()
    return tuple(bare), Credentials(
        user=user,
        password=Secret(password) if password is not None else None,
        token=Secret(token) if token is not None else None,
    )


def shown(url: str) -> str:
    """``url`` as it may be printed: a password or a token is ``***`` (the user stays)."""
    if "://" in url:
        return redacted(url)
    return redacted("nats://" + url).removeprefix("nats://")
