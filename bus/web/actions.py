"""An operator's actions on the HTTP port: ``POST /api/v1/actions/SERVICE/ACTION``.

A composed service offers its actions (:class:`bus.application.contract.Acting`: eMQP purges,
pauses and resumes a queue, removes a schedule, forgets a worker; the Event BUS drops a
snapshot client); the process offers one of its own, ``curve/refuse`` (a CURVE key refused
on every port of the process, see :mod:`bus.transport.security`). Each takes a small JSON
object and answers one (``{"ok": true, "service": ..., "action": ..., "result": {...}}``,
or ``{"ok": false, "error": ...}`` with 400, 404, 409 or 500).

Who may act (checked by :func:`refusal_at_headers` when a POST's headers are in, before
a byte of its body is read, else the connection is answered and closed):

- **the bearer token**, the same one as for reads (``--http-token-file``), in the
  ``Authorization`` header: a port without a token takes no action at all (403), since
  anyone on the machine, and any web page through DNS rebinding, could act otherwise;
- **a body of JSON**, ``Content-Type: application/json``, with a ``Content-Length`` of at
  most :data:`MAX_BODY` octets (415, 411, 413): an HTML form cannot send that type, and a
  page of another origin that tries it with ``fetch`` must first ask the browser's
  preflight, which the port never answers with CORS headers;
- **no other origin**: a browser's ``Origin`` must name the host the request was sent to
  (its ``Host``), and its ``Sec-Fetch-Site`` must be ``same-origin`` or ``none`` (403).
  The token lives in the page's ``sessionStorage`` and travels in the header only (never
  a cookie), so a page of another origin has nothing the browser would add for it anyway;
  these checks hold if a token leaked into such a page's reach, or a browser misbehaves.

Each action is logged (who: the client's address, as a trusted proxy names it; what: the
service, the action and its parameters; when: the log line's time; and what came of it),
counted in ``/metrics`` (``bus_http_actions_total{service, action, outcome}``) and kept
among the last :data:`RECENT` in ``/status`` (``services.http.actions``).
"""

from __future__ import annotations

import json
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from twisted.internet import defer
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web import resource, server

from bus.application.contract import Acting, Action, ActionRefused
from bus.web.channel import client_of
from bus.web.console.view import Named

log = Logger(namespace="bus.web.actions")

#: The path under which actions are served.
PREFIX = b"/api/v1/actions/"
#: The most octets of an action's body (its JSON object names a queue or a key).
MAX_BODY = 4096
#: Actions kept for ``/status`` (and so sent to every open console each second), the
#: latest last.
RECENT = 20
#: The most characters of an action's parameters kept with it (as JSON text beyond).
PARAMS_KEPT = 300
#: The sites a browser's ``Sec-Fetch-Site`` may name for an action.
SAME_SITE = frozenset({b"same-origin", b"none"})


def refusal_at_headers(
    request: Any,
    target: bytes,
    length: int | None,
    chunked: bool,
    token_required: bool,
    bears_token: bool,
) -> tuple[int, str, str] | None:
    """Why a POST whose headers are in is not let on to its body: (status, reason, text),
    or None. ``target``: its request line's path; ``length``: its ``Content-Length``;
    ``bears_token``: whether it bears the port's token."""
    path = target.split(b"?", 1)[0]
    if not path.startswith(PREFIX):  # as every method the port does not serve
        if length or chunked:
            return 413, "body", "this port takes no request body"
        return 405, "method", "POST is served under /api/v1/actions/ only"
    if not token_required:
        return 403, "action-no-token-file", "this port takes actions only with --http-token-file"
    if not bears_token:
        return 401, "action-token", "send Authorization: Bearer <token>"
    origin = request.getHeader(b"origin")
    if origin is not None and not _same_origin(origin, request.getHeader(b"host")):
        return 403, "action-origin", "actions are taken from the console's own origin only"
    site = request.getHeader(b"sec-fetch-site")
    if site is not None and site.lower() not in SAME_SITE:
        return 403, "action-origin", "actions are taken from the console's own origin only"
    kind = (request.getHeader(b"content-type") or b"").split(b";", 1)[0].strip().lower()
    if kind != b"application/json":
        return 415, "action-type", "an action's body is JSON (Content-Type: application/json)"
    if chunked or length is None:
        return 411, "action-length", "an action's body needs a Content-Length"
    if length > MAX_BODY:
        return 413, "body", f"an action's body is at most {MAX_BODY} octets"
    return None


