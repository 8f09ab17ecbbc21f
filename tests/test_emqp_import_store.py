"""``emqp-cli import-store``: a stopped SQLite broker's guaranteed requests and schedules
moved into JetStream, through real processes.

A ``twistd -n emqp`` on SQLite takes twelve guaranteed requests with no worker to run
them, and a 2 s schedule; it is stopped, and its store imported into a real nats-server.
The store gives them up; a broker started on the same data directory with ``--store
jetstream`` and a real ``emqp-worker`` runs each request once, its client (still
connected to the same ports) gets every answer, and the schedule goes on from its runs
and next due time, under its id and creation time. A second import is refused, as is one
while the broker runs; an import stopped half-way leaves the stream marked (a broker
refuses it) and ``--resume`` finishes it."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import defer

from bus.emqp import jobstream
from bus.emqp.client import EmqpClient
from bus.emqp.store import JobStore, StoredJob
from bus.nats import kv
from bus.nats.admin import StreamAdmin
from bus.nats.blocking import Connection
from bus.nats.servers import NatsCluster
from bus.testing import wait_until
from tests.jetstream_helpers import stream_info
from tests.processes import BrokerProcess, CommandProcess, ended, reported
from tests.test_emqp_worker_command import WorkerProcess, run

pytest.importorskip("nats")

CLEAN_EXIT = (0, -signal.SIGTERM)


class Cli(CommandProcess):
    program = "emqp-cli"


@defer.inlineCallbacks
def ran(cleanup: list[Any], *args: str) -> Any:
    command = Cli(*args)
    cleanup.append(command)
    yield command.ended()
    return command


def streaming(process: BrokerProcess) -> bool:
    return process.ready() and bool((process.status().get("jetstream") or {}).get("ready"))


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


@pytest_twisted.inlineCallbacks
def test_stored_requests_and_a_schedule_run_at_a_broker_on_jetstream(
    nats_server: NatsCluster, tmp_path: Path, cleanup: list[Any]
) -> Any:
    data, record, stamps = tmp_path / "emqp", tmp_path / "record.txt", tmp_path / "stamps.txt"
    url = nats_server.urls[0]
    old = BrokerProcess(data)
    new = worker = client = None
    try:
        yield reported(old.ready, what="the SQLite broker")
        ports, admin = old.ports(), old.endpoints["admin"]
        client = EmqpClient(old.endpoints["client"])
        results = [
            client.submit("default", run("record", str(record), f"job-{i}"), guarantee=True)
            for i in range(12)
        ]
        yield wait_until(lambda: old.status().get("stored") == 12, what="12 requests stored")
        added = yield ran(
            cleanup, "schedule", "default", json.dumps(run("stamp", str(stamps))),
            "--every", "2s", "--no-haste", "--admin", admin,
        )  # fmt: skip
        assert added.code == 0, added.err
        schedule = json.loads(added.out)["schedule"]

        # While the broker runs, its store is not imported.
        busy = yield ran(cleanup, "import-store", "--data-dir", str(data), "--nats", url)
        assert busy.code == 1 and "open in another process" in busy.err

        assert old.stop() in CLEAN_EXIT
        kept = JobStore(data)
        [row] = kept.load_schedules()
        assert len(kept.load()) == 12
        kept.close()

        imported = yield ran(cleanup, "import-store", "--data-dir", str(data), "--nats", url)
        assert imported.code == 0, imported.err
        [done] = imported.lines()
        assert (done["requests"], done["schedules"]) == (12, 1)
        assert done["broker_id"] == (data / "broker-id").read_text().strip()
        # Moved: the store holds them no more, the stream and the bucket do, as brokers
        # write them.
        emptied = JobStore(data)
        assert emptied.load() == [] and emptied.load_schedules() == []
        emptied.close()
        assert stream_info(url, "EMQP")["state"]["messages"] == 12
        with Connection([url]) as nats:
            key = StreamAdmin(nats, "KV_EMQP_SCHEDULES").message(1)
        assert key is not None and key[0] == kv.key_subject("EMQP_SCHEDULES", schedule.encode())
        assert jobstream.decode_row(key[2]) == (tuple(row), False)

        again = yield ran(cleanup, "import-store", "--data-dir", str(data), "--nats", url)
        assert again.code == 1 and "already holds 12 requests" in again.err

        # Heartbeats a busy machine keeps: a worker forgotten for its silence has its
        # requests dispatched again (at least once), which is not what is tested here.
        new = BrokerProcess(
            data, ports, "--store", "jetstream", "--nats", url, "--heartbeat-interval", "3s"
        )
        yield reported(lambda: streaming(new), what="the broker on JetStream")
        assert new.status()["jetstream"]["broker_id"] == done["broker_id"]
        worker = WorkerProcess(
            tmp_path / "worker.log", "--broker", new.endpoints["worker"], "--queues",
            "default", "--slots", "2", "--heartbeat-interval", "1s",
        )  # fmt: skip
        # The client, connected to the same ports, gets every answer through the new broker.
        values = yield defer.gatherResults(results)
        assert values == [f"job-{i}" for i in range(12)]
        ran_jobs = [line.split()[0] for line in lines(record)]
        assert sorted(ran_jobs) == sorted(f"job-{i}" for i in range(12))  # each once

        # The schedule goes on: its id, interval and creation time, its runs counted on.
        yield wait_until(lambda: len(lines(stamps)) >= 2, timeout=60, what="two runs")
        listed = yield ran(cleanup, "schedules", "--admin", new.endpoints["admin"])
        [entry] = map(json.loads, listed.out.splitlines())
        assert (entry["id"], entry["interval"], entry["created"]) == (schedule, 2.0, row[6])
        assert entry["runs"] >= row[8] + 2
        first, second = (float(line.split()[0]) for line in lines(stamps)[:2])
        assert second - first >= 1.0  # its rhythm: never two runs closer than half of it
        yield wait_until(
            lambda: (new.status()["jetstream"] or {}).get("acks_confirming") == 0,
            what="every acknowledgement confirmed",
        )
        assert sorted(line.split()[0] for line in lines(record)) == sorted(ran_jobs)
    finally:
        if client is not None:
            client.close()
        if worker is not None:
            worker.close()
        if new is not None:
            assert new.stop() in CLEAN_EXIT, new.log_path.read_text()
        if old.process.poll() is None:
            old.stop()


@pytest_twisted.inlineCallbacks
def test_an_import_stopped_half_way_is_refused_by_brokers_and_resumed(
    nats_server: NatsCluster, tmp_path: Path, cleanup: list[Any]
) -> Any:
    from bus.emqp.config import JetStreamSettings
    from bus.emqp.migrate import StoreMove
    from bus.emqp.store import StoreExport

    data, url = tmp_path / "emqp", nats_server.urls[0]
    store = JobStore(data)
    for i in range(40):
        job = StoredJob(
            b"msg-%d" % i, store.next_position(), b"client", b"default", b"guarantee",
            b'["noop"]', time.time(), 1, 2,
        )  # fmt: skip
        store.put(job)
    store.commit()
    store.close()

    # Stopped after twenty requests reached the stream (as a lost server stops it).
    class Stopped(Exception):
        pass

    export = StoreExport(data)
    move = StoreMove(export, JetStreamSettings((url,)), b"b1")
    stopping = move._requests

    def twenty(admin: Any, jobs: list[StoredJob], base: int) -> None:
        stopping(admin, jobs[:20], base)
        raise Stopped()

    move._requests = twenty  # type: ignore[method-assign]
    with pytest.raises(Stopped):
        move.run()
    export.close()
    info = stream_info(url, "EMQP")
    assert info["state"]["messages"] == 20 and "bus_importing" in info["config"]["metadata"]

    refused = BrokerProcess(
        tmp_path / "b2", None, "--store", "jetstream", "--nats", url, "--nats-broker-id", "b2"
    )
    code = yield ended(refused.process, 0, "the refused broker")
    refused.log.close()
    assert code != 0 and "is being imported into" in refused.log_path.read_text()
    plain = yield ran(cleanup, "import-store", "--data-dir", str(data), "--nats", url,
                      "--nats-broker-id", "b1")  # fmt: skip
    assert plain.code == 1 and "--resume goes on" in plain.err

    resumed = yield ran(cleanup, "import-store", "--data-dir", str(data), "--nats", url,
                        "--nats-broker-id", "b1", "--resume")  # fmt: skip
    assert resumed.code == 0, resumed.err
    assert json.loads(resumed.out)["requests"] == 40
    info = stream_info(url, "EMQP")
    assert info["state"]["messages"] == 40 and "bus_importing" not in info["config"]["metadata"]
    with Connection([url]) as nats:
        admin = StreamAdmin(nats, "EMQP")
        msgids = []
        for sequence in range(1, 41):
            found = admin.message(sequence)
            assert found is not None
            msgids.append(jobstream.decode(found[2]).msgid)
    assert msgids == [b"msg-%d" % i for i in range(40)]  # each once, in the store's order
    left = JobStore(data)
    assert left.load() == []
    left.close()
