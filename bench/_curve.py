"""CURVE for the raw load generators: ``BENCH_CURVE="SERVER_PUBLIC CLIENT_PUBLIC
CLIENT_SECRET"`` (Z85) in their environment makes each client socket a CURVE client, so the
same generator measures a server with and without CURVE (see curve_cost.py)."""

from __future__ import annotations

import os
from typing import Any

ENV = "BENCH_CURVE"


def secure(sock: Any) -> None:
    """Make ``sock`` a CURVE client when the environment says so; call before connect."""
    keys = os.environ.get(ENV, "").split()
    if len(keys) != 3:
        return
    server, public, secret = (key.encode("ascii") for key in keys)
    sock.curve_serverkey = server
    sock.curve_publickey = public
    sock.curve_secretkey = secret
