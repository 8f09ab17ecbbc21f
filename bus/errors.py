"""The one exception family that codecs raise for malformed input, and what a service that
cannot start raises."""

import re
from typing import Any


class ProtocolError(ValueError):
    """A peer sent something the protocol does not allow.

    ``reason`` is a short, stable label used for drop counters and rate-limited logs.
    """

    reason = "malformed"

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        if reason is not None:
            self.reason = reason


class StartupError(Exception):
    """A service cannot start because of one of its settings (a busy port, a bad key file).

    ``option`` is the option's name as the service's tap spells it (``port``); composition
    adds the service's prefix and the value when it tells the operator (:meth:`line`). An
    empty ``option``: the service itself, whatever its options say (a missing extra).
    """

    def __init__(self, option: str, cause: str) -> None:
        super().__init__(f"--{option}: {cause}" if option else cause)
        self.option = option
        self.cause = cause

    def line(self, service: str, prefix: str = "", value: Any = None) -> str:
        """The one line for operators: ``cannot start eventbus: --port 5556: CAUSE``
        (``prefix``: how the service's options are spelled where it runs)."""
        if not self.option:
            return f"cannot start {service}: {redacted(self.cause)}"
        flag = f"--{prefix}{self.option}"
        shown = f"{flag} {redacted(str(value))}" if value not in (None, "") else flag
        return f"cannot start {service}: {shown}: {redacted(self.cause)}"


class StartFailed(Exception):
    """A service could not start; the message is the one line for operators."""


class StorageError(Exception):
    """A store could not open or write: ``cause`` is the underlying error (SQLite's, the
    filesystem's, a replicated log's).

    The message is the cause's own (e.g. "database or disk is full"), so it reads well in
    one log line; the failed call changed nothing."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


#: ``scheme://userinfo@`` anywhere in a text.
_USERINFO = re.compile(r"\b([a-zA-Z][a-zA-Z0-9+.-]*://)([^\s/@,;'\"]+)@")


def redacted(text: str) -> str:
    """``text`` with every URL's password or token shown as ``***`` (its user stays):
    what operators are told never carries a secret a URL held (``nats://u:pw@h``)."""

    def hide(match: re.Match[str]) -> str:
        user, colon, _ = match.group(2).partition(":")
        return f"{match.group(1)}{user}:***@" if colon else f"{match.group(1)}***@"

    return _USERINFO.sub(hide, text)
