"""The console's actions in a real browser (Chromium, headless, under selenium) against
``twistd -n eventbus`` with a token: eMQP's buttons pause, resume and purge a queue,
remove a schedule and forget a worker; and a page of another origin, which even knows the
token, cannot act (its fetch dies at the preflight the port does not answer, its form
POST carries no token), counted at the port."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tests.processes import CLEAN_EXIT, wait_for
from tests.test_console_browser import (  # noqa: F401 (fixtures)
    BIN,
    FREE_PORTS,
    browser,
    card_state,
    page,
    row_cells,
    wait,
)
from tests.test_product_process import Product, environment

TOKEN = "console-act-secret"


@pytest.fixture(scope="module")
def product(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Product]:
    workdir = tmp_path_factory.mktemp("actions")
    (workdir / "token").write_text(TOKEN + "\n")
    running = Product(
        workdir, *FREE_PORTS, "--services", "eventbus,emqp", "--data-dir", str(workdir / "bus"),
        "--http-token-file", str(workdir / "token"),
    )  # fmt: skip
    try:
        wait_for(lambda: authorized_status(running) is not None, what="the product started")
        yield running
    finally:
        code = running.stop()
        assert code in CLEAN_EXIT, running.output()


def authorized_status(product: Product) -> dict[str, Any] | None:
    assert product.process.poll() is None, product.output()
    request = urllib.request.Request(
        f"http://127.0.0.1:{product.http_port}/status",
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return dict(json.loads(response.read()))
    except OSError:
        return None


def status_of(product: Product) -> dict[str, Any]:
    status = authorized_status(product)
    assert status is not None
    return status


def open_console(product: Product, driver: Any) -> None:
    driver.get(f"http://127.0.0.1:{product.http_port}/")
    driver.execute_script(f"sessionStorage.setItem('bus-console-token', '{TOKEN}')")
    driver.get(f"http://127.0.0.1:{product.http_port}/")
    wait(driver, lambda d: card_state(d, "emqp") == "up", 30)


def click(driver: Any, selector: str, text: str | None = None) -> None:
    """Click the button ``selector`` finds (once it says ``text``), found anew each time:
    the tables are redrawn every second."""
    from selenium.common.exceptions import (
        ElementNotInteractableException,
        NoSuchElementException,
        StaleElementReferenceException,
    )

    def clicked(d: Any) -> bool:
        try:
            button = d.find_element("css selector", selector)
            if text is not None and button.text != text:
                return False
            button.click()
            return True
        except (
            NoSuchElementException,
            StaleElementReferenceException,
            ElementNotInteractableException,
        ):
            return False

    wait(driver, clicked, 30)


def result_line(driver: Any) -> str:
    return str(driver.find_element("id", "action-result").text)


def test_the_emqp_buttons_act(product: Product, page: Any) -> None:  # noqa: F811
    open_console(product, page)
    endpoints = status_of(product)["services"]["emqp"]["endpoints"]
    log = open(product.log_path.parent / "worker.log", "ab")
    worker = subprocess.Popen(
        [BIN / "emqp-worker", "--broker", endpoints["worker"], "--queues", "10:acts",
         "--slots", "1"],
        stdout=log, stderr=subprocess.STDOUT, env=environment(), start_new_session=True,
    )  # fmt: skip
    try:
        queue = '#emqp-queues tr[data-queue="acts"]'
        wait(page, lambda d: row_cells(d, queue)[:3] == ["acts", "0", "1"], 30)
        click(page, f'{queue} button[data-action="pause"]')
        wait(page, lambda d: row_cells(d, queue)[:1] == ["acts (paused)"])
        assert status_of(product)["services"]["emqp"]["paused_queues"] == ["acts"]
        assert '"paused":true' in result_line(page)
        click(page, f'{queue} button[data-action="resume"]')
        wait(page, lambda d: row_cells(d, queue)[:1] == ["acts"])
        assert status_of(product)["services"]["emqp"]["paused_queues"] == []
        # A purge asks to be clicked again.
        click(page, f'{queue} button[data-action="purge"]', "purge")
        assert "purged" not in result_line(page)
        click(page, f'{queue} button[data-action="purge"]', "confirm purge")
        wait(page, lambda d: '"purged":0' in result_line(d))
        # The worker: forgotten (told KBYE, it connects again as a new one).
        name = status_of(product)["services"]["emqp"]["workers"][0]["id"]
        row = f'#emqp-workers tr[data-worker="{name}"]'
        click(page, f'{row} button[data-action="forget-worker"]', "forget")
        click(page, f'{row} button[data-action="forget-worker"]', "confirm forget")
        wait(page, lambda d: '"forgotten":true' in result_line(d))
        counters = status_of(product)["services"]["emqp"]["counters"]
        assert counters["workers_forgotten"] == 1
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(timeout=30)
        log.close()
    # A schedule, removed by its button.
    done = subprocess.run(
        [BIN / "emqp-cli", "schedule", "acts", '"nightly"', "--every", "1d", "--no-haste",
         "--admin", endpoints["admin"]],
        capture_output=True, text=True, env=environment(), timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    schedule = json.loads(done.stdout)["schedule"]
    row = f'#emqp-schedules tr[data-schedule="{schedule}"]'
    click(page, f'{row} button[data-action="remove-schedule"]', "remove")
    click(page, f'{row} button[data-action="remove-schedule"]', "confirm remove")
    wait(page, lambda d: not d.find_elements("css selector", row))
    assert status_of(product)["services"]["emqp"]["schedules_count"] == 0
    actions = status_of(product)["services"]["http"]["actions"]
    assert actions["counts"] == {"done": 5}
    assert [a["action"] for a in actions["recent"]] == [
        "pause", "resume", "purge", "forget-worker", "remove-schedule",
    ]  # fmt: skip


#: A page of another origin that knows the token and tries every way to act.
ATTACK = """<!doctype html><html><body>
<iframe name="sink" id="sink"></iframe>
<form id="form" method="POST" target="sink" enctype="text/plain"
      action="{url}/api/v1/actions/emqp/pause">
  <input name='{{"queue": "evil", "x": "' value='"}}'>
