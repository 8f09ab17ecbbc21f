"""The optional compiled helpers (everything else is in setup.cfg).

``bus.transport._frames`` reads and sends whole ZeroMQ messages a batch per call (see
bus/transport/frames.py). ``optional=True``: where it cannot be built (no C compiler or
no Python headers) the install goes on, and the transport reads and sends through pyzmq.
``bus.nats._scan`` parses NATS messages and JetStream deliveries (see
bus/nats/_scan.c); without it the Python parser does the same.
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
    ]
)
