"""The operator's console in a real browser (Debian's Chromium, headless, under selenium),
against the product as operators run it: ``twistd -n eventbus``, and the same composition
from a tac file for a service that stops while the console watches."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser import chromium, save_failure
from tests.ports import free_port
from tests.processes import CLEAN_EXIT, ROOT, TWISTD, wait_for
from tests.test_product_process import Product, environment

BIN = Path(sys.executable).parent
FREE_PORTS = (
    "--port", "0", "--emqp-worker-port", "0", "--emqp-client-port", "0",
    "--emqp-admin-port", "0",
)  # fmt: skip


def answers(url: str, process: subprocess.Popen[bytes]) -> bool:
    assert process.poll() is None, f"exited with {process.returncode}"
    try:
        with urllib.request.urlopen(url, timeout=5):
            return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    driver = chromium()
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def page(browser: Any, request: pytest.FixtureRequest) -> Iterator[Any]:
    """The browser, its page saved under test-artifacts/ when the test failed."""
    yield browser
    report = getattr(request.node, "report_call", None)
    if report is None or report.failed:
        print(f"page saved: {save_failure(browser, request.node.name)}")


@pytest.fixture(scope="module")
def product(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Product]:
    workdir = tmp_path_factory.mktemp("console")
    running = Product(workdir, *FREE_PORTS, "--data-dir", str(workdir / "bus"))
    try:
        wait_for(running.ready, what="the product started")
        yield running
    finally:
        code = running.stop()
        assert code in CLEAN_EXIT, running.output()


def card_state(driver: Any, service: str) -> str:
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException

    try:
        return str(driver.find_element("css selector", f"#card-{service} .state").text)
    except (NoSuchElementException, StaleElementReferenceException):
        return ""


def row_cells(driver: Any, selector: str) -> list[str]:
    """The cells of the first row ``selector`` finds (none: an empty list); the page
    redraws its tables every second, so a row is read in one go."""
    from selenium.common.exceptions import StaleElementReferenceException

    try:
        rows = driver.find_elements("css selector", selector)
        return [cell.text for cell in rows[0].find_elements("css selector", "td")] if rows else []
    except StaleElementReferenceException:  # redrawn meanwhile
        return []


def wait(driver: Any, check: Callable[[Any], Any], timeout: float = 15) -> Any:
    """``check(driver)`` until it is truthy; an element it read that the page redrew
    meanwhile (the console redraws as news comes) is read again."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    ignored = (NoSuchElementException, StaleElementReferenceException)
    return WebDriverWait(driver, timeout, 0.05, ignored).until(check)


def click(driver: Any, selector: str) -> None:
    """Click the element ``selector`` finds, found again if the page redrew it first."""
    wait(driver, lambda d: d.find_element("css selector", selector).click() or True)


def test_the_console_shows_every_composed_service_live(product: Product, page: Any) -> None:
    page.get(f"http://127.0.0.1:{product.http_port}/")
    services = ("eventbus", "emqp", "mc0", "dbp", "zre", "http")
    wait(page, lambda d: all(card_state(d, name) == "up" for name in services))
    assert page.find_element("id", "link").text == "live"
    # The charts draw from rates the stream brings each second.
    wait(page, lambda d: d.find_elements("css selector", "#card-eventbus svg.spark polyline"))
    sequence = page.find_element("id", "eventbus-facts").text
    assert "sequence" in sequence and "clients on collector" in sequence
    assert "no worker connected" in page.find_element("id", "emqp-workers").text
    assert "the catalog is empty" in page.find_element("id", "dbp-catalog").text


