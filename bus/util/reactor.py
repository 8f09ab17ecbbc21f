"""The reactor a piece of code runs on: the one injected (a test's ``Clock``, a memory
reactor) or Twisted's global one, imported only when it is needed, so that importing a
module installs no reactor."""

from __future__ import annotations

from typing import Any


def reactor_of(reactor: Any | None) -> Any:
    """The injected reactor, or the global one (imported only when needed)."""
    if reactor is not None:
        return reactor
    from twisted.internet import reactor as global_reactor

    return global_reactor
