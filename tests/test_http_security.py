"""The HTTP port's bearer token, through real HTTP requests: missing and wrong tokens refused
and counted, a rotated token taking effect without a restart, /metrics left open on demand,
loopback by default, one warning for an open port beyond it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import defer, reactor
from twisted.logger import LogEvent, formatEvent, globalLogPublisher
from twisted.python import usage
from twisted.web.client import Agent, readBody
from twisted.web.http_headers import Headers

from bus import tap
from bus.errors import StartupError
from bus.web.server import StatusWebService


@defer.inlineCallbacks
def get(port: int, path: str, token: str | None = None) -> Any:
    headers = Headers({b"authorization": [f"Bearer {token}".encode()]} if token else {})
    response = yield Agent(reactor).request(
        b"GET", f"http://127.0.0.1:{port}{path}".encode(), headers
    )
    body = yield readBody(response)
    return response.code, response.headers, body


def web(cleanup: list[Any], **options: Any) -> StatusWebService:
    service = StatusWebService([], 0, options.pop("interface", "127.0.0.1"), **options)
    service.startService()
    cleanup.append(service)
    return service


@pytest_twisted.inlineCallbacks
def test_a_token_is_required_and_a_rotated_one_works_at_once(
    tmp_path: Path, cleanup: list[Any]
) -> Any:
    token = tmp_path / "token"
    token.write_text("first-secret\n")
    service = web(cleanup, token_file=token)
    code, headers, body = yield get(service.port, "/status")
    assert code == 401
    assert headers.getRawHeaders(b"www-authenticate") == [b'Bearer realm="bus"']
    assert b"first-secret" not in body
    assert (yield get(service.port, "/metrics", "wrong"))[0] == 401
    code, _, body = yield get(service.port, "/status", "first-secret")
    assert code == 200 and b'"services"' in body
    assert (yield get(service.port, "/", "first-secret"))[0] == 200
    token.write_text("second-secret-longer\n")
    assert (yield get(service.port, "/status", "first-secret"))[0] == 401
    assert (yield get(service.port, "/status", "second-secret-longer"))[0] == 200
    status = service.status()
    assert status["token_required"] and status["refused"] == {"no-token": 1, "wrong-token": 2}
    refused = {s.labels["reason"]: s.value for s in service.metrics()[0].samples}
    assert refused == {"no-token": 1.0, "wrong-token": 2.0}


@pytest_twisted.inlineCallbacks
def test_metrics_can_stay_open_for_prometheus(tmp_path: Path, cleanup: list[Any]) -> Any:
    token = tmp_path / "token"
    token.write_text("s3cret")
    service = web(cleanup, token_file=token, metrics_open=True)
    code, _, body = yield get(service.port, "/metrics")
    assert code == 200 and b"bus_service_up" in body
    assert (yield get(service.port, "/status"))[0] == 401


def test_an_empty_or_missing_token_file_stops_the_start(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_text("  \n")
    for path, why in ((empty, "it is empty"), (tmp_path / "none", "No such file")):
        service = StatusWebService([], 0, "127.0.0.1", token_file=path)
        with pytest.raises(StartupError, match=why) as failed:
            service.startService()
        assert failed.value.option == "http-token-file"


@pytest.fixture
def warnings() -> Iterator[list[str]]:
    lines: list[str] = []

    def observe(event: LogEvent) -> None:
        if event.get("log_namespace") == "bus.web.server" and event["log_level"].name == "warn":
            lines.append(formatEvent(event))

    globalLogPublisher.addObserver(observe)
    yield lines
    globalLogPublisher.removeObserver(observe)


@pytest_twisted.inlineCallbacks
def test_beyond_loopback_without_a_token_is_one_warning(
    tmp_path: Path, cleanup: list[Any], warnings: list[str]
) -> Any:
    service = web(cleanup, interface="0.0.0.0")
    assert warnings == [
        f"/status and /metrics on 0.0.0.0:{service.port} are open to anyone who can reach "
        "it (give --http-token-file, or --http-bind 127.0.0.1)"
    ]
    assert (yield get(service.port, "/status"))[0] == 200
    token = tmp_path / "token"
    token.write_text("t")
    web(cleanup, interface="0.0.0.0", token_file=token)
    web(cleanup)
    assert len(warnings) == 1


def test_the_http_port_binds_loopback_whatever_the_bus_binds() -> None:
    options = tap.Options()
    options.parseOptions(["--bind", "0.0.0.0", "--services", "eventbus"])
    product = tap.compose(options)
    web_service = product.getServiceNamed("http")
    assert web_service.interface == "127.0.0.1"
    again = tap.Options()
    again.parseOptions(["--http-bind", "0.0.0.0", "--http-token-file", "t", "--http-metrics-open"])
    assert again["http-bind"] == "0.0.0.0" and again["http-metrics-open"]


def test_the_trusted_proxies_are_checked_and_reach_the_port() -> None:
    options = tap.Options()
    options.parseOptions(
        ["--http-trusted-proxy", "127.0.0.1, 10.0.0.0/8", "--http-forwarded-header", "Forwarded"]
    )
    proxies = tap.compose(options).getServiceNamed("http").bounds.proxies
    assert proxies.describe() == {"networks": ["127.0.0.1/32", "10.0.0.0/8"], "header": "forwarded"}
    for argv, said in [
        (["--http-trusted-proxy", "proxy.example"], "--http-trusted-proxy wants addresses or"),
        (["--http-forwarded-header", "x-real-ip"], "--http-forwarded-header wants x-forwarded-for"),
    ]:
        with pytest.raises(usage.UsageError, match=said):
            tap.Options().parseOptions(argv)


@pytest_twisted.inlineCallbacks
def test_eventbus_cli_status_bears_the_token(tmp_path: Path, cleanup: list[Any]) -> Any:
    from tests.processes import CommandProcess

    class Cli(CommandProcess):
        program = "eventbus-cli"

    token = tmp_path / "token"
    token.write_text("letmein\n")
    service = web(cleanup, token_file=token)
    address = f"127.0.0.1:{service.port}"
    # Their answers come from this process's reactor, which a loaded machine may hold up
    # past the status command's 3 s default: a timeout of 30 s.
    asked = Cli("status", "--http", address, "--token-file", str(token), "--timeout", "30")
    without = Cli("status", "--http", address, "--timeout", "30")
    cleanup += [asked, without]
    # Each ends by itself, within its --timeout of having started.
    yield asked.ended()
    yield without.ended()
    assert asked.code == 0, asked.err
    assert '"services"' in asked.out
    assert "HTTP 401: it wants a bearer token (--token-file)" in without.err
