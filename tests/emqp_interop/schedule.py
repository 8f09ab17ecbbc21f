"""The real eventmq client's ``schedule``: ``python schedule.py ADDR FUNC ARGS_JSON INTERVAL
[unschedule]`` sends one SCHEDULE (or UNSCHEDULE) on its own Sender and exits once sent.
INTERVAL ``cron:LINE`` schedules the cron line instead."""

import json
import os
import sys

os.environ.setdefault("EVENTMQ_CONFIG_FILE", os.devnull)

import zmq
from eventmq.client.messages import schedule
from eventmq.sender import Sender

address, func, args, interval = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
unschedule = sys.argv[5:] == ["unschedule"]
sender = Sender()
sender.connect(address)
if interval.startswith("cron:"):
    timing = {"cron": interval.removeprefix("cron:")}
else:
    timing = {"interval_secs": int(interval)}
msgid = schedule(sender, func, args=args, unschedule=unschedule, **timing)
print(msgid, flush=True)
sender.zsocket.close(linger=5000)  # sent before the process ends
zmq.Context.instance().term()
