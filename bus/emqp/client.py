"""Twisted client of the eMQP broker: submit requests, get their results as Deferreds.

    client = EmqpClient("tcp://127.0.0.1:47291")
    result = yield client.submit("default", ["resize", {"id": 42}])   # the worker's value
    msgid = yield client.submit("default", body, reply=False)          # fires when dispatched

The broker answers a REQUEST twice at most: a 5-frame REPLY when the request went to a worker
(the original broker's acknowledgement), then, with ``reply=True``, a 6-frame REPLY with the
worker's ``{"value": ...}``. A 6-frame REPLY carrying ``{"error": ...}`` means the broker gave
up (queue full, timeout, worker lost, retries spent): the Deferred fails with
:class:`JobFailed`.
"""

from __future__ import annotations

import json
from collections import deque
from typing import Any

import zmq
from twisted.internet import defer
from twisted.internet.base import DelayedCall
from twisted.logger import Logger

from bus.emqp import codec
from bus.emqp.codec import EmqpError
from bus.extension import SocketFactory, SocketOptions, reactor_of
from bus.transport.curve import ClientCurve
from bus.util.droplog import DropCounter

log = Logger(namespace="bus.emqp.client")


class JobFailed(Exception):
    """The broker (or the worker) reported a failure; ``reason`` is a short label such as
    ``queue-full``, ``timeout``, ``worker-lost`` or ``handler-failed``."""

    def __init__(self, msgid: str, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.msgid = msgid
        self.reason = reason
        self.message = message


class EmqpClient:
    """One DEALER connected to the broker's client port (reconnects by itself)."""

    def __init__(
        self,
        endpoint: str,
        reactor: Any = None,
        identity: bytes | None = None,
        hwm: int = 100_000,
        curve: ClientCurve | None = None,
    ) -> None:
        """``curve``: connect as a CURVE client (a broker run with ``--server-cert``)."""
        self.reactor: Any = reactor_of(reactor)
        self.identity = identity or codec.new_msgid()
        self._factory = SocketFactory(self.reactor, curve=curve)
        self._socket = self._factory.socket(
            zmq.DEALER,
            self._on_messages,
            SocketOptions(identity=self.identity, send_hwm=hwm, receive_hwm=hwm, linger_ms=0),
            name="emqp-client",
        )
        try:
            self._socket.connect(endpoint)
        except zmq.ZMQError:
            self._factory.shutdown()  # an invalid endpoint: no context left behind
            raise
        #: msgid -> (Deferred, whether it waits for the result).
        self._pending: dict[bytes, tuple[defer.Deferred[Any], bool]] = {}
        self._backlog: deque[list[bytes]] = deque()
        self._retry: DelayedCall | None = None
        self.drops = DropCounter(log, "broker message", self.reactor.seconds)
        self.dispatched = 0
        #: KBYEs received: a broker's worker port tells a peer that never sent INFORM to
        #: leave, so a client sees one when it was pointed at the worker port.
        self.kbyes = 0

    def submit(
        self,
        queue: str,
        body: Any,
        reply: bool = True,
        guarantee: bool = False,
        retries: int = 0,
        timeout: float = 0,
        msgid: bytes | None = None,
    ) -> defer.Deferred[Any]:
        """Send a REQUEST. ``body`` is any JSON value (the original's ``["run", {...}]``
        included). Fires with the worker's value (``reply=True``) or with the message id
        once the request went to a worker (``reply=False``); fails with :class:`JobFailed`."""
        msgid = msgid or codec.new_msgid()
        headers = codec.encode_headers(reply, guarantee, retries, timeout)
        frames = codec.request(queue, json.dumps(body).encode(), headers, msgid)
        result: defer.Deferred[Any] = defer.Deferred()
        self._pending[msgid] = (result, reply)
        self._send(frames)
        return result

    def _send(self, frames: list[bytes]) -> None:
        if self._backlog or not self._socket.send_frames(frames):
            self._backlog.append(frames)  # the HWM is reached: send once ZeroMQ can
            self._schedule_retry()

    def _schedule_retry(self) -> None:
        if self._retry is None or not self._retry.active():
            self._retry = self.reactor.callLater(0.001, self._send_backlog)

    def _send_backlog(self) -> None:
        self._retry = None
        backlog = self._backlog
        while backlog and not self._socket.closed:
            if not self._socket.send_frames(backlog[0]):
                self._schedule_retry()
                return
            backlog.popleft()

    @property
    def outstanding(self) -> int:
        """Requests sent and not yet answered."""
        return len(self._pending)

    def _on_messages(self, batch: list[list[bytes]]) -> None:
        for frames in batch:
            try:
                command = codec.parse(frames)
            except EmqpError as error:
                self.drops.drop(error.reason, str(error))
                continue
            if isinstance(command, codec.DispatchAck):
                self.dispatched += 1
                entry = self._pending.get(command.request_msgid)
                if entry is not None and not entry[1]:
                    del self._pending[command.request_msgid]
                    entry[0].callback(command.request_msgid.decode())
            elif isinstance(command, codec.Reply):
                self._on_result(command)
            elif isinstance(command, codec.Kbye):
                self.kbyes += 1
            elif isinstance(command, codec.Heartbeat):
                pass
            else:
                self.drops.drop("unexpected-command", type(command).__name__)

    def _on_result(self, reply: codec.Reply) -> None:
        entry = self._pending.pop(reply.request_msgid, None)
        if entry is None:
            return  # a failure after the dispatch acknowledgement of reply=False
        deferred, _ = entry
        msgid = reply.request_msgid.decode()
        value = reply.value()
        if isinstance(value, dict) and "error" in value:
            deferred.errback(JobFailed(msgid, str(value["error"]), str(value.get("message", ""))))
        elif isinstance(value, dict):
            deferred.callback(value.get("value"))
        else:
            deferred.callback(value)

    def close(self) -> None:
        """Close the socket; outstanding Deferreds fail with :class:`JobFailed`."""
        if self._retry is not None and self._retry.active():
            self._retry.cancel()
        self._factory.shutdown()
        pending, self._pending = self._pending, {}
        for msgid, (deferred, _) in pending.items():
            deferred.errback(JobFailed(msgid.decode(), "closed", "the client was closed"))


def query_status(
    endpoint: str, reactor: Any = None, timeout: float = 5.0, curve: ClientCurve | None = None
) -> defer.Deferred[dict[str, Any]]:
    """The broker's STATUS, from its admin port, as a dict."""
    return admin_request(endpoint, codec.message(codec.STATUS), reactor, timeout, curve)


def add_schedule(
    endpoint: str,
    queue: str,
    body: Any,
    interval: float | None = None,
    cron: str | None = None,
    guarantee: bool = False,
    haste: bool = True,
    runs: int | None = None,
    reactor: Any = None,
    timeout: float = 5.0,
    curve: ClientCurve | None = None,
) -> defer.Deferred[dict[str, Any]]:
    """Ask the broker's scheduler (on its admin or client port) to send ``body`` to
    ``queue`` every ``interval`` seconds or at the times of a ``cron`` line. Fires with
    ``{"schedule": id, "replaced": bool, "next_run_in": seconds}``; fails with
    :class:`JobFailed` (``bad-schedule``, ``no-scheduler``...)."""
    headers = [b"guarantee"] if guarantee else []
    if not haste:
        headers.append(b"nohaste")
    if runs is not None:
        headers.append(b"run_count:%d" % runs)
    frames = codec.schedule(queue, json.dumps(body).encode(), b",".join(headers), interval, cron)
    return admin_request(endpoint, frames, reactor, timeout, curve).addCallback(_value_of)


def send_schedule(
    endpoint: str,
    fields: list[bytes],
    reactor: Any = None,
    timeout: float = 5.0,
    curve: ClientCurve | None = None,
) -> defer.Deferred[dict[str, Any]]:
    """SCHEDULE with eventmq's five fields as they are (``queue, headers, interval, body,
    cron``: what eventmq's client sends and its scheduler stores); fires as
    :func:`add_schedule` does."""
    frames = codec.message(codec.SCHEDULE, *fields)
    return admin_request(endpoint, frames, reactor, timeout, curve).addCallback(_value_of)


def remove_schedule(
    endpoint: str,
    schedule_id: str,
    reactor: Any = None,
    timeout: float = 5.0,
    curve: ClientCurve | None = None,
) -> defer.Deferred[dict[str, Any]]:
    """UNSCHEDULE by id; fires with ``{"schedule": id, "removed": bool}``."""
    frames = codec.unschedule(schedule_id)
    return admin_request(endpoint, frames, reactor, timeout, curve).addCallback(_value_of)


def list_schedules(
    endpoint: str, reactor: Any = None, timeout: float = 5.0, curve: ClientCurve | None = None
) -> defer.Deferred[list[dict[str, Any]]]:
    """Every schedule the broker keeps (SCHEDULES on its admin port), soonest first."""
    frames = codec.message(codec.SCHEDULES)
    return admin_request(endpoint, frames, reactor, timeout, curve).addCallback(_value_of)


def _value_of(answer: Any) -> Any:
    if isinstance(answer, dict) and "error" in answer:
        raise JobFailed("", str(answer["error"]), str(answer.get("message", "")))
    return answer.get("value") if isinstance(answer, dict) else answer


def admin_request(
    endpoint: str,
    request: list[bytes],
    reactor: Any = None,
    timeout: float = 5.0,
    curve: ClientCurve | None = None,
) -> defer.Deferred[Any]:
    """Send one message on a fresh DEALER and fire with the decoded result of the REPLY
    that answers it; fails with TimeoutError when none comes within ``timeout``."""
    reactor = reactor_of(reactor)
    factory = SocketFactory(reactor, curve=curve)
    result: defer.Deferred[Any] = defer.Deferred()
    what = request[2].decode()

    def answered(batch: list[list[bytes]]) -> None:
        for frames in batch:
            try:
                command = codec.parse(frames)
            except EmqpError:
                continue
            if not isinstance(command, codec.Reply) or result.called:
                continue
            if command.request_msgid == request[3]:
                result.callback(command.value())

    sock = factory.socket(zmq.DEALER, answered, SocketOptions(linger_ms=0), name="emqp-admin")
    try:
        sock.connect(endpoint)
    except zmq.ZMQError:
        factory.shutdown()
        raise
    sock.send_frames(request)

    def give_up() -> None:
        if not result.called:
            result.errback(TimeoutError(f"no {what} answer from {endpoint} in {timeout}s"))

    timer = reactor.callLater(timeout, give_up)

    def done(value: Any) -> Any:
        if timer.active():
            timer.cancel()
        factory.shutdown()
        return value

    result.addBoth(done)
    return result