def test_a_publish_appears_in_the_live_tail(product: Product, page: Any) -> None:
    page.get(f"http://127.0.0.1:{product.http_port}/")
    wait(page, lambda d: card_state(d, "eventbus") == "up")
    topic = page.find_element("id", "tail-topic")
    topic.clear()
    topic.send_keys("/console/orders/")
    page.find_element("id", "tail-start").click()
    wait(page, lambda d: "tailing /console/orders/" in d.find_element("id", "tail-state").text)
    address = product.status()["services"]["eventbus"]["endpoints"]["snapshot"]
    server = address.removeprefix("tcp://")
    for topic_name, value in (("/console/other/", {"n": 0}), ("/console/orders/42/", {"n": 1})):
        published = subprocess.run(
            [BIN / "eventbus-cli", "publish", "--server", server, topic_name, json.dumps(value)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert published.returncode == 0, published.stderr
    row = wait(page, lambda d: d.find_elements("css selector", "#tail-rows tr[data-seq]"))
    cells = [cell.text for cell in row[0].find_elements("css selector", "td")]
    assert cells[1] == "/console/orders/42/"  # the other subtree is not tailed
    assert json.loads(cells[4]) == {"n": 1}
    assert len(page.find_elements("css selector", "#tail-rows tr[data-seq]")) == 1
    # The topic browser offers the subtrees shown: one click widens the tail to a parent.
    chip = '#tail-topics button[data-subtree="/console/"]'
    wait(page, lambda d: d.find_elements("css selector", chip))
    subtrees = wait(
        page,
        lambda d: {
            b.get_attribute("data-subtree")
            for b in d.find_elements("css selector", "#tail-topics button")
        },
    )
    assert subtrees == {"/console/", "/console/orders/", "/console/orders/42/"}
    click(page, chip)
    wait(page, lambda d: d.find_element("id", "tail-state").text == "tailing /console/")
    page.find_element("id", "tail-stop").click()


def test_a_worker_joining_appears_in_the_emqp_view(product: Product, page: Any) -> None:
    page.get(f"http://127.0.0.1:{product.http_port}/")
    wait(page, lambda d: card_state(d, "emqp") == "up")
    # Where its guaranteed requests are kept (here the SQLite file; docs/cluster.md).
    wait(page, lambda d: "store sqlite" in d.find_element("id", "emqp-facts").text)
    endpoint = product.status()["services"]["emqp"]["endpoints"]["worker"]
    log = open(product.log_path.parent / "worker.log", "ab")
    worker = subprocess.Popen(
        [BIN / "emqp-worker", "--broker", endpoint, "--queues", "10:console", "--slots", "3"],
        stdout=log, stderr=subprocess.STDOUT, env=environment(), start_new_session=True,
    )  # fmt: skip
    try:
        # Its row, then its three slots (its READYs follow its INFORM).
        workers = "#emqp-workers tr[data-worker]"
        wait(page, lambda d: row_cells(d, workers)[1:3] == ["console", "3"])
        queue = '#emqp-queues tr[data-queue="console"]'
        wait(page, lambda d: row_cells(d, queue)[:3] == ["console", "0", "1"])  # one worker
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(timeout=30)
        log.close()
    # Gone from the view when the broker lets it go (a worker's DISCONNECT on SIGTERM).
    wait(page, lambda d: not d.find_elements("css selector", "#emqp-workers tr[data-worker]"), 30)


def test_a_stopped_service_shows_as_down(tmp_path: Path, page: Any) -> None:
    http = free_port()
    env = environment(
        EVENTBUS_PORT="0", EVENTBUS_DATA_DIR=str(tmp_path / "bus"), EVENTBUS_HTTP_PORT=str(http),
        EMQP_WORKER_PORT="0", EMQP_CLIENT_PORT="0", EMQP_ADMIN_PORT="0",
        EMQP_DATA_DIR=str(tmp_path / "emqp"), STOP_ON_USR1="dbp",
    )  # fmt: skip
    log = open(tmp_path / "twistd.log", "ab")
    command = [TWISTD, "-n", "--pidfile=", "-y", str(ROOT / "tests" / "console_stoppable.tac")]
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp_path)
    try:
        wait_for(lambda: answers(f"http://127.0.0.1:{http}/status", process), what="the HTTP port")
        page.get(f"http://127.0.0.1:{http}/")
        wait(page, lambda d: card_state(d, "dbp") == "up")
        process.send_signal(signal.SIGUSR1)
        wait(page, lambda d: card_state(d, "dbp") == "down")
        # Cards are made anew each state frame: read within wait(), never once (a read
        # across a redraw is stale).
        wait(page, lambda d: "down since" in d.find_element("id", "card-dbp").text)
        wait(page, lambda d: card_state(d, "eventbus") == "up")  # the others go on
    finally:
        process.terminate()
        code = process.wait(timeout=30)
        log.close()
    assert code in CLEAN_EXIT, (tmp_path / "twistd.log").read_text()


def test_the_console_asks_for_the_token_when_the_server_wants_one(
    tmp_path: Path, page: Any
) -> None:
    token = tmp_path / "token"
    token.write_text("console-secret\n")
    running = Product(
        tmp_path, "--services", "eventbus", "--port", "0", "--data-dir", str(tmp_path / "bus"),
        "--http-token-file", str(token),
    )  # fmt: skip
    url = f"http://127.0.0.1:{running.http_port}"
    try:

        def started() -> bool:
            assert running.process.poll() is None, running.output()
            request = urllib.request.Request(
                f"{url}/status", headers={"Authorization": "Bearer console-secret"}
            )
            try:
                with urllib.request.urlopen(request, timeout=5):
                    return True
            except OSError:
                return False

        wait_for(started, what="the product started")
        page.get(f"{url}/")
        wait(page, lambda d: d.find_element("id", "token-form").is_displayed())
        assert not page.find_element("id", "console").is_displayed()
        field = page.find_element("id", "token")
        field.send_keys("wrong")
        field.submit()
        wait(page, lambda d: "refused" in d.find_element("id", "token-error").text)
        field.clear()
        field.send_keys("console-secret")
        field.submit()
        wait(page, lambda d: card_state(d, "eventbus") == "up")
        page.refresh()  # kept for the tab: no question again
        wait(page, lambda d: card_state(d, "eventbus") == "up")
        assert not page.find_element("id", "token-form").is_displayed()
        request = urllib.request.Request(
            f"{url}/status", headers={"Authorization": "Bearer console-secret"}
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            refused = json.loads(response.read())["services"]["http"]["refused"]
        assert refused.get("wrong-token", 0) >= 1 and refused.get("no-token", 0) >= 1
    finally:
        page.execute_script("sessionStorage.clear()")
        code = running.stop()
    assert code in CLEAN_EXIT, running.output()


def test_a_schedule_shows_what_it_runs(product: Product, page: Any) -> None:
    page.get(f"http://127.0.0.1:{product.http_port}/")
    wait(page, lambda d: card_state(d, "emqp") == "up")
    admin = product.status()["services"]["emqp"]["endpoints"]["admin"]
    ids = []
    for body in (
        '["run", {"path": "app.jobs", "callable": "cleanup", "args": [1]}]',
        '["report", {"to": "ops@example.org"}]',
    ):
        made = subprocess.run(
            [BIN / "emqp-cli", "schedule", "console", body, "--every", "1d", "--no-haste",
             "--admin", admin],
            capture_output=True, text=True, env=environment(), timeout=60,
        )  # fmt: skip
        assert made.returncode == 0, made.stderr
        ids.append(json.loads(made.stdout)["schedule"])
    try:
        eventmq = f'#emqp-schedules tr[data-schedule="{ids[0]}"]'
        wait(page, lambda d: row_cells(d, eventmq)[1:3] == ["app.jobs cleanup", "console"])
        other = f'#emqp-schedules tr[data-schedule="{ids[1]}"]'
        # (A slice: the row may not be drawn yet.)
        wait(page, lambda d: row_cells(d, other)[1:2] == ['["report", {"to": "ops@example.org"}]'])
    finally:
        for schedule in ids:
            subprocess.run(
                [BIN / "emqp-cli", "unschedule", schedule, "--admin", admin],
                capture_output=True, env=environment(), timeout=60,
            )  # fmt: skip


def test_the_emqp_view_says_its_store_is_a_jetstream_stream(
    tmp_path: Path, page: Any, nats_server: Any
) -> None:
    http = free_port()
    env = environment(
        EVENTBUS_PORT="0", EVENTBUS_DATA_DIR=str(tmp_path / "bus"), EVENTBUS_HTTP_PORT=str(http),
        EMQP_WORKER_PORT="0", EMQP_CLIENT_PORT="0", EMQP_ADMIN_PORT="0",
        EMQP_DATA_DIR=str(tmp_path / "emqp"), EMQP_STORE="jetstream",
        EMQP_NATS=nats_server.urls[0],
    )  # fmt: skip
    log = open(tmp_path / "twistd.log", "ab")
    command = [TWISTD, "-n", "--pidfile=", "eventbus", "--services", "eventbus,emqp"]
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp_path)
    try:
        wait_for(lambda: answers(f"http://127.0.0.1:{http}/status", process), what="the HTTP port")
        page.get(f"http://127.0.0.1:{http}/")
        wait(page, lambda d: card_state(d, "emqp") == "up")
        port = nats_server.urls[0].rsplit(":", 1)[1]
        wait(page, lambda d: "store jetstream EMQP (R1)" in d.find_element("id", "emqp-facts").text)
        assert f":{port}" in page.find_element("id", "emqp-facts").text  # the server it uses
    finally:
        process.terminate()
        code = process.wait(timeout=30)
        log.close()
    assert code in CLEAN_EXIT, (tmp_path / "twistd.log").read_text()


def table(driver: Any, body: str) -> list[dict[str, Any]]:
    """Every row of the table body ``#body`` in one read (the page redraws them each
    second): its ``data-`` attributes, its class and its cells' text."""
    found = driver.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map((r) => "
        "({data: {...r.dataset}, cls: r.className, cells: [...r.cells].map((c) => c.textContent)}))",
        f"#{body} tr",
    )
    return list(found)


def card_lines(driver: Any, service: str) -> list[tuple[str, str]]:
    """The lines of a service's card with their class (``alarm``: red; ``caution``: amber)."""
    lines = driver.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map((l) => [l.className, l.textContent])",
        f"#card-{service} .line",
    )
    return [(str(cls), str(text)) for cls, text in lines]


