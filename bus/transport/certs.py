"""CURVE certificates with their metadata: read as CZMQ and pyzmq write them, written as CZMQ
does.

A certificate is a ZPL text (RFC 4/ZPL): a ``metadata`` section of ``name = value`` lines and
a ``curve`` section with ``public-key`` (and, in ``NAME.key_secret``, ``secret-key``), each
entry indented by four spaces. CZMQ's ``zcert_save_public`` double-quotes values
(``    publish = "/orders/"``); pyzmq's ``create_certificates`` writes metadata unquoted and
only into the secret file. Both are read, with CZMQ's reading of ZPL: a value is quoted
(``"..."`` or ``'...'``, no escapes) or runs up to a ``#`` comment; deeper entries and a
section's own value are allowed and ignored. Where CZMQ and pyzmq would read one file two ways
(a key or an entry given twice) the file is refused. What a key may do on a service is in the
metadata of its public certificate in the allow-list (see docs/security.md), so the writer
here puts the metadata in both files.

Nothing here is evaluated: a file is scanned line by line, and anything else is a
:class:`KeyFileError` naming the file and the line (:mod:`bus.transport.curve`, which
uses these certificates, raises it too and names it as well).
"""

from __future__ import annotations

import datetime
import os
import stat
import tempfile
import time
import types
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import zmq
from twisted.logger import Logger
from zmq.utils import z85

log = Logger(namespace="bus.transport.certs")

_Z85_LENGTH = 40
_Z85_DIGITS = {
    c: i
    for i, c in enumerate(
        "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
    )
}
#: What C's isspace() is in libzmq's locale: CZMQ trims exactly these around names and values.
_SPACE = " \t\n\v\f\r"
#: ZPL name characters besides ASCII letters and digits.
_NAME_MARKS = frozenset("$-_@.&+/")
_MAX_BYTES = 64 * 1024
#: The sections a certificate is made of; what else a file holds is ignored, as zcert does.
_SECTIONS = ("metadata", "curve")

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


class KeyFileError(Exception):
    """A key file is missing, unreadable or not a CURVE key."""


@dataclass(frozen=True, slots=True)
class Certificate:
    """A parsed certificate: Z85 keys (40 ASCII bytes each; ``secret`` None in a public
    certificate), its metadata in file order, and where it was read from."""

    public: bytes
    secret: bytes | None
    metadata: Mapping[str, str]
    path: Path


# -- reading ----------------------------------------------------------------------------------


def read_certificate(path: Path | str) -> Certificate:
    """The certificate in ``path`` (``NAME.key`` or ``NAME.key_secret``); KeyFileError names
    the file, and the line at fault."""
    path = Path(path)
    try:
        with path.open("rb") as handle:
            data = handle.read(_MAX_BYTES + 1)
    except OSError as error:
        raise KeyFileError(f"{path}: {error.strerror or error}") from None
    if len(data) > _MAX_BYTES:
        raise KeyFileError(f"{path}: larger than {_MAX_BYTES} bytes: not a certificate")
    try:
        text = data.decode("utf-8-sig")  # an editor's byte-order mark is tolerated
    except UnicodeDecodeError:
        raise KeyFileError(f"{path}: not UTF-8 text") from None
    return parse_certificate(text, path)


