"""The one exception family that codecs raise for malformed input."""


class ProtocolError(ValueError):
    """A peer sent something the protocol does not allow.

    ``reason`` is a short, stable label used for drop counters and rate-limited logs.
    """

    reason = "malformed"

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        if reason is not None:
            self.reason = reason