def cluster_whole(service: str, urls: list[str], streams: list[str]) -> Callable[[Any], bool]:
    """Whether a service's section shows every server connected and each of ``streams``
    with a leader and two current replicas."""

    def check(driver: Any) -> bool:
        servers = {
            r["data"].get("server"): r["cells"][1] for r in table(driver, f"{service}-servers")
        }
        replicas = [r for r in table(driver, f"{service}-streams") if r["data"].get("replica")]
        return servers == dict.fromkeys(urls, "connected") and all(
            [r["cells"][3] for r in replicas if r["data"]["stream"] == name] == ["yes", "yes"]
            for name in streams
        )

    return check


def row_of(driver: Any, body: str, **data: str) -> dict[str, Any]:
    """The row of ``#body`` whose ``data-`` attributes include ``data`` (empty: none)."""
    rows = [r for r in table(driver, body) if data.items() <= r["data"].items()]
    return rows[0] if rows else {"data": {}, "cls": None, "cells": []}


def test_the_cluster_seen_by_the_event_bus_and_emqp_changes_as_nats_servers_die(
    tmp_path: Path, page: Any
) -> None:
    """Three nats-servers, an Event BUS front-end and an eMQP broker on them (R3), a worker:
    each service's section lists the servers connected, each stream's leader and its two
    current replicas, its consumers (eMQP: the queue's, with its leader); a follower
    killed is unreachable, its replicas not current (amber, on the cards too); a second
    killed leaves the streams without a leader (red), as the shipped alerts have it."""
    from tests.ports import nats_cluster

    pytest.importorskip("nats")
    cluster = nats_cluster(tmp_path / "nats", size=3)
    cluster.start()
    urls = ",".join(cluster.urls)
    running = Product(
        tmp_path, "--services", "eventbus,emqp", "--port", "0", "--data-dir", str(tmp_path / "bus"),
        "--store", "jetstream", "--nats", urls, "--nats-replicas", "3", "--stats-interval", "0.5s",
        "--emqp-worker-port", "0", "--emqp-client-port", "0", "--emqp-admin-port", "0",
        "--emqp-data-dir", str(tmp_path / "emqp"), "--emqp-store", "jetstream", "--emqp-nats", urls,
        "--emqp-nats-replicas", "3", "--emqp-stats-interval", "0.5s",
    )  # fmt: skip
    names = {node.name for node in cluster.nodes}
    worker = None
    log = open(tmp_path / "worker.log", "ab")
    try:
        wait_for(running.ready, timeout=120, what="the front-end and the broker started")
        endpoint = running.status()["services"]["emqp"]["endpoints"]["worker"]
        worker = subprocess.Popen(
            [BIN / "emqp-worker", "--broker", endpoint, "--queues", "10:seen", "--slots", "1"],
            stdout=log, stderr=subprocess.STDOUT, env=environment(), start_new_session=True,
        )  # fmt: skip
        page.get(f"http://127.0.0.1:{running.http_port}/")
        wait(page, cluster_whole("eventbus", cluster.urls, ["EVENTBUS"]), 60)
        wait(page, cluster_whole("emqp", cluster.urls, ["EMQP", "KV_EMQP_SCHEDULES"]), 60)
        leader = row_of(page, "eventbus-streams", stream="EVENTBUS")["cells"][1]
        assert leader in names

        # The queue's consumer, shared by every broker, with a leader of its own.
        def consumer_led(driver: Any) -> bool:
            return row_of(driver, "emqp-consumers", consumer="q_seen")["cells"][3:4] in [
                [name] for name in names
            ]

        wait(page, consumer_led, 60)
        assert row_of(page, "emqp-consumers", consumer="q_seen")["cells"][1:3] == [
            "queue seen",
            "EMQP",
        ]
        assert not [line for line in card_lines(page, "eventbus") if line[0] != "line"]

        follower = next(node for node in cluster.nodes if node.name != leader)
        cluster.kill(follower, signal.SIGKILL)
        for service in ("eventbus", "emqp"):
            wait(page, lambda d, s=service: row_of(d, f"{s}-servers", server=follower.url)["cells"][1:2]
                 == ["unreachable"], 60)  # fmt: skip
            assert row_of(page, f"{service}-servers", server=follower.url)["cls"] == "warn"
        wait(page, lambda d: row_of(d, "eventbus-streams", stream="EVENTBUS", replica=follower.name)
             ["cells"][3:4] == ["no"], 60)  # fmt: skip
        assert row_of(page, "eventbus-streams", replica=follower.name)["cls"] == "warn"
        # eMQP's stream too (its replica there, or its leader elected anew elsewhere).
        wait(page, lambda d: row_of(d, "emqp-streams", stream="EMQP", replica=follower.name)
             ["cells"][3:4] == ["no"], 90)  # fmt: skip
        caution = ("line caution", f"stream EVENTBUS: replica {follower.name} not current")
        wait(page, lambda d: caution in card_lines(d, "eventbus"), 30)
        assert ("line caution", f"NATS server {follower.url} unreachable") in card_lines(
            page, "emqp"
        )

        # A second: no quorum, no leader (red on the cards and in the sections).
        second = next(n for n in cluster.nodes if n is not follower and n.name != leader)
        cluster.kill(second, signal.SIGKILL)
        for service, stream in (("eventbus", "EVENTBUS"), ("emqp", "EMQP")):
            wait(page, lambda d, s=service, n=stream: any(
                cls == "line alarm" and text.startswith(f"stream {n}: no leader")
                for cls, text in card_lines(d, s)), 90)  # fmt: skip
            assert row_of(page, f"{service}-streams", stream=stream)["cls"] == "bad"
    finally:
        if worker is not None:
            os.killpg(worker.pid, signal.SIGTERM)
            worker.wait(timeout=30)
        log.close()
        code = running.stop()
        cluster.stop()
    assert code in CLEAN_EXIT, running.output()


