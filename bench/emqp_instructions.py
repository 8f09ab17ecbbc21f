"""Instructions per job of the eMQP broker's own work, counted by valgrind.

On a shared 2-core machine every CPU-time figure moves with what else runs; the number of
instructions a piece of code executes does not. Each stage runs the broker's own code in one
process under ``valgrind --tool=cachegrind`` (instruction counts only), once with BATCHES
batches of 64 jobs and once with none; the difference over the jobs is the stage's
instructions per job. A job is what the pipelined bench (``emqp_broker.py``) sends: a
client's REQUEST (``reply-requested``, a JSON body), and from the worker that ran it a REPLY
and a READY; four workers of 16 slots each, so a batch of 64 requests is dispatched at once
and the workers' 128 messages free every slot again.

* ``codec``: ``codec.parse`` of the job's three messages (as the core gets them: without
  the ROUTER identity);
* ``core``: ``Broker.on_client_message`` and ``on_worker_message`` of them (parsing,
  routing, the outgoing frame lists: the REQUEST to the worker, the dispatch
  acknowledgement and the REPLY to the client), the clock injected;
* ``service``: the service's handling of each read batch (``EmqpService._on_clients`` and
  ``_on_workers``: the core, the store's check, the sends handed to the sockets), its
  sockets replaced by ones that take every message (the transport's helper and libzmq are
  not in it);
* ``guaranteed``: ``service`` with ``guarantee`` requests: each committed to the job store
  (SQLite, WAL, in a temporary directory) before its dispatch, deleted once replied;
* ``waiting``: ``guaranteed`` as the pipelined bench's guaranteed mode runs it, every slot
  busy: each batch's 64 new requests wait in their queue (committed, not yet dispatched)
  while the workers' REPLY and READY for the 64 before them dispatch them;
* ``read``: the transport's read of the job's three messages (8, 5 and 7 frames with the
  identity) from an in-process ROUTER socket (``ZmqSocket._read_batch``); the peers'
  sends (through the compiled helper, whatever ``BUS_NATIVE_FRAMES`` says), the same on
  both sides of an A/B, are counted in it too.

Instructions are not time (a cache miss costs more than an add), but a change that removes
instructions removes their time on any machine, and the count is the same on a busy machine
as on a quiet one (``PYTHONHASHSEED=0`` in every run: the same dictionaries each time):
``bench/ab.py --runs 1`` resolves a few percent. Two valgrind runs go at once (they share
nothing). Baseline, same run: ``read`` with ``BUS_NATIVE_FRAMES=0`` (the transport reads
through pyzmq, frame by frame; the other stages do not read).

    python bench/emqp_instructions.py [--batches 20] [--stages codec,core,service,guaranteed,read]
"""

from __future__ import annotations

import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from _common import cachegrind_instructions, instruction_args, instruction_summary, machine

WORKERS = 4
SLOTS = 16
BATCH = WORKERS * SLOTS
STAGES = ("codec", "core", "service", "guaranteed", "waiting", "read")
PYTHON_ONLY = {"BUS_NATIVE_FRAMES": "0"}
PROTOCOL = b"eMQP/1.0"
BODY = b'["bench", {"n": 1}]'


class _TakesAll:
    """A socket that takes every message (the service's sends without libzmq)."""

    closed = False

    def send_each(self, messages: Any) -> tuple[int, int]:
        return len(messages), 0


def _messages(
    guaranteed: bool, first: int = 0
) -> tuple[list[list[bytes]], list[list[bytes]], list[bytes]]:
    """One batch: the client's REQUESTs, the workers' REPLY and READY for each (identity
    first, as read), and the workers' identities; message ids from ``first`` on."""
    workers = [b"\x00worker-%d" % n for n in range(WORKERS)]
    headers = b"reply-requested,guarantee" if guaranteed else b"reply-requested"
    msgids = [b"7c4d3a1e-55aa-4f0e-9b1c-%012x" % n for n in range(first, first + BATCH)]
    requests = [
        [b"\x00client", b"", PROTOCOL, b"REQUEST", msgid, b"default", headers, BODY]
        for msgid in msgids
    ]
    answers = []
    for n, msgid in enumerate(msgids):
        worker = workers[n % WORKERS]  # the broker dispatches round-robin (checked below)
        answers.append(
            [worker, b"", PROTOCOL, b"REPLY", b"1b2c-%08x" % n, b'{"value": ' + BODY + b"}", msgid]
        )
        answers.append([worker, b"", PROTOCOL, b"READY", b"3d4e-%08x" % n])
    return requests, answers, workers


def _informs(workers: list[bytes]) -> list[list[bytes]]:
    from bus.emqp import codec

    batch = [[w, *codec.inform([(10, "default")], "worker")] for w in workers]
    batch += [[w, *codec.ready()] for w in workers for _ in range(SLOTS)]
    return batch


