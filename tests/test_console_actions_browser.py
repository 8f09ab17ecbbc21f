"""The console's actions in a real browser (Chromium, headless, under selenium) against
``twistd -n eventbus`` with a token: eMQP's buttons pause, resume and purge a queue,
remove a schedule and forget a worker; and a page of another origin, which even knows the
token, cannot act (its fetch dies at the preflight the port does not answer, its form
POST carries no token), counted at the port."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
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


def open_console(product: Product, driver: Any, service: str = "emqp") -> None:
    driver.get(f"http://127.0.0.1:{product.http_port}/")
    driver.execute_script(f"sessionStorage.setItem('bus-console-token', '{TOKEN}')")
    driver.get(f"http://127.0.0.1:{product.http_port}/")
    wait(driver, lambda d: card_state(d, service) == "up", 30)


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


def test_a_stuck_snapshot_client_is_dropped_and_its_key_refused_from_the_page(
    tmp_path: Path,
    page: Any,  # noqa: F811
) -> None:
    import zmq

    from bus.eventbus.codec import SEQUENCE
    from bus.transport.certs import REFUSED_DIR
    from tests.curve_helpers import Keys
    from tests.eventbus_helpers import pub

    keys = Keys(tmp_path / "keys")
    publisher_key, leaked = keys.client("publisher"), keys.client("leaked")
    (tmp_path / "token").write_text(TOKEN + "\n")
    running = Product(
        tmp_path, "--services", "eventbus", "--port", "0", "--data-dir", str(tmp_path / "bus"),
        "--http-token-file", str(tmp_path / "token"), "--server-cert", str(keys.server_cert),
        "--client-certs", str(keys.allowed), "--snapshot-hwm", "5",
        "--snapshot-stall-timeout", "10m",
    )  # fmt: skip
    context = zmq.Context()
    sockets = []

    def dealer(pair: Any, endpoint: str) -> Any:
        sock = context.socket(zmq.DEALER)
        sock.curve_serverkey = keys.server.public
        sock.curve_publickey, sock.curve_secretkey = pair.public, pair.secret
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, 1)
        sock.connect(endpoint)
        sockets.append(sock)
        return sock

    try:
        wait_for(lambda: authorized_status(running) is not None, what="the product started")
        endpoints = status_of(running)["services"]["eventbus"]["endpoints"]
        producer = dealer(publisher_key, endpoints["collector"])
        pad = "x" * 32_768
        for i in range(300):
            producer.send_multipart(pub(f"/big/{i % 5}/", {"i": i, "pad": pad}))
        wait_for(
            lambda: status_of(running)["services"]["eventbus"]["sequence"] == 300,
            what="300 events stored",
        )
        stuck = dealer(leaked, endpoints["snapshot"])  # asks, then never reads
        stuck.send_multipart([b"SYNCSTART", b"", SEQUENCE.pack(0)])
        wait_for(
            lambda: status_of(running)["services"]["eventbus"]["snapshot_clients"],
            what="the stuck client's stream",
        )
        client = status_of(running)["services"]["eventbus"]["snapshot_clients"][0]["client"]
        open_console(running, page, "eventbus")
        row = f'#eventbus-snapshots tr[data-client="{client}"]'
        click(page, f'{row} button[data-action="drop-snapshot"]', "drop")
        click(page, f'{row} button[data-action="drop-snapshot"]', "confirm drop")
        wait(page, lambda d: '"dropped":1' in result_line(d))
        wait(page, lambda d: not d.find_elements("css selector", row))
        assert status_of(running)["services"]["eventbus"]["snapshots_dropped"] == 1
        # Its key, refused on every CURVE port of the process: the form is there (the
        # process speaks CURVE), the certificate leaves the allow-list, the connection is
        # cut and made again, and refused.
        wait(page, lambda d: d.find_element("id", "refuse-form").is_displayed())
        page.find_element("id", "refuse-key").send_keys(leaked.public.decode())
        page.find_element("id", "refuse-button").click()
        wait(page, lambda d: '"connections_cut":{"snapshot":1}' in result_line(d))
        assert (keys.allowed / REFUSED_DIR / "leaked.key").exists()
        wait_for(
            lambda: status_of(running)["services"]["eventbus"]["clients"]["snapshot"] == 0,
            what="its connection cut",
        )

        def refused_once_it_reads() -> bool:
            # A client that reads nothing does not see its connection end (libzmq reads
            # no more from a full pipe): reading, it sees it, connects again, is refused.
            with contextlib.suppress(zmq.Again):
                while True:
                    stuck.recv(zmq.NOBLOCK)
            curve = status_of(running)["services"]["eventbus"]["curve"]
            return bool(curve["refused"].get("refused"))

        wait_for(refused_once_it_reads, what="the leaked key's reconnection refused")
    finally:
        for sock in sockets:
            sock.close()
        context.term()
        code = running.stop()
    assert code in CLEAN_EXIT, running.output()
