"""mc0 brokers on several hosts as one topic space over NATS (issue 47), as operators run
them: ``twistd -n eventbus --services mc0 --mc0-nats ...`` and ``twistd -n mc0 --nats ...``
in child processes, real nats-servers on 127.0.0.1, the Twisted connector and ``mc0-cli``.

- Three brokers on a three-server NATS cluster (each broker on another server): a client
  of each publishes, a client of each subscribes, and each subscriber gets every message
  once, each publisher's in its order; a topic only one broker's client holds travels to
  that broker alone (interest); ``/status`` and ``/metrics`` show the link.
- CURVE without TLS to NATS is refused at start, in one line, unless
  ``--nats-without-tls``; with TLS (``--nats-tls-ca``) it runs, and messages flow.
- The TTL across brokers: a PUT held at a broker whose link to NATS is down is relayed
  when the link is back within its sender's TTL, and answered ERROR (never relayed) when
  not; a PUT stuck in a stopped nats-server past its deadline is dropped by the broker it
  reaches, and its sender answered ERROR.
- A SUB joining a topic's subscription the server has not confirmed waits for it, as the
  SUB that made it does (a stopped nats-server).
- A broker killed: the connector's subscriber and publisher, and ``mc0-cli``, go on at the
  next broker.
- ``twistd -n mc0 --nats`` alone; a token given in a file never printed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import defer

from bus.mc0.client import Mc0CommandError, Mc0Connector
from bus.testing import ConditionTimeout, wait_until
from tests.curve_helpers import Keys
from tests.mc0_cluster import ClusterBroker, Recorder
from tests.mc0_helpers import RawMc0Peer
from tests.nats_proxy import NatsProxy
from tests.nats_tls import make_certificates, tls_block
from tests.ports import nats_cluster
from tests.processes import START_BOUND, CommandProcess, ended, reported
from tests.test_product_process import TWISTD, environment, free_port, metric_samples

pytest.importorskip("nats")


@pytest.fixture
def keys(tmp_path: Path) -> Keys:
    return Keys(tmp_path / "keys")


@pytest.fixture
def brokers() -> Iterator[list[ClusterBroker]]:
    started: list[ClusterBroker] = []
    yield started
    for broker in started:
        broker.stop()


class Mc0Cli(CommandProcess):
    """mc0-cli in a child process."""

    program = "mc0-cli"


def start(brokers: list[ClusterBroker], *args: Any, **kwargs: Any) -> ClusterBroker:
    broker = ClusterBroker(*args, **kwargs)
    brokers.append(broker)
    return broker


def serving(*brokers: ClusterBroker) -> defer.Deferred[None]:
    return reported(
        lambda: all(b.ready() for b in brokers),
        *(b.process for b in brokers),
        what="brokers serving, their links to NATS up",
    )


def connector(endpoints: Any, keys: Keys, on_message: Any = None, **kw: Any) -> Mc0Connector:
    return Mc0Connector(endpoints, on_message, server_key=keys.server.public, **kw)


def numbered(recorder: Recorder, topic: bytes) -> list[bytes]:
    """What ``recorder`` got on ``topic`` but the hellos of :func:`each_hears_each`."""
    return [body for body in recorder.bodies(topic) if not body.startswith(b"hello-")]


def from_others(name: str, recorder: Recorder) -> int:
    """How many of the messages ``recorder`` got on ``t`` came from other brokers' clients."""
    senders = (body.removeprefix(b"hello-").split(b"-")[0] for body in recorder.bodies(b"t"))
    return sum(sender != name.encode() for sender in senders)


@defer.inlineCallbacks
def each_hears_each(
    publishers: dict[str, Mc0Connector], subscribers: dict[str, Recorder], topic: bytes
) -> Any:
    """Hellos on ``topic`` until each subscriber has one from each publisher; how many each
    publisher sent. A SUB's OK says that its broker's own nats-server has the interest; the
    other servers learn it over their routes a moment later (docs/mc0.md), so a PUT sent
    elsewhere at once may find no one. A hello that arrives shows that its publisher's
    server knows the subscriber's interest."""
    deadline = time.monotonic() + 60
    sent = dict.fromkeys(publishers, 0)

    def silent() -> list[str]:
        return [
            name
            for name in publishers
            if not all(
                any(body.startswith(b"hello-%s-" % name.encode()) for body in r.bodies(topic))
                for r in subscribers.values()
            )
        ]

    rounds = 0
    while missing := silent():
        assert time.monotonic() < deadline, f"no hello from {missing} at every subscriber"
        hellos = [
            publishers[name].put(topic, b"hello-%s-%d" % (name.encode(), rounds))
            for name in missing
        ]
        yield defer.gatherResults(hellos, consumeErrors=True)
        for name in missing:
            sent[name] += 1
        rounds += 1
        # The next round once this one's hellos are all in, or a moment after.
        with contextlib.suppress(ConditionTimeout):
            yield wait_until(lambda: not silent(), timeout=0.5, what="the hellos")
    return sent


