"""Certificates with their metadata (bus.transport.certs): CZMQ's and pyzmq's forms read as CZMQ
reads them, ours written as CZMQ writes them (and read back by CZMQ, pyzmq and us), files
appearing whole with their modes from creation, garbage refused with a KeyFileError only."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path
from typing import Any

import pytest
import zmq
import zmq.auth
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.logger import globalLogPublisher
from zmq.utils import z85

from bus.transport import certs
from bus.transport.curve import KeyFileError, load_key_pair

# The fixtures below are what Debian's CZMQ 4.2.1 (libczmq-dev) did on this machine, through
# a small C program: zcert_new, zcert_set_meta and zcert_save_public / zcert_save_secret for
# the written ones; zcert_load and zcert_meta for what it read from the hand-written ones.
CZMQ_PUBLIC = """#   ****  Generated on 2026-11-24 01:05:26 by CZMQ  ****
#   ZeroMQ CURVE Public Certificate
#   Exchange securely, or use a secure mechanism to verify the contents
#   of this file after exchange. Store public certificates in your home
#   directory, in the .curve subdirectory.

metadata
    publish = "/orders/,/billing/"
    role = "worker"
curve
    public-key = ".JrdgPp/Z%qPEQ{iLOq>a^gEHjPcs<c)xBtzdp{b"
"""
CZMQ_SECRET = """#   ****  Generated on 2026-11-24 01:21:23 by CZMQ  ****
#   ZeroMQ CURVE **Secret** Certificate
#   DO NOT PROVIDE THIS FILE TO OTHER USERS nor change its permissions.

metadata
    names = "billing"
    role = "admin"
curve
    public-key = "ZEQ?G)#}})Zv.z2Uouk=yqIZ>^Cl)+be%#63tmZO"
    secret-key = "NyY38Xy&[3{OAU8@C#tXNW[{n3e8-v(Fdmbp+yS9"
"""
# zcert_save_public with no metadata still writes the section's line.
CZMQ_EMPTY = """#   ****  Generated on 2026-11-24 01:19:06 by CZMQ  ****
#   ZeroMQ CURVE Public Certificate

metadata
curve
    public-key = "V&*q=z}IAzj#Z=q=a.l4a/S<IoY^!W-Fw+O9X1gk"
"""
# Hand-written; zcert_load read: role "worker", publish "/a/", single 'it"s', bare "".
HAND_WRITTEN = (
    "metadata\n"
    "    role = worker   # a comment\n"
    "    publish = /a/#x\n"
    "    single = 'it\"s'\n"
    "    bare\n"
    "    # indented comment\n"
    "curve\r\n"
    '    public-key = "rA$z2!bCHA?@ZZnB.6WO28/k<)cX6{g.On&1X}x)"   # trailing\n'
)
# Hand-written; zcert_load took it (a section's own value and deeper entries ignored).
NESTED = """metadata = "top"
    role = a
        deeper = 1
curve
    public-key = "rA$z2!bCHA?@ZZnB.6WO28/k<)cX6{g.On&1X}x)"
