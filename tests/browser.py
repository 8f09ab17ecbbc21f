"""Debian's Chromium driven by selenium, headless, for the console's tests.

``make test`` installs ``chromium`` and ``chromium-driver`` when they are missing (as root,
with apt-get); without them these tests fail when ``BUS_BROWSER_TESTS=required`` (CI sets it)
and are skipped otherwise, saying how to get them. On a failure the page is saved as a PNG
under ``test-artifacts/`` (or ``$BUS_TEST_ARTIFACTS``), with the browser's console log."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.processes import ROOT

CHROMIUM = os.environ.get("BUS_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("BUS_CHROMEDRIVER", "/usr/bin/chromedriver")
ARTIFACTS = Path(os.environ.get("BUS_TEST_ARTIFACTS", ROOT / "test-artifacts"))

# As the machine's notes have it: without the background-networking flags Chromium keeps
# trying to reach Google's hosts, which this closed network refuses.
FLAGS = (
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--window-size=1280,1600",
)  # fmt: skip


def chromium() -> Any:
    """A headless Chromium under selenium (skipped, or failed when required, if absent)."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not shutil.which(p)]
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        missing.append("selenium (pip install -e '.[test]')")
    if missing:
        message = f"the browser tests need {', '.join(missing)} (make test installs them)"
        if os.environ.get("BUS_BROWSER_TESTS") == "required":
            pytest.fail(message)
        pytest.skip(message)
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # The driver named: selenium's manager would try to download one.
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


def save_failure(driver: Any, name: str) -> Path:
    """The page as a PNG and the browser's console log, under ARTIFACTS."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    stem = "".join(c if c.isalnum() or c in "-_" else "_" for c in name)
    png = ARTIFACTS / f"{stem}.png"
    driver.save_screenshot(str(png))
    try:
        entries = driver.get_log("browser")
    except Exception:  # a driver that keeps no log
        entries = []
    (ARTIFACTS / f"{stem}.log").write_text(
        "\n".join(f"{e.get('level')} {e.get('message')}" for e in entries) + "\n"
    )
    return png
