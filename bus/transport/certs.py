"""CURVE certificates with their metadata: read as CZMQ and pyzmq write them, written as CZMQ
does.

A certificate is a ZPL text (RFC 4/ZPL): a ``metadata`` section of ``name = value`` lines and
a ``curve`` section with ``public-key`` (and, in ``NAME.key_secret``, ``secret-key``), each
line indented by four spaces. CZMQ's ``zcert_save_public`` quotes values
(``    publish = "/orders/"``); pyzmq's ``create_certificates`` writes metadata unquoted and
only into the secret file. Both are read. What a key may do on a service is in the metadata
of its public certificate in the allow-list (see docs/security.md), so the writer here puts
the metadata in both files.

Nothing here is evaluated: a file is parsed line by line, and anything else is a
:class:`~bus.transport.curve.KeyFileError` naming the file and the line.
"""

from __future__ import annotations

import datetime
import os
import re
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import zmq
from twisted.logger import Logger
from zmq.utils import z85

from bus.transport.curve import KeyFileError

log = Logger(namespace="bus.transport.certs")

_Z85_LENGTH = 40
#: ZPL names: letters, digits and ``$ - _ @ . & + /``.
_NAME = re.compile(r"^[A-Za-z0-9$\-_@.&+/]+$")
_LINE = re.compile(r"^(?P<indent>(?:    )*)(?P<name>[^=\s]+)\s*(?:=\s*(?P<value>.*?))?\s*$")
_MAX_BYTES = 64 * 1024

_PUBLIC_BANNER = """#   ****  Generated on {now} by bus-keys  ****
#   ZeroMQ CURVE Public Certificate
#   Exchange securely, or use a secure mechanism to verify the contents
#   of this file after exchange. Store public certificates in your home
#   directory, in the .curve subdirectory.

"""
_SECRET_BANNER = """#   ****  Generated on {now} by bus-keys  ****
#   ZeroMQ CURVE **Secret** Certificate
#   DO NOT PROVIDE THIS FILE TO OTHER USERS nor change its permissions.

"""


@dataclass(frozen=True, slots=True)
class Certificate:
    """A parsed certificate: Z85 keys (40 ASCII bytes) and its metadata."""

    public: bytes
    secret: bytes | None
    metadata: Mapping[str, str] = field(default_factory=dict)
    path: Path | None = None


def parse_certificate(text: str, path: Path | str = "<certificate>") -> Certificate:
    """A certificate from its ZPL text; KeyFileError names the line at fault."""
    sections: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for number, raw in enumerate(text.replace("\r\n", "\n").split("\n"), 1):
        line = raw.rstrip()
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        match = _LINE.match(line)
        if match is None or not _NAME.match(match["name"]):
            raise KeyFileError(f"{path}:{number}: not a ZPL line: {raw.strip()[:60]!r}")
        depth = len(match["indent"]) // 4
        name, value = match["name"], match["value"]
        if depth == 0:
            if value is not None:
                raise KeyFileError(f"{path}:{number}: {name!r} should be a section")
            current = sections.setdefault(name, {})
            continue
        if depth != 1 or current is None:
            raise KeyFileError(f"{path}:{number}: {name!r} is not in a section")
        current[name] = _unquoted(value or "", path, number)
    curve = sections.get("curve", {})
    public = curve.get("public-key")
    if public is None:
        raise KeyFileError(f"{path}: no curve public-key")
    secret = curve.get("secret-key")
    certificate = Certificate(
        _key(public, "public-key", path),
        None if secret is None else _key(secret, "secret-key", path),
        dict(sections.get("metadata", {})),
        Path(path),
    )
    if certificate.secret is not None and zmq.curve_public(certificate.secret) != public.encode():
        raise KeyFileError(f"{path}: the public key does not match the secret key")
    return certificate


def _unquoted(value: str, path: Path | str, number: int) -> str:
    if value[:1] in ("'", '"'):
        if len(value) < 2 or value[-1] != value[0]:
            raise KeyFileError(f"{path}:{number}: unterminated quoted value")
        return value[1:-1]
    return value


def _key(text: str, what: str, path: Path | str) -> bytes:
    key = text.encode("ascii", "replace")
    if len(key) != _Z85_LENGTH:
        raise KeyFileError(f"{path}: {what} is not a 40-character Z85 CURVE key")
    try:
        z85.decode(key)
    except (ValueError, KeyError, TypeError):
        raise KeyFileError(f"{path}: {what} is not valid Z85") from None
    return key


