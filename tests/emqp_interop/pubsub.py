"""eventmq's own PUBLISH service (``emq-pubsub``), for comparison: ``python pubsub.py
INCOMING_ADDR OUTGOING_ADDR``. It binds both and serves until SIGTERM."""

import os
import sys

os.environ.setdefault("EVENTMQ_CONFIG_FILE", os.devnull)
os.environ.update(
    EVENTMQ_PUBLISHER_INCOMING_ADDR=sys.argv[1], EVENTMQ_PUBLISHER_OUTGOING_ADDR=sys.argv[2]
)

from eventmq.pub import Pub

Pub().pub_main()