@pytest_twisted.inlineCallbacks
def test_clients_of_three_brokers_get_each_message_once(
    tmp_path: Path, keys: Keys, brokers: list[ClusterBroker]
) -> Any:
    nats = nats_cluster(tmp_path / "nats", size=3)
    nats.start()
    connectors: list[Mc0Connector] = []
    try:
        names = ["a", "b", "c"]
        for index, name in enumerate(names):
            # Each broker's own server first: the three links are on three servers, and a
            # message crosses the cluster's routes.
            urls = ",".join(nats.urls[index:] + nats.urls[:index])
            start(
                brokers, tmp_path / name, urls, "--mc0-nats-without-tls",
                "--mc0-nats-broker-id", f"broker-{name}", server_cert=keys.server_cert,
            )  # fmt: skip
        yield serving(*brokers)
        subscribers = {name: Recorder() for name in names}
        publishers = {}
        for name, broker in zip(names, brokers, strict=True):
            listening = connector(broker.endpoint, keys, subscribers[name])
            publishing = connector(broker.endpoint, keys)
            connectors += [listening, publishing]
            publishers[name] = publishing
            yield listening.start()
            yield publishing.start()
            yield listening.subscribe(b"t")  # OK once the server has its broker's interest
        only_b = Recorder()
        at_b = connector(brokers[1].endpoint, keys, only_b)
        connectors.append(at_b)
        yield at_b.start()
        yield at_b.subscribe(b"only-b")
        hellos = yield each_hears_each(publishers, subscribers, b"t")
        hellos_for_b = yield each_hears_each({"a": publishers["a"]}, {"b": only_b}, b"only-b")
        count = 50
        puts = [
            publishers[name].put(b"t", b"%s-%d" % (name.encode(), number))
            for number in range(count)
            for name in names
        ]
        puts.append(publishers["a"].put(b"only-b", b"for b"))
        yield defer.gatherResults(puts, consumeErrors=True)  # each OK: the cluster has it
        yield wait_until(
            lambda: (
                all(len(numbered(r, b"t")) >= 3 * count for r in subscribers.values())
                and numbered(only_b, b"only-b")
            ),
            timeout=60,
            what="every message at every subscriber",
        )
        for name, recorder in subscribers.items():
            got = numbered(recorder, b"t")
            assert len(got) == 3 * count, f"{name}: {len(got)} messages"
            for sender in names:
                theirs = [body for body in got if body.startswith(sender.encode() + b"-")]
                assert theirs == [b"%s-%d" % (sender.encode(), n) for n in range(count)], (
                    f"{name} got {sender}'s messages not once each in order"
                )
            assert recorder.bodies(b"only-b") == []
        assert numbered(only_b, b"only-b") == [b"for b"]

        clusters = {name: broker.cluster() for name, broker in zip(names, brokers, strict=True)}
        # Interest: what each broker received from the others is what its clients hold (b's
        # topic went to b alone). Each publisher's messages come in order, so its hellos
        # are all in before its numbered messages: nothing is still on its way.
        assert {name: c["received"] for name, c in clusters.items()} == {
            "a": from_others("a", subscribers["a"]),
            "b": from_others("b", subscribers["b"]) + len(only_b.bodies(b"only-b")),
            "c": from_others("c", subscribers["c"]),
        }
        assert all(c["received"] >= 2 * count for c in clusters.values()), clusters
        assert {name: c["subjects"] for name, c in clusters.items()} == {"a": 1, "b": 2, "c": 1}
        published = count + 1 + hellos["a"] + hellos_for_b["a"]
        assert clusters["a"]["published"] == clusters["a"]["confirmed"] == published
        assert clusters["b"]["broker_id"] == "broker-b" and clusters["b"]["tls"] is False
        assert [s["connected"] for s in clusters["c"]["servers"]] == [True, True, True]
        samples = metric_samples(brokers[0].get("/metrics"))
        assert samples["mc0_nats_connected"] == 1
        assert samples["mc0_nats_messages_total{kind=out}"] == published
        assert samples["mc0_nats_messages_total{kind=in}"] == clusters["a"]["received"]
        assert samples["mc0_nats_acknowledgements_total{result=confirmed}"] == published
        assert samples["mc0_nats_servers{state=connected}"] == 3
    finally:
        for each in connectors:
            yield each.stop()
        nats.stop()


