"""Property-based fuzzing of a RUNNING eMQP broker through real sockets.

Hypothesis generates batches of garbage (random frames, valid messages with one frame
corrupted, commands on the wrong port or from peers that never sent INFORM, REPLYs for no
request) interleaved with valid guaranteed requests, and sends them to the worker, client
and admin ports of one broker shared by the module, with one of our workers serving the
valid requests. After every example: the broker still answers (a probe on each port),
every valid request got its worker's reply and left the store, and the drop counters grew
by exactly what the oracle (the codec's parser plus which port and peer) says.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import pytest_twisted
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bus.emqp import codec
from bus.emqp.codec import EmqpError
from bus.emqp.schedules import ScheduleSpec, unschedule_id
from bus.emqp.worker import EmqpWorker
from bus.testing import RawPeer, start_broker, wait_until
from tests.emqp_helpers import RawClient

Message = list[bytes]


def echo(value: Any) -> Any:
    return value


# -- the oracle ------------------------------------------------------------------------------------


def outcome(port: str, frames: Message) -> str | None:
    """The drop reason the broker must count for this message, "" for one it must answer
    without a drop, or None for one this fuzzer does not send (it would change the broker's
    state: a new worker or scheduler, a request to a queue nobody serves)."""
    try:
        command = codec.parse(frames)
    except EmqpError as error:
        return error.reason
    if isinstance(command, codec.Inform):
        return None
    if port == "worker":  # from a peer that never sent INFORM
        return "not-informed"
    if isinstance(command, codec.Schedule):
        return schedule_outcome(command)
    if port == "client":
        if isinstance(command, codec.Request):
            return None
        return "unexpected-command"
    if isinstance(command, codec.Hello):
        return None  # neither answered nor counted: not worth a case of its own here
    answered = codec.Status | codec.Schedules | codec.ShowWorkers | codec.ShowSchedulers
    return "" if isinstance(command, answered) else "unexpected-command"


def is_schedule(frames: Message) -> bool:
    try:
        return isinstance(codec.parse(frames), codec.Schedule)
    except EmqpError:
        return False


def answered_malformed(frames: Message) -> bool:
    """A SCHEDULE or UNSCHEDULE the codec refuses is still answered (bad-schedule) when its
    message id can be read."""
    try:
        codec.parse(frames)
    except EmqpError:
        return codec.refused_schedule_msgid(frames) is not None
    return False


def schedule_outcome(command: codec.Schedule) -> str:
    """The broker's own scheduler answers every SCHEDULE and UNSCHEDULE; one whose frames
    do not make a schedule is also dropped under its reason."""
    try:
        if command.command == codec.SCHEDULE:
            ScheduleSpec.from_frames(command.fields)
        elif command.schedule_id is None:
            unschedule_id(command.fields)
    except EmqpError as error:
        return error.reason
    return ""


# -- strategies ------------------------------------------------------------------------------------

ids = st.uuids(version=4).map(lambda u: str(u).encode())
json_bodies = st.sampled_from([b"1", b"[]", b'["run", {}]', b'{"a": [1, 2]}', b'"x"', b"null"])
headers = st.sampled_from([b"", b"reply-requested", b"guarantee,retry-count:2", b"timeout:9"])


@st.composite
def valid_messages(draw: st.DrawFn) -> Message:
    kind = draw(st.sampled_from(["ready", "heartbeat", "reply", "ack", "kbye", "request",
                                 "status", "schedule", "inform", "dispatch"]))  # fmt: skip
    msgid = draw(ids)
    if kind == "ready":
        return codec.message(codec.READY, msgid=msgid)
    if kind == "heartbeat":
        return codec.message(codec.HEARTBEAT, b"1700000000.5", msgid=msgid)
    if kind == "reply":
        return codec.message(codec.REPLY, draw(json_bodies), draw(ids), msgid=msgid)
    if kind == "dispatch":
        return codec.message(codec.REPLY, draw(ids), msgid=msgid)
    if kind == "ack":
        return codec.message(codec.ACK, draw(ids), msgid=msgid)
    if kind == "kbye":
        return codec.message(codec.KBYE, msgid=msgid)
    if kind == "request":
        queue = draw(st.sampled_from([b"fuzz-nobody", b"x"]))
        return codec.message(codec.REQUEST, queue, draw(headers), draw(json_bodies), msgid=msgid)
    if kind == "status":
        return codec.message(codec.STATUS, msgid=msgid)
    if kind == "schedule":
        # Accepted ones must not run during the test: an hour away, and never at once.
        interval, cron = draw(st.sampled_from([(b"3600", b""), (b"-1", b"0 3 1 1 *")]))
        fields = [b"q", b"nohaste", interval, draw(json_bodies), cron]
        return codec.message(draw(st.sampled_from([codec.SCHEDULE, codec.UNSCHEDULE])), *fields,
                             msgid=msgid)  # fmt: skip
    return codec.inform([(10, "fuzz-inform")], draw(st.sampled_from(["worker", "scheduler"])))


BAD_FRAMES = [b"", b"\xff\xfe", b"\x00", b"{", b"[[1]]", b"retry-count:x", b"x" * 300,
              b"eMQP/1.1", b"READY", b"\xc3\x28"]  # fmt: skip


@st.composite
def corrupted(draw: st.DrawFn) -> Message:
    frames = draw(valid_messages())
    how = draw(st.sampled_from(["known-bad", "random", "drop", "add", "huge"]))
    index = draw(st.integers(0, len(frames) - 1))
    if how == "known-bad":
        frames[index] = draw(st.sampled_from(BAD_FRAMES))
    elif how == "random":
        frames[index] = draw(st.binary(max_size=30))
    elif how == "drop":
        del frames[index]
    elif how == "huge":
        frames[index] = b"\x01" * draw(st.integers(1000, 60_000))
    else:
        frames.insert(index, draw(st.binary(max_size=10)))
    return frames or [b""]


messages = st.one_of(
    valid_messages(),
    corrupted(),
    st.lists(st.binary(max_size=30), min_size=1, max_size=8),
)
actions = st.lists(
    st.one_of(
        st.tuples(st.sampled_from(["worker", "client", "admin"]), messages),
        st.tuples(st.just("request"), st.integers(0, 1_000_000)),
    ),
    min_size=1,
    max_size=25,
)


# -- the broker under test -------------------------------------------------------------------------


@dataclass
class Fuzzed:
    broker: Any
    worker: EmqpWorker
    stranger: RawPeer  # on the worker port; INFORMs only as the probe, then leaves
    client: RawClient
    admin: RawPeer
    examples: int = 0
    answered: set[bytes] = field(default_factory=set)


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fuzzed]:
    broker = start_broker(tmp_path_factory.mktemp("fuzzed-emqp"))
    worker = EmqpWorker(broker.endpoints["worker"], [(10, "fuzz")], slots=4,
                        handlers={"echo": echo})  # fmt: skip
    worker.startService()
    stranger = RawPeer.dealer(broker.endpoints["worker"])
    client = RawClient(broker.endpoints["client"])
    admin = RawPeer.dealer(broker.endpoints["admin"])
    try:
        pytest_twisted.blockon(wait_until(lambda: worker.registered, what="the worker's ACK"))
        yield Fuzzed(broker, worker, stranger, client, admin)
    finally:
        for peer in (stranger, client, admin):
            peer.close()
        pytest_twisted.blockon(worker.stopService())
        pytest_twisted.blockon(broker.stopService())


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(batch=actions)
@pytest_twisted.inlineCallbacks
def test_broker_survives_garbage_and_accounts_for_every_message(
    fuzzed: Fuzzed, batch: list[tuple[str, Any]]
) -> Any:
    core = fuzzed.broker.broker
    fuzzed.examples += 1
    drops_before = Counter(core.drops.counts)
    expected: Counter[str] = Counter()
    admin_answers = len([m for m in fuzzed.admin.messages if m[2] == codec.REPLY])
    expected_admin_answers = 0
    requests: list[tuple[bytes, int]] = []
    peers = {"worker": fuzzed.stranger, "client": fuzzed.client.peer, "admin": fuzzed.admin}
    for port, what in batch:
        if port == "request":
            msgid = fuzzed.client.request("fuzz", ["echo", what], b"reply-requested,guarantee")
            requests.append((msgid, what))
            continue
        reason = outcome(port, what)
        if reason is None:
            continue
        peers[port].send(what)
        if reason:
            expected[reason] += 1
        if port == "admin" and (not reason or is_schedule(what) or answered_malformed(what)):
            expected_admin_answers += 1

    # Probes, sent last on each connection: once answered, all before them was handled.
    probe = fuzzed.client.request("fuzz", ["echo", -fuzzed.examples], b"reply-requested")
    fuzzed.admin.send(codec.message(codec.STATUS))
    fuzzed.stranger.send(codec.ready())
    expected["not-informed"] += 1
    expected_admin_answers += 1
    # The stranger's probe: INFORM, whose ACK comes after all it sent before was handled.
    # Its KBYE then makes it a stranger again for the next example.
    probe_inform = codec.inform([(1, "stranger-probe")], codec.WORKER)
    fuzzed.stranger.send(probe_inform)
    fuzzed.stranger.send(codec.kbye())
    yield wait_until(
        lambda: fuzzed.client.results(probe) == [{"value": -fuzzed.examples}], what="the probe"
    )
    yield wait_until(
        lambda: (
            len([m for m in fuzzed.admin.messages if m[2] == codec.REPLY])
            == admin_answers + expected_admin_answers
        ),
        what="an answer to every STATUS and SCHEDULE on the admin port",
    )
    yield wait_until(
        lambda: [probe_inform[3]] in [m[4:] for m in fuzzed.stranger.messages],
        what="ACK of the stranger's INFORM",
    )
    # Told KBYE once in this example, however many of its messages were not-informed.
    kbyes = len([m for m in fuzzed.stranger.messages if m[2] == codec.KBYE])
    assert kbyes == fuzzed.examples
    # Every valid request answered by its worker, and gone from the store.
    for msgid, value in requests:
        yield wait_until(lambda m=msgid: fuzzed.client.results(m), what="a request's reply")
        assert fuzzed.client.results(msgid) == [{"value": value}]
    yield wait_until(lambda: fuzzed.broker.store.count() == 0, what="the store emptied")
    # Every bad message counted under the oracle's reason, nothing else counted.
    assert Counter(core.drops.counts) - drops_before == expected
    assert sum(core.drops.counts.values()) - sum(drops_before.values()) == sum(expected.values())
    assert fuzzed.broker.storage_errors == 0
    assert json.loads(fuzzed.admin.messages[-1][4])["workers"][0]["queues"] == [[10, "fuzz"]]
