"""The optional compiled helpers (everything else is in setup.cfg).

``bus.transport._frames`` reads and sends whole ZeroMQ messages a batch per call (see
bus/transport/frames.py). ``optional=True``: where it cannot be built (no C compiler or
no Python headers) the install goes on, and the transport reads and sends through pyzmq.
``bus.nats._scan`` parses NATS messages and JetStream deliveries (see
bus/nats/_scan.c); without it the Python parser does the same.
``bus.eventbus._pubscan`` checks the collector's PUBs (see bus/eventbus/_pubscan.c);
without it the Python loop does the same. ``bus.util._sqlrows`` builds rows that sqlite3
binds without its adapter search (see bus/util/_sqlrows.c); without it rows keep their bytes.
``bus.emqp._jobscan`` parses the eMQP commands of every job and makes message ids (see
bus/emqp/_jobscan.c); without it the Python code does the same.
"""

import sys

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "bus.transport._frames",
            ["bus/transport/_frames.c"],
            libraries=["dl"] if sys.platform.startswith("linux") else [],
            optional=True,
        ),
        Extension("bus.nats._scan", ["bus/nats/_scan.c"], optional=True),
        Extension("bus.eventbus._pubscan", ["bus/eventbus/_pubscan.c"], optional=True),
        Extension("bus.util._sqlrows", ["bus/util/_sqlrows.c"], optional=True),
        Extension("bus.emqp._jobscan", ["bus/emqp/_jobscan.c"], optional=True),
    ]
)
