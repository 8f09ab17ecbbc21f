"""The API a third-party service builds on (docs/extending.md) is documented: every public
class, function and method of these modules has a docstring (``make docs`` renders them and
fails on a broken cross-reference)."""

from __future__ import annotations

import importlib
import inspect

import pytest

#: What docs/extending.md tells a service author to use.
PUBLIC_API = (
    "bus.application.services",
    "bus.application.options",
    "bus.application.composition",
    "bus.application.activity",
    "bus.application.metrics",
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
