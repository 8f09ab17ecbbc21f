"""A bearer token for the HTTP port: every resource of the site behind one guard.

``--http-token-file FILE`` holds the token (surrounding whitespace ignored); the file is
re-read when it changes, so a rotated token needs no restart. A request without
``Authorization: Bearer <token>`` gets 401 with ``WWW-Authenticate: Bearer realm="bus"``;
refusals are counted by reason and logged, rate-limited, with the client's address (the one
a trusted proxy names, see :mod:`bus.web.channel`; never with what it presented). Resources the operator leaves open (``/metrics`` with
``--http-metrics-open``) are named by their first path segment.
"""

from __future__ import annotations

import hmac
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from twisted.logger import Logger
from twisted.web import resource

from bus.errors import StartupError
from bus.util.droplog import RefusalCounter
from bus.web.channel import client_of

log = Logger(namespace="bus.web.auth")


class TokenFile:
    """The token in a file, read again when the file's modification time or size changes."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._signature: tuple[float, int] | None = None
        self._token = b""
        self.read()

    def read(self) -> bytes:
        """The current token; a StartupError (named ``http-token-file``) when the file is
        missing, unreadable or empty on the first read, the last good token afterwards."""
        try:
            stat = os.stat(self.path)
            signature = (stat.st_mtime, stat.st_size)
            if signature != self._signature:
                token = self.path.read_bytes().strip()
                if not token:
                    raise ValueError("it is empty")
                self._token, self._signature = token, signature
        except (OSError, ValueError) as error:
            why = error.strerror if isinstance(error, OSError) else str(error)
            if not self._token:
                raise StartupError("http-token-file", f"{self.path}: {why}") from None
            log.warn(
                "{path}: {why}; the previous token stays in force", path=str(self.path), why=why
            )
            self._signature = None
        return self._token


class BearerGuard(resource.Resource):
    """Serves the children of ``root`` (and ``root`` itself) to requests bearing the token,
    and 401 to the others; children named in ``open_children`` are served to anyone."""

    def __init__(
        self,
        root: resource.Resource,
        token: TokenFile,
        open_children: Iterable[bytes] = (),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self._root = root
        self._token = token
        self._open = frozenset(open_children)
        self._refusals = RefusalCounter(
            log, "refused {count} HTTP request(s) ({reason}); latest from {client}", clock
        )

    def getChildWithDefault(self, path: bytes, request: Any) -> Any:
        if path in self._open:
            return self._root.getChildWithDefault(path, request)
        refusal = self._refusal(request)
        if refusal is not None:
            return self._refuse(request, refusal)
        return self._root.getChildWithDefault(path, request)

    def render(self, request: Any) -> bytes:
        refusal = self._refusal(request)
        if refusal is not None:
            return self._refuse(request, refusal).render(request)  # type: ignore[no-any-return]
        return self._root.render(request)  # type: ignore[no-any-return]

    def bears_token(self, request: Any) -> bool:
        """Whether ``request`` carries the token (checked as every resource checks it)."""
        return self._refusal(request) is None

    def _refusal(self, request: Any) -> str | None:
        header = request.getHeader(b"authorization")
        if header is None:
            return "no-token"
        scheme, _, presented = header.partition(b" ")
        if scheme.lower() != b"bearer":
            return "not-bearer"
        if not hmac.compare_digest(presented.strip(), self._token.read()):
            return "wrong-token"
        return None

    @property
    def refusals(self) -> Counter[str]:
        """Requests refused, by reason."""
        return self._refusals.counts

    def _refuse(self, request: Any, reason: str) -> resource.Resource:
        self._refusals.refuse(reason, client=client_of(request))
        request.setHeader(b"www-authenticate", b'Bearer realm="bus"')
        return _Unauthorized()  # type: ignore[no-untyped-call]


class _Unauthorized(resource.Resource):
    isLeaf = True

    def render(self, request: Any) -> bytes:
        request.setResponseCode(401)
        request.setHeader(b"content-type", b"application/json")
        return b'{"error": "unauthorized", "hint": "send Authorization: Bearer <token>"}\n'
