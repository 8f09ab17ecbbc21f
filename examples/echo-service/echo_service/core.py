"""The echo service's logic, sans I/O: requests in, replies and counters out."""

from __future__ import annotations

from collections import Counter

from echo_service import codec


class EchoCore:
    """Answers each request; counts what it echoed and what it refused, by reason."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.echoed = 0
        self.echoed_bytes = 0
        self.refused: Counter[str] = Counter()

    def handle(self, frames: list[bytes]) -> tuple[list[bytes], int | None]:
        """The reply to ``frames`` (without the ROUTER identity), and the payload's size
        when it was echoed (None when refused)."""
        try:
            payload = codec.parse_request(frames, self.max_bytes)
        except codec.EchoError as error:
            self.refused[error.reason] += 1
            return codec.error(error.reason), None
        self.echoed += 1
        self.echoed_bytes += len(payload)
        return codec.reply(payload), len(payload)
