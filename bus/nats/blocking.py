"""One NATS connection over a plain socket, driven synchronously: for a reader that owns
its thread (a Spark task, a worker thread), where an event loop would only add cost.

It takes the servers, credentials and TLS settings the front-ends take (URLs with
``user:password@`` or ``token@``, ``tls://``, a credentials file, a CA and a client
certificate) and tries the servers in order until one admits it. There is no
reconnection here: a reader that loses its connection fails, and its caller connects
again, to the next server (:mod:`bus.nats.failover` does it for Spark's source).
"""

from __future__ import annotations

import base64
import contextlib
import functools
import itertools
import os
import socket
import ssl
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from bus.nats import codec, handshake
from bus.nats.codec import Control, Msg, ProtocolError, Run
from bus.nats.credentials import Credentials, shown
from bus.nats.handshake import ConnectError
from bus.nats.settings import NatsSettings, tls_context

__all__ = [
    "READ_SIZE",
    "ConnectError",
    "Connection",
    "Limits",
    "connection",
    "connector",
    "tls_context",
]

#: Bytes asked of the socket at once.
READ_SIZE = 1 << 18


class Limits(NamedTuple):
    """How much may wait for a subscriber that is not reading (nats-py's pending limits)."""

    messages: int
    bytes: int


#: nats-py's defaults for a subscription's pending messages and bytes.
DEFAULT_PENDING = Limits(512 * 1024, 128 * 1024 * 1024)


