"""The bounds on inbound connections (bus.transport.inbound) fuzzed over real TCP
connections: any order of connections from several addresses, closes with and without the
monitor's report, and descriptors reused before a report was read. What the guard holds is
always what is really open and was let in, never beyond its bounds, and every connection
it refused was shut down at once."""

from __future__ import annotations

import socket

from hypothesis import given, settings
from hypothesis import strategies as st

from bus.transport.inbound import InboundPolicy
from tests.flood import closed_by_server

SOURCES = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]


class Server:
    """A listening socket standing in for libzmq's: accepts, and closes on demand."""

    def __init__(self) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(100)
        self.port = self.listener.getsockname()[1]
        #: server side -> its client side, for every connection accepted and not closed.
        self.open: dict[socket.socket, socket.socket] = {}

    def connect(self, source: str) -> tuple[socket.socket, socket.socket]:
        client = socket.socket()
        client.bind((source, 0))
        client.connect(("127.0.0.1", self.port))
        accepted, _ = self.listener.accept()
        self.open[accepted] = client
        return accepted, client

    def close(self, accepted: socket.socket) -> int:
        fd = accepted.fileno()
        self.open.pop(accepted).close()
        accepted.close()
        return fd

    def close_all(self) -> None:
        for accepted in list(self.open):
            self.close(accepted)
        self.listener.close()


steps = st.lists(
    st.one_of(
        st.tuples(st.just("connect"), st.sampled_from(SOURCES)),
        st.tuples(st.just("close"), st.integers(0, 50)),
        st.tuples(st.just("close-unreported"), st.integers(0, 50)),
        st.tuples(st.just("audit"), st.just(0)),
    ),
    max_size=40,
)


@settings(max_examples=60, deadline=None)
@given(steps=steps, per_port=st.integers(1, 8), per_address=st.integers(1, 4))
def test_what_is_held_is_what_is_open_and_let_in(
    steps: list[tuple[str, object]], per_port: int, per_address: int
) -> None:
    server = Server()
    policy = InboundPolicy(per_port, per_address, limit=12)  # a share of 6 descriptors
    guard = policy.guard("fuzzed")
    guard.ports.add(server.port)
    admitted: set[socket.socket] = set()
    try:
        for step, argument in steps:
            if step == "connect":
                accepted, client = server.connect(str(argument))
                guard.accepted(accepted.fileno())
                if guard.holds(accepted.fileno()):
                    admitted.add(accepted)
                else:
                    assert closed_by_server(client), "a refused connection was left open"
            elif step in ("close", "close-unreported") and server.open:
                accepted = list(server.open)[int(str(argument)) % len(server.open)]
                admitted.discard(accepted)
                fd = server.close(accepted)
                if step == "close":
                    guard.disconnected(fd)
            elif step == "audit":
                policy.status()  # what /status does: it looks again first
                assert guard.held == len(admitted)
            # Never beyond a bound, whatever was reported.
            assert guard.held <= per_port and policy.budget.in_use <= policy.budget.capacity
            assert all(count <= per_address for count in guard.by_address().values())
        policy.status()
        assert guard.held == len(admitted) == policy.budget.in_use
        assert sum(policy.refused.values()) == sum(guard.refused.values())
        server.close_all()
        policy.status()
        assert guard.held == 0 and policy.budget.in_use == 0
    finally:
        guard.close()
        server.close_all()
