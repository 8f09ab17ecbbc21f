"""An operator's action through a running process's HTTP port, for the command-line tools
(``emqp-cli purge``, ``eventbus-cli drop-snapshot``, ``bus-keys refuse``): one POST to
``/api/v1/actions/SERVICE/ACTION`` with the bearer token of a token file (see
``bus.web.actions`` for what the port checks), blocking, its JSON answer returned."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any


class ActionFailed(Exception):
    """The action was not done: one sentence saying why (refused, unreachable, no token)."""


def read_token(path: str | Path | None) -> bytes:
    """The token a ``--token-file`` holds (surrounding whitespace ignored)."""
    if not path:
        raise ActionFailed(
            "actions need the HTTP port's bearer token: give --token-file (the file its "
            "--http-token-file names)"
        )
    try:
        token = Path(path).read_bytes().strip()
    except OSError as error:
        raise ActionFailed(f"--token-file {path}: {error.strerror}") from None
    if not token:
        raise ActionFailed(f"--token-file {path} is empty")
    return token


def act(
    address: str,
    service: str,
    action: str,
    params: Mapping[str, Any],
    token: bytes,
    timeout: float = 10.0,
) -> dict[str, Any]:
    """POST the action to the process whose HTTP port is ``address`` (host:port); its
    ``result`` on success, :class:`ActionFailed` (with the server's reason) otherwise."""
    body = json.dumps(dict(params)).encode()
    request = urllib.request.Request(
        f"http://{address}/api/v1/actions/{service}/{action}",
        data=body,
        method="POST",
        headers={
            "Authorization": "Bearer " + token.decode("latin-1"),
            "Content-Type": "application/json",
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            answer = json.loads(response.read())
    except urllib.error.HTTPError as error:
        raise ActionFailed(f"{address}: HTTP {error.code}: {_reason(error)}") from None
    except (OSError, ValueError) as error:
        why = getattr(error, "reason", None) or error
        raise ActionFailed(f"{address}: {why}") from None
    result = answer.get("result") if isinstance(answer, dict) else None
    return result if isinstance(result, dict) else {}


def _reason(error: urllib.error.HTTPError) -> str:
    try:
        answer = json.loads(error.read())
    except (OSError, ValueError):
        return str(error.reason)
    if isinstance(answer, dict):
        text = answer.get("message") or answer.get("error")
        if text:
            return str(text)
    return str(error.reason)


def add_http_arguments(parser: Any, env_prefix: str) -> None:
    """``--http HOST:PORT`` (``<PREFIX>_HTTP``, default 127.0.0.1:8642) and ``--token-file``
    (``<PREFIX>_HTTP_TOKEN_FILE``) on an argparse parser of an action's command."""
    import os

    from bus.util.cliargs import host_port, positive_seconds

    parser.add_argument(
        "--http",
        default=os.environ.get(f"{env_prefix}_HTTP", "127.0.0.1:8642"),
        type=host_port,
        help="host:port of the process's --http-port (default %(default)s)",
    )
    parser.add_argument(
        "--token-file",
        default=os.environ.get(f"{env_prefix}_HTTP_TOKEN_FILE"),
        help="file of the bearer token the process's --http-token-file holds (required: a "
        "port without a token takes no action)",
    )
    parser.add_argument("--timeout", type=positive_seconds, default=10.0)


def act_from(args: Any, service: str, action: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`act` with the ``--http``, ``--token-file`` and ``--timeout`` of ``args``."""
    return act(args.http, service, action, params, read_token(args.token_file), args.timeout)
