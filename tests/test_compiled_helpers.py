"""The optional compiled helpers (setup.py): built wherever a C compiler is, and each turned
off by its environment switch. What each gives is compared with its Python code in the
helper's own tests (test_transport_frames, test_natswire_scan,
test_eventbus_codec_fastpath, test_emqp_codec_fastpath, test_sqlitewal)."""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys

import pytest

#: (module holding it, its attribute, the switch that turns it off)
HELPERS = [
    ("bus.transport.frames", "native", "BUS_NATIVE_FRAMES"),
    ("bus.nats.codec", "native", "BUS_NATIVE_NATS"),
    ("bus.eventbus.codec", "native", "BUS_NATIVE_PUBS"),
    ("bus.util.sqlitewal", "native_rows", "BUS_NATIVE_ROWS"),
    ("bus.emqp.codec", "native", "BUS_NATIVE_EMQP"),
]


@pytest.mark.parametrize(("module", "attribute", "switch"), HELPERS)
def test_it_is_built_wherever_a_c_compiler_is(module: str, attribute: str, switch: str) -> None:
    # Optional at install time, so a build that failed would go unnoticed but for this.
    if not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("no C compiler here: the Python code does it all")
    assert getattr(importlib.import_module(module), attribute) is not None


@pytest.mark.parametrize(("module", "attribute", "switch"), HELPERS)
def test_its_switch_at_0_turns_it_off(module: str, attribute: str, switch: str) -> None:
    code = f"import {module} as m; print(m.{attribute} is None)"
    for value, off in (("0", "True"), ("1", "False")):
        if value == "1" and not (shutil.which("cc") or shutil.which("gcc")):
            continue
        env = {**os.environ, switch: value}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        assert out.stdout.strip() == off, (value, out.stderr)


def test_jetstream_deliveries_are_read_in_python_when_the_nats_scanner_is_off() -> None:
    code = "from bus.nats import ranged; print(ranged.deliveries.__name__)"
    env = {**os.environ, "BUS_NATIVE_NATS": "0"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.split() == ["_deliveries"], out.stderr
