"""The API a third-party service builds on (docs/extending.md): one door,
:mod:`bus.extension`, which the example service uses alone, which loads nothing before a
name is asked for, and whose modules document every public class, function and method
(``make docs`` renders them and fails on a broken cross-reference)."""

from __future__ import annotations

import ast
import importlib
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

import bus.extension

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "echo-service"

#: What docs/extending.md tells a service author to use.
PUBLIC_API = (
    "bus.extension",
    "bus.application.contract",
    "bus.transport.testing",
    "bus.transport.curve_settings",
    "bus.application.services",
    "bus.application.options",
    "bus.application.composition",
    "bus.application.activity",
    "bus.util.metrics",
    "bus.errors",
    "bus.transport.zmqsocket",
    "bus.transport.udp",
    "bus.transport.curve",
    "bus.transport.fdbudget",
    "bus.testing",
)


def undocumented(module_name: str) -> list[str]:
    module = importlib.import_module(module_name)
    missing = [] if (module.__doc__ or "").strip() else [module_name]
    for name, value in vars(module).items():
        if name.startswith("_") or getattr(value, "__module__", None) != module_name:
            continue
        if not (inspect.isclass(value) or inspect.isfunction(value)):
            continue
        if not (value.__doc__ or "").strip():
            missing.append(f"{module_name}.{name}")
        if inspect.isclass(value):
            missing += [
                f"{module_name}.{name}.{method}"
                for method, member in vars(value).items()
                if not method.startswith("_")
                and inspect.isfunction(member)
                and not (member.__doc__ or "").strip()
            ]
    return missing


@pytest.mark.parametrize("module_name", PUBLIC_API)
def test_every_public_name_is_documented(module_name: str) -> None:
    assert undocumented(module_name) == []


def test_the_door_exports_each_name_from_its_home() -> None:
    homes = bus.extension._HOMES
    assert sorted(bus.extension.__all__) == sorted(homes)
    for name, home in homes.items():
        assert getattr(bus.extension, name) is getattr(importlib.import_module(home), name)
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        bus.extension.nothing_here  # noqa: B018


def test_the_example_service_imports_from_bus_only_through_the_door() -> None:
    others = []
    for path in sorted(EXAMPLE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            others += [
                f"{path.relative_to(EXAMPLE)}:{node.lineno} {name}"
                for name in names
                if (name == "bus" or name.startswith("bus.")) and name != "bus.extension"
            ]
    assert others == []
    assert any("bus.extension" in path.read_text() for path in EXAMPLE.rglob("*.py"))


def test_a_tap_taking_its_options_from_the_door_loads_no_zeromq() -> None:
    """A plugin's tap is imported for ``twistd --help``: the door loads what is asked."""
    code = (
        "import sys\n"
        "from bus.extension import ServiceOptions, Composition, ProtocolError\n"
        "loaded = sorted(m for m in ('txzmq', 'zmq', 'bus.transport.zmqsocket') if m in sys.modules)\n"
        "print(loaded)\n"
        "from bus.extension import SocketFactory\n"
        "print('txzmq' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split("\n")
    assert out[:2] == ["[]", "True"]
