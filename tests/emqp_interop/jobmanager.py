"""Run the real eventmq JobManager against a broker: ``python jobmanager.py ADDR QUEUES JOBS``.

QUEUES is JSON ``[[weight, "name"], ...]``; JOBS the number of worker processes. It installs
its own signal handlers: SIGTERM makes it say KBYE and stop."""

import json
import os
import sys

os.environ.setdefault("EVENTMQ_CONFIG_FILE", os.devnull)

from eventmq.jobmanager import JobManager

address, queues, jobs = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
JobManager(queues=queues, concurrent_jobs=jobs).jobmanager_main(broker_addr=address)
