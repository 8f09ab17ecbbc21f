"""A stream's management through JetStream's API on a blocking connection: its info
(None when there is no such stream), made, changed, purged, a message read by sequence.

For a process that owns its thread and talks to one stream at a time (the imports of
``eventbus-cli import-log`` and ``emqp-cli import-store``); the services manage their
streams on the reactor (:mod:`bus.nats.client`). A request JetStream does not answer
(no leader yet: a new cluster, an election) is asked again until ``patience`` runs out.
"""

from __future__ import annotations

import base64
import json
import time
from typing import Any

from bus.nats import jsapi
from bus.nats.blocking import Connection

#: Seconds one request waits for its answer before it is asked again.
ATTEMPT = 2.0


class StreamAdmin:
    """Requests about stream :attr:`name` (see the module's text)."""

    def __init__(self, connection: Connection, name: str, patience: float = 30.0) -> None:
        self.connection = connection
        self.name = name
        self.patience = patience

    def ask(self, subject: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        """JetStream's answer to ``subject`` (with ``body`` as JSON), asked again while
        unanswered or answered 503 (no leader); its error raised as
        :class:`bus.nats.jsapi.JetStreamError`."""
        payload = b"" if body is None else json.dumps(body).encode()
        deadline = time.monotonic() + self.patience
        while True:
            try:
                return jsapi.answer(self.connection.request(subject, payload, ATTEMPT).payload)
            except jsapi.JetStreamError as error:
                if error.code != 503 or time.monotonic() > deadline:
                    raise
            except (TimeoutError, ConnectionRefusedError):
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"JetStream did not answer {subject} in {self.patience:g}s"
                    ) from None
            time.sleep(0.25)

    def info(self) -> dict[str, Any] | None:
        """The stream's config and state; None when there is no such stream."""
        try:
            return self.ask(jsapi.stream_info(self.name))
        except jsapi.JetStreamError as error:
            if error.err_code == jsapi.STREAM_NOT_FOUND:
                return None
            raise

    def create(self, config: dict[str, Any]) -> dict[str, Any]:
        """Make the stream (``config["name"]`` is :attr:`name`); its info."""
        return self.ask(f"{jsapi.API}.STREAM.CREATE.{self.name}", config)

    def update(self, config: dict[str, Any]) -> dict[str, Any]:
        """Change its settings to ``config`` (the whole of them, as info gave them); its info."""
        return self.ask(f"{jsapi.API}.STREAM.UPDATE.{self.name}", config)

    def purge(self, **request: Any) -> int:
        """Remove messages (``filter``: those of a subject; ``seq``: those below it); how
        many."""
        answer = self.ask(f"{jsapi.API}.STREAM.PURGE.{self.name}", request or None)
        return int(answer.get("purged", 0))

    def message(self, sequence: int) -> tuple[str, bytes, bytes] | None:
        """The subject, header block and body stored at ``sequence``; None when none is."""
        try:
            answer = self.ask(jsapi.message_get(self.name), {"seq": sequence})
        except jsapi.JetStreamError as error:
            if error.err_code == jsapi.NO_MESSAGE_FOUND:
                return None
            raise
        stored = answer["message"]
        headers = base64.b64decode(stored.get("hdrs") or "")
        return str(stored["subject"]), headers, base64.b64decode(stored.get("data") or "")