@pytest_twisted.inlineCallbacks
def test_curve_topics_go_over_nats_only_with_tls_unless_told(
    tmp_path: Path, keys: Keys, brokers: list[ClusterBroker]
) -> Any:
    refused = subprocess.run(
        [TWISTD, "-n", "--pidfile=", "mc0", "--port", "0", "--data-dir", str(tmp_path / "d"),
         "--nats", "nats://127.0.0.1:4222"],
        capture_output=True, text=True, env=environment(), timeout=START_BOUND, check=False,
    )  # fmt: skip
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "--nats-without-tls" in refused.stderr and "without TLS" in refused.stderr
    assert "Traceback" not in refused.stdout + refused.stderr
    (tmp_path / "tls").mkdir()
    certificates = make_certificates(tmp_path / "tls")
    nats = nats_cluster(tmp_path / "nats", size=1, extra=tls_block(certificates))
    nats.start()
    connectors: list[Mc0Connector] = []
    try:
        tls = ("--mc0-nats-tls-ca", str(certificates["ca"]))
        a = start(brokers, tmp_path / "a", nats.urls[0], *tls, server_cert=keys.server_cert)
        b = start(brokers, tmp_path / "b", nats.urls[0], *tls, server_cert=keys.server_cert)
        yield serving(a, b)
        assert a.cluster()["tls"] is True
        heard = Recorder()
        listening, publishing = connector(b.endpoint, keys, heard), connector(a.endpoint, keys)
        connectors += [listening, publishing]
        yield listening.start()
        yield listening.subscribe(b"t")
        yield publishing.start()
        yield publishing.put(b"t", b"over TLS")
        yield wait_until(lambda: heard.got, timeout=30, what="the message over TLS")
        assert heard.bodies() == [b"over TLS"]
        assert "WITHOUT" not in a.output() and "without TLS" not in a.output()
    finally:
        for each in connectors:
            yield each.stop()
        nats.stop()


