"""eventmq's own publisher code against a PUBLISH service: ``python publish.py ADDR
READY_FILE PUBLICATIONS_JSON``.

It connects eventmq's ``Sender`` to ADDR and sends ``send_publish_request(sender, "sync",
...)`` every 20 ms until READY_FILE exists (the test's subscriber saw one: its subscriptions
have reached the PUB), then each ``[topic, value]`` of PUBLICATIONS_JSON with
``send_publish_request``, in order, and exits once they left (linger)."""

import json
import os
import sys
import time

os.environ.setdefault("EVENTMQ_CONFIG_FILE", os.devnull)

from eventmq.client.messages import send_publish_request
from eventmq.sender import Sender

address, ready_file, publications = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
sender = Sender()
sender.connect(address)
deadline = time.time() + 60
while not os.path.exists(ready_file):
    if time.time() > deadline:
        sys.exit("no subscriber saw a sync publication in 60 s")
    send_publish_request(sender, "sync", {"sync": True})
    time.sleep(0.02)
for topic, value in publications:
    print(send_publish_request(sender, topic, value), flush=True)
sender.zsocket.close(linger=5000)
