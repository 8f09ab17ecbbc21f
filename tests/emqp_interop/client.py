"""The real eventmq client code against a broker: ``python client.py ADDR REQUESTS_JSON``.

Each request is ``{"func": "pkg.mod.callable", "args": [...], "kwargs": {...}, "reply": bool,
"guarantee": bool, "retries": N, "timeout": N, "queue": name, "class_args": [...]}``, sent
with eventmq's own ``defer_job`` on its own ``Sender``. The script then reads the socket until
each request's dispatch acknowledgement (and, when asked, its result) arrived, or 30 s
passed, and prints one JSON line per request: msgid, acknowledged, result."""

import json
import os
import sys
import time

os.environ.setdefault("EVENTMQ_CONFIG_FILE", os.devnull)

import zmq
from eventmq.client.messages import defer_job
from eventmq.sender import Sender

address, requests = sys.argv[1], json.loads(sys.argv[2])
sender = Sender()
sender.connect(address)
sent = []
for request in requests:
    msgid = defer_job(
        sender,
        request["func"],
        args=request.get("args", ()),
        kwargs=request.get("kwargs"),
        class_args=request.get("class_args", ()),
        reply_requested=request.get("reply", False),
        guarantee=request.get("guarantee", False),
        retry_count=request.get("retries", 0),
        timeout=request.get("timeout", 0),
        queue=request.get("queue"),
    )
    sent.append(
        {
            "msgid": msgid,
            "acknowledged": False,
            "result": None,
            "reply": request.get("reply", False),
        }
    )
by_id = {entry["msgid"]: entry for entry in sent}
poller = zmq.Poller()
poller.register(sender.zsocket, zmq.POLLIN)
deadline = time.time() + 30


def finished():
    return all(e["acknowledged"] and (e["result"] is not None or not e["reply"]) for e in sent)


while not finished() and time.time() < deadline:
    if not poller.poll(100):
        continue
    frames = [f.decode() for f in sender.zsocket.recv_multipart()]
    if len(frames) == 5 and frames[2] == "REPLY" and frames[4] in by_id:
        by_id[frames[4]]["acknowledged"] = True
    elif len(frames) == 6 and frames[2] == "REPLY" and frames[5] in by_id:
        by_id[frames[5]]["result"] = json.loads(frames[4])
for entry in sent:
    print(json.dumps(entry), flush=True)
sender.zsocket.close(linger=1000)
