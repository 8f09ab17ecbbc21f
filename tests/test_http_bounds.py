"""The HTTP port's connection bounds (bus.web.channel) as rules, with a clock of our own: a
connection past a bound gives way only once it has had its grace, the oldest first; a
request in progress never counts against its address; requests without the token count
against their client, the one a trusted proxy names."""

from __future__ import annotations

from typing import Any

import pytest
from twisted.internet import task
from twisted.web.http_headers import Headers

from bus.web.channel import (
    ConnectionBounds,
    Limits,
    RefusalCounts,
    TrustedProxies,
    forwarded_hops,
)


class FakeChannel:
    """What the bounds see of a channel: its addresses, its state, and being dropped."""

    def __init__(self, address: str) -> None:
        self.address = self.client = address
        self.state = "new"
        self.counted_client: str | None = None
        self.dropped = False

    def drop(self) -> None:
        self.dropped = True


LIMITS = Limits(connections=8, waiting=6, waiting_per_address=3, requests_per_client=2, grace=2.0)


def bounds_of(proxies: TrustedProxies | None = None) -> tuple[ConnectionBounds, task.Clock]:
    clock = task.Clock()
    return ConnectionBounds(RefusalCounts(clock.seconds), clock, proxies, LIMITS), clock


def arrive(bounds: ConnectionBounds, address: str, count: int = 1) -> list[Any]:
    channels = [FakeChannel(address) for _ in range(count)]
    for channel in channels:
        bounds.arrived(channel)  # type: ignore[arg-type]
    return channels


def test_the_oldest_of_an_address_gives_way_once_its_grace_is_over() -> None:
    bounds, clock = bounds_of()
    slow = arrive(bounds, "10.0.0.1", 3)
    clock.advance(1)
    burst = arrive(bounds, "10.0.0.1", 2)  # past the bound of 3, all within their grace
    assert not any(c.dropped for c in slow + burst)
    assert bounds.status()["waiting"] == 5
    # One of the burst sends its request at once: it no longer counts as waiting.
    bounds.serving(burst[0])
    clock.advance(1)  # the first three have had their grace: the oldest gives way
    assert [c.dropped for c in slow] == [True, False, False]
    assert not any(c.dropped for c in burst)
    assert bounds.refusals.counts == {"displaced": 1}
    # Another address is not concerned.
    other = arrive(bounds, "10.0.0.2", 3)
    clock.advance(10)
    assert not any(c.dropped for c in other)


def test_a_request_in_progress_does_not_count_against_its_address() -> None:
    bounds, clock = bounds_of()
    many = arrive(bounds, "10.0.0.1", 7)
    for channel in many:
        bounds.serving(channel)
    clock.advance(60)
    assert not any(c.dropped for c in many)
    assert bounds.status()["serving"] == 7
    # Done and kept alive: idle again, so waiting, and the bound applies after the grace.
    for channel in many:
        bounds.idle(channel)
    clock.advance(2)
    assert sum(c.dropped for c in many) == 4
    assert bounds.status()["waiting"] == 3


def test_past_every_place_a_newcomer_displaces_a_waiting_one_or_is_closed() -> None:
    bounds, clock = bounds_of()
    served = arrive(bounds, "10.0.0.9", 5)
    for channel in served:
        bounds.serving(channel)
    waiting = [arrive(bounds, f"10.0.1.{n}")[0] for n in range(3)]  # 8: every place taken
    [early] = arrive(bounds, "10.0.2.1")
    assert early.dropped and bounds.refusals.counts["connections"] == 1  # none past grace
    clock.advance(2)
    [late] = arrive(bounds, "10.0.2.1")
    assert not late.dropped and waiting[0].dropped and not waiting[1].dropped
    assert not any(c.dropped for c in served)  # serving connections never give way
    for channel in waiting[1:]:
        bounds.left(channel)
    assert bounds.status()["waiting"] == 1


def test_the_waiting_in_all_are_bounded_too() -> None:
    bounds, clock = bounds_of()
    first = [arrive(bounds, f"10.0.0.{n}")[0] for n in range(6)]
    clock.advance(1)
    second = [arrive(bounds, f"10.0.1.{n}")[0] for n in range(2)]
    clock.advance(1)  # the first six have had their grace: the two oldest give way
    assert [c.dropped for c in first] == [True, True, False, False, False, False]
    assert not any(c.dropped for c in second)


def test_a_trusted_proxy_is_not_bounded_by_address_but_its_clients_requests_are() -> None:
    bounds, clock = bounds_of(TrustedProxies(["127.0.0.1"]))
    through_proxy = arrive(bounds, "127.0.0.1", 5)
    clock.advance(5)
    assert not any(c.dropped for c in through_proxy)
    alice, bob = "203.0.113.7", "203.0.113.8"
    for channel, client in zip(through_proxy, [alice, alice, alice, bob, bob], strict=True):
        channel.client = client
    started = [bounds.request_started(c, bearer=False) for c in through_proxy]
    assert started == [True, True, False, True, True]
    assert bounds.request_started(through_proxy[2], bearer=True)  # the token: no bound
    bounds.request_ended(through_proxy[0])
    assert bounds.request_started(through_proxy[2], bearer=False)
    bounds.left(through_proxy[1])  # a lost connection ends its request too
    assert bounds.request_started(FakeChannel(alice), bearer=False)  # type: ignore[arg-type]


def test_the_client_is_the_last_hop_that_is_not_a_trusted_proxy() -> None:
    proxies = TrustedProxies(["127.0.0.1", "10.0.0.0/8"])

    def client(peer: str, header: str) -> str:
        return proxies.client(peer, Headers({b"x-forwarded-for": [header.encode()]}))

    assert client("127.0.0.1", "203.0.113.7") == "203.0.113.7"
    # What the client wrote before the proxy's hop is not believed.
    assert client("127.0.0.1", "1.2.3.4, 203.0.113.7") == "203.0.113.7"
    assert client("127.0.0.1", "203.0.113.7, 10.1.2.3") == "203.0.113.7"  # two proxies
    assert client("127.0.0.1", "10.1.2.3") == "10.1.2.3"  # only proxies: the first
    # From a peer that is not a proxy the header is the client's own: not read.
    assert client("127.0.0.2", "203.0.113.7") == "127.0.0.2"
    assert proxies.client("127.0.0.1", Headers()) == "127.0.0.1"
    # Forwarded (RFC 7239), read only when it is the proxies' header.
    rfc = TrustedProxies(["127.0.0.1"], header="forwarded")
    header = b'for=1.2.3.4, for="[2001:db8::17]:4711";proto=http, For=192.0.2.60:80;by=x'
    assert rfc.client("127.0.0.1", Headers({b"forwarded": [header]})) == "192.0.2.60"
    assert forwarded_hops("forwarded", [header]) == ["1.2.3.4", "2001:db8::17", "192.0.2.60"]
    spoofed = Headers({b"forwarded": [b"for=6.6.6.6"], b"x-forwarded-for": [b"203.0.113.7"]})
    assert client_of_xff(proxies, spoofed) == "203.0.113.7"


def client_of_xff(proxies: TrustedProxies, headers: Headers) -> str:
    return proxies.client("127.0.0.1", headers)


@pytest.mark.parametrize("text", ["nonsense", "10.0.0.0/33", "127.0.0.1,,x"])
def test_a_bad_proxy_list_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        TrustedProxies.parse(text)
