"""eMQP as a drop-in for eventmq 0.3.13, broker side (issue 34), through real sockets: the
admin commands eventmq's ``emq-cli`` sends, eventmq's STATUS keys, six-field cron lines,
cron haste, and an answer to every SCHEDULE a client waits on, malformed ones included.
Where eventmq has the behaviour, its own code (``.venv-interop``) is the peer."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_twisted
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from bus.emqp import codec
from bus.emqp.codec import EmqpError
from bus.testing import RawPeer, start_broker, wait_until

Message = list[bytes]


# -- malformed SCHEDULE and UNSCHEDULE ---------------------------------------------------------


@dataclass
class Scheduling:
    broker: Any
    client: RawPeer
    admin: RawPeer


@pytest.fixture(scope="module")
def scheduling(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scheduling]:
    broker = start_broker(tmp_path_factory.mktemp("dropin-emqp"))
    client = RawPeer.dealer(broker.endpoints["client"])
    admin = RawPeer.dealer(broker.endpoints["admin"])
    try:
        yield Scheduling(broker, client, admin)
    finally:
        client.close()
        admin.close()
        pytest_twisted.blockon(broker.stopService())


def _not_json(data: bytes) -> bool:
    try:
        json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return True
    return False


good_fields = [b"q", b"nohaste", b"3600", b'["run", {"path": "a", "callable": "b"}]', b""]


@st.composite
def malformed_schedules(draw: st.DrawFn) -> Message:
    """A SCHEDULE or UNSCHEDULE eventmq's client could never send: too few or too many
    fields, or a body that is not JSON; its message id sound, so it can be answered."""
    command = draw(st.sampled_from([codec.SCHEDULE, codec.UNSCHEDULE]))
    if draw(st.booleans()):
        count = draw(st.sampled_from([0, 2, 3, 4, 6, 7, 11]))
        fields = [draw(st.sampled_from(good_fields)) for _ in range(count)]
    else:
        body = draw(st.binary(min_size=0, max_size=40).filter(_not_json))
        fields = [*good_fields[:3], body, b""]
    return codec.message(command, *fields)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(batch=st.lists(st.tuples(st.sampled_from(["client", "admin"]), malformed_schedules()),
                      min_size=1, max_size=8))  # fmt: skip
@pytest_twisted.inlineCallbacks
def test_a_malformed_schedule_is_answered_bad_schedule_and_counted(
    scheduling: Scheduling, batch: list[tuple[str, Message]]
) -> Any:
    """Each gets one 6-frame REPLY ``bad-schedule`` naming its id (a client waits for an
    answer), and is still dropped and counted under the codec's reason."""
    core = scheduling.broker.broker
    before = Counter(core.drops.counts)
    expected: Counter[str] = Counter()
    for _port, frames in batch:
        try:
            codec.parse(frames)
        except EmqpError as error:
            expected[error.reason] += 1
        else:
            assume(False)
    for port, frames in batch:
        getattr(scheduling, port).send(frames)

    def answers(port: str, msgid: bytes) -> list[Any]:
        peer = getattr(scheduling, port)
        return [json.loads(m[4]) for m in peer.messages if len(m) == 6 and m[5] == msgid]

    for port, frames in batch:
        yield wait_until(lambda p=port, f=frames: answers(p, f[3]), what="the bad-schedule answer")
    for port, frames in batch:
        [answer] = answers(port, frames[3])
        assert answer["error"] == "bad-schedule" and answer["message"]
    assert Counter(core.drops.counts) - before == expected
    assert len(core.schedules) == 0
