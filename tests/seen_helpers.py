"""The cluster seen as operators read it: a service's ``/status`` and ``/metrics`` over
HTTP, on the reactor (twisted.web's Agent), for the tests of bus.nats.seen's views."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from twisted.internet import defer, reactor
from twisted.internet.task import deferLater


class StatusPort:
    """The HTTP port of a process (``port``) and one of its services (``service``)."""

    def __init__(self, port: int, service: str) -> None:
        from twisted.web.client import Agent

        self.port = port
        self.service = service
        self.agent = Agent(reactor)
        #: The service's ``jetstream`` section as last read.
        self.seen: dict[str, Any] = {}

    @defer.inlineCallbacks
    def read(self, path: str) -> Any:
        """The body of ``GET /path``."""
        from twisted.web.client import readBody

        url = f"http://127.0.0.1:{self.port}/{path}".encode()
        response = yield self.agent.request(b"GET", url)
        return (yield readBody(response))

    @defer.inlineCallbacks
    def says(self, check: Callable[[dict[str, Any]], bool], timeout: float = 60) -> Any:
        """Polls /status until ``check`` holds of the service's ``jetstream`` section
        (kept in :attr:`seen`); fails with the last one read after ``timeout``."""
        deadline = reactor.seconds() + timeout
        while True:
            body = yield self.read("status")
            self.seen = json.loads(body)["services"][self.service]["jetstream"]
            if check(self.seen):
                return self.seen
            assert reactor.seconds() < deadline, json.dumps(self.seen)
            yield deferLater(reactor, 0.2, lambda: None)

    @defer.inlineCallbacks
    def samples(self, prefix: str) -> Any:
        """/metrics' samples whose names start with ``prefix``, keyed (name, sorted labels)."""
        from prometheus_client.parser import text_string_to_metric_families

        text = (yield self.read("metrics")).decode()
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name.startswith(prefix)
        }


def replica(cluster: dict[str, Any], name: str) -> dict[str, Any] | None:
    """Replica ``name`` of a ``stream_cluster`` (or a consumer's ``cluster``) as /status
    shows it; None when it is not among the followers."""
    return next((r for r in cluster["replicas"] if r["name"] == name), None)


def in_cluster(status: dict[str, Any]) -> list[bool]:
    """Whether each server of a ``jetstream`` section is in the cluster now."""
    return [server["connected"] for server in status["servers"]]