def stage(name: str, batches: int) -> None:
    """Run ``name`` on ``batches`` batches in this process (under valgrind, from main())."""
    if name == "read":
        read_stage(batches)
        return
    from twisted.internet.task import Clock

    from bus.emqp import codec
    from bus.emqp.config import EmqpConfig
    from bus.emqp.core import Broker, BrokerSettings
    from bus.emqp.server import EmqpService, log
    from bus.emqp.store import JobStore

    guaranteed = name in ("guaranteed", "waiting")
    requests, answers, workers = _messages(guaranteed)
    clock = Clock()
    clock.advance(1_000)
    with tempfile.TemporaryDirectory(prefix="emqp-instructions-") as directory:
        store = JobStore(directory) if name in ("service", "guaranteed", "waiting") else None
        broker = Broker(BrokerSettings(), clock.seconds, log, store)
        for frames in _informs(workers):
            broker.on_worker_message(frames[0], frames[1:])
        broker.to_workers.clear()
        if name == "codec":
            parse = codec.parse
            inputs = [m[1:] for m in requests + answers]
            for _ in range(batches):
                for frames in inputs:
                    parse(frames)
        elif name == "core":
            client, worker = broker.on_client_message, broker.on_worker_message
            for _ in range(batches):
                for frames in requests:
                    client(frames[0], frames[1:])
                for frames in answers:
                    worker(frames[0], frames[1:])
                broker.to_workers.clear()
                broker.to_clients.clear()
                assert not broker.jobs
        else:
            service = EmqpService(EmqpConfig(data_dir=Path(directory)), reactor=clock)
            service.store, service.broker = store, broker
            service.worker_socket = service.client_socket = _TakesAll()  # type: ignore[assignment]
            if name == "waiting":
                # Two sets of requests in turn: one runs while the other waits.
                turns = [requests, _messages(True, BATCH)[0]]
                replies = [answers, _messages(True, BATCH)[1]]
                service._on_clients(turns[0])  # every slot busy
                for n in range(batches):
                    service._on_clients(turns[(n + 1) % 2])
                    service._on_workers(replies[n % 2])
                assert len(broker.jobs) == BATCH and not broker.drops.counts
                store.close()  # type: ignore[union-attr]
                return
            for _ in range(batches):
                service._on_clients(requests)
                service._on_workers(answers)
                assert not broker.jobs
        if store is not None:
            store.close()


def read_stage(batches: int) -> None:
    """The transport's reads of a batch's messages from an in-process ROUTER."""
    import bus.transport._frames as helper
    import zmq
    import zmq.backend.cython._zmq as backend

    from bus.transport.zmqsocket import SocketFactory

    class Reactor:
        """What a ZmqSocket asks of its reactor here: nothing runs."""

        def addReader(self, reader: Any) -> None: ...

        def removeReader(self, reader: Any) -> None: ...

        def callLater(self, delay: float, call: Any, *args: Any) -> Any:
            return None

        def seconds(self) -> float:
            return 0.0

    requests, answers, workers = _messages(False)
    factory = SocketFactory(Reactor())
    received: list[int] = []
    router = factory.socket(zmq.ROUTER, lambda batch: received.append(len(batch)))
    router.bind("inproc://emqp-instructions")
    context = factory.txzmq_factory.context
    peers: dict[bytes, Any] = {}
    for identity in [requests[0][0], *workers]:
        peer = peers[identity] = context.socket(zmq.DEALER)
        peer.setsockopt(zmq.IDENTITY, identity)
        peer.set_hwm(0)
        peer.connect("inproc://emqp-instructions")
    helper.bind(backend.__file__)
    sends = [
        (peers[identity].underlying, [m[1:] for m in requests + answers if m[0] == identity])
        for identity in peers
    ]
    for handle, messages in sends:  # warm: every peer connected and known to the ROUTER
        helper.send(handle, messages)
    while sum(received) < len(requests) + len(answers):
        router._read_batch(router.socket, 1_000)
    for _ in range(batches):
        for handle, messages in sends:
            helper.send(handle, messages)
        router._read_batch(router.socket, len(requests))
        router._read_batch(router.socket, len(answers))
    for peer in peers.values():
        peer.close(linger=0)
    factory.shutdown()


def instructions(name: str, batches: int, env: dict[str, str]) -> int:
    """Instructions valgrind counted for this script's ``stage`` run of ``name``."""
    return cachegrind_instructions(__file__, name, batches, {"PYTHONHASHSEED": "0", **env})


def per_job(pool: ThreadPoolExecutor, name: str, batches: int, env: dict[str, str]) -> Any:
    """The stage's instructions per job, once its two runs (submitted now) are done."""
    runs = pool.submit(instructions, name, batches, env), pool.submit(instructions, name, 0, env)
    return lambda: (runs[0].result() - runs[1].result()) / (batches * BATCH)


def main() -> int:
    args = instruction_args(__doc__.split("\n\n")[0], STAGES, stage)
    if args is None:
        return 0
    info = machine()
    stages = [s for s in args.stages.split(",") if s]
    counted: dict[str, dict[str, float]] = {}
    with ThreadPoolExecutor(2) as pool:  # two runs at a time
        futures = {
            name: {
                "code": per_job(pool, name, args.batches, {}),
                **(
                    {"python": per_job(pool, name, args.batches, PYTHON_ONLY)}
                    if name == "read"
                    else {}
                ),
            }
            for name in stages
        }
        for name in stages:
            counted[name] = {kind: result() for kind, result in futures[name].items()}
            baseline = counted[name].get("python")
            print(
                f"{name:<11} {counted[name]['code']:>9,.0f} instructions/job"
                + (f" (BUS_NATIVE_FRAMES=0: {baseline:,.0f})" if baseline is not None else ""),
                flush=True,
            )
    main_stage = "service" if "service" in counted else stages[-1]
    read = counted.get("read", {})
    instruction_summary(
        "emqp_instructions", info, args, counted, main_stage, "job",
        baseline=(
            f"read with BUS_NATIVE_FRAMES=0: {read['python']:,.0f}" if read else "read not run"
        ),
        ratio=(
            f"read {read['code'] / read['python']:.2f} (with the compiled helper / without)"
            if read
            else "none"
        ),
        details=[("jobs", f"{args.batches} batches of {BATCH} per stage, valgrind cachegrind")],
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
