"""The sdist and the wheel carry everything the checkout's product is made of: a package
left out of either (bus.nats was, and every ``twistd -n eventbus`` died at import) fails
here, whatever the packaging configuration says."""

from __future__ import annotations

import shutil
import tarfile
import zipfile
from pathlib import Path

from tests.installed import ROOT, artifact, needs_artifacts

pytestmark = needs_artifacts


def product_files() -> set[str]:
    """What the product is made of, as paths relative to the checkout: every module and
    data file under bus/, the plugin files."""
    found = set()
    for path in (ROOT / "bus").rglob("*"):
        if "__pycache__" in path.parts or not path.is_file():
            continue
        if path.suffix in (".py", ".html", ".css", ".js") or path.name == "py.typed":
            found.add(path.relative_to(ROOT).as_posix())
    found.update(p.relative_to(ROOT).as_posix() for p in (ROOT / "twisted/plugins").glob("*.py"))
    return found


def c_sources() -> set[str]:
    return {p.relative_to(ROOT).as_posix() for p in (ROOT / "bus").rglob("*.c")}


def test_the_checkout_has_what_this_test_counts() -> None:
    files = product_files()
    packages = {Path(f).parent.as_posix() for f in files if f.endswith("/__init__.py")}
    # The test would pass on an empty list: make sure it lists the product.
    assert {"bus", "bus/nats", "bus/transport", "bus/eventbus", "bus/web/console"} <= packages
    assert "twisted/plugins/bus_eventbus.py" in files
    assert "bus/web/console/static/index.html" in files
    assert not (ROOT / "twisted/plugins/__init__.py").exists()  # would replace Twisted's own


def test_the_wheel_carries_every_module_data_file_and_plugin() -> None:
    with zipfile.ZipFile(artifact(".whl")) as wheel:
        names = set(wheel.namelist())
    missing = product_files() - names
    assert not missing, f"missing from the wheel: {sorted(missing)}"
    assert "twisted/plugins/__init__.py" not in names
    assert not [n for n in names if "__pycache__" in n or n.startswith(("tests/", "bench/"))]
    if shutil.which("cc") or shutil.which("gcc"):
        # With a compiler the optional C helpers are built (setup.py): their absence from
        # the wheel would be a silent slowdown for every user.
        built = {n.split(".", 1)[0] for n in names if n.endswith(".so")}
        assert built == {
            "bus/transport/_frames",
            "bus/nats/_scan",
            "bus/eventbus/_pubscan",
            "bus/util/_sqlrows",
            "bus/emqp/_jobscan",
        }, built


def test_the_sdist_carries_the_sources_a_wheel_is_built_from() -> None:
    with tarfile.open(artifact(".tar.gz")) as sdist:
        top, *_ = sdist.getnames()
        root = top.split("/", 1)[0]
        names = {n.removeprefix(f"{root}/") for n in sdist.getnames()}
    wanted = product_files() | c_sources() | {
        "README.md", "CHANGELOG.md", "LICENSE", "setup.cfg", "setup.py", "pyproject.toml",
    }  # fmt: skip
    missing = wanted - names
    assert not missing, f"missing from the sdist: {sorted(missing)}"
    assert not [n for n in names if n.endswith((".so", ".pyc"))]
