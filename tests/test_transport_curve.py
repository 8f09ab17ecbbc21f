"""bus.transport.curve: zcert key files (as zmq.auth reads and writes them), mc0d's bare Z85
secret key, public keys given inline or as files, and refusals of bad files."""

from __future__ import annotations

from pathlib import Path

import pytest
import zmq
import zmq.auth

from bus.transport.curve import (
    CurveKeyPair,
    KeyFileError,
    create_key_pair,
    load_key_pair,
    load_public_key,
    public_keys_in,
    server_key_pair,
)


def test_a_pair_made_here_is_what_zmq_auth_reads(tmp_path: Path) -> None:
    public_path, secret_path = create_key_pair(tmp_path / "keys", "alice")
    assert (public_path.name, secret_path.name) == ("alice.key", "alice.key_secret")
    public, secret = zmq.auth.load_certificate(str(secret_path))
    assert secret is not None and zmq.curve_public(secret) == public
    assert load_key_pair(secret_path) == CurveKeyPair(public, secret)
    assert load_key_pair(public_path) == CurveKeyPair(public, secret)  # reads the sibling
    assert load_public_key(public_path) == public
    assert load_public_key(public.decode()) == public
    assert secret_path.stat().st_mode & 0o777 == 0o600
    assert public_keys_in(tmp_path / "keys") == [public]
    with pytest.raises(KeyFileError, match="not overwriting"):
        create_key_pair(tmp_path / "keys", "alice")


def test_a_pair_zmq_auth_made_is_read_here(tmp_path: Path) -> None:
    _public_path, secret_path = zmq.auth.create_certificates(str(tmp_path), "bob")
    pair = load_key_pair(secret_path)
    assert pair.secret is not None and zmq.curve_public(pair.secret) == pair.public


def test_a_bare_z85_secret_key_file_as_mc0d_keeps_it(tmp_path: Path) -> None:
    pair = CurveKeyPair.generate()
    assert pair.secret is not None
    path = tmp_path / "private.key"
    path.write_bytes(pair.secret + b"\n")
    assert load_key_pair(path) == pair


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "No such file"),
        (b"hello\n", "not a CURVE certificate"),
        (b'#   ZeroMQ CURVE\ncurve\n    public-key = "x"\n', "holds no secret key"),
        (b"\x00" * 40, "not valid Z85"),
    ],
)
def test_bad_key_files_are_refused(tmp_path: Path, content: bytes | None, message: str) -> None:
    path = tmp_path / "bad.key_secret"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(KeyFileError, match=message):
        load_key_pair(path)


def test_a_secret_that_does_not_match_its_public_key_is_refused(tmp_path: Path) -> None:
    _public_path, secret_path = create_key_pair(tmp_path, "eve")
    other = CurveKeyPair.generate()
    text = secret_path.read_text()
    public, _secret = zmq.auth.load_certificate(str(secret_path))
    secret_path.write_text(text.replace(public.decode(), other.public.decode()))
    with pytest.raises(KeyFileError, match="does not match"):
        load_key_pair(secret_path)


def test_the_servers_pair_is_made_once(tmp_path: Path) -> None:
    first, created = server_key_pair(tmp_path)
    again, created_again = server_key_pair(tmp_path)
    assert created and not created_again and first == again


def test_a_public_key_of_the_wrong_length_is_refused() -> None:
    with pytest.raises(KeyFileError):
        load_public_key("short")
