"""Shared fixtures. Nothing here imports txzmq at import time (it would pick the
global reactor before pytest-twisted installs its own)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted


@pytest.fixture
def bus_server(tmp_path: Path) -> Iterator[Any]:
    """A running Event BUS on free ports of 127.0.0.1 with its log in tmp_path."""
    from bus.testing import start_bus

    server = start_bus(tmp_path / "bus")
    yield server
    pytest_twisted.blockon(server.stopService())


@pytest.fixture
def peers() -> Iterator[list[Any]]:
    """Raw peers made by a test are closed after it."""
    made: list[Any] = []
    yield made
    for peer in made:
        peer.close()
