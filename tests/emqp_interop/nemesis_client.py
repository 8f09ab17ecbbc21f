"""eventmq's own client sending guaranteed requests until told to stop, for the nemesis
test: ``python nemesis_client.py ADDR NAME OUT STOP_FILE RATE SECONDS``.

Every 1/RATE s it sends, with eventmq's ``defer_job`` on its own ``Sender``, a guaranteed
request with a reply of ``tests.emqp_interop.jobs.nemesis_run("NAME-N", SECONDS)``. Each
record goes to the JSON-lines file OUT the moment it is made: ``{"kind": "sent", "token",
"msgid", "t"}`` for each request sent, ``{"kind": "ack", "msgid", "t"}`` for each dispatch
acknowledgement (the 5-frame REPLY: the broker holds it), ``{"kind": "result", "msgid",
"value", "t"}`` for each answer, ``{"kind": "other", "frames"}`` for anything else. Once
STOP_FILE exists it sends no more, and exits (``{"kind": "done"}``) when every request sent
has its answer or QUIET seconds passed with nothing received."""

import json
import os
import sys
import time

os.environ.setdefault("EVENTMQ_CONFIG_FILE", os.devnull)

import zmq
from eventmq.client.messages import defer_job
from eventmq.sender import Sender

QUIET = 15.0
address, name, out, stop_file = sys.argv[1:5]
rate, seconds = float(sys.argv[5]), float(sys.argv[6])
records = open(out, "a")


def note(**fields):
    records.write(json.dumps(fields) + "\n")
    records.flush()


sender = Sender()
sender.connect(address)
poller = zmq.Poller()
poller.register(sender.zsocket, zmq.POLLIN)
unanswered = set()
number = 0
next_at = time.time()
heard = None  # when the last frame came, once stopping
while True:
    now = time.time()
    if heard is None and os.path.exists(stop_file):
        heard = now
    if heard is not None:
        if not unanswered or now - heard > QUIET:
            break
    elif now >= next_at:
        token = f"{name}-{number}"
        number += 1
        next_at += 1 / rate
        msgid = defer_job(
            sender,
            "tests.emqp_interop.jobs.nemesis_run",
            args=[token, seconds],
            reply_requested=True,
            guarantee=True,
        )
        unanswered.add(msgid)
        note(kind="sent", token=token, msgid=msgid, t=time.time())
    wait = 0.1 if heard is not None else max(0.0, min(0.1, next_at - time.time()))
    if not poller.poll(int(wait * 1000)):
        continue
    frames = [f.decode() for f in sender.zsocket.recv_multipart()]
    if heard is not None:
        heard = time.time()
    if len(frames) == 5 and frames[2] == "REPLY":
        note(kind="ack", msgid=frames[4], t=time.time())
    elif len(frames) == 6 and frames[2] == "REPLY":
        unanswered.discard(frames[5])
        note(kind="result", msgid=frames[5], value=json.loads(frames[4]), t=time.time())
    else:
        note(kind="other", frames=frames, t=time.time())
note(kind="done", unanswered=len(unanswered))
sender.zsocket.close(linger=0)
