"""A fake of zyre (C, its git master) written from what it is known to do on the wire
(shared/specs/README.md, "ZRE"), not from its code: zyre is not on PyPI nor in Debian.

Like zyre it has a ROUTER mailbox (its "inbox") on an ephemeral port, sends 22-octet
beacons, and, when a node it does not know says HELLO, connects a DEALER (identity 0x01 +
its UUID) to the HELLO's endpoint and greets back. Every message it sends on that DEALER is
a 36/ZRE frame carrying the next sequence number, including its extensions: ELECT and LEADER
(``zyre_set_contest_in_group``) and GOODBYE (gossip mode, on leaving). It answers PING with
PING-OK and records everything its mailbox receives.

Its election is zyre's as tried against zyre's git master (d8370f7) on 2026-11-23: a
contester sends ELECT(itself) to the group's members and sends LEADER(itself) only once
every member has sent ELECT(it) back; it reports the leader (``elected``) only once every
member has sent it LEADER too. A member that stays silent stalls it for ever. This fake has
one member, the node under test.

With ``keys`` it is zyre given a certificate (``zyre_set_zcert``), as tried against zyre's
git master in network namespaces on 2026-11-24: a 54-octet version 3 beacon with its public
key, a CURVE mailbox (no ZAP handler: any client key), its Z85 key in the HELLO header
X-PUBLICKEY, a DEALER that is a CURVE client of the key in the peer's HELLO, and a HELLO
without X-PUBLICKEY ignored ("to avoid security downgrade").
"""

from __future__ import annotations

import socket
import uuid as uuidlib
from collections.abc import Sequence
from typing import Any

import zmq
from twisted.internet.task import LoopingCall
from zmq.utils import z85

from bus.transport.curve import CurveKeyPair, make_curve_client, make_curve_server
from bus.transport.zmqsocket import SocketFactory, SocketOptions, ZmqSocket
from bus.util.reactor import reactor_of
from bus.zre import codec