</form>
<pre id="out"></pre>
<script>
const out = document.getElementById("out");
const url = "{url}/api/v1/actions/emqp/pause";
const body = JSON.stringify({{queue: "evil"}});
const said = (what) => out.textContent += what + "\\n";
fetch(url, {{method: "POST", body, headers: {{"Content-Type": "application/json",
                                             "Authorization": "Bearer {token}"}}}})
  .then((r) => said("fetch-json " + r.status), (e) => said("fetch-json blocked"))
  .then(() => fetch(url, {{method: "POST", mode: "no-cors", body,
                          headers: {{"Content-Type": "text/plain"}}}}))
  .then((r) => said("fetch-simple " + r.type), (e) => said("fetch-simple blocked"))
  .then(() => {{ document.getElementById("sink").onload = () => said("form sent");
                document.getElementById("form").submit(); }});
</script></body></html>"""


def test_a_page_of_another_origin_cannot_act(product: Product, page: Any) -> None:  # noqa: F811
    url = f"http://127.0.0.1:{product.http_port}"
    html = ATTACK.format(url=url, token=TOKEN).encode()

    class Attacker(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(html)))
            self.end_headers()
            self.wfile.write(html)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Attacker)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        before = status_of(product)["services"]["http"]["refused_at_headers"]
        page.get(f"http://127.0.0.1:{server.server_address[1]}/")
        wait(page, lambda d: "form sent" in d.find_element("id", "out").text, 30)
        said = page.find_element("id", "out").text.splitlines()
        # The JSON fetch with the token needs a preflight: OPTIONS, refused (405) at its
        # headers, so the browser never sends the POST. The simple fetch and the form go
        # out without the token: refused (401) before their bodies are read.
        assert said[0] == "fetch-json blocked"
        after = status_of(product)["services"]["http"]["refused_at_headers"]
        assert after.get("method", 0) - before.get("method", 0) >= 1
        assert after.get("action-token", 0) - before.get("action-token", 0) == 2
        emqp = status_of(product)["services"]["emqp"]
        assert emqp["paused_queues"] == [] and "evil" not in emqp["queues"]
    finally:
        server.shutdown()
        server.server_close()