def read_certificate(path: Path | str) -> Certificate:
    """The certificate in ``path`` (``NAME.key`` or ``NAME.key_secret``)."""
    path = Path(path)
    try:
        with path.open("rb") as handle:
            data = handle.read(_MAX_BYTES + 1)
    except OSError as error:
        raise KeyFileError(f"{path}: {error.strerror or error}") from None
    if len(data) > _MAX_BYTES:
        raise KeyFileError(f"{path}: larger than {_MAX_BYTES} bytes: not a certificate")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise KeyFileError(f"{path}: not UTF-8 text") from None
    return parse_certificate(text, path)


def certificates_in(directory: Path | str) -> dict[bytes, Certificate]:
    """Public key -> certificate for every ``*.key`` file in ``directory``; a file that is
    not a certificate is logged and skipped (one bad file never empties an allow-list)."""
    found: dict[bytes, Certificate] = {}
    for path in sorted(Path(directory).glob("*.key")):
        try:
            certificate = read_certificate(path)
        except KeyFileError as error:
            log.warn("skipped {path}: {error}", path=str(path), error=str(error))
            continue
        found[certificate.public] = certificate
    return found


def generate_key_pair(zyre_safe: bool = True) -> tuple[bytes, bytes]:
    """A new (public, secret) Z85 key pair. ``zyre_safe``: never a public key whose first
    byte is zero, which zyre reads as "no key" in a beacon (about 1 key in 256)."""
    while True:
        public, secret = zmq.curve_keypair()
        if not zyre_safe or z85.decode(public)[0] != 0:
            return public, secret


def format_certificate(public: bytes, secret: bytes | None, metadata: Mapping[str, str]) -> str:
    """The ZPL text of a certificate, as CZMQ writes it (quoted values)."""
    for name, value in metadata.items():
        check_metadata(name, value)
    now = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    banner = (_SECRET_BANNER if secret is not None else _PUBLIC_BANNER).format(now=now)
    lines = [banner.rstrip("\n"), "", "metadata"]
    lines += [f'    {name} = "{value}"' for name, value in metadata.items()]
    lines += ["curve", f'    public-key = "{public.decode("ascii")}"']
    if secret is not None:
        lines.append(f'    secret-key = "{secret.decode("ascii")}"')
    return "\n".join(lines) + "\n"


def check_metadata(name: str, value: str) -> None:
    """A metadata entry ZPL can hold (a name of its characters, a value without a quote or
    a line break); ValueError otherwise."""
    if not _NAME.match(name):
        raise ValueError(f"metadata name {name!r}: letters, digits and $-_@.&+/ only")
    if '"' in value or "\n" in value or "\r" in value:
        raise ValueError(f"metadata {name}: a value cannot hold a double quote or a line break")


def write_certificate(
    directory: Path | str,
    name: str,
    public: bytes,
    secret: bytes | None,
    metadata: Mapping[str, str],
) -> tuple[Path, Path | None]:
    """Write ``NAME.key`` (public, mode 0644) and, with ``secret``, ``NAME.key_secret``
    (mode 0600 from its creation), both with ``metadata``; never over an existing file."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    public_path = directory / f"{name}.key"
    secret_path = directory / f"{name}.key_secret" if secret is not None else None
    for path in (public_path, secret_path):
        if path is not None and path.exists():
            raise KeyFileError(f"{path} exists: not overwriting a key")
    if secret_path is not None:
        _write_new(secret_path, format_certificate(public, secret, metadata), 0o600)
    _write_new(public_path, format_certificate(public, None, metadata), 0o644)
    return public_path, secret_path


def set_metadata(
    path: Path | str, metadata: Mapping[str, str], remove: Iterable[str] = ()
) -> Certificate:
    """Change the metadata of the certificate in ``path`` (its keys kept), atomically;
    the changed certificate."""
    path = Path(path)
    old = read_certificate(path)
    merged = {k: v for k, v in old.metadata.items() if k not in set(remove)}
    merged.update(metadata)
    mode = 0o600 if old.secret is not None else 0o644
    _replace(path, format_certificate(old.public, old.secret, merged), mode)
    return Certificate(old.public, old.secret, merged, path)


def _write_new(path: Path, text: str, mode: int) -> None:
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.chmod(path, mode)  # whatever the umask


def _replace(path: Path, text: str, mode: int) -> None:
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(descriptor, mode)
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
