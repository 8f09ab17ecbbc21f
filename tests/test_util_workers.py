"""Work kept off the reactor on a thread of its own (bus.util.workers), with real threads."""

from __future__ import annotations

import threading
from typing import Any

import pytest_twisted
from twisted.internet import reactor
from twisted.python.failure import Failure

from bus.util.workers import NewestWins


def started(failures: list[Failure]) -> NewestWins:
    work = NewestWins(reactor, "test-newest", failures.append)
    work.start()
    return work


@pytest_twisted.inlineCallbacks
def test_a_call_asked_for_while_one_runs_waits_and_the_newest_replaces_it() -> Any:
    failures: list[Failure] = []
    work = started(failures)
    release = threading.Event()
    ran: list[tuple[str, bool]] = []

    def call(name: str) -> Any:
        def body() -> None:
            if name == "first":
                release.wait(60)  # held until the others were asked for
            ran.append((name, threading.current_thread() is threading.main_thread()))

        return body

    try:
        work.run(call("first"))
        work.run(call("second"))
        work.run(call("third"))
        idle = work.idle()
        assert not idle.called
        release.set()
        yield idle
    finally:
        release.set()
        work.stop()
    assert ran == [("first", False), ("third", False)]
    assert failures == []


@pytest_twisted.inlineCallbacks
def test_a_failed_call_is_reported_and_the_waiting_one_still_runs() -> Any:
    failures: list[Failure] = []
    work = started(failures)
    release = threading.Event()
    ran: list[str] = []

    def broken() -> None:
        release.wait(60)
        raise OSError("disk gone")

    try:
        work.run(broken)
        work.run(lambda: ran.append("after"))
        release.set()
        yield work.idle()
    finally:
        release.set()
        work.stop()
    assert ran == ["after"]
    assert [f.check(OSError) for f in failures] == [OSError]
    # Idle with nothing asked for: at once.
    assert work.idle().called
