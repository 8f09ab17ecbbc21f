"""eventmq's own router, for comparison: ``python router.py WORKER_ADDR CLIENT_ADDR
ADMIN_ADDR WAL_PATH``. It binds the three addresses and serves until SIGTERM."""

import os
import sys

os.environ.setdefault("EVENTMQ_CONFIG_FILE", os.devnull)
backend, frontend, admin, wal = sys.argv[1:5]
os.environ.update(
    EVENTMQ_BACKEND_ADDR=backend,
    EVENTMQ_FRONTEND_ADDR=frontend,
    EVENTMQ_ADMINISTRATIVE_ADDR=admin,
    EVENTMQ_WAL=wal,
)

from eventmq.router import Router  # noqa: E402

Router().router_main()