def _same_origin(origin: bytes, host: bytes | None) -> bool:
    """Whether a browser's ``Origin`` names the host and port the request went to (the
    scheme is not compared: a TLS proxy in front changes it)."""
    if host is None:
        return False
    try:
        netloc = urlsplit(origin.decode("ascii")).netloc
    except (UnicodeDecodeError, ValueError):
        return False
    return bool(netloc) and netloc.lower() == host.decode("latin-1").lower()


class Actions:
    """The actions of the composed services and of the process, their counts and the
    latest of them."""

    def __init__(
        self,
        services: Named,
        process_actions: Callable[[], Mapping[str, Mapping[str, Action]]] = dict,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``process_actions``: the actions that are the process's, not a service's, as
        offered now (``{"curve": {"refuse": ...}}``)."""
        self.services = services
        self.process_actions = process_actions
        self.clock = clock
        #: Actions answered, by (service, action, outcome: done, refused, failed).
        self.counts: Counter[tuple[str, str, str]] = Counter()
        #: The latest actions: when, who, service, action, parameters, outcome.
        self.recent: deque[dict[str, Any]] = deque(maxlen=RECENT)

    def find(self, service: str, action: str) -> Action | None:
        """The action named, if the process or a running service offers it."""
        own = self.process_actions().get(service)
        if own is not None:
            return own.get(action)
        for name, candidate in self.services:
            if name == service and isinstance(candidate, Acting) and candidate.running:
                return candidate.actions().get(action)
        return None

    def offered(self) -> dict[str, list[str]]:
        """Every action offered now, by service (``/status``, the console's buttons)."""
        found = {name: sorted(actions) for name, actions in self.process_actions().items()}
        for name, service in self.services:
            if isinstance(service, Acting) and service.running:
                found[name] = sorted(service.actions())
        return found

    def done(
        self, who: str, service: str, action: str, params: Any, status: int, answer: Any
    ) -> None:
        """Log, count and remember an action's outcome."""
        outcome = "done" if status < 400 else "refused" if status < 500 else "failed"
        known = self.find(service, action) is not None
        key = (service, action, outcome) if known else ("?", "?", outcome)
        self.counts[key] += 1
        text = json.dumps(params, sort_keys=True, default=str)
        entry = {
            "at": round(self.clock(), 3),
            "who": who,
            "service": service,
            "action": action,
            "params": params if len(text) <= PARAMS_KEPT else text[:PARAMS_KEPT] + "...",
            "status": status,
            "outcome": outcome,
        }
        if status >= 400:
            entry["error"] = answer.get("error") if isinstance(answer, dict) else None
        self.recent.append(entry)
        log.info(
            "action {service}/{action} {params} by {who}: {outcome} ({status}) {answer}",
            service=service,
            action=action,
            params=text[:500],
            who=who,
            outcome=outcome,
            status=status,
            answer=json.dumps(answer, sort_keys=True, default=str)[:500],
        )

    def status(self) -> dict[str, Any]:
        """What ``/status`` says of actions: offered, counted, the latest."""
        totals: Counter[str] = Counter()
        for (_, _, outcome), count in self.counts.items():
            totals[outcome] += count
        return {"offered": self.offered(), "counts": dict(totals), "recent": list(self.recent)}

    def metrics(self) -> list[Any]:
        """``bus_http_actions_total{service, action, outcome}``."""
        from prometheus_client.core import CounterMetricFamily

        family = CounterMetricFamily(
            "bus_http_actions",
            "Operators' actions on the HTTP port, by service, action and outcome (done, "
            "refused: a 4xx answer, failed: a 5xx answer)",
            labels=["service", "action", "outcome"],
        )
        for labels, count in sorted(self.counts.items()):
            family.add_metric(list(labels), count)
        return [family]

    def mount(self, root: resource.Resource) -> None:
        """Serve the actions under ``/api/v1/actions/`` of ``root`` (whose ``api/v1``
        the console made)."""
        version = root.getStaticEntity(b"api").getStaticEntity(b"v1")
        version.putChild(b"actions", _ActionResource(self))


class _ActionResource(resource.Resource):
    isLeaf = True

    def __init__(self, actions: Actions) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.actions = actions

    def render_POST(self, request: Any) -> Any:
        who = client_of(request)
        parts = [p.decode("utf-8", "replace") for p in request.postpath]
        if len(parts) != 2 or not all(parts):
            return self._answer(request, who, "?", "?", {}, 404, _error("no such action"))
        service, action = parts
        body = request.content.read(MAX_BODY + 1)
        try:
            params = json.loads(body or b"{}")
        except ValueError:
            params = None
        if not isinstance(params, dict) or len(body) > MAX_BODY:
            return self._answer(
                request, who, service, action, {}, 400, _error("the body is not a JSON object")
            )
        act = self.actions.find(service, action)
        if act is None:
            offered = self.actions.offered().get(service)
            text = f"no action {action!r} of {service!r}" + (
                f" (it offers {', '.join(offered)})" if offered else ""
            )
            return self._answer(request, who, service, action, params, 404, _error(text))
        outcome: defer.Deferred[Any] = defer.maybeDeferred(act, params)

        def done(result: Any) -> tuple[int, dict[str, Any]]:
            return 200, {"ok": True, "service": service, "action": action, "result": result}

        def answer(answered: tuple[int, dict[str, Any]]) -> None:
            status, body = answered
            self._answer(request, who, service, action, params, status, body, deferred=True)

        outcome.addCallbacks(done, _failure_answer).addCallback(answer)
        return server.NOT_DONE_YET

    def _answer(
        self,
        request: Any,
        who: str,
        service: str,
        action: str,
        params: Any,
        status: int,
        answer: dict[str, Any],
        deferred: bool = False,
    ) -> bytes | None:
        self.actions.done(who, service, action, params, status, answer)
        request.setResponseCode(status)
        request.setHeader(b"content-type", b"application/json")
        request.setHeader(b"cache-control", b"no-store")
        body = json.dumps(answer, default=str).encode() + b"\n"
        request.setHeader(b"content-length", b"%d" % len(body))
        if not deferred:
            return body
        if not request.finished and not getattr(request, "_disconnected", False):
            request.write(body)
            request.finish()
        return None


def _error(text: str) -> dict[str, Any]:
    return {"ok": False, "error": text}


def _failure_answer(failure: Failure) -> tuple[int, dict[str, Any]]:
    if failure.check(ActionRefused):
        refused: ActionRefused = failure.value  # type: ignore[assignment]
        return refused.status, _error(refused.message)
    log.failure("an action failed", failure)
    return 500, _error(f"{type(failure.value).__name__}: {failure.getErrorMessage()}")


def process_actions() -> dict[str, Mapping[str, Action]]:
    """The actions that are the process's own rather than a service's, as offered now:
    ``curve/refuse`` while a service of the process speaks CURVE."""
    from bus.transport.security import curve_serving

    return {"curve": {"refuse": _refuse_key}} if curve_serving() else {}


def _refuse_key(params: Mapping[str, Any]) -> dict[str, Any]:
    """``{"key": Z85}``: the key refused on every CURVE port of the process."""
    from bus.transport.security import refuse_everywhere

    key = params.get("key")
    if not isinstance(key, str):
        raise ActionRefused(400, "key: a client's 40-character Z85 public key")
    try:
        return {"key": key.strip(), "services": refuse_everywhere(key)}
    except ValueError as error:
        raise ActionRefused(400, str(error)) from None
    except LookupError as error:
        raise ActionRefused(409, str(error)) from None
