"""The real eventmq client's ``schedule``: ``python schedule.py ADDR FUNC ARGS_JSON INTERVAL
[unschedule] [run_count:N] [queue:NAME]`` sends one SCHEDULE (or UNSCHEDULE) on its own
Sender and exits once sent. INTERVAL ``cron:LINE`` schedules the cron line instead;
``run_count:N`` is sent as a header beside ``guarantee`` (eventmq's own way to limit a
schedule to N runs); ``queue:NAME`` runs it on queue NAME (else eventmq's default)."""

import json
import os
import sys

os.environ.setdefault("EVENTMQ_CONFIG_FILE", os.devnull)

import zmq
from eventmq.client.messages import schedule
from eventmq.sender import Sender

address, func, args, interval = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
unschedule = "unschedule" in sys.argv[5:]
headers = ("guarantee", *(word for word in sys.argv[5:] if word.startswith("run_count:")))
queues = [word.removeprefix("queue:") for word in sys.argv[5:] if word.startswith("queue:")]
where = {"queue": queues[0]} if queues else {}
sender = Sender()
sender.connect(address)
if interval.startswith("cron:"):
    timing = {"cron": interval.removeprefix("cron:")}
else:
    timing = {"interval_secs": int(interval)}
msgid = schedule(sender, func, args=args, unschedule=unschedule, headers=headers, **timing, **where)
print(msgid, flush=True)
sender.zsocket.close(linger=5000)  # sent before the process ends
zmq.Context.instance().term()
