"""The allow-list of a CURVE server as an operator edits it, through a real ``twistd -n
eventbus`` and raw ZeroMQ CURVE handshakes: a key added is let in and a key removed is
refused within a re-read, whatever else lies in the directory (a dangling link, an
unreadable entry), and when the directory is removed and made again or a certificate is
replaced by rename with its old modification time kept.

A hostile tester's finding: one dangling ``*.key`` link froze the allow-list, so that a
removed key stayed admitted for as long as the link was there."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
import zmq
from zmq.utils.monitor import recv_monitor_message

from bus.testing import wait_until
from bus.transport.certs import directory_signature, write_certificate
from bus.transport.curve import CurveKeyPair
from tests.curve_helpers import Keys
from tests.processes import CLEAN_EXIT, ServerProcess, reported

_OUTCOMES = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH


def admitted(endpoint: str, server: bytes, client: CurveKeyPair) -> bool | None:
    """Whether the server lets ``client`` finish a CURVE handshake (None: no word in 3 s)."""
    context = zmq.Context.instance()
    sock = context.socket(zmq.DEALER)
    sock.linger = 0
    sock.curve_serverkey, sock.curve_publickey = server, client.public
    sock.curve_secretkey = client.secret
    monitor = sock.get_monitor_socket(_OUTCOMES)
    try:
        sock.connect(endpoint)
        if not monitor.poll(3000):
            return None
        event = recv_monitor_message(monitor)["event"]
        return bool(event == zmq.EVENT_HANDSHAKE_SUCCEEDED)
    finally:
        sock.disable_monitor()
        monitor.close(linger=0)
        sock.close(linger=0)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[ServerProcess, Keys]]:
    keys = Keys(tmp_path)
    server = ServerProcess(
        tmp_path / "data",
        "--server-cert", str(keys.server_cert), "--client-certs", str(keys.allowed),
        "--services", "eventbus",
    )  # fmt: skip
    try:
        yield server, keys
    finally:
        assert server.stop() in CLEAN_EXIT


def certify(keys: Keys, name: str, pair: CurveKeyPair) -> None:
    write_certificate(keys.allowed, name, pair.public, None, {})


@pytest_twisted.inlineCallbacks
def test_keys_come_and_go_whatever_else_is_in_the_directory(
    served: tuple[ServerProcess, Keys],
) -> Any:
    server, keys = served
    yield reported(server.ready, what="the bus")
    endpoint = server.status()["endpoints"]["snapshot"]
    public = keys.server.public

    def becomes(pair: CurveKeyPair, expected: bool, what: str) -> Any:
        return wait_until(lambda: admitted(endpoint, public, pair) is expected, 15, what=what)

    kept = keys.client("kept")
    yield becomes(kept, True, "a key added let in")

    # A dangling link: skipped with its line, and the list still follows every change.
    (keys.allowed / "moved-away.key").symlink_to(keys.root / "nowhere")
    late = CurveKeyPair.generate()
    assert admitted(endpoint, public, late) is False
    certify(keys, "late", late)
    yield becomes(late, True, "a key added beside a dangling link let in")
    (keys.allowed / "kept.key").unlink()
    yield becomes(kept, False, "a key removed beside a dangling link refused")
    assert "moved-away.key" in server.output()
    # The link's target appears: that certificate counts from the next re-read.
    target = CurveKeyPair.generate()
    write_certificate(keys.root, "nowhere-made", target.public, None, {})
    (keys.root / "nowhere-made.key").rename(keys.root / "nowhere")
    yield becomes(target, True, "a dangling link's certificate once it is there")

    # An entry that cannot be read as a file (a directory of that name): likewise.
    (keys.allowed / "a-directory.key").mkdir()
    (keys.allowed / "late.key").unlink()
    yield becomes(late, False, "a key removed beside an unreadable entry refused")
    again = CurveKeyPair.generate()
    certify(keys, "again", again)
    yield becomes(again, True, "a key added beside an unreadable entry let in")

    # A certificate replaced by rename, its modification time kept (cp -p, rsync -t).
    replacement = CurveKeyPair.generate()
    staged = keys.root / "staged"
    staged.mkdir()
    write_certificate(staged, "again", replacement.public, None, {})
    old = (keys.allowed / "again.key").stat()
    os.utime(staged / "again.key", ns=(old.st_atime_ns, old.st_mtime_ns))
    (staged / "again.key").rename(keys.allowed / "again.key")
    yield becomes(again, False, "the replaced key refused")
    yield becomes(replacement, True, "its replacement let in")

    # The directory removed (every key refused) and made again with other keys.
    shutil.rmtree(keys.allowed)
    yield becomes(replacement, False, "every key refused without the directory")
    keys.allowed.mkdir()
    newcomer = CurveKeyPair.generate()
    certify(keys, "newcomer", newcomer)
    yield becomes(newcomer, True, "a key of the directory made again let in")
    assert admitted(endpoint, public, replacement) is False
    assert server.process.poll() is None


def test_the_signature_changes_with_every_change_of_what_can_be_read(tmp_path: Path) -> None:
    """Each change the re-read must see, in isolation (the test above through a server)."""
    keys = Keys(tmp_path)
    seen = [directory_signature(keys.allowed)]

    def changed() -> bool:
        seen.append(directory_signature(keys.allowed))
        return seen[-1] != seen[-2]

    (keys.allowed / "dangling.key").symlink_to(tmp_path / "nowhere")
    assert changed()
    keys.client("added")
    assert changed()
    (tmp_path / "nowhere").write_text("now there\n")
    assert changed()
    assert not changed()  # nothing happened: nothing read again
    (keys.allowed / "added.key").unlink()
    assert changed()
    (keys.allowed / "odd.key").mkdir()
    assert changed()
    keys.client("copied")
    before = (keys.allowed / "copied.key").stat()
    write_certificate(tmp_path, "copied", CurveKeyPair.generate().public, None, {})
    os.utime(tmp_path / "copied.key", ns=(before.st_atime_ns, before.st_mtime_ns))
    (tmp_path / "copied.key").rename(keys.allowed / "copied.key")
    assert changed()
    shutil.rmtree(keys.allowed)
    assert changed()
    keys.allowed.mkdir()
    assert changed()
