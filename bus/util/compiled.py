"""The optional compiled helpers (setup.py builds them where a C compiler is): each is
imported here, or None where it was not built or its environment switch is ``0``. Every
caller has Python code that gives the same results without it."""

from __future__ import annotations

import importlib
import os
from typing import Any


def compiled(module: str, switch: str) -> Any:
    """The compiled module named ``module`` (e.g. ``bus.nats._scan``), or None: not built,
    or ``switch=0`` in the environment (e.g. ``BUS_NATIVE_NATS=0``)."""
    if os.environ.get(switch, "1") == "0":
        return None
    try:
        return importlib.import_module(module)
    except ImportError:
        return None