@pytest_twisted.inlineCallbacks
def test_the_ttl_holds_across_brokers(
    tmp_path: Path, keys: Keys, brokers: list[ClusterBroker]
) -> Any:
    nats = nats_cluster(tmp_path / "nats", size=1)
    nats.start()
    (node,) = nats.nodes
    proxy = NatsProxy(node.port)  # broker a's only way to the server
    connectors: list[Mc0Connector] = []
    peers: list[RawMc0Peer] = []
    try:
        no_tls = "--mc0-nats-without-tls"
        a = start(brokers, tmp_path / "a", proxy.url, no_tls, server_cert=keys.server_cert)
        b = start(brokers, tmp_path / "b", node.url, no_tls, server_cert=keys.server_cert)
        yield serving(a, b)
        heard = Recorder()
        listening = connector(b.endpoint, keys, heard)
        patient = connector(a.endpoint, keys, ttl=30.0)
        connectors += [listening, patient]
        yield listening.start()
        yield listening.subscribe(b"t")
        yield patient.start()

        def hasty(ttl_ms: int) -> RawMc0Peer:
            """A client of a whose session's TTL is ``ttl_ms`` (no heartbeats of its own:
            the PUT follows its CONNECT at once)."""
            peer = RawMc0Peer(a.endpoint, keys.server.public)
            peers.append(peer)
            peer.send(b"", b"CONNECT", b"ID", b"c", b"TTL", b"%d" % ttl_ms)
            return peer

        def answer(peer: RawMc0Peer, message_id: bytes) -> list[bytes] | None:
            for frames in peer.messages:
                if frames[1] in (b"OK", b"ERROR") and frames[-1] == message_id:
                    return frames
            return None

        # 1. The link to NATS down at a: PUTs held there.
        yield proxy.shut()
        yield wait_until(lambda: not a.cluster()["connected"], timeout=30, what="a's link down")
        kept = patient.put(b"t", b"kept")
        short = hasty(1000)
        short.send(b"", b"PUT", b"ID", b"short", b"TOPIC", b"t", b"", b"expired at a")
        # Counted as they are held (the short one's hold ends within a second).
        yield wait_until(lambda: a.cluster()["held_total"] == 2, timeout=30, what="two PUTs held")
        # The short one's TTL passes first: its ERROR comes while the link is still down.
        yield wait_until(lambda: answer(short, b"short"), timeout=30, what="the short PUT's end")
        assert answer(short, b"short")[1] == b"ERROR"  # type: ignore[index]
        assert b"expired" in answer(short, b"short")[3]  # type: ignore[index]
        assert not kept.called
        proxy.reopen()
        yield kept  # relayed once the link is back, within its sender's TTL: OK
        yield patient.put(b"t", b"after")
        yield wait_until(lambda: len(heard.got) >= 2, timeout=30, what="the relayed PUTs")
        assert heard.bodies() == [b"kept", b"after"]
        assert a.cluster()["expired"]["held"] == 1 and a.cluster()["held_published"] == 1

        # 2. A PUT stuck in a stopped nats-server past its deadline: when a took it, plus its
        # sender's TTL. Counted from a's publishing it, not from the test's send: a fresh
        # connection's CURVE handshake and a's turn may take longer than the TTL on a busy
        # machine, and a PUT a takes late is not past its deadline when b gets it. The
        # handshake is made before the server stops (its stop stays short).
        handshakes = a.status()["handshakes"]
        stalled = RawMc0Peer(a.endpoint, keys.server.public)
        peers.append(stalled)
        yield wait_until(
            lambda: a.status()["handshakes"] > handshakes, timeout=30, what="its handshake"
        )
        published = a.cluster()["published"]
        nats.kill(node, signal.SIGSTOP)
        try:
            stalled.send(b"", b"CONNECT", b"ID", b"c", b"TTL", b"300")
            stalled.send(b"", b"PUT", b"ID", b"stalled", b"TOPIC", b"t", b"", b"too late")
            yield wait_until(
                lambda: a.cluster()["published"] > published, timeout=30, what="a publishing it"
            )
            taken = time.time()
            # Past its deadline (by the hosts' clock, which the brokers share here), well
            # within the two keep-alive PINGs (1 s apart) that make a broker leave a server.
            yield wait_until(lambda: time.time() > taken + 0.6, timeout=5, what="its deadline")
        finally:
            nats.kill(node, signal.SIGCONT)
        yield wait_until(
            lambda: b.cluster()["expired"]["received"] == 1, timeout=30, what="b dropping it"
        )
        yield wait_until(lambda: answer(stalled, b"stalled"), timeout=30, what="its answer")
        assert answer(stalled, b"stalled")[1] == b"ERROR"  # type: ignore[index]
        yield patient.put(b"t", b"last")
        yield wait_until(lambda: len(heard.got) >= 3, timeout=30, what="the last PUT")
        assert heard.bodies() == [b"kept", b"after", b"last"]
    finally:
        for each in connectors:
            yield each.stop()
        for peer in peers:
            peer.close()
        yield proxy.close()
        nats.stop()


