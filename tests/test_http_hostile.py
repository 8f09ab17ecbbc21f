"""The HTTP port against hostile requests, through a real ``twistd -n eventbus`` and raw
sockets: a body is refused at the request's headers (413) before a byte of it is read or
spooled to disk, a method not served gets 405, oversized headers 400, and the port goes on
serving the token's bearer throughout. Fuzzed request heads never stop it either.

A hostile tester's finding: four connections without a token each sent ``POST /status``
announcing 1 GB and streamed 64 MB; twisted.web spooled all of it to deleted temporary
files before the bearer-token guard ran."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.flood import closed_by_server
from tests.ports import free_port
from tests.processes import CLEAN_EXIT, TWISTD, TwistdProcess, wait_for

TOKEN = "hostile-test-token"


class Product(TwistdProcess):
    def __init__(self, tmp_path: Path) -> None:
        self.http_port = free_port()
        (tmp_path / "token").write_text(TOKEN + "\n")
        command = [
            TWISTD, "-n", "--pidfile=", "eventbus", "--services", "eventbus", "--port", "0",
            "--data-dir", str(tmp_path / "data"), "--http-port", str(self.http_port),
            "--http-token-file", str(tmp_path / "token"),
        ]  # fmt: skip
        super().__init__(command, tmp_path / "product.log", dict(os.environ))

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.http_port), timeout=10)

    def exchange(self, head: bytes) -> bytes:
        """Send ``head`` (a request line and headers) and read until the server closes."""
        with self.connect() as sock:
            sock.sendall(head)
            return read_all(sock)

    def get(self, path: str, token: str | None = TOKEN) -> tuple[int, bytes]:
        auth = f"Authorization: Bearer {token}\r\n" if token else ""
        answer = self.exchange(
            f"GET {path} HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n".encode()
        )
        status_line, _, rest = answer.partition(b"\r\n")
        return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2]

    def up(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"exited: {self.output()}")
        try:
            return self.get("/status")[0] == 200
        except OSError:
            return False

    def spooled_files(self) -> list[str]:
        """Deleted files the process holds open (twisted.web's spooled bodies are such)."""
        fds = Path(f"/proc/{self.process.pid}/fd")
        held = []
        for fd in fds.iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.endswith("(deleted)"):
                held.append(target)
        return held


def read_all(sock: socket.socket) -> bytes:
    chunks = []
    while True:
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, TimeoutError):
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


@pytest.fixture(scope="module")
def product(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Product]:
    running = Product(tmp_path_factory.mktemp("hostile"))
    try:
        wait_for(running.up, timeout=30, what="the product's HTTP port")
        yield running
    finally:
        assert running.stop() in CLEAN_EXIT


