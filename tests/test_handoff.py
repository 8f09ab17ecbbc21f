"""bus.util.handoff: lists from a thread reach the reactor in order, one wake-up per burst."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from twisted.internet import reactor as global_reactor
from twisted.internet.defer import Deferred, gatherResults
from twisted.internet.threads import deferToThread

from bus.util.handoff import Handoff


class Wakes:
    """A reactor stand-in that keeps what callFromThread was given."""

    def __init__(self) -> None:
        self.calls: list[Callable[[], None]] = []

    def callFromThread(self, call: Callable[..., Any], *args: Any) -> None:
        self.calls.append(lambda: call(*args))


def test_a_burst_wakes_the_reactor_once_and_arrives_whole_in_order() -> None:
    reactor = Wakes()
    got: list[list[int]] = []
    handoff: Handoff[int] = Handoff(reactor, got.append)
    handoff.put([1, 2])
    handoff.put([3])
    handoff.put([4, 5])
    assert len(reactor.calls) == 1
    reactor.calls.pop()()
    assert got == [[1, 2, 3, 4, 5]]
    handoff.put([6])
    assert len(reactor.calls) == 1  # a new burst: a new wake-up
    reactor.calls.pop()()
    assert got == [[1, 2, 3, 4, 5], [6]]


def test_items_put_from_threads_reach_the_reactor_thread_in_each_threads_order() -> Deferred[None]:
    received: list[tuple[int, int]] = []
    threads_seen: set[int] = set()

    def receive(items: list[tuple[int, int]]) -> None:
        threads_seen.add(threading.get_ident())
        received.extend(items)

    handoff: Handoff[tuple[int, int]] = Handoff(global_reactor, receive)
    reactor_thread = threading.get_ident()

    def produce(which: int) -> None:
        for n in range(2000):
            handoff.put([(which, n)])

    def check(_: object) -> None:
        assert threads_seen == {reactor_thread}
        for which in (0, 1):
            assert [n for w, n in received if w == which] == list(range(2000))

    done = gatherResults([deferToThread(produce, 0), deferToThread(produce, 1)])

    def settle(_: object) -> Deferred[None]:
        # Anything still posted arrives on the reactor's next turns.
        waited: Deferred[None] = Deferred()
        global_reactor.callLater(0.1, waited.callback, None)
        return waited

    return done.addCallback(settle).addCallback(check)
