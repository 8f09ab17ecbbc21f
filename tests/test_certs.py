"""Certificates with their metadata (bus.transport.certs): CZMQ's and pyzmq's forms read, ours
written as CZMQ writes them, garbage refused with a KeyFileError and nothing else."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
import zmq
import zmq.auth
from hypothesis import given
from hypothesis import strategies as st
from zmq.utils import z85

from bus.transport import certs
from bus.transport.curve import KeyFileError, load_key_pair

# What CZMQ 4.2.1's zcert_save_public wrote (a C program calling zcert_new, zcert_set_meta
# twice and zcert_save_public, run on this machine with Debian's libczmq).
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


def test_czmqs_public_certificate() -> None:
    certificate = certs.parse_certificate(CZMQ_PUBLIC)
    assert certificate.public == b".JrdgPp/Z%qPEQ{iLOq>a^gEHjPcs<c)xBtzdp{b"
    assert certificate.secret is None
    assert certificate.metadata == {"publish": "/orders/,/billing/", "role": "worker"}


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
        tmp_path, "bob", public, secret, {"subscribe": "/a/", "names": "x"}
    )
    assert secret_path is not None
    assert stat.S_IMODE(secret_path.stat().st_mode) == 0o600
    assert stat.S_IMODE(public_path.stat().st_mode) == 0o644
    assert 'subscribe = "/a/"' in public_path.read_text()
    assert "secret-key" not in public_path.read_text()
    assert zmq.auth.load_certificate(str(public_path)) == (public, None)
    assert load_key_pair(secret_path).secret == secret
    assert certs.read_certificate(public_path).metadata == {"subscribe": "/a/", "names": "x"}
    with pytest.raises(KeyFileError, match="exists"):
        certs.write_certificate(tmp_path, "bob", public, None, {})


def test_set_metadata_keeps_the_key(tmp_path: Path) -> None:
    public, _secret = certs.generate_key_pair()
    path, _ = certs.write_certificate(tmp_path, "c", public, None, {"publish": "/a/", "x": "1"})
    changed = certs.set_metadata(path, {"publish": "/b/"}, remove=["x"])
    assert changed.metadata == {"publish": "/b/"}
    again = certs.read_certificate(path)
    assert again.public == public and again.metadata == {"publish": "/b/"}
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    with pytest.raises(ValueError, match="double quote"):
        certs.set_metadata(path, {"publish": 'a"b'})


def test_zyre_safe_keys_never_begin_with_a_zero_byte() -> None:
    for _ in range(2000):
        public, _secret = certs.generate_key_pair()
        assert z85.decode(public)[0] != 0


def test_a_directory_skips_what_is_not_a_certificate(tmp_path: Path) -> None:
    public, _ = certs.generate_key_pair()
    certs.write_certificate(tmp_path, "good", public, None, {})
    (tmp_path / "bad.key").write_text('curve\n    public-key = "short"\n')
    (tmp_path / "note.txt").write_text("not a key")
    assert list(certs.certificates_in(tmp_path)) == [public]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("curve\n", "no curve public-key"),
        ('curve\n    public-key = "abc"\n', "40-character"),
        ("metadata\n  role = x\n", "not a ZPL line"),
        ('    role = "x"\n', "not in a section"),
        ('metadata\n    role = "x\n', "unterminated"),
        ("metadata = 1\n", "should be a section"),
        ('curve\n    public-key = "' + "~" * 40 + '"\n', "not valid Z85"),
    ],
)
def test_malformed_certificates_name_the_fault(text: str, message: str) -> None:
    with pytest.raises(KeyFileError, match=message):
        certs.parse_certificate(text)


def test_a_secret_that_does_not_match_its_public_key_is_refused() -> None:
    public, _ = certs.generate_key_pair()
    _, other_secret = zmq.curve_keypair()
    text = certs.format_certificate(public, other_secret, {})
    with pytest.raises(KeyFileError, match="does not match"):
        certs.parse_certificate(text)


names = st.from_regex(r"[A-Za-z0-9$\-_@.&+/]{1,12}", fullmatch=True)
values = st.text(st.characters(blacklist_characters='"\r\n', blacklist_categories=("Cs",)))


@given(st.dictionaries(names, values.map(str.strip), max_size=5))
def test_metadata_survives_a_round_trip(metadata: dict[str, str]) -> None:
    public, secret = zmq.curve_keypair()
    text = certs.format_certificate(public, secret, metadata)
    parsed = certs.parse_certificate(text)
    assert parsed.metadata == metadata
    assert (parsed.public, parsed.secret) == (public, secret)


@given(st.text(max_size=300))
def test_any_text_is_a_certificate_or_a_key_file_error(text: str) -> None:
    try:
        certificate = certs.parse_certificate(text)
    except KeyFileError:
        return
    assert len(certificate.public) == 40


@given(st.lists(st.sampled_from(CZMQ_PUBLIC.splitlines(keepends=True)), max_size=12))
def test_shuffled_czmq_lines_never_raise_anything_else(lines: list[str]) -> None:
    try:
        certificate = certs.parse_certificate("".join(lines))
    except KeyFileError:
        return  # any other exception fails the test
    assert certificate.public == b".JrdgPp/Z%qPEQ{iLOq>a^gEHjPcs<c)xBtzdp{b"