def test_the_links_of_mc0_emqp_pubsub_and_dbp_to_their_nats_cluster_show_and_fail(
    tmp_path: Path, page: Any
) -> None:
    """mc0, eMQP's PUBLISH service and the DBP catalog on one nats-server (issue 47): each
    view says its link is up through that server and lists it connected (DBP: its bucket's
    stream too, and its view current); the server killed, each card says so in red (the
    brokers' links down, the catalog's view not current) and each view lists it
    unreachable."""
    from tests.ports import nats_cluster

    pytest.importorskip("nats")
    cluster = nats_cluster(tmp_path / "nats", size=1)
    cluster.start()
    url = cluster.urls[0]
    running = Product(
        tmp_path, "--services", "mc0,dbp,emqp-pubsub", "--mc0-nats", url,
        "--mc0-data-dir", str(tmp_path / "mc0"), "--mc0-nats-without-tls", "--dbp-nats", url, "--dbp-beacon-port", "0",
        "--dbp-data-dir", str(tmp_path / "dbp"), "--emqp-pubsub-nats", url,
        "--emqp-pubsub-incoming-port", "0", "--emqp-pubsub-outgoing-port", "0",
    )  # fmt: skip
    shown = url.removeprefix("nats://")
    try:
        wait_for(running.ready, timeout=120, what="mc0, the catalog and the PUBLISH service")
        page.get(f"http://127.0.0.1:{running.http_port}/")
        for service in ("mc0", "emqp-pubsub", "dbp"):
            wait(page, lambda d, s=service: [r["cells"][1] for r in table(d, f"{s}-servers")]
                 == ["connected"], 60)  # fmt: skip
            assert row_of(page, f"{service}-servers", server=url)["cells"][1] == "connected"
            assert not [line for line in card_lines(page, service) if line[0] != "line"]
        for service in ("mc0", "emqp-pubsub"):
            facts_text = page.find_element("id", f"{service}-facts").text
            assert "NATS link up via" in facts_text and shown in facts_text, facts_text
            # Core NATS subjects: no stream to show.
            assert not page.find_elements("id", f"{service}-streams")
        wait(page, lambda d: "shared catalog KV_DBP_CATALOG, current"
             in d.find_element("id", "dbp-facts").text, 60)  # fmt: skip
        assert row_of(page, "dbp-streams", stream="KV_DBP_CATALOG")["cells"][:1] == [
            "KV_DBP_CATALOG"
        ]

        cluster.kill(cluster.nodes[0], signal.SIGKILL)
        down = ("line alarm", "NATS link down: the other brokers are not reached")
        for service in ("mc0", "emqp-pubsub"):
            wait(page, lambda d, s=service: down in card_lines(d, s), 60)
            wait(page, lambda d, s=service: "NATS link down" in d.find_element(
                "id", f"{s}-facts").text, 30)  # fmt: skip
        stale = ("line alarm", "shared catalog: this instance's view is not current")
        wait(page, lambda d: stale in card_lines(d, "dbp"), 60)
        for service in ("mc0", "emqp-pubsub", "dbp"):
            wait(page, lambda d, s=service: row_of(d, f"{s}-servers", server=url)["cells"][1:2]
                 == ["unreachable"], 60)  # fmt: skip
            assert ("line caution", f"NATS server {url} unreachable") in card_lines(page, service)
    finally:
        code = running.stop()
        cluster.stop()
    assert code in CLEAN_EXIT, running.output()