def parse_certificate(text: str, path: Path | str = "<certificate>") -> Certificate:
    """A certificate from its ZPL text (``path`` only names it in errors and the result)."""
    if "\0" in text:
        raise KeyFileError(f"{path}: holds a NUL byte: not a certificate")
    sections: dict[str, dict[str, tuple[str, int]]] = {}
    # The names of the latest entries at each depth: a line may go one level deeper at most.
    trail: list[str] = []
    for number, raw in enumerate(text.split("\n"), 1):
        line = raw.rstrip(_SPACE)  # CRLF's CR included
        body = line.lstrip(" ")
        if body.lstrip(_SPACE)[:1] in ("", "#"):  # blank, or a comment at any indentation
            continue
        where = f"{path}:{number}"
        indent = len(line) - len(body)
        if indent % 4:
            raise KeyFileError(f"{where}: indent by 4 spaces at a time")
        depth = indent // 4
        if depth > len(trail):
            raise KeyFileError(f"{where}: indented deeper than the line above allows")
        name, value = _entry(body, where)
        del trail[depth:]
        trail.append(name)
        if depth == 0:
            if name in sections:
                raise KeyFileError(f"{where}: section {name!r} given twice")
            if name in _SECTIONS:
                sections[name] = {}
        elif depth == 1 and trail[0] in sections:
            entries = sections[trail[0]]
            if name in entries:
                raise KeyFileError(f"{where}: {trail[0]} {name!r} given twice")
            entries[name] = (value, number)
    curve = sections.get("curve", {})
    if "public-key" not in curve:
        raise KeyFileError(f"{path}: no public-key in a curve section")
    public = check_key(curve["public-key"][0], "public-key", f"{path}:{curve['public-key'][1]}")
    secret = None
    if "secret-key" in curve:
        value, number = curve["secret-key"]
        secret = check_key(value, "secret-key", f"{path}:{number}")
        if _public_of(secret, path) != public:
            raise KeyFileError(f"{path}: the public key does not match the secret key")
    metadata = {name: value for name, (value, _) in sections.get("metadata", {}).items()}
    return Certificate(public, secret, types.MappingProxyType(metadata), Path(path))


def _entry(body: str, where: str) -> tuple[str, str]:
    """The name and value of a line without its indentation, as CZMQ's zconfig reads it."""
    end = 0
    while end < len(body) and _is_name_character(body[end]):
        end += 1
    name, rest = body[:end], body[end:].lstrip(_SPACE)
    if not name:
        raise KeyFileError(f"{where}: not a ZPL line: {body[:60]!r}")
    if name.startswith("/") or name.endswith("/"):
        raise KeyFileError(f"{where}: {name!r}: a name neither begins nor ends with /")
    if not rest.startswith("="):
        if rest and not rest.startswith("#"):
            raise KeyFileError(f"{where}: {rest[:60]!r} after {name!r}: write NAME = VALUE")
        return name, ""
    rest = rest[1:].lstrip(_SPACE)
    if rest[:1] in ("'", '"'):
        close = rest.find(rest[0], 1)
        if close < 0:
            raise KeyFileError(f"{where}: {name}: the value's {rest[0]} is never closed")
        after = rest[close + 1 :].lstrip(_SPACE)
        if after and not after.startswith("#"):
            raise KeyFileError(f"{where}: {name}: {after[:60]!r} after the quoted value")
        return name, rest[1:close]
    return name, rest.partition("#")[0].rstrip(_SPACE)


def _is_name_character(character: str) -> bool:
    return (character.isascii() and character.isalnum()) or character in _NAME_MARKS


def check_key(key: str | bytes, what: str = "the key", where: Path | str = "<key>") -> bytes:
    """``key`` as 40 Z85 ASCII bytes, or KeyFileError naming ``what`` and ``where``."""
    text = key.decode("latin-1") if isinstance(key, bytes) else key
    if len(text) != _Z85_LENGTH:
        raise KeyFileError(f"{where}: {what} is not a 40-character Z85 CURVE key")
    # Z85 in five-character groups, each at most 2**32 - 1 (pyzmq's decoder lets a larger
    # one escape as struct.error, and a non-ASCII character is no Z85 digit).
    for start in range(0, _Z85_LENGTH, 5):
        value = 0
        for character in text[start : start + 5]:
            digit = _Z85_DIGITS.get(character)
            if digit is None:
                raise KeyFileError(f"{where}: {what} is not valid Z85")
            value = value * 85 + digit
        if value >= 1 << 32:
            raise KeyFileError(f"{where}: {what} is not valid Z85 (out of range)")
    return text.encode("ascii")


def _public_of(secret: bytes, where: Path | str) -> bytes:
    try:
        return zmq.curve_public(secret)
    except zmq.ZMQError as error:
        raise KeyFileError(f"{where}: the secret key is refused by libzmq ({error})") from None


