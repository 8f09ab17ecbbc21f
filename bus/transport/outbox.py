"""What a ROUTER could not send yet, per peer, in order, bounded by bytes and by count.

A ROUTER with ROUTER_MANDATORY refuses a message at its identity frame when the peer's pipe
is full (``zmq.Again``: the peer reads slowly, or not at all) or when the peer is not
connected (``EHOSTUNREACH``: it has not reconnected yet after a restart, or it left). Such
messages wait here, behind nothing and ahead of everything later for the same peer:

* they are tried again when the socket signals (libzmq does when a full pipe drained to its
  low-water mark, though not always: a send may consume the signal), and on a timer: a
  millisecond after a try that moved some (the peer reads: keep up with it), backing off
  while a peer takes nothing (to 50 ms while it is connected, to 1 s while it is not);
* a peer that takes nothing for ``linger`` seconds loses what waits for it (counted);
* what waits per peer is bounded by ``max_bytes`` and ``max_messages``: past either, the new
  message is dropped and counted, so a client that never reads costs a bounded amount of
  memory (the socket's own send HWM bounds what libzmq holds for it);
* memory that dropped messages and departed peers leave behind is handed back to the
  system (:class:`bus.util.memory.MemoryRelease`), once what was dropped adds up to a MiB.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import zmq
from twisted.internet.base import DelayedCall
from twisted.logger import Logger

from bus.transport.zmqsocket import ZmqSocket
from bus.util.memory import MemoryRelease

_NOBLOCK = zmq.NOBLOCK
_MORE = zmq.NOBLOCK | zmq.SNDMORE
#: The next try after one that moved messages (the peer reads), and the backoffs' limits
#: for a peer that took nothing: connected (its pipe full) and not connected.
_SOON = 0.001
_FULL_BACKOFF_MAX = 0.05
_UNREACHABLE_BACKOFF_MAX = 1.0
#: A line per reason of dropping at most this often.
_REPORT_INTERVAL = 10.0
#: Dropping this much, at once or adding up since the last hand-back, is worth handing
#: memory back for.
_RELEASE_BYTES = 1 << 20

Message = list[bytes]


@dataclass(slots=True, eq=False)
class _PeerBox:
    sock: ZmqSocket
    peer: bytes
    #: When what waits is dropped, unless something is taken before (then it moves on).
    deadline: float
    next_try: float
    delay: float = _SOON
    #: The last refusal was "not connected" (back off) rather than "pipe full" (retry on
    #: the socket's signal).
    unreachable: bool = False
    messages: deque[Message] = field(default_factory=deque)
    size: int = 0


class PeerOutboxes:
    """The messages a ROUTER could not send yet, a box per (socket, peer), each bounded by
    ``max_bytes`` and ``max_messages``, at most ``max_peers`` boxes; what a peer does not take
    within ``linger`` seconds is dropped, counted in :attr:`dropped`."""

    def __init__(
        self,
        reactor: Any,
        log: Logger,
        linger: float,
        max_bytes: int,
        max_messages: int,
        max_peers: int = 10_000,
        memory: MemoryRelease | None = None,
    ) -> None:
        self.reactor = reactor
        self.log = log
        self.linger = linger
        self.max_bytes = max_bytes
        self.max_messages = max_messages
        self.max_peers = max_peers
        self.memory = memory
        self._boxes: dict[tuple[int, bytes], _PeerBox] = {}
        self._timer: DelayedCall | None = None
        #: Dropped messages not yet told in the log, by reason, and their peers; a line
        #: per reason at most every :data:`_REPORT_INTERVAL`, the held-back ones told by a
        #: line at the end of the interval (:meth:`_report`).
        self._untold: Counter[str] = Counter()
        self._untold_peers: dict[str, set[bytes]] = {}
        self._last_peer: dict[str, bytes] = {}
        self._told_at: dict[str, float] = {}
        self._report_timers: dict[str, DelayedCall] = {}
        #: Messages dropped, by reason: ``queue-full`` (a peer's bound), ``gone`` (nothing
        #: taken for ``linger`` seconds), ``too-many-peers``, ``stopped``.
        self.dropped: Counter[str] = Counter()
        #: Bytes dropped since memory was last asked back: a client that does not read
        #: 100 kB answers has them dropped one at a time, each below :data:`_RELEASE_BYTES`,
        #: and 2,000 of them left 190 MB of the broker's RSS with glibc until it went.
        self._dropped_bytes = 0

    # -- sending -------------------------------------------------------------------------

    def send(self, sock: ZmqSocket | None, messages: Iterable[Message]) -> None:
        """Send each message, or keep it behind what already waits for its peer."""
        if sock is None or sock.closed:
            self._drop("stopped", sum(1 for _ in messages), 0, b"")
            return
        rest = messages if isinstance(messages, list) else list(messages)
        boxes = self._boxes
        while rest and not boxes:
            # Nothing waits: the whole batch in one call (the transport's compiled helper);
            # a refused message is held, and what follows it looks at the boxes.
            sent, error = sock.send_each(rest)
            if not error:
                return
            self._hold(sock, rest[sent], unreachable=error == zmq.EHOSTUNREACH)
            rest = rest[sent + 1 :]
        sock_id = id(sock)
        for frames in rest:
            box = boxes.get((sock_id, frames[0]))
            if box is not None:
                self._append(box, frames)
                continue
            error = sock.send_each((frames,))[1]
            if error:
                self._hold(sock, frames, unreachable=error == zmq.EHOSTUNREACH)

    def _hold(self, sock: ZmqSocket, frames: Message, unreachable: bool) -> None:
        if len(self._boxes) >= self.max_peers:
            self._drop("too-many-peers", 1, _size(frames), frames[0])
            return
        now = self.reactor.seconds()
        box = _PeerBox(sock, frames[0], now + self.linger, now + _SOON, unreachable=unreachable)
        self._boxes[(id(sock), frames[0])] = box
        self._append(box, frames)
        self._arm(box.next_try)

    def _arm(self, when: float) -> None:
        timer = self._timer
        if timer is not None and timer.active():
            if timer.getTime() <= when:
                return
            timer.cancel()
        self._timer = self.reactor.callLater(max(0.0, when - self.reactor.seconds()), self.retry)

    def _append(self, box: _PeerBox, frames: Message) -> None:
        size = _size(frames)
        if box.messages and (
            len(box.messages) >= self.max_messages or box.size + size > self.max_bytes
        ):
            self._drop("queue-full", 1, size, box.peer)
            return
        box.messages.append(frames)
        box.size += size

    # -- retrying ------------------------------------------------------------------------

    def signalled(self, sock: ZmqSocket) -> None:
        """The socket signalled (a full pipe may have drained): try its full peers now."""
        if self._boxes:
            self._try(lambda box: box.sock is sock and not box.unreachable)

    def retry(self) -> None:
        """Try again the boxes whose backoff has run out (the timer's call)."""
        self._timer = None
        now = self.reactor.seconds()
        self._try(lambda box: box.next_try <= now)

    def _try(self, due: Callable[[_PeerBox], bool]) -> None:
        now = self.reactor.seconds()
        for key, box in list(self._boxes.items()):
            if box.sock.closed:
                del self._boxes[key]
                self._drop("stopped", len(box.messages), box.size, box.peer)
                continue
            if not due(box):
                continue
            moved = self._send_from(box)
            if not box.messages:
                del self._boxes[key]
            elif moved:
                box.deadline = now + self.linger
                box.delay = _SOON
                box.next_try = now + _SOON
            elif now >= box.deadline:
                del self._boxes[key]
                self._drop("gone", len(box.messages), box.size, box.peer)
            else:
                limit = _UNREACHABLE_BACKOFF_MAX if box.unreachable else _FULL_BACKOFF_MAX
                box.delay = min(box.delay * 2, limit)
                box.next_try = now + box.delay
        if self._boxes:
            self._arm(min(box.next_try for box in self._boxes.values()))

    @staticmethod
    def _send_from(box: _PeerBox) -> int:
        send = box.sock.raw_send
        messages = box.messages
        moved = 0
        try:
            while messages:
                frames = messages[0]
                for frame in frames[:-1]:
                    send(frame, _MORE)
                send(frames[-1], _NOBLOCK)
                messages.popleft()
                box.size -= _size(frames)
                moved += 1
        except zmq.Again:
            box.unreachable = False
        except zmq.ZMQError as error:
            if error.errno != zmq.EHOSTUNREACH:
                raise
            box.unreachable = True
        box.sock.look_for_input()
        return moved

    # -- accounting ----------------------------------------------------------------------

    def _drop(self, reason: str, count: int, size: int, peer: bytes) -> None:
        if not count:
            return
        self.dropped[reason] += count
        if self.memory is not None:
            self._dropped_bytes += size
            if self._dropped_bytes >= _RELEASE_BYTES:
                self._dropped_bytes = 0
                self.memory.soon()
        if reason == "stopped":
            return
        self._untold[reason] += count
        self._untold_peers.setdefault(reason, set()).add(peer)
        self._last_peer[reason] = peer
        now = self.reactor.seconds()
        told = self._told_at.get(reason)
        if told is None or now - told >= _REPORT_INTERVAL:
            self._report(reason)
        elif reason not in self._report_timers:
            delay = told + _REPORT_INTERVAL - now
            self._report_timers[reason] = self.reactor.callLater(delay, self._report, reason)

    def _report(self, reason: str) -> None:
        """One line of the answers dropped for ``reason`` since its last line."""
        timer = self._report_timers.pop(reason, None)
        if timer is not None and timer.active():
            timer.cancel()
        count = self._untold.pop(reason, 0)
        peers = self._untold_peers.pop(reason, set())
        if not count:
            return
        self._told_at[reason] = self.reactor.seconds()
        self.log.warn(
            "dropped {count} answers ({reason}) since the last such line, for {peers} "
            "peer(s), the last {peer}; {total} so far",
            count=count,
            reason=reason,
            peers=len(peers),
            peer=self._last_peer.get(reason, b"").hex()[:40],
            total=self.dropped[reason],
        )

    @property
    def held_messages(self) -> int:
        """Messages waiting, over every peer."""
        return sum(len(box.messages) for box in self._boxes.values())

    @property
    def held_bytes(self) -> int:
        """Bytes waiting, over every peer."""
        return sum(box.size for box in self._boxes.values())

    @property
    def peers(self) -> int:
        """Peers with messages waiting."""
        return len(self._boxes)

    def stop(self) -> None:
        """Forget everything that waits (counted as ``stopped``), after a last line of
        the drops not told yet."""
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        for reason in list(self._untold):
            self._report(reason)
        for box in self._boxes.values():
            self._drop("stopped", len(box.messages), 0, box.peer)
        self._boxes = {}


def _size(frames: Message) -> int:
    return sum(map(len, frames))