"""
# zcert_set_meta(cert, "quote", "%s", "a\"b") then zcert_save_public wrote this line, and
# zcert_load then refused the file ("invalid syntax 'b\"'").
CZMQ_UNREADABLE = CZMQ_PUBLIC.replace('    role = "worker"\n', '    quote = "a"b"\n')

Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"


def test_czmqs_public_certificate() -> None:
    certificate = certs.parse_certificate(CZMQ_PUBLIC, "alice.key")
    assert certificate.public == b".JrdgPp/Z%qPEQ{iLOq>a^gEHjPcs<c)xBtzdp{b"
    assert certificate.secret is None
    assert certificate.metadata == {"publish": "/orders/,/billing/", "role": "worker"}
    assert certificate.path == Path("alice.key")


def test_czmqs_secret_and_empty_certificates() -> None:
    secret = certs.parse_certificate(CZMQ_SECRET)
    assert secret.secret == b"NyY38Xy&[3{OAU8@C#tXNW[{n3e8-v(Fdmbp+yS9"
    assert secret.metadata == {"names": "billing", "role": "admin"}
    assert certs.parse_certificate(CZMQ_EMPTY).metadata == {}


def test_read_as_czmq_reads_zpl() -> None:
    hand = certs.parse_certificate(HAND_WRITTEN)
    assert hand.public == b"rA$z2!bCHA?@ZZnB.6WO28/k<)cX6{g.On&1X}x)"
    assert hand.metadata == {"role": "worker", "publish": "/a/", "single": 'it"s', "bare": ""}
    assert certs.parse_certificate(NESTED).metadata == {"role": "a"}


def test_what_czmq_cannot_read_back_is_refused_and_never_written() -> None:
    with pytest.raises(KeyFileError, match=r"<certificate>:9: quote: 'b\"' after"):
        certs.parse_certificate(CZMQ_UNREADABLE)
    public, _ = certs.generate_key_pair()
    text = certs.format_certificate(public, None, {"quote": 'a"b'})
    assert "    quote = 'a\"b'\n" in text
    assert certs.parse_certificate(text).metadata == {"quote": 'a"b'}


def test_pyzmqs_certificates_unquoted_metadata_in_the_secret_file(tmp_path: Path) -> None:
    public_path, secret_path = zmq.auth.create_certificates(
        str(tmp_path), "alice", metadata={"role": "client", "queues": "a,b"}
    )
    public = certs.read_certificate(public_path)
    secret = certs.read_certificate(secret_path)
    assert public.metadata == {}  # pyzmq writes it only in the secret file
    assert secret.metadata == {"role": "client", "queues": "a,b"}
    assert secret.public == public.public and secret.secret is not None


def test_written_as_czmq_writes_and_read_back_by_pyzmq(tmp_path: Path) -> None:
    public, secret = certs.generate_key_pair()
    public_path, secret_path = certs.write_certificate(
        tmp_path / "new", "bob", public, secret, {"subscribe": "/a/", "names": "x"}
    )
    assert (public_path, secret_path) == (tmp_path / "new/bob.key", tmp_path / "new/bob.key_secret")
    text = public_path.read_text()
    assert 'metadata\n    subscribe = "/a/"\n    names = "x"\ncurve\n    public-key = "' in text
    assert "secret-key" not in text
    assert zmq.auth.load_certificate(str(public_path)) == (public, None)
    assert load_key_pair(secret_path).secret == secret
    for path in (public_path, secret_path):
        assert certs.read_certificate(path).metadata == {"subscribe": "/a/", "names": "x"}
    assert sorted(p.name for p in public_path.parent.iterdir()) == ["bob.key", "bob.key_secret"]


def test_modes_from_creation_whatever_the_umask(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each file is complete, with its final mode, before it gets its name (os.link).
    seen: dict[str, int] = {}
    link = os.link

    def spying_link(source: Any, target: Any) -> None:
        seen[Path(target).name] = stat.S_IMODE(os.stat(source).st_mode)
        assert certs.read_certificate(source).public == public
        link(source, target)

    monkeypatch.setattr(os, "link", spying_link)
    public, secret = certs.generate_key_pair()
    old = os.umask(0)
    try:
        public_path, secret_path = certs.write_certificate(tmp_path, "m", public, secret, {})
    finally:
        os.umask(old)
    assert seen == {"m.key_secret": 0o600, "m.key": 0o644}
    assert secret_path is not None and stat.S_IMODE(secret_path.stat().st_mode) == 0o600
    assert stat.S_IMODE(public_path.stat().st_mode) == 0o644


def test_never_overwrites_and_leaves_nothing_behind(tmp_path: Path) -> None:
    public, _ = certs.generate_key_pair()
    certs.write_certificate(tmp_path, "bob", public, None, {})
    before = (tmp_path / "bob.key").read_bytes()
    other, other_secret = certs.generate_key_pair()
    with pytest.raises(KeyFileError, match=r"bob\.key exists: not overwriting a key"):
        certs.write_certificate(tmp_path, "bob", other, other_secret, {})
    assert (tmp_path / "bob.key").read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["bob.key"]
    with pytest.raises(ValueError, match="not a name"):
        certs.write_certificate(tmp_path, "../x", public, None, {})
    with pytest.raises(ValueError, match="does not match"):
        certs.write_certificate(tmp_path, "y", public, other_secret, {})
    with pytest.raises(ValueError, match="line break"):
        certs.write_certificate(tmp_path, "z", public, None, {"a": "1\n    public-key = x"})
    assert [p.name for p in tmp_path.iterdir()] == ["bob.key"]


def test_set_metadata_keeps_the_key_and_the_mode(tmp_path: Path) -> None:
    public, secret = certs.generate_key_pair()
    path, secret_path = certs.write_certificate(
        tmp_path, "c", public, secret, {"publish": "/a/", "x": "1"}
    )
    path.chmod(0o640)
    changed = certs.set_metadata(path, {"publish": "/b/", "y": "#2"}, remove=["x", "absent"])
    assert changed.metadata == {"publish": "/b/", "y": "#2"}
    again = certs.read_certificate(path)
    assert (again.public, again.secret) == (public, None)
    assert again.metadata == {"publish": "/b/", "y": "#2"}
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert secret_path is not None
    secret_path.chmod(0o644)  # an operator's mistake is not kept: a secret is its owner's
    assert certs.set_metadata(secret_path, {}, remove=["x"]).secret == secret
    assert stat.S_IMODE(secret_path.stat().st_mode) == 0o600
    with pytest.raises(ValueError, match="both"):
        certs.set_metadata(path, {"publish": "a\"b'c"})
    with pytest.raises(KeyFileError, match=r"nothere\.key"):
        certs.set_metadata(tmp_path / "nothere.key", {})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.key", "c.key_secret"]


def test_set_metadata_on_a_czmq_certificate(tmp_path: Path) -> None:
    path = tmp_path / "w.key"
    path.write_text(CZMQ_PUBLIC)
    certs.set_metadata(path, {"queues": "jobs"}, remove=["publish"])
    assert certs.read_certificate(path).metadata == {"role": "worker", "queues": "jobs"}
    assert zmq.auth.load_certificate(str(path))[0] == b".JrdgPp/Z%qPEQ{iLOq>a^gEHjPcs<c)xBtzdp{b"


def test_zyre_safe_keys_never_begin_with_a_zero_byte(monkeypatch: pytest.MonkeyPatch) -> None:
    zero_first = z85.encode(bytes(1) + os.urandom(31))
    one_first = z85.encode(bytes([1]) + os.urandom(31))
    pairs = iter([(zero_first, b"s1"), (zero_first, b"s2"), (one_first, b"s3")])
    monkeypatch.setattr(zmq, "curve_keypair", lambda: next(pairs))
    assert certs.generate_key_pair(zyre_safe=False) == (zero_first, b"s1")
    assert certs.generate_key_pair() == (one_first, b"s3")  # the zero-first one skipped
    monkeypatch.undo()
    for _ in range(1000):
        public, _secret = certs.generate_key_pair()
        assert z85.decode(public)[0] != 0


def test_a_directory_skips_what_is_not_a_certificate(tmp_path: Path) -> None:
    events: list[dict[str, Any]] = []
    globalLogPublisher.addObserver(events.append)
    try:
        public, _ = certs.generate_key_pair()
        certs.write_certificate(tmp_path, "good", public, None, {"role": "admin"})
        (tmp_path / "bad.key").write_text('curve\n    public-key = "short"\n')
        (tmp_path / "copy.key").write_text((tmp_path / "good.key").read_text())
        (tmp_path / "note.txt").write_text("not a key")
        (tmp_path / "x.key_secret").write_text("not read")
        found = certs.certificates_in(tmp_path)
    finally:
        globalLogPublisher.removeObserver(events)  # type: ignore[arg-type]
    assert list(found) == [public]
    assert found[public].path == tmp_path / "copy.key"  # the first by name
    skipped = {e["path"]: e for e in events if e.get("log_namespace") == "bus.transport.certs"}
    assert set(skipped) == {str(tmp_path / "bad.key"), str(tmp_path / "good.key")}
    assert "40-character" in skipped[str(tmp_path / "bad.key")]["error"]
    assert skipped[str(tmp_path / "good.key")]["first"] == str(tmp_path / "copy.key")
    assert certs.certificates_in(tmp_path / "absent") == {}


KEY = "rA$z2!bCHA?@ZZnB.6WO28/k<)cX6{g.On&1X}x)"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("curve\n", "no public-key"),
        ("metadata\n    public-key = " + KEY, "no public-key"),
        ('curve\n    public-key = "abc"\n', r":2: public-key is not a 40-character"),
        ("metadata\n  role = x\n", r":2: indent by 4 spaces"),
        ('    role = "x"\n', r":1: indented deeper"),
        ("metadata\n        role = x\n", r":2: indented deeper"),
        ("metadata\n\trole = x\n", r":2: not a ZPL line"),
        ('metadata\n    role = "x\n', r":2: role: the value's \" is never closed"),
        ("metadata\n    role worker\n", r":2: 'worker' after 'role'"),
        ("metadata\n    /role = x\n", "neither begins nor ends with /"),
        ("metadata\n    rôle = x\n", "'ôle = x' after 'r'"),
        (
            f"curve\n    public-key = {KEY}\n    public-key = {KEY}\n",
            r":3: curve 'public-key' given",
        ),
        (f"curve\n    public-key = {KEY}\ncurve\n", r":3: section 'curve' given twice"),
        ('curve\n    public-key = "' + "#" * 40 + '"\n', "not valid Z85"),  # > 2**32 - 1
        ('curve\n    public-key = "' + "é" * 40 + '"\n', "not valid Z85"),
        ('curve\n    public-key = "' + "?" * 39 + 'é"\n', "not valid Z85"),
        ("curve\n    public-key = " + KEY + "\0", "NUL"),
    ],
)
def test_malformed_certificates_name_the_fault(text: str, message: str) -> None:
    with pytest.raises(KeyFileError, match=message):
        certs.parse_certificate(text)


def test_a_secret_that_does_not_match_its_public_key_is_refused() -> None:
    public, secret = certs.generate_key_pair()
    _, other_secret = zmq.curve_keypair()
    text = certs.format_certificate(public, secret, {}).replace(
        secret.decode(), other_secret.decode()
    )
    with pytest.raises(KeyFileError, match="does not match"):
        certs.parse_certificate(text)


def test_files_that_are_not_text(tmp_path: Path) -> None:
    (tmp_path / "bin.key").write_bytes(b"\xff\xfe\x00curve")
    (tmp_path / "big.key").write_bytes(b"#" * 70_000)
    with pytest.raises(KeyFileError, match="not UTF-8"):
        certs.read_certificate(tmp_path / "bin.key")
    with pytest.raises(KeyFileError, match="larger than"):
        certs.read_certificate(tmp_path / "big.key")
    with pytest.raises(KeyFileError, match="No such file"):
        certs.read_certificate(tmp_path / "none.key")
    (tmp_path / "bom.key").write_bytes(b"\xef\xbb\xbf" + CZMQ_PUBLIC.encode())
    assert certs.read_certificate(tmp_path / "bom.key").metadata["role"] == "worker"


# -- properties -------------------------------------------------------------------------------

names = st.from_regex(
    r"[A-Za-z0-9$\-_@.&+]([A-Za-z0-9$\-_@.&+/]{0,10}[A-Za-z0-9$\-_@.&+])?", fullmatch=True
)
any_values = st.text(st.characters(blacklist_characters="\r\n\0", blacklist_categories=("Cs",)))
# What pyzmq's unquoted form can carry and CZMQ reads back unchanged: no comment, no quote to
# begin with, no surrounding space.
unquoted_values = any_values.map(lambda v: v.replace("#", "").strip(" \t\v\f")).filter(
    lambda v: v[:1] not in ("'", '"')
)
z85_keys = st.text(st.sampled_from(Z85), min_size=40, max_size=40)


@given(st.dictionaries(names, any_values.filter(lambda v: not ('"' in v and "'" in v)), max_size=5))
def test_our_metadata_survives_a_round_trip(metadata: dict[str, str]) -> None:
    public, secret = zmq.curve_keypair()
    for text in (
        certs.format_certificate(public, secret, metadata),
        certs.format_certificate(public, None, metadata).replace("\n", "\r\n"),
    ):
        parsed = certs.parse_certificate(text)
        assert parsed.metadata == metadata
        assert parsed.public == public and parsed.secret in (secret, None)


@settings(max_examples=40)
@given(st.dictionaries(names, unquoted_values, max_size=5))
def test_pyzmqs_written_metadata_read_back(metadata: dict[str, str]) -> None:
    with tempfile.TemporaryDirectory() as directory:
        public_path, secret_path = zmq.auth.create_certificates(directory, "p", metadata)
        public, secret = zmq.auth.load_certificate(secret_path)
        parsed = certs.read_certificate(secret_path)
        assert (parsed.public, parsed.secret) == (public, secret)
        assert parsed.metadata == metadata
        assert certs.read_certificate(public_path).metadata == {}


@given(st.text(max_size=300))
def test_any_text_is_a_certificate_or_a_key_file_error(text: str) -> None:
    try:
        certificate = certs.parse_certificate(text)
    except KeyFileError:
        return  # any other exception fails the test
    assert len(certificate.public) == 40


zpl_lines = st.sampled_from(
    [*CZMQ_PUBLIC.splitlines(keepends=True), *CZMQ_SECRET.splitlines(keepends=True),
     *HAND_WRITTEN.splitlines(keepends=True), *NESTED.splitlines(keepends=True)]
) | z85_keys.map(lambda key: f'    public-key = "{key}"\n') | z85_keys.map(
    lambda key: f"    secret-key = {key}\n"
) | st.text(max_size=12).map(lambda text: f"    {text}\n")  # fmt: skip


@given(st.lists(zpl_lines, max_size=12))
def test_certificate_like_garbage_never_raises_anything_else(lines: list[str]) -> None:
    try:
        certificate = certs.parse_certificate("".join(lines))
    except KeyFileError:
        return
    assert len(certificate.public) == 40
    if certificate.secret is not None:
        assert zmq.curve_public(certificate.secret) == certificate.public


@settings(max_examples=50)
@given(st.binary(max_size=400))
def test_any_file_is_a_certificate_or_a_key_file_error(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "x.key"
        path.write_bytes(data)
        try:
            certs.read_certificate(path)
        except KeyFileError as error:
            assert str(path) in str(error)