def certificates_in(directory: Path | str) -> dict[bytes, Certificate]:
    """Public key -> certificate for every ``*.key`` file in ``directory`` (``*.key_secret``
    are not read). A file that is not a certificate is logged and skipped: one bad file
    never empties an allow-list. Of two files with one key, the first by name counts."""
    found: dict[bytes, Certificate] = {}
    for path in sorted(Path(directory).glob("*.key")):
        try:
            certificate = read_certificate(path)
        except KeyFileError as error:
            log.warn("skipped {path}: {error}", path=str(path), error=str(error))
            continue
        first = found.setdefault(certificate.public, certificate)
        if first is not certificate:
            log.warn(
                "skipped {path}: its key is already {first}'s",
                path=str(path),
                first=str(first.path),
                key=certificate.public.decode("ascii"),
            )
    return found


def directory_signature(directory: Path | str) -> tuple[object, ...]:
    """What changes whenever the certificates :func:`certificates_in` reads in ``directory``
    may have: the directory itself (removed and made again is another directory) and, per
    ``*.key`` entry, its file's identity, size, times and mode, or why it cannot be
    reached (a dangling link is an entry of its own, so one added beside it still changes
    the signature, and so does the link once its target appears). A file replaced by
    rename is another inode even where a copy kept its modification time."""
    directory = Path(directory)
    try:
        top = directory.stat()
    except OSError as error:
        return (("no directory", error.errno),)
    entries: list[object] = [(top.st_dev, top.st_ino, top.st_mode, top.st_mtime_ns)]
    for path in sorted(directory.glob("*.key")):
        try:
            found = path.stat()
        except OSError as error:
            try:
                target = os.readlink(path)
            except OSError:
                target = ""
            entries.append((path.name, "unreachable", error.errno, target))
            continue
        entries.append(
            (
                path.name,
                found.st_dev,
                found.st_ino,
                found.st_size,
                found.st_mode,
                found.st_mtime_ns,
                found.st_ctime_ns,
            )
        )
    return tuple(entries)


# -- writing ----------------------------------------------------------------------------------


def generate_key_pair(zyre_safe: bool = True) -> tuple[bytes, bytes]:
    """A new (public, secret) Z85 key pair. ``zyre_safe``: never a public key whose first
    byte is zero, which zyre reads as "no key" in a beacon (about 1 key in 256)."""
    while True:
        public, secret = zmq.curve_keypair()
        if not zyre_safe or z85.decode(public)[0] != 0:
            return public, secret


def check_metadata(name: str, value: str) -> None:
    """A metadata entry a certificate can hold and CZMQ read back: a ZPL name, and a value
    without a line break or NUL and not holding both kinds of quote; ValueError otherwise."""
    if not name or not all(map(_is_name_character, name)) or "/" in (name[0], name[-1]):
        raise ValueError(
            f"metadata name {name!r}: letters, digits and $-_@.&+/ only (no / at either end)"
        )
    if any(character in value for character in "\n\r\0"):
        raise ValueError(f"metadata {name}: a value cannot hold a line break or NUL")
    if '"' in value and "'" in value:
        raise ValueError(f"metadata {name}: a value cannot hold both ' and \"")


def format_certificate(public: bytes, secret: bytes | None, metadata: Mapping[str, str]) -> str:
    """The ZPL text of a certificate as CZMQ writes it: values in double quotes, or in single
    quotes when they hold a double quote (CZMQ would write ``"a"b"``, which it cannot read)."""
    check_key(public, "the public key")
    if (
        secret is not None
        and _public_of(check_key(secret, "the secret key"), "<secret key>") != public
    ):
        raise ValueError("the public key does not match the secret key")
    lines = [(_SECRET_BANNER if secret is not None else _PUBLIC_BANNER).format(now=_now())]
    lines.append("metadata")
    for name, value in metadata.items():
        check_metadata(name, value)
        quote = "'" if '"' in value else '"'
        lines.append(f"    {name} = {quote}{value}{quote}")
    lines += ["curve", f'    public-key = "{public.decode("ascii")}"']
    if secret is not None:
        lines.append(f'    secret-key = "{secret.decode("ascii")}"')
    return "\n".join(lines) + "\n"


def _now() -> str:
    return datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S")


