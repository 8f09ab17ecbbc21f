"""``bus-keys`` (and its former name ``mc0-keys``) as a user runs it, through the installed
scripts: key pairs with rights, rights changed in place, certificates shown; any mistake one
line on stderr and exit status 1."""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

import pytest
import zmq.auth

from bus.transport.certs import read_certificate

BIN = Path(sys.executable).parent


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / args[0]), *args[1:]], cwd=cwd, capture_output=True, text=True, timeout=60
    )


def test_a_key_pair_with_rights_in_both_files(tmp_path: Path) -> None:
    made = run(
        "bus-keys", "orders", "keys", "--publish", "/orders/, /billing/", "--role", "client",
        "--queues", "jobs", "--meta", "team=ops", "--subscribe", "", cwd=tmp_path,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    public = read_certificate(tmp_path / "keys" / "orders.key")
    secret = read_certificate(tmp_path / "keys" / "orders.key_secret")
    assert made.stdout == public.public.decode() + "\n"
    assert made.stderr == "made keys, wrote keys/orders.key and keys/orders.key_secret\n"
    expected = {
        "team": "ops",
        "publish": "/orders/,/billing/",
        "subscribe": "",
        "role": "client",
        "queues": "jobs",
    }
    assert public.metadata == expected == secret.metadata
    assert public.secret is None and secret.secret is not None
    assert stat.S_IMODE((tmp_path / "keys" / "orders.key_secret").stat().st_mode) == 0o600
    # pyzmq (zmq.auth) reads them as the allow-lists of other tools do.
    assert zmq.auth.load_certificate(str(tmp_path / "keys" / "orders.key"))[0] == public.public


def test_make_names_a_pair_that_looks_like_a_command(tmp_path: Path) -> None:
    made = run("bus-keys", "make", "set", "keys", "--names", "a", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    assert read_certificate(tmp_path / "keys" / "set.key").metadata == {"names": "a"}
    assert run("bus-keys", "make", "make", "keys", cwd=tmp_path).returncode == 0
    assert (tmp_path / "keys" / "make.key_secret").exists()


def test_rights_changed_in_place_and_shown(tmp_path: Path) -> None:
    made = run("bus-keys", "w", "keys", "--role", "worker", "--meta", "x=1", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    path = tmp_path / "keys" / "w.key"
    before = read_certificate(path).public
    changed = run("bus-keys", "set", str(path), "--queues", "a,b", "--unset", "x", cwd=tmp_path)
    assert changed.returncode == 0, changed.stderr
    assert changed.stdout == ""
    after = read_certificate(path)
    assert after.public == before
    assert after.metadata == {"role": "worker", "queues": "a,b"}
    # Its secret half beside it says the same (CZMQ's zcert_load would read that one).
    assert read_certificate(tmp_path / "keys" / "w.key_secret").metadata == after.metadata
    shown = run("bus-keys", "show", str(path), cwd=tmp_path)
    assert shown.stdout.splitlines() == [before.decode(), "role = worker", "queues = a,b"]
    secret_file = tmp_path / "keys" / "w.key_secret"
    secret = run("bus-keys", "show", str(secret_file), cwd=tmp_path)
    assert secret.stdout == shown.stdout
    secret_key = read_certificate(secret_file).secret
    assert secret_key is not None and secret_key.decode() not in secret.stdout + secret.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["x", "keys", "--role", "boss"],
            "'boss': a role is one of worker, client, admin, publisher, subscriber",
        ),
        (
            ["x", "keys", "--meta", "role=boss"],
            "'boss': a role is one of worker, client, admin, publisher, subscriber",
        ),
        (["x", "keys", "--publish", "orders"], "'orders': a subtree starts with /"),
        (["x", "keys", "--queues", "a,,b"], "comma-separated names, none empty"),
        (["x", "keys", "--meta", "novalue"], "write KEY=VALUE"),
        (["x", "keys", "--meta", "a b=1"], "letters, digits"),
        (["x"], "the following arguments are required: directory"),
        (["x", "no/such"], "'no/such': its parent 'no' is not a directory"),
        (["--bogus"], "unrecognized arguments: --bogus"),
        (["a/b", "keys"], "'a/b' is not a name for a key"),
        (["show", "nothere.key"], "nothere.key: No such file or directory"),
        (["set", "nothere.key", "--role", "admin"], "nothere.key: No such file or directory"),
    ],
)
def test_a_mistake_is_one_line_and_status_1(tmp_path: Path, args: list[str], message: str) -> None:
    failed = run("bus-keys", *args, cwd=tmp_path)
    assert failed.returncode == 1
    assert failed.stdout == "" and failed.stderr.count("\n") == 1, failed.stderr
    assert failed.stderr.startswith("bus-keys") and message in failed.stderr
    assert list(tmp_path.iterdir()) == []


def test_never_overwrites(tmp_path: Path) -> None:
    assert run("bus-keys", "x", "keys", cwd=tmp_path).returncode == 0
    before = (tmp_path / "keys" / "x.key_secret").read_bytes()
    again = run("bus-keys", "x", "keys", cwd=tmp_path)
    assert again.returncode == 1
    assert again.stderr.endswith("exists: not overwriting a key\n")
    assert (tmp_path / "keys" / "x.key_secret").read_bytes() == before


def test_mc0_keys_is_the_same_command(tmp_path: Path) -> None:
    made = run("mc0-keys", "alice", "keys", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    assert read_certificate(tmp_path / "keys" / "alice.key").public.decode() == made.stdout.strip()
    again = run("mc0-keys", "alice", "keys", cwd=tmp_path)
    assert again.returncode == 1 and again.stderr.startswith("mc0-keys: ")
