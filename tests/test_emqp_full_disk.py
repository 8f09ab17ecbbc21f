"""The eMQP broker on a real full disk (a small tmpfs the test mounts, fills and frees),
run as operators run it (``twistd -n emqp``), killed and restarted.

Every guaranteed request a client was told is dispatched is on disk: while the job store
refuses, guaranteed requests are neither acknowledged nor dispatched (the client port
pauses), they go out once space returns, a SIGTERM on a full disk stops the broker in
bounded time and tells the held ones' clients why, and a restart finds every
acknowledged request and none that was refused.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest_twisted
from twisted.internet import defer

from bus.emqp import codec
from bus.emqp.client import list_schedules
from bus.testing import wait_until
from tests.emqp_helpers import RawClient, RawWorker
from tests.processes import CLEAN_EXIT, BrokerProcess, broker_ports, reported
from tests.small_disk import fill, small_tmpfs

HEADERS = b"reply-requested,guarantee"
BODY = ["work", "x" * 4000]  # a few pages each: no commit fits in what the WAL has
# The raw worker never heartbeats: the broker must not forget it during the test.
SLOW_HEARTBEAT = ("--heartbeat-interval", "60s")


def acknowledged(client: RawClient, ids: list[bytes]) -> set[bytes]:
    return {msgid for msgid in ids if client.acks(msgid)}


def refused(client: RawClient, ids: list[bytes]) -> set[bytes]:
    return {
        msgid
        for msgid in ids
        if any(r.get("error") == "storage-error" for r in client.results(msgid))
    }


def paused(broker: BrokerProcess) -> bool:
    return bool(broker.status().get("client_port_paused"))


@defer.inlineCallbacks
def until_paused(broker: BrokerProcess, client: RawClient, stored: int) -> Any:
    """Guaranteed requests, 100 at a time, until the store refuses and the client port pauses
    (the disk full); the requests sent. The WAL file takes commits first where a checkpoint
    copied all it held (SQLite then writes it over from its start): a round may be stored
    whole, up to what that file has."""
    sent: list[bytes] = []
    for _ in range(20):  # 8 MB in all: past any WAL file the small disk holds
        sent += [client.request("q", BODY, HEADERS) for _ in range(100)]
        whole = stored + len(sent)
        yield wait_until(
            lambda whole=whole: paused(broker) or broker.status().get("stored") == whole,
            timeout=30,
            what="paused, or the round stored",
        )
        if paused(broker):
            return sent
    raise AssertionError(f"{len(sent)} requests stored on a full disk")


def taken_in_wal(client: RawClient, sent: list[bytes], taken: int) -> None:
    """Of ``sent`` on a full disk, ``taken`` were stored (in the WAL file's room): those the
    client was told are dispatched are among them, and none refused is."""
    acked, told_no = acknowledged(client, sent), refused(client, sent)
    assert not acked & told_no
    assert len(acked) <= taken <= len(sent) - len(told_no), (len(acked), taken, len(told_no))


@pytest_twisted.inlineCallbacks
def test_acknowledged_guaranteed_requests_survive_a_full_disk(tmp_path: Path) -> Any:
    ports = broker_ports()
    with small_tmpfs(tmp_path / "disk", "8m") as disk:
        data = disk / "emqp"
        logs = iter(tmp_path / f"broker-{n}.log" for n in range(10))  # off the small disk
        brokers = [BrokerProcess(data, ports, *SLOW_HEARTBEAT, log_path=next(logs))]
        client = worker = None
        try:
            yield reported(brokers[-1].ready, what="the broker")
            worker = RawWorker(brokers[-1].endpoints["worker"], [[10, "q"]])  # never replies
            yield wait_until(worker.acked, what="the worker's ACK")
            worker.ready(1000)
            client = RawClient(brokers[-1].endpoints["client"])

            # Full: held unannounced, the client port paused; space returns: all go out.
            filler = fill(disk)
            held = [client.request("q", BODY, HEADERS) for _ in range(300)]
            yield wait_until(lambda: paused(brokers[-1]), timeout=30, what="paused")
            assert "job store refused a commit" in brokers[-1].log_path.read_text()
            assert acknowledged(client, held) == set() and worker.requests() == []
            filler.unlink()
            yield wait_until(
                lambda: acknowledged(client, held) == set(held), timeout=60, what="all acked"
            )
            yield wait_until(lambda: len(worker.requests()) == 300, what="all dispatched")
            yield wait_until(lambda: not paused(brokers[-1]), what="the client port read again")
            yield wait_until(lambda: brokers[-1].status()["stored"] == 300, what="300 stored")
            assert "job store writes again" in brokers[-1].log_path.read_text()

            # Full again, then SIGTERM: bounded, and the held ones' clients are told.
            filler = fill(disk)
            late = yield until_paused(brokers[-1], client, stored=300)
            stored = brokers[-1].status()["stored"]
            assert brokers[-1].stop() in CLEAN_EXIT
            yield wait_until(lambda: refused(client, late), what="storage-error replies")
            taken_in_wal(client, late, stored - 300)

            # kill -9 on a full disk too: nothing acknowledged is lost there either.
            filler.unlink()
            brokers.append(BrokerProcess(data, ports, *SLOW_HEARTBEAT, log_path=next(logs)))
            yield reported(brokers[-1].ready, what="the broker again")
            assert brokers[-1].status()["counters"]["restored"] == stored
            filler = fill(disk)
            killed = yield until_paused(brokers[-1], client, stored=stored)
            stored_then = brokers[-1].status()["stored"]
            assert brokers[-1].stop(signal.SIGKILL) == -signal.SIGKILL
            filler.unlink()
            brokers.append(BrokerProcess(data, ports, *SLOW_HEARTBEAT, log_path=next(logs)))
            yield reported(brokers[-1].ready, what="the broker a third time")
            # Exactly what the store had taken: the first 300, and those of each full disk
            # the WAL took, acknowledged or not yet; none refused or held unstored.
            status = brokers[-1].status()
            assert status["counters"]["restored"] == stored_then == status["stored"]
            taken_in_wal(client, killed, stored_then - stored)
        finally:
            for peer in (client, worker):
                if peer is not None:
                    peer.close()
            for broker in brokers:
                if broker.process.poll() is None:
                    broker.stop(signal.SIGKILL)


def schedule_answers(client: RawClient, ids: list[bytes]) -> dict[bytes, Any]:
    """The answers each SCHEDULE got (its value, or the error), by request id."""
    return {msgid: client.results(msgid) for msgid in ids if client.results(msgid)}


def refusals(broker: BrokerProcess) -> int:
    """How many times the broker said its store refused a commit."""
    return broker.log_path.read_text().count("job store refused a commit")


def send_schedules(client: RawClient, first: int, count: int) -> list[bytes]:
    """SCHEDULEs of distinct bodies (distinct schedules), hourly: none fires in the test
    after its first run, which the broker makes at once."""
    ids = []
    for n in range(first, first + count):
        frames = codec.schedule("q", json.dumps(["job", n, "x" * 4000]).encode(), b"", 3600, None)
        client.peer.send(frames)
        ids.append(frames[3])
    return ids


@pytest_twisted.inlineCallbacks
def test_schedules_are_answered_only_once_stored_on_a_full_disk(tmp_path: Path) -> Any:
    """A hostile tester's finding: 200 SCHEDULEs answered on a full disk, 5 survived kill -9.
    Every schedule a client was told it has must be there after kill -9, and none other."""
    ports = broker_ports()
    with small_tmpfs(tmp_path / "disk", "8m") as disk:
        data = disk / "emqp"
        logs = iter(tmp_path / f"broker-{n}.log" for n in range(10))
        brokers = [BrokerProcess(data, ports, *SLOW_HEARTBEAT, log_path=next(logs))]
        client = None
        try:
            yield reported(brokers[-1].ready, what="the broker")
            client = RawClient(brokers[-1].endpoints["client"])
            before = send_schedules(client, 0, 5)
            yield wait_until(lambda: len(schedule_answers(client, before)) == 5, what="5 answers")

            # Full: no answer, and the log says the client port is not read (status.json
            # cannot be written on the full disk); space returns: all answered.
            filler = fill(disk)
            held = send_schedules(client, 5, 100)
            yield wait_until(lambda: refusals(brokers[-1]) == 1, timeout=30, what="refused")
            assert schedule_answers(client, held) == {}
            said = "schedule changes held unanswered, client port not read until it writes"
            assert said in brokers[-1].log_path.read_text()
            filler.unlink()
            yield wait_until(
                lambda: len(schedule_answers(client, held)) == 100, timeout=60, what="answered"
            )
            assert all("value" in r[0] for r in schedule_answers(client, held).values())
            assert "schedule changes answered, ports read again" in brokers[-1].log_path.read_text()

            # Full again, kill -9: what was answered is there.
            filler = fill(disk)
            lost = send_schedules(client, 105, 400)  # more than the WAL has room for
            yield wait_until(lambda: refusals(brokers[-1]) == 2, timeout=30, what="refused again")
            assert brokers[-1].stop(signal.SIGKILL) == -signal.SIGKILL
            filler.unlink()
            brokers.append(BrokerProcess(data, ports, *SLOW_HEARTBEAT, log_path=next(logs)))
            yield reported(brokers[-1].ready, what="the broker again")
            # Every schedule answered is stored; a few of the last batch may be stored
            # without their answer (the WAL's free pages took them, the answer was on its way).
            answered = {
                r[0]["value"]["schedule"]
                for r in schedule_answers(client, before + held + lost).values()
                if "value" in r[0]
            }
            listing = yield list_schedules(brokers[-1].endpoints["admin"], timeout=10)
            stored = {s["id"] for s in listing}
            assert len(answered) >= 105 and answered <= stored
            assert len(stored) < 505
        finally:
            if client is not None:
                client.close()
            for broker in brokers:
                if broker.process.poll() is None:
                    broker.stop(signal.SIGKILL)
