"""The echo service's own tests: the codec and core sans I/O, the service through a real
socket (a third-party distribution tests itself as the built-in services do)."""

from __future__ import annotations

from typing import Any

import pytest_twisted
from echo_service.core import EchoCore
from echo_service.service import EchoService

from bus.extension import RawPeer, wait_until


def test_the_core_echoes_and_counts_what_it_refuses() -> None:
    core = EchoCore(max_bytes=4)
    assert core.handle([b"ECHO", b"abcd"]) == ([b"ECHO-OK", b"abcd"], 4)
    assert core.handle([b"ECHO", b"abcde"]) == ([b"ERROR", b"oversized"], None)
    assert core.handle([b"ECHO"]) == ([b"ERROR", b"frame-count"], None)
    assert core.handle([]) == ([b"ERROR", b"unknown-command"], None)
    assert (core.echoed, core.echoed_bytes) == (1, 4)
    assert dict(core.refused) == {"oversized": 1, "frame-count": 1, "unknown-command": 1}


@pytest_twisted.inlineCallbacks
def test_the_service_answers_on_its_router() -> Any:
    service = EchoService("127.0.0.1", 0, max_bytes=16)
    service.startService()
    client = RawPeer.dealer(service.endpoint)
    try:
        client.send([b"ECHO", b"ping"])
        yield wait_until(lambda: client.messages, what="the echo")
        assert client.messages == [[b"ECHO-OK", b"ping"]]
        assert service.status()["echoed"] == 1
    finally:
        client.close()
        service.stopService()