@pytest_twisted.inlineCallbacks
def test_a_sub_joining_a_subscription_the_server_has_not_confirmed_waits_for_it(
    tmp_path: Path, keys: Keys, brokers: list[ClusterBroker]
) -> Any:
    """Two clients SUB one topic while the nats-server is stopped: the first's SUB waits
    for the server's word on the broker's new subscription, and so does the second's,
    which joins it (answered at once, its client could have a PUT sent at another broker
    reach the server first: the fake mc0torture beside busy cores lost 21). The second
    client's NOOP, sent after its SUB, is answered first; both SUBs once the server runs."""
    nats = nats_cluster(tmp_path / "nats", size=1)
    nats.start()
    (node,) = nats.nodes
    peers: list[RawMc0Peer] = []
    try:
        b = start(brokers, tmp_path / "b", node.url, "--mc0-nats-without-tls",
                  server_cert=keys.server_cert)  # fmt: skip
        yield serving(b)
        first, second = (RawMc0Peer(b.endpoint, keys.server.public) for _ in range(2))
        peers += [first, second]

        def verbs(peer: RawMc0Peer) -> list[tuple[bytes, bytes]]:
            return [(f[1], f[-1]) for f in peer.messages if f[1] in (b"OK", b"ERROR")]

        for peer in peers:
            peer.send(b"", b"CONNECT", b"ID", b"c")
        yield wait_until(lambda: all(verbs(p) == [(b"OK", b"c")] for p in peers),
                         timeout=30, what="both sessions")  # fmt: skip
        disconnects = b.cluster()["disconnects"]
        nats.kill(node, signal.SIGSTOP)
        try:
            first.send(b"", b"SUB", b"ID", b"s1", b"", b"t")
            second.send(b"", b"SUB", b"ID", b"s2", b"", b"t")
            second.send(b"", b"NOOP", b"ID", b"n")
            yield wait_until(lambda: (b"OK", b"n") in verbs(second), timeout=30,
                             what="the NOOP after the second SUB")  # fmt: skip
            assert verbs(second) == [(b"OK", b"c"), (b"OK", b"n")]
            assert verbs(first) == [(b"OK", b"c")]
        finally:
            nats.kill(node, signal.SIGCONT)
        yield wait_until(lambda: len(verbs(first)) == 2 and len(verbs(second)) == 3,
                         timeout=30, what="both SUBs answered")  # fmt: skip
        assert verbs(first)[-1] == (b"OK", b"s1") and verbs(second)[-1] == (b"OK", b"s2")
        # Answered on the server's word, not because the broker left it.
        assert b.cluster()["disconnects"] == disconnects
    finally:
        for peer in peers:
            peer.close()
        nats.stop()


@pytest_twisted.inlineCallbacks
def test_clients_move_to_the_next_broker_when_theirs_is_killed(
    tmp_path: Path, keys: Keys, brokers: list[ClusterBroker]
) -> Any:
    nats = nats_cluster(tmp_path / "nats", size=1)
    nats.start()
    connectors: list[Mc0Connector] = []
    cli_sub: Mc0Cli | None = None
    try:
        no_tls = "--mc0-nats-without-tls"
        a = start(brokers, tmp_path / "a", nats.urls[0], no_tls, server_cert=keys.server_cert)
        b = start(brokers, tmp_path / "b", nats.urls[0], no_tls, server_cert=keys.server_cert)
        yield serving(a, b)
        both, other_first = [a.endpoint, b.endpoint], [b.endpoint, a.endpoint]
        heard = Recorder()
        # A killed broker's TCP connection ends its sessions at once; a TTL of 10 s keeps a
        # broker that a busy machine starves for a second or two from being taken for dead
        # (the session's silence limit is 1.05 x TTL) and a second failover from racing the test.
        listening = connector(both, keys, heard, ttl=10.0)
        publishing = connector(other_first, keys, ttl=10.0)
        connectors += [listening, publishing]
        yield listening.start()
        yield listening.subscribe(b"t")
        yield publishing.start()
        assert listening.endpoint == a.endpoint and publishing.endpoint == b.endpoint
        cli = ["--server-key", str(keys.server_key), "--timeout", "30"]
        cli_sub = Mc0Cli(
            *cli, "--server", a.endpoint, "--server", b.endpoint, "--ttl", "10s", "sub", "t",
            "--count", "2",
        )  # fmt: skip
        yield wait_until(lambda: a.status()["subscriptions"] == 2, timeout=START_BOUND)
        yield publishing.put(b"t", b"before")
        yield wait_until(lambda: heard.got, timeout=30, what="the first message")
        # mc0-cli printed it too before its broker dies: a message still in its socket's
        # queue when the connection goes is dropped with the socket (the session ends).
        yield wait_until(
            lambda: "before" in cli_sub.out, timeout=30, what="mc0-cli's first message"
        )
        a.kill()
        # Both subscribers see their connection go, and SUBscribe again at b.
        yield wait_until(
            lambda: listening.connected and listening.endpoint == b.endpoint,
            timeout=30,
            what="the subscriber at b",
        )
        yield wait_until(
            lambda: b.status()["subscriptions"] == 2, timeout=30, what="both subscribers at b"
        )
        # mc0-cli put tries the dead broker first, then the next one (waited for on the
        # reactor: the connectors here keep their sessions alive meanwhile).
        put = Mc0Cli(*cli, "--server", a.endpoint, "--server", b.endpoint, "put", "t", "after")
        try:
            put_status = yield ended(put.process, 30)
            assert put_status == 0, (put.out, put.err)
        finally:
            put.close()
        yield wait_until(lambda: len(heard.got) >= 2, timeout=30, what="the second message")
        assert heard.bodies() == [b"before", b"after"]
        assert listening.failovers == 1 and publishing.failovers == 0
        try:
            status = yield ended(cli_sub.process, 30)
        except Exception:
            raise AssertionError(
                f"mc0-cli sub did not end: {cli_sub.out!r}, {cli_sub.err!r}"
            ) from None
        lines = cli_sub.out.splitlines()
        assert status == 0 and [line.split('"body": ')[1] for line in lines] == [
            '["before"]}',
            '["after"]}',
        ]
        with pytest.raises(Mc0CommandError):  # and refusals still come through the next
            yield publishing.put(b"", b"no topic")
    finally:
        if cli_sub is not None:
            cli_sub.close()
        for each in connectors:
            yield each.stop()
        nats.stop()


