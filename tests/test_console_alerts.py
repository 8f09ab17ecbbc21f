"""The console's alerts, from the shipped rules evaluated in the product
(bus/web/alerts), against ``twistd -n eventbus`` as operators run it:

- in Chromium: an eMQP queue with requests and no worker shows its alert pending, then
  firing with the same since-when, on the list and on eMQP's card; a worker for the queue
  resolves it;
- beside a real Prometheus (Debian's, loading the shipped rules with every ``for`` made
  1s, as tests/test_prometheus.py does), the product (``--http-alert-for '*=1s'``) fires
  the same alerts, with the same labels and annotations, for the same condition.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser import chromium, save_failure
from tests.processes import CLEAN_EXIT, wait_for
from tests.test_console_browser import FREE_PORTS, wait
from tests.test_product_process import Product, environment

BIN = Path(sys.executable).parent


@pytest.fixture
def page(request: pytest.FixtureRequest) -> Iterator[Any]:
    """Chromium, its page saved under test-artifacts/ when the test failed."""
    driver = chromium()
    try:
        yield driver
        report = getattr(request.node, "report_call", None)
        if report is None or report.failed:
            print(f"page saved: {save_failure(driver, request.node.name)}")
    finally:
        driver.quit()


def start(workdir: Path, *args: str) -> Product:
    product = Product(workdir, *FREE_PORTS, "--data-dir", str(workdir / "bus"), *args)
    wait_for(product.ready, what="the product started")
    return product


def submit(product: Product, queue: str) -> subprocess.Popen[str]:
    """A guaranteed request on ``queue``, from ``emqp-cli`` (no worker takes it: the tool
    gives up waiting and exits 1, the broker keeps the request)."""
    endpoint = product.status()["services"]["emqp"]["endpoints"]["client"]
    return subprocess.Popen(
        [BIN / "emqp-cli", "submit", "--broker", endpoint, "--guarantee", "--no-reply",
         "--wait", "1", queue, "1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=environment(),
    )  # fmt: skip


def submitted(client: subprocess.Popen[str]) -> None:
    output, _ = client.communicate(timeout=120)
    assert client.returncode == 1, output  # no worker: it gave up waiting


def depth(product: Product, queue: str) -> int:
    found = product.status()["services"]["emqp"]["queues"].get(queue)
    return int(found["depth"]) if found else 0


def alerts(product: Product) -> list[dict[str, Any]]:
    answer = json.loads(product.get("/api/v1/alerts"))
    assert answer["status"] == "success"
    return list(answer["data"]["alerts"])


def row(driver: Any, alert: str) -> dict[str, Any] | None:
    """The alert's row on the page: its state and cells (empty when none; None when the
    page redrew the table while it was read)."""
    from selenium.common.exceptions import StaleElementReferenceException

    try:
        found = driver.find_elements("css selector", f'#alerts-rows tr[data-alert="{alert}"]')
        if not found:
            return {}
        cells = [cell.text for cell in found[0].find_elements("css selector", "td")]
        return {"state": found[0].get_attribute("data-state"), "cells": cells}
    except StaleElementReferenceException:  # redrawn meanwhile
        return None


def card_classes(driver: Any, service: str) -> set[str] | None:
    """The service card's classes (None when the page, which makes its cards anew at each
    state frame, redrew it while it was read: asked within :func:`wait`, never once)."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException

    try:
        card = driver.find_element("css selector", f"#card-{service}")
        return set((card.get_attribute("class") or "").split())
    except (NoSuchElementException, StaleElementReferenceException):
        return None


def card_shows(driver: Any, service: str, alert: str, shown: bool = True) -> bool:
    """The card of ``service`` read whole, framed (``alert-firing``...) as ``shown`` says."""
    classes = card_classes(driver, service)
    return classes is not None and (alert in classes) == shown


