"""``bus-keys`` (and its former name ``mc0-keys``) as a user runs it: key pairs with rights,
rights changed in place, certificates shown; bad input one line and exit status 1."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
        "--queues", "jobs", "--meta", "team=ops", cwd=tmp_path,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    public = read_certificate(tmp_path / "keys" / "orders.key")
    secret = read_certificate(tmp_path / "keys" / "orders.key_secret")
    assert made.stdout.strip() == public.public.decode()
    expected = {"team": "ops", "publish": "/orders/,/billing/", "role": "client", "queues": "jobs"}
    assert public.metadata == expected == secret.metadata
    assert public.secret is None and secret.secret is not None
    # pyzmq (zmq.auth) reads them as the allow-lists of other tools do.
    assert zmq.auth.load_certificate(str(tmp_path / "keys" / "orders.key"))[0] == public.public


def test_rights_changed_in_place_and_shown(tmp_path: Path) -> None:
    assert (
        run("bus-keys", "w", "keys", "--role", "worker", "--meta", "x=1", cwd=tmp_path).returncode
        == 0
    )
    path = tmp_path / "keys" / "w.key"
    before = read_certificate(path).public
    changed = run("bus-keys", "set", str(path), "--queues", "a,b", "--unset", "x", cwd=tmp_path)
    assert changed.returncode == 0, changed.stderr
    after = read_certificate(path)
    assert after.public == before
    assert after.metadata == {"role": "worker", "queues": "a,b"}
    shown = run("bus-keys", "show", str(path), cwd=tmp_path)
    assert shown.stdout.splitlines() == [before.decode(), "role = worker", "queues = a,b"]
    secret = run("bus-keys", "show", str(tmp_path / "keys" / "w.key_secret"), cwd=tmp_path)
    assert "secret" not in secret.stdout.lower() and len(secret.stdout.splitlines()) == 3


def test_bad_input_is_one_line(tmp_path: Path) -> None:
    role = run("bus-keys", "x", "keys", "--role", "boss", cwd=tmp_path)
    assert role.returncode == 2 and "a role is one of worker, client, admin" in role.stderr
    subtree = run("bus-keys", "x", "keys", "--publish", "orders", cwd=tmp_path)
    assert subtree.returncode == 2 and "a subtree starts with /" in subtree.stderr
    assert run("bus-keys", "x", "keys", cwd=tmp_path).returncode == 0
    again = run("bus-keys", "x", "keys", cwd=tmp_path)
    assert again.returncode == 1
    assert again.stderr.strip().endswith("exists: not overwriting a key")
    missing = run("bus-keys", "show", "nothere.key", cwd=tmp_path)
    assert missing.returncode == 1 and missing.stderr.count("\n") == 1
    assert not (tmp_path / "nothere.key").exists()


def test_mc0_keys_is_the_same_command(tmp_path: Path) -> None:
    made = run("mc0-keys", "alice", "keys", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    assert read_certificate(tmp_path / "keys" / "alice.key").public.decode() == made.stdout.strip()