class FakeZyre:
    def __init__(
        self,
        beacon_port: int,
        name: str = "zyre",
        groups: Sequence[str] = (),
        beacon_interval: float = 0.1,
        keys: CurveKeyPair | None = None,
        greet_back: bool = True,
    ) -> None:
        self.keys = keys
        #: False: a HELLO is kept in :attr:`unanswered` until :meth:`greet` (a zyre whose
        #: greeting is slow to come, as a newcomer's is under load).
        self.greet_back = greet_back
        self.unanswered: codec.Hello | None = None
        #: HELLOs ignored for want of X-PUBLICKEY (with ``keys``).
        self.downgrades_refused = 0
        self.uuid = uuidlib.uuid4().bytes
        #: zyre writes a UUID as text in ELECT and LEADER (32 upper-case hex digits).
        self.uuid_text = self.uuid.hex().upper()
        self.name = name
        self.groups = list(groups)
        self.status = len(self.groups)
        self.reactor = reactor_of(None)
        self.factory = SocketFactory(self.reactor)
        #: Every message the mailbox received: (sender identity, parsed message).
        self.received: list[tuple[bytes, codec.Message]] = []
        self.mailbox = self.factory.socket(
            zmq.ROUTER, self._on_mailbox, SocketOptions(linger_ms=0), name="zyre-inbox"
        )
        if keys is not None:
            make_curve_server(self.mailbox, keys)
        self.endpoint = self.mailbox.bind("tcp://127.0.0.1:*")
        self.dealer: ZmqSocket | None = None
        self.sequence = 0
        self.contesting: set[str] = set()
        self.leader_sent = False
        #: The leader named by each LEADER that came back after ours: zyre reports the
        #: leader to its application once every member sent one.
        self.elected: list[str] = []
        self._udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        port = int(self.endpoint.rpartition(":")[2])
        raw_key = None if keys is None else z85.decode(keys.public)
        self._beacon = codec.encode_beacon(self.uuid, port, raw_key)
        self._beacon_target = ("127.0.0.1", beacon_port)
        self._beacons = LoopingCall(self.send_beacon)
        self._beacons.clock = self.reactor
        self._beacons.start(beacon_interval)

    def send_beacon(self) -> None:
        self._udp.sendto(self._beacon, self._beacon_target)

    def stop_beacons(self) -> None:
        if self._beacons.running:
            self._beacons.stop()

    # -- zyre's side of the conversation --------------------------------------------------

    def _on_mailbox(self, batch: list[list[bytes]]) -> None:
        for identity, *frames in batch:
            message = codec.parse(frames)
            self.received.append((identity, message))
            if isinstance(message, codec.Hello) and self.dealer is None:
                if not self.greet_back:
                    self.unanswered = message
                    continue
                self._greet(message)
            elif isinstance(message, codec.Ping):
                self.send(codec.PingOk(0))
            elif isinstance(message, codec.Elect) and message.group in self.contesting:
                if message.challenger == self.uuid_text and not self.leader_sent:
                    # Our one member echoed our challenge: the wave is complete.
                    self.leader_sent = True
                    self.send(codec.Leader(0, message.group, self.uuid_text))
            elif isinstance(message, codec.Leader) and self.leader_sent:
                self.elected.append(message.leader)

    def greet(self) -> None:
        """Greet back the node whose HELLO waits (``greet_back=False``)."""
        assert self.unanswered is not None, "no HELLO waits for an answer"
        self.greet_back = True
        hello, self.unanswered = self.unanswered, None
        self._greet(hello)

    def _greet(self, message: codec.Hello) -> None:
        headers = dict(message.headers)
        server_key = headers.get(codec.PUBLIC_KEY_HEADER)
        if self.keys is not None and server_key is None:
            self.downgrades_refused += 1
            return
        # zyre requires the peer on its HELLO: connect to it and greet back.
        self.dealer = self.factory.socket(
            zmq.DEALER,
            None,
            SocketOptions(identity=codec.identity_of(self.uuid), linger_ms=0),
            name="zyre-peer",
        )
        own: tuple[tuple[str, str], ...] = ()
        if self.keys is not None and server_key is not None:
            make_curve_client(self.dealer, server_key.encode(), self.keys)
            own = ((codec.PUBLIC_KEY_HEADER, self.keys.public.decode()),)
        self.dealer.connect(message.endpoint)
        self.send(
            codec.Hello(0, self.endpoint, tuple(self.groups), self.status, self.name, dict(own))
        )

    def send(self, message: codec.Message) -> None:
        """Send ``message`` on the DEALER with the next sequence number."""
        assert self.dealer is not None, "no peer has greeted this fake yet"
        self.sequence = (self.sequence + 1) & 0xFFFF
        frames = codec.encode(message, codec.VERSION_36)
        head = bytearray(frames[0])
        head[4:6] = self.sequence.to_bytes(2, "big")
        assert self.dealer.send_frames([bytes(head), *frames[1:]])

    @property
    def greeted(self) -> bool:
        return self.dealer is not None

    def join(self, group: str) -> None:
        self.groups.append(group)
        self.status = (self.status + 1) & 0xFF
        self.send(codec.Join(0, group, self.status))

    def contest(self, group: str) -> None:
        """What ``zyre_set_contest_in_group`` leads to: ELECT(itself) to the group's members,
        and LEADER(itself) once they have all sent the ELECT back."""
        self.contesting.add(group)
        self.leader_sent = False
        self.send(codec.Elect(0, group, self.uuid_text))

    def shout(self, group: str, content: Sequence[bytes]) -> None:
        self.send(codec.Shout(0, group, tuple(content)))

    def whisper(self, content: Sequence[bytes]) -> None:
        self.send(codec.Whisper(0, tuple(content)))

    def goodbye(self) -> None:
        self.stop_beacons()
        self.send(codec.Goodbye(0))

    def close(self) -> Any:
        self.stop_beacons()
        self._udp.close()
        self.factory.shutdown()