@pytest_twisted.inlineCallbacks
def test_twistd_mc0_nats_alone(tmp_path: Path, keys: Keys) -> Any:
    """The broker as its own process (``twistd -n mc0 --nats``): it says where its link
    is, warns that CURVE's topics go without TLS, and exchanges messages with a broker of
    the composed product."""
    nats = nats_cluster(tmp_path / "nats", size=1)
    nats.start()
    port = free_port()
    log_path = tmp_path / "alone.log"
    with log_path.open("wb") as log:
        alone = subprocess.Popen(
            [TWISTD, "-n", "--pidfile=", "mc0", "--port", str(port), "--data-dir",
             str(tmp_path / "alone"), "--server-cert", str(keys.server_cert), "--nats",
             nats.urls[0], "--nats-without-tls"],
            stdout=log, stderr=subprocess.STDOUT, env=environment(),
        )  # fmt: skip
    other = ClusterBroker(
        tmp_path / "other", nats.urls[0], "--mc0-nats-without-tls", server_cert=keys.server_cert
    )
    connectors: list[Mc0Connector] = []
    try:
        yield reported(lambda: "started mc0" in log_path.read_text(), alone, what="twistd mc0")
        text = log_path.read_text()
        assert "mc0 relay" in text and "--nats-without-tls" in text  # its warning
        yield serving(other)
        heard = Recorder()
        listening = connector(other.endpoint, keys, heard)
        publishing = connector(f"tcp://127.0.0.1:{port}", keys)
        connectors += [listening, publishing]
        yield listening.start()
        yield listening.subscribe(b"t")
        yield publishing.start()
        yield publishing.put(b"t", b"from twistd mc0")
        yield wait_until(lambda: heard.got, timeout=30, what="the message")
        assert heard.bodies() == [b"from twistd mc0"]
    finally:
        for each in connectors:
            yield each.stop()
        alone.send_signal(signal.SIGTERM)
        alone.wait(30)
        other.stop()
        nats.stop()


@pytest_twisted.inlineCallbacks
def test_a_broker_admitted_with_a_token_file_never_prints_it(
    tmp_path: Path, keys: Keys, brokers: list[ClusterBroker]
) -> Any:
    """The credentials options are the Event BUS's: a token from a file, not in the log,
    ``/status`` or the command line."""
    token = "tk-" + os.urandom(8).hex()
    nats = nats_cluster(tmp_path / "nats", size=1, token=token)
    nats.start()
    try:
        token_file = tmp_path / "token"
        token_file.write_text(token + "\n")
        token_file.chmod(0o600)
        broker = start(
            brokers, tmp_path / "a", nats.urls[0], "--mc0-nats-token-file", str(token_file)
        )
        yield serving(broker)
        said = broker.get("/status") + broker.get("/metrics") + broker.output()
        assert token not in said and token not in " ".join(map(str, broker.process.args))
        assert broker.cluster()["connected"] is True
    finally:
        nats.stop()