def test_a_queue_without_a_worker_is_pending_then_firing_in_the_console(
    tmp_path: Path, page: Any
) -> None:
    # Long enough a `for` that the pending state is seen, short enough for a test.
    # (The page's state comes once a second: 20 s of pending is seen on a busy machine.)
    product = start(tmp_path, "--http-alert-for", "EmqpQueueWithoutWorkers=20s")
    worker = None
    try:
        page.get(f"http://127.0.0.1:{product.http_port}/")
        wait(page, lambda d: d.find_element("id", "alerts-count").text != "")
        assert row(page, "EmqpQueueWithoutWorkers") == {}

        client = submit(product, "orphans")
        pending = wait(page, lambda d: row(d, "EmqpQueueWithoutWorkers"), 60)
        submitted(client)
        assert pending["state"] == "pending", pending
        state, name, severity, service, summary, since = pending["cells"]
        assert (state, name, severity, service) == (
            "pending",
            "EmqpQueueWithoutWorkers",
            "warning",
            "emqp",
        )
        assert summary == (
            f"eMQP on 127.0.0.1:{product.http_port}: queue orphans has waited 15 minutes for a "
            "worker"
        )
        wait(page, lambda d: card_shows(d, "emqp", "alert-pending"))

        firing = wait(
            page,
            lambda d: (r := row(d, "EmqpQueueWithoutWorkers") or {}).get("state") == "firing" and r,
            90,
        )
        # Since when it began: kept from pending to firing (the clock time, before "(… ago)").
        assert firing["cells"][5].split(" (")[0] == since.split(" (")[0]
        wait(page, lambda d: card_shows(d, "emqp", "alert-firing"))
        # The card's alert line (read again when the page redrew the card meanwhile).
        wait(page, lambda d: any(
            line.text.startswith("EmqpQueueWithoutWorkers firing since")
            for line in d.find_elements("css selector", "#card-emqp .line.alert.alarm")
        ))  # fmt: skip

        [served] = [
            a for a in alerts(product) if a["labels"]["alertname"] == "EmqpQueueWithoutWorkers"
        ]
        assert served["state"] == "firing"
        assert served["labels"]["queue"] == "orphans" and served["value"] == "1e+00"
        assert served["annotations"]["description"].startswith("1 requests wait")

        endpoint = product.status()["services"]["emqp"]["endpoints"]["worker"]
        log = open(tmp_path / "worker.log", "ab")
        worker = subprocess.Popen(
            [BIN / "emqp-worker", "--broker", endpoint, "--queues", "10:orphans", "--slots", "1"],
            stdout=log, stderr=subprocess.STDOUT, env=environment(), start_new_session=True,
        )  # fmt: skip
        log.close()
        # A worker serves the queue: the condition ends, and the alert with it.
        wait(page, lambda d: row(d, "EmqpQueueWithoutWorkers") == {}, 60)
        wait(page, lambda d: card_shows(d, "emqp", "alert-firing", shown=False))
    finally:
        if worker is not None:
            os.killpg(worker.pid, signal.SIGTERM)
            worker.wait(timeout=30)
        code = product.stop()
        assert code in CLEAN_EXIT, product.output()


def test_the_product_and_a_real_prometheus_fire_the_same_alerts(tmp_path: Path) -> None:
    from tests.test_prometheus import Prometheus, binary, quick_rules

    binary("prometheus")
    product = start(tmp_path, "--http-alert-for", "*=1s")
    prometheus = None
    try:
        target = f"127.0.0.1:{product.http_port}"
        prometheus = Prometheus(tmp_path / "prometheus", {"bus": [target]}, [quick_rules(tmp_path)])
        wait_for(prometheus.ready, what="prometheus")
        wait_for(lambda: prometheus.targets_up(1), what="scraped")

        def firing(found: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
            return sorted(
                (sorted(a["labels"].items()), sorted(a["annotations"].items()))
                for a in found
                if a["state"] == "firing"
            )

        def theirs() -> list[tuple[Any, ...]]:
            return firing(prometheus.api("alerts")["alerts"])

        def ours() -> list[tuple[Any, ...]]:
            return firing(alerts(product))

        submitted(submit(product, "orphans"))
        wait_for(
            lambda: len(prometheus.firing("EmqpQueueWithoutWorkers")) == 1,
            timeout=90,
            what="Prometheus firing EmqpQueueWithoutWorkers",
        )
        submitted(submit(product, "orphans"))  # the queue grows: deriv(depth[5m]) > 0
        wait_for(
            lambda: len(prometheus.firing("EmqpQueueGrowingWithoutWorkers")) == 1,
            timeout=90,
            what="Prometheus firing EmqpQueueGrowingWithoutWorkers",
        )
        # Both evaluate every second over their own samples: they agree once both have
        # seen the same state (no assumption on which sees it first).
        agreed = wait_for(
            lambda: (mine := ours()) == theirs() and mine, timeout=90, what="the same alerts"
        )
        names = {dict(labels)["alertname"] for labels, _ in agreed}
        assert {"EmqpQueueWithoutWorkers", "EmqpQueueGrowingWithoutWorkers"} <= names, agreed
    finally:
        if prometheus is not None:
            prometheus.stop()
        code = product.stop()
        assert code in CLEAN_EXIT, product.output()