def refusal(answer: bytes) -> tuple[int, dict[str, Any]]:
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def test_a_body_is_refused_at_its_headers_and_nothing_is_spooled(product: Product) -> None:
    gigabyte = 1 << 30
    streams = []
    for _ in range(4):
        sock = product.connect()
        sock.sendall(b"POST /status HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % gigabyte)
        streams.append(sock)
    chunk = b"\0" * (1 << 20)
    for sock in streams:
        # The answer comes at the headers, without waiting for a byte of the body.
        sock.settimeout(10)
        answer = sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 413 "), answer
        assert refusal(answer + read_all(sock))[1]["error"] == "body"
        # The connection is closed: the body cannot be streamed into the process.
        sent = 0
        with pytest.raises(OSError):
            for _ in range(64):
                sock.sendall(chunk)
                sent += len(chunk)
        assert sent < 64 * len(chunk)
        sock.close()
    assert product.spooled_files() == []
    # Chunked, or announced with Expect: 100-continue (never told to go on): the same.
    chunked = product.exchange(
        b"POST /status HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"100000\r\n" + b"x" * 4096
    )
    assert refusal(chunked)[0] == 413
    expecting = product.exchange(
        b"PUT /status HTTP/1.1\r\nHost: x\r\nContent-Length: 5000000\r\n"
        b"Expect: 100-continue\r\n\r\n"
    )
    assert b"100 Continue" not in expecting and refusal(expecting)[0] == 413
    # Even with the token: the port takes no bodies. A GET with an empty body is served.
    with_token = product.exchange(
        b"POST /status HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
        + TOKEN.encode()
        + b"\r\nContent-Length: 200000\r\n\r\n"
    )
    assert refusal(with_token)[0] == 413
    empty = product.exchange(
        b"GET /status HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
        + TOKEN.encode()
        + b"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    assert empty.startswith(b"HTTP/1.1 200 ")
    status = json.loads(product.get("/status")[1])
    counted = status["services"]["http"]["refused_at_headers"]
    assert counted["body"] >= 7
    assert "HTTP request(s) or connection(s) (body)" in product.output()


def test_methods_not_served_and_oversized_headers(product: Product) -> None:
    for method in (b"DELETE", b"PUT", b"OPTIONS", b"TRACE", b"PATCH"):
        answer = product.exchange(method + b" /status HTTP/1.1\r\nHost: x\r\n\r\n")
        code, body = refusal(answer)
        assert code == 405 and body["error"] == "method"
        assert b"Allow: GET, HEAD" in answer
    head = product.exchange(
        b"HEAD /status HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
        + TOKEN.encode()
        + b"\r\nConnection: close\r\n\r\n"
    )
    assert head.startswith(b"HTTP/1.1 200 ")
    # Too long a line, too many bytes, too many lines: refused (400) or cut off unanswered.
    long_line = b"X-Padding: " + b"a" * 20_000 + b"\r\n"
    many_bytes = b"".join(b"X-P%d: %s\r\n" % (n, b"a" * 1000) for n in range(20))
    many_lines = b"".join(b"X-H%d: v\r\n" % n for n in range(150))
    for extra in (long_line, many_bytes, many_lines):
        answer = product.exchange(b"GET /status HTTP/1.1\r\nHost: x\r\n" + extra + b"\r\n")
        assert answer == b"" or answer.startswith(b"HTTP/1.1 400 "), answer[:100]
    assert product.get("/status", token=None)[0] == 401
    assert product.get("/status")[0] == 200


_token = st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=12)
_header = st.tuples(
    st.sampled_from(["Content-Length", "Transfer-Encoding", "Expect", "Authorization", "X-A"])
    | _token,
    st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=30),
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    method=st.sampled_from(["GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT"]) | _token,
    path=st.sampled_from(["/status", "/metrics", "/", "/api/v1/state", "/x"]) | _token,
    headers=st.lists(_header, max_size=6),
    tail=st.binary(max_size=200),
)
def test_fuzzed_request_heads_get_an_answer_and_never_stop_the_port(
    product: Product, method: str, path: str, headers: list[tuple[str, str]], tail: bytes
) -> None:
    lines = [f"{method} {path} HTTP/1.1", "Host: x", *(f"{k}: {v}" for k, v in headers)]
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + tail
    with product.connect() as sock:
        sock.sendall(head)
        sock.shutdown(socket.SHUT_WR)
        answer = read_all(sock)
    # Whatever it was: an HTTP answer or a closed connection, never a spooled body, and
    # the port still serves the next request.
    assert answer == b"" or answer.startswith(b"HTTP/1.1 ")
    if method not in ("GET", "HEAD") and answer:
        assert answer.split()[1] in (b"400", b"405", b"413")
    assert product.spooled_files() == []
    assert product.get("/status")[0] == 200


def test_connections_from_one_address_are_bounded(product: Product) -> None:
    """A flood of idle connections from one address keeps 64 of them (the rest closed as
    accepted) and the port serves others; all given back once the flood leaves."""
    held = []
    try:
        for _ in range(150):
            sock = socket.socket()
            sock.bind(("127.0.0.2", 0))
            sock.settimeout(5)
            sock.connect(("127.0.0.1", product.http_port))
            held.append(sock)

        def closed(sock: socket.socket) -> bool:
            return closed_by_server(sock, 0.05)

        wait_for(lambda: sum(map(closed, held)) >= 150 - 64, timeout=30, what="the excess closed")
        assert sum(not closed(sock) for sock in held) <= 64
        assert product.get("/status")[0] == 200  # another address is served meanwhile
        status = json.loads(product.get("/status")[1])["services"]["http"]
        assert status["refused_at_headers"]["connections-per-address"] >= 150 - 64
    finally:
        for sock in held:
            sock.close()