class Connection:
    """A connected client: :meth:`request`, :meth:`subscribe`, :meth:`publish` and
    :meth:`read` what the subscriptions receive."""

    def __init__(
        self,
        servers: Sequence[str],
        *,
        timeout: float = 5.0,
        tls: ssl.SSLContext | None = None,
        credentials: Credentials | None = None,
        name: str = "bus",
        echo: bool = True,
        pending: Limits = DEFAULT_PENDING,
    ) -> None:
        self.timeout = timeout
        self._tls = tls
        self._credentials = credentials
        self._name = name
        self._echo = echo
        #: What may wait for :meth:`read` while a request waits for its answer (nats-py's
        #: pending limits): beyond it, messages are dropped and counted in :attr:`dropped`.
        self.pending_limits = pending
        self._pending_bytes = 0
        self._pending_count = 0  # messages, those of runs each counted
        self.dropped = 0
        self._parser = codec.Parser()
        self._pending: deque[Msg | Run] = deque()
        self._controls: deque[Control] = deque()
        self._sids = itertools.count(1)
        self._inbox = "_INBOX." + base64.urlsafe_b64encode(os.urandom(12)).decode()
        self._replies = itertools.count(1)
        self._reply_sid = 0
        #: The server's INFO: the one it began with, then any it sent since (a cluster's
        #: ``connect_urls`` as they change, ``ldm`` when it goes into lame-duck mode).
        self.info: dict[str, Any] = {}
        #: The URL (of ``servers``) of the server that admitted us.
        self.server = ""
        #: An INFO saying lame duck came and no :meth:`read` returned for it yet.
        self._lame_duck_news = False
        self._sock: socket.socket | ssl.SSLSocket | None = None
        reasons = []
        for url in servers:
            try:
                self._connect(url)
                self.server = url
                break
            except (OSError, ProtocolError, ConnectError) as error:
                reasons.append(f"{shown(url)}: {error or type(error).__name__}")
                self._drop()
        else:
            raise ConnectError("; ".join(reasons) or "no server given")

    # -- connecting ----------------------------------------------------------------------------

    def _connect(self, url: str) -> None:
        address = handshake.server(url)
        sock = socket.create_connection((address.host, address.port), self.timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock = sock
        self._parser = codec.Parser()
        self._controls.clear()
        first = self._control()
        if first.op != b"INFO":
            raise ProtocolError(f"the server began with {first.op!r}, not INFO")
        self.info = codec.info(first)
        tls = self._tls
        if tls is None and handshake.wants_tls(address, self.info, False):
            tls = ssl.create_default_context()
        if tls is not None:
            self._sock = tls.wrap_socket(sock, server_hostname=address.host)
        options = handshake.connect_options(
            address, self.info, self._name, tls is not None, self._credentials, self._echo
        )
        self._send(codec.connect(options) + codec.PING)
        # The server answers PONG once it admitted us, or -ERR (authorization
        # violation), which _receive raises.
        while self._control().op != b"PONG":
            pass
        self._reply_sid = next(self._sids)
        self._send(codec.sub(self._inbox + ".>", self._reply_sid))

    def _control(self) -> Control:
        """The next control line while connecting (nothing is subscribed yet)."""
        deadline = time.monotonic() + self.timeout
        while not self._controls:
            self._controls.extend(self._receive(deadline)[1])
        return self._controls.popleft()

    def _drop(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None

    # -- the wire ------------------------------------------------------------------------------

    def _send(self, data: bytes) -> None:
        assert self._sock is not None, "not connected"
        self._sock.sendall(data)

    def _receive(self, deadline: float) -> tuple[list[Any], list[Control]]:
        """What one read of the socket brings, parsed (messages, control lines); PINGs
        answered, errors raised."""
        assert self._sock is not None, "not connected"
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"nothing from the NATS server in {self.timeout:g}s")
        self._sock.settimeout(left)
        try:
            data = self._sock.recv(READ_SIZE)
        except TimeoutError:
            raise TimeoutError(f"nothing from the NATS server in {self.timeout:g}s") from None
        if not data:
            raise ConnectionError("the NATS server closed the connection")
        return self._parsed(data)

    def _parsed(self, data: bytes) -> tuple[list[Any], list[Control]]:
        """``data`` parsed (messages, control lines); PINGs answered, errors raised, INFOs
        taken. Only the control lines are looked at one by one: a read brings thousands
        of messages to a reader of a stream."""
        messages, controls = self._parser.feed_apart(data)
        for item in controls:
            if item.op == b"PING":
                self._send(codec.PONG)
            elif item.op == b"-ERR":
                raise ProtocolError(item.argument.decode("utf-8", "replace"))
            elif item.op == b"INFO":
                was = self.lame_duck
                self.info = codec.info(item)
                self._lame_duck_news = self._lame_duck_news or (self.lame_duck and not was)
        return messages, controls

    # -- what callers use ----------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        """Bytes already framed (:mod:`bus.nats.codec`), in one write."""
        self._send(data)

    def poll(self) -> None:
        """Take what the server sent meanwhile, without waiting: a new INFO (lame-duck
        mode, the cluster's servers, a lower ``max_payload``) is read, PINGs answered,
        messages kept for :meth:`read`; a lost connection raises as a read would."""
        sock = self._sock
        assert sock is not None, "not connected"
        sock.settimeout(0.0)
        try:
            while True:
                try:
                    data = sock.recv(READ_SIZE)
                except (BlockingIOError, ssl.SSLWantReadError):
                    return
                if not data:
                    raise ConnectionError("the NATS server closed the connection")
                waiting = self._parser.waiting
                messages = self._parsed(data)[0]
                self._keep_all(messages, waiting + len(data) - self._parser.waiting)
        finally:
            sock.settimeout(self.timeout)  # a send after it blocks as sends do

    def flush(self, timeout: float | None = None) -> None:
        """PING, and wait for the server's PONG: everything sent before it was read by the
        server (nats-py's ``flush``); an ``-ERR`` it sent meanwhile raises. Messages that
        arrive meanwhile are kept for :meth:`read`."""
        self._send(codec.PING)
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            messages, controls = self._receive(deadline)
            self._keep_all(messages)  # those after the PONG too
            if any(item.op == b"PONG" for item in controls):
                return

    def shutdown(self) -> None:
        """Wake a read blocked in another thread: it fails as a lost connection."""
        sock = self._sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    @property
    def max_payload(self) -> int:
        """The most bytes (headers and payload) one message may hold, as the server's
        latest INFO says: a larger one would cost the connection."""
        return int(self.info.get("max_payload") or handshake.DEFAULT_MAX_PAYLOAD)

    @property
    def lame_duck(self) -> bool:
        """The server said it is in lame-duck mode: it closes its clients soon."""
        return bool(self.info.get("ldm"))

    def new_inbox(self) -> str:
        """A reply subject whose answers :meth:`read` gives with :attr:`reply_sid`."""
        return f"{self._inbox}.{next(self._replies)}"

    @property
    def reply_sid(self) -> int:
        """The subscription id of the answers to :meth:`new_inbox`'s subjects."""
        return self._reply_sid

    def publish(self, subject: str, payload: bytes, reply: str = "") -> None:
        """Send ``payload`` to ``subject`` (answers to ``reply``, when given)."""
        self._send(codec.pub(subject.encode(), payload, reply.encode()))

    def subscribe(self, subject: str) -> int:
        """Subscribe to ``subject``; its messages come from :meth:`read` with the sid returned."""
        sid = next(self._sids)
        self._send(codec.sub(subject, sid))
        return sid

    def unsubscribe(self, sid: int) -> None:
        """End the subscription ``sid``."""
        self._send(codec.unsub(sid))

    def read(self, timeout: float | None = None) -> list[Msg | Run]:
        """The messages that arrived (at least one), waiting up to ``timeout``; none when
        the server said meanwhile that it goes into lame-duck mode (once: the caller may
        leave it now, as :attr:`lame_duck` says). Once :meth:`runs_of_deliveries` was
        called, JetStream deliveries come as runs: a caller that wants other messages
        (acknowledgements) passes over them, as over other subscriptions' messages."""
        if self._pending:
            out = list(self._pending)
            self._pending.clear()
            self._pending_bytes = self._pending_count = 0
            return out
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            if self._lame_duck_news:
                self._lame_duck_news = False
                return []
            messages = self._receive(deadline)[0]
            if messages:
                return messages

    def runs_of_deliveries(self, stamps: bool = True) -> None:
        """From now on, JetStream deliveries to :meth:`new_inbox`'s subjects come one run
        after another as :class:`bus.nats.codec.Run` columns, no message made for each: a
        reader of a stream gets thousands a read. Without ``stamps``, their times stored
        are 0 (for a reader that does not want them)."""
        self._parser.run_sid = self._reply_sid
        self._parser.run_stamps = stamps

    def request(self, subject: str, payload: bytes, timeout: float | None = None) -> Msg:
        """Publish with a reply subject of our own and wait for the one answer; other
        messages that arrive meanwhile are kept for :meth:`read`. A request nobody
        listens to fails at once (the server's no-responders status)."""
        inbox = self.new_inbox().encode()
        self.publish(subject, payload, inbox.decode())
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            answer = None
            for item in self._receive(deadline)[0]:
                if answer is None and type(item) is Msg and item.subject == inbox:
                    answer = item
                else:
                    self._keep(item)  # those after the answer too
            if answer is not None:
                if codec.status(answer.headers) == 503:
                    raise ConnectionRefusedError(f"no responders for {subject}")
                return answer

    def _keep_all(self, messages: list[Any], wire: int | None = None) -> None:
        """:meth:`_keep` of each of ``messages``, at once where all fit. ``wire``, the bytes
        parsed that made them, bounds their size from above: counted for them, it spares
        a reader of a stream a look at each message (the limit is met a little early)."""
        if not messages:
            return
        limits, pending = self.pending_limits, self._pending
        count = len(messages)
        runs = (
            [item for item in messages if type(item) is Run]
            if self._parser.run_sid is not None
            else []
        )
        count += sum(len(run.sequences) - 1 for run in runs)
        if self._pending_count + count <= limits.messages:
            size = (
                wire
                if wire is not None and self._pending_bytes + wire <= limits.bytes
                else sum(map(_size, messages))
            )
            if self._pending_bytes + size <= limits.bytes:
                pending.extend(messages)
                self._pending_bytes += size
                self._pending_count += count
                return
        for item in messages:
            self._keep(item)

    def _keep(self, item: Msg | Run) -> None:
        """A message (or a run of them) for :meth:`read`, within the pending limits (else
        dropped, counted); of a run, the first messages that fit, as one by one."""
        if isinstance(item, Run):
            item = self._fitting(item)
            if not item.sequences:
                return
        size = _size(item)
        limits = self.pending_limits
        if self._pending_count >= limits.messages or self._pending_bytes + size > limits.bytes:
            self.dropped += 1
            return
        self._pending.append(item)
        self._pending_bytes += size
        self._pending_count += len(item.sequences) if isinstance(item, Run) else 1

    def _fitting(self, run: Run) -> Run:
        """The first messages of ``run`` that fit the pending limits (each counted with its
        share of the run's headers); those past them dropped and counted."""
        limits = self.pending_limits
        count = len(run.sequences)
        headers = (run.bytes - sum(map(len, run.payloads))) / count if count else 0.0
        room, left = (
            limits.messages - self._pending_count,
            float(limits.bytes - self._pending_bytes),
        )
        fit = 0
        for payload in run.payloads[: max(room, 0)]:
            left -= len(payload) + headers
            if left < 0:
                break
            fit += 1
        self.dropped += count - fit
        if fit == count:
            return run
        size = sum(map(len, run.payloads[:fit])) + int(headers * fit)  # down: within what fit
        return run.part(0, fit, size)

    def close(self) -> None:
        """Close the socket; idempotent."""
        self._drop()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _size(item: Msg | Run) -> int:
    """The bytes of a message's headers and payload, or of a run's."""
    if isinstance(item, Run):
        return item.bytes
    return len(item.headers) + len(item.payload)


# -- connections as a service's settings ask -----------------------------------------------------


def connection(
    settings: NatsSettings, name: str = "bus-reader", timeout: float | None = None
) -> Connection:
    """A blocking connection to the first server that admits it."""
    return connector(settings, name, timeout)(settings.servers)


def connector(
    settings: NatsSettings, name: str, timeout: float | None = None
) -> Callable[[Sequence[str]], Connection]:
    """What connects to the first of some servers that admits it, as the settings say
    (timeouts, TLS, credentials). No echo: a reader never wants its own messages."""
    return functools.partial(
        Connection,
        timeout=settings.connect_timeout if timeout is None else timeout,
        tls=tls_context(settings),
        credentials=settings.credentials,
        name=name,
        echo=False,
    )
