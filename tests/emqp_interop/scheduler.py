"""Run the real eventmq Scheduler against a broker's client port: ``python scheduler.py ADDR``.

Without redis it keeps its schedules in memory. SIGTERM stops it."""

import os
import sys

os.environ.setdefault("EVENTMQ_CONFIG_FILE", os.devnull)
os.environ["EVENTMQ_SCHEDULER_ADDR"] = sys.argv[1]
os.environ["EVENTMQ_REDIS_STARTUP_ERROR_HARD_KILL"] = "no"

from eventmq.scheduler import Scheduler

Scheduler().scheduler_main()
