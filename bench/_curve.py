"""CURVE for the raw load generators: ``BENCH_CURVE="SERVER_PUBLIC CLIENT_PUBLIC
CLIENT_SECRET"`` (Z85) in their environment makes each client socket a CURVE client, so the
same generator measures a server with and without CURVE (see curve_cost.py);
``BENCH_CURVE_SERVER="SERVER_SECRET"`` makes a raw baseline's bound sockets CURVE servers
(no ZAP handler: any client key is let in)."""

from __future__ import annotations

import os
from typing import Any

ENV = "BENCH_CURVE"
SERVER_ENV = "BENCH_CURVE_SERVER"


def secure(sock: Any) -> None:
    """Make ``sock`` a CURVE client when the environment says so; call before connect."""
    keys = os.environ.get(ENV, "").split()
    if len(keys) != 3:
        return
    server, public, secret = (key.encode("ascii") for key in keys)
    sock.curve_serverkey = server
    sock.curve_publickey = public
    sock.curve_secretkey = secret


def serve(sock: Any) -> None:
    """Make ``sock`` a CURVE server when the environment says so; call before bind."""
    secret = os.environ.get(SERVER_ENV, "").strip()
    if not secret:
        return
    sock.curve_server = True
    sock.curve_secretkey = secret.encode("ascii")