def write_certificate(
    directory: Path | str,
    name: str,
    public: bytes,
    secret: bytes | None,
    metadata: Mapping[str, str],
) -> tuple[Path, Path | None]:
    """Write ``NAME.key`` (public, mode 0644) and, with ``secret``, ``NAME.key_secret`` (mode
    0600 from its creation), both with ``metadata``, creating ``directory``; the paths
    written. Each file appears whole or not at all, and never over an existing one
    (KeyFileError)."""
    if not name or name in (".", "..") or "/" in name or os.sep in name or "\0" in name:
        raise ValueError(f"{name!r} is not a name for a key (a file name, without /)")
    directory = Path(directory)
    public_path = directory / f"{name}.key"
    secret_path = directory / f"{name}.key_secret" if secret is not None else None
    public_text = format_certificate(public, None, metadata)  # bad input fails before a file
    secret_text = format_certificate(public, secret, metadata) if secret is not None else ""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise KeyFileError(f"{directory}: {error.strerror or error}") from None
    for path in (public_path, secret_path):
        if path is not None and path.exists():
            raise KeyFileError(f"{path} exists: not overwriting a key")
    if secret_path is not None:
        _publish(secret_path, secret_text, 0o600, replace=False)
    try:
        _publish(public_path, public_text, 0o644, replace=False)
    except BaseException:
        if secret_path is not None:  # half a pair is no use: the secret just written goes
            secret_path.unlink(missing_ok=True)
        raise
    return public_path, secret_path


def set_metadata(
    path: Path | str, metadata: Mapping[str, str], remove: Iterable[str] = ()
) -> Certificate:
    """Change the metadata of the certificate in ``path``: entries of ``metadata`` set, those
    named in ``remove`` dropped, its keys and mode kept; atomically (a reader sees the old
    file or the new one). The changed certificate."""
    path = Path(path)
    old = read_certificate(path)
    removed = set(remove)
    merged = {k: v for k, v in old.metadata.items() if k not in removed}
    merged.update(metadata)
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except OSError as error:
        raise KeyFileError(f"{path}: {error.strerror or error}") from None
    if old.secret is not None:
        mode &= 0o700  # a secret key never becomes readable by others here
    _publish(path, format_certificate(old.public, old.secret, merged), mode, replace=True)
    return Certificate(old.public, old.secret, types.MappingProxyType(merged), path)


def _publish(path: Path, text: str, mode: int, replace: bool) -> None:
    """Write ``text`` to a temporary file beside ``path`` (mode 0600 from its creation, then
    ``mode``) and move it into place: replacing ``path``, or, hard-linked, only where no
    file is (a concurrent writer's key is never overwritten)."""
    # The temporary's name ends in .tmp: never one of the *.key files an allow-list reads.
    descriptor, temporary = tempfile.mkstemp(
        prefix=f".{path.name}.", suffix=".tmp", dir=path.parent
    )
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fchmod(handle.fileno(), mode)
            os.fsync(handle.fileno())
        if replace:
            os.replace(temporary, path)
        else:
            try:
                os.link(temporary, path)
            except FileExistsError:
                raise KeyFileError(f"{path} exists: not overwriting a key") from None
    except OSError as error:
        raise KeyFileError(f"{path}: {error.strerror or error}") from None
    finally:
        Path(temporary).unlink(missing_ok=True)


#: Where :func:`refuse_certificates` moves a refused key's certificates, in the allow-list.
REFUSED_DIR = "refused"


def refuse_certificates(directory: Path | str, public: bytes) -> list[Path]:
    """Move every ``*.key`` certificate of key ``public`` (Z85) out of the allow-list
    ``directory`` into its ``refused/`` subdirectory (not read as part of the list), each
    renamed whole; the paths they have now. Moved back, the key is allowed again.
    OSError when the directory may not be changed."""
    directory = Path(directory)
    moved: list[Path] = []
    for path in sorted(directory.glob("*.key")):
        try:
            if read_certificate(path).public != public:
                continue
        except KeyFileError:
            continue
        target_dir = directory / REFUSED_DIR
        target_dir.mkdir(mode=0o700, exist_ok=True)
        target = target_dir / path.name
        if target.exists():  # refused once before, allowed again, refused anew
            target = target_dir / f"{path.stem}.{int(time.time())}.key"
        path.rename(target)
        moved.append(target)
    return moved
