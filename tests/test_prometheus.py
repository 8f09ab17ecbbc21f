"""Prometheus for real: Debian's ``prometheus`` package (the server and ``promtool``) against
the product as operators run it (``twistd -n eventbus``).

- ``promtool check metrics`` passes on the /metrics of the composed product: every service
  by default; the Event BUS of a pair with the Spark bridge; a JetStream front-end;
- a real Prometheus scrapes them and its query API answers their series;
- the shipped alert rules (docs/prometheus/alerts.yml) pass ``promtool check rules`` and
  their unit tests (alerts_test.yml), are evaluated without error by the server, and every
  series they read is one the product exports; the same holds for the Grafana dashboard
  (docs/grafana/bus.json), which draws every chart of the console;
- a real Prometheus fires the storage alert on a full disk under the Event BUS.

``make test`` installs the package when it is missing (as root, with apt-get); without it
these tests fail when ``BUS_PROMETHEUS_TESTS=required`` (CI sets it) and are skipped
otherwise, saying how to get it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from prometheus_client.parser import text_string_to_metric_families
from twisted.internet import reactor, task

from tests.ports import free_port, free_ports, nats_cluster
from tests.processes import ROOT, ServerProcess, wait_for
from tests.promql import Selector, selectors
from tests.small_disk import fill, small_tmpfs

RULES = ROOT / "docs" / "prometheus" / "alerts.yml"
RULE_TESTS = ROOT / "docs" / "prometheus" / "alerts_test.yml"
DASHBOARD = ROOT / "docs" / "grafana" / "bus.json"

#: The labels the product's families may carry: each names what a series is about (a
#: service, a socket, a reason, a queue an operator configured), never a peer's identity or
#: address, so that a flood of peers cannot make a flood of series.
LABELS = {"service", "socket", "port", "reason", "kind", "result", "verb", "type", "command"}
LABELS |= {"queue", "state", "replica", "stream"}

#: The console's charts (``/api/v1/state``: each service's counters) and the family the
#: dashboard draws each from.
CONSOLE_CHARTS = {
    ("eventbus", "events"): "eventbus_sequence",
    ("eventbus", "snapshot messages"): "eventbus_snapshot_messages_sent_total",
    ("eventbus", "dropped"): "eventbus_messages_dropped_total",
    ("emqp", "jobs"): "emqp_replied_total",
    ("emqp", "requests"): "emqp_requests_total",
    ("emqp", "dropped"): "emqp_messages_dropped_total",
    ("emqp-pubsub", "publications"): "emqp_pubsub_published_total",
    ("emqp-pubsub", "dropped"): "emqp_pubsub_messages_dropped_total",
    ("mc0", "messages"): "mc0_puts_total",
    ("mc0", "delivered"): "mc0_messages_delivered_total",
    ("dbp", "messages"): "dbp_messages_total",
    ("dbp", "heartbeats"): "dbp_udp_heartbeats_received_total",
    ("dbp", "dropped"): "dbp_dropped_total",
    ("zre", "messages"): "zre_messages_received_total",
    ("zre", "beacons"): "zre_beacons_received_total",
    ("zre", "dropped"): "zre_dropped_total",
    ("spark-bridge", "journaled"): "spark_bridge_events_journaled_total",
}


def binary(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        message = (
            f"these tests need {name} (Debian's prometheus package: apt-get install "
            "prometheus; make test installs it)"
        )
        if os.environ.get("BUS_PROMETHEUS_TESTS") == "required":
            pytest.fail(message)
        pytest.skip(message)
    return found


def get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return bytes(response.read())


def answers(url: str) -> bool:
    try:
        get(url)
    except OSError:
        return False
    return True


@dataclass
class Exported:
    """What /metrics exports: series names (from samples, and from the TYPE lines of
    families that have none yet) and the labels seen on each."""

    labels: dict[str, set[str]] = field(default_factory=dict)

    def add(self, text: str) -> None:
        for line in text.splitlines():
            if line.startswith("# TYPE "):
                self.labels.setdefault(line.split()[2], set())
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                self.labels.setdefault(sample.name, set()).update(sample.labels)


@dataclass
class Product:
    """A ``twistd -n eventbus`` in a child process, with its HTTP port."""

    name: str
    server: ServerProcess

    @property
    def http(self) -> str:
        return f"127.0.0.1:{self.server.http_port}"

    def metrics(self) -> str:
        return get(f"http://{self.http}/metrics").decode()

    def up(self) -> bool:
        """Whether /metrics says every composed service is running."""
        if self.server.process.poll() is not None:
            raise AssertionError(f"{self.name} exited: {self.server.output()[-3000:]}")
        try:
            text = self.metrics()
        except OSError:
            return False
        up = re.findall(r"^bus_service_up\{[^}]*\} (\S+)$", text, re.M)
        return bool(up) and all(float(value) == 1 for value in up)


class Prometheus:
    """A real Prometheus server in a child process, on a free port of 127.0.0.1, scraping
    and evaluating every second."""

    def __init__(self, directory: Path, jobs: dict[str, list[str]], rule_files: list[Path]) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(path) for path in rule_files],
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": targets}]}
                for job, targets in jobs.items()
            ],
        }
        path = directory / "prometheus.yml"  # JSON is YAML
        path.write_text(json.dumps(config, indent=1))
        self.port = free_port()
        self.log_path = directory / "prometheus.log"
        self.log = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            [
                binary("prometheus"),
                f"--config.file={path}",
                f"--storage.tsdb.path={directory / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def ready(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"prometheus exited: {self.log_path.read_text()[-3000:]}")
        return answers(f"http://127.0.0.1:{self.port}/-/ready")

    def api(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        try:
            body = get(f"http://127.0.0.1:{self.port}/api/v1/{path}{query}")
        except urllib.error.HTTPError as error:  # a bad query: its error in the body
            body = error.read()
        answer = json.loads(body)
        assert answer["status"] == "success", answer
        return answer["data"]

    def targets_up(self, count: int) -> bool:
        active = self.api("targets")["activeTargets"]
        return len(active) == count and all(target["health"] == "up" for target in active)

    def firing(self, alert: str) -> list[dict[str, Any]]:
        return [
            found
            for found in self.api("alerts")["alerts"]
            if found["labels"]["alertname"] == alert and found["state"] == "firing"
        ]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


def check_metrics(text: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [binary("promtool"), "check", "metrics"],
        input=text,
        capture_output=True,
        text=True,
        timeout=60,
    )


@dataclass
class Running:
    products: list[Product]
    prometheus: Prometheus
    exported: Exported
    texts: dict[str, str]


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    """The product three ways, and a real Prometheus scraping them with the shipped rules:

    - ``bus``: ``twistd -n eventbus`` with every default service;
    - ``bus-pair``: the Event BUS as a pair's primary (alone) with the Spark bridge;
    - ``bus-cluster``: the Event BUS and eMQP on JetStream streams, and mc0 on NATS (one
      nats-server).
    """
    binary("prometheus")
    binary("promtool")
    root = tmp_path_factory.mktemp("prometheus")
    nats = nats_cluster(root / "nats", size=1)
    products: list[Product] = []
    prometheus: Prometheus | None = None
    try:
        products.append(Product("bus", ServerProcess(root / "bus", http=True)))
        peer = free_ports(4)  # no peer there: the primary goes on alone
        pair = [
            "--services", "eventbus,spark-bridge", "--ha-role", "primary",
            "--ha-peer", f"127.0.0.1:{peer + 3}", "--ha-alone-timeout", "1s",
            "--spark-bridge-journal-dir", str(root / "journal"),
        ]  # fmt: skip
        # Its own ports from below the ephemeral range: its link binds the base port + 3,
        # which another test's connection may hold when the kernel picked the base.
        paired = ServerProcess(root / "pair", *pair, http=True, port=free_ports(4))
        products.append(Product("bus-pair", paired))
        nats.start()
        front_end = [
            "--services", "eventbus,emqp,mc0", "--store", "jetstream", "--nats", *nats.urls[:1],
            "--emqp-store", "jetstream", "--emqp-nats", *nats.urls[:1],
            "--emqp-worker-port", "0", "--emqp-client-port", "0", "--emqp-admin-port", "0",
            "--emqp-data-dir", str(root / "front-end-emqp"), "--mc0-port", "0", "--mc0-plain",
            "--mc0-data-dir", str(root / "front-end-mc0"), "--mc0-nats", *nats.urls[:1],
        ]  # fmt: skip
        products.append(
            Product("bus-cluster", ServerProcess(root / "front-end", *front_end, http=True))
        )
        for product in products:
            wait_for(product.up, timeout=60, what=f"{product.name} up")
        prometheus = Prometheus(
            root / "server", {p.name: [p.http] for p in products}, rule_files=[RULES]
        )
        wait_for(prometheus.ready, timeout=60, what="prometheus ready")
        texts = {product.name: product.metrics() for product in products}
        exported = Exported()
        for text in texts.values():
            exported.add(text)
        yield Running(products, prometheus, exported, texts)
    finally:
        if prometheus is not None:
            prometheus.stop()
        for product in products:
            product.server.stop()
        nats.stop()


def source_strings() -> set[str]:
    """Every double-quoted string literal in bus/ (label values come from them)."""
    found: set[str] = set()
    for path in (ROOT / "bus").rglob("*.py"):
        found.update(re.findall(r'"([\w.-]+)"', path.read_text()))
    return found


def unexported(
    selector: Selector, exported: Exported, recorded: set[str], strings: set[str]
) -> list[str]:
    """What of ``selector`` the product does not export: its name, a label no series of
    it carries, or a label value the product's code never names."""
    problems: list[str] = []
    name = selector.name
    if name in recorded:
        return problems
    if name not in exported.labels:
        return [f"{name}: no such series in /metrics"]
    seen = exported.labels[name]
    for matcher in selector.matchers:
        if matcher.label in ("instance", "job"):
            continue  # the scrape's labels
        if seen and matcher.label not in seen:
            problems.append(f"{name}: no label {matcher.label} (it has {sorted(seen)})")
        values = matcher.value.split("|") if matcher.op == "=~" else [matcher.value]
        for value in values:
            if matcher.op in ("=", "=~") and value not in strings:
                problems.append(f"{name}{{{matcher.label}}}: the product never says {value!r}")
    return problems


# -- promtool ----------------------------------------------------------------------------------


def test_promtool_checks_the_rules_and_runs_their_unit_tests() -> None:
    checked = subprocess.run(
        [binary("promtool"), "check", "rules", str(RULES)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS" in checked.stdout
    tested = subprocess.run(
        [binary("promtool"), "test", "rules", RULE_TESTS.name],
        cwd=RULE_TESTS.parent,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def test_every_alert_has_a_unit_test() -> None:
    alerts = re.findall(r"^\s*- alert: (\w+)$", RULES.read_text(), re.M)
    tested = set(re.findall(r"^\s*alertname: (\w+)$", RULE_TESTS.read_text(), re.M))
    assert len(alerts) >= 10
    assert sorted(set(alerts) - tested) == []


def test_promtool_check_metrics_passes_on_every_product(running: Running) -> None:
    for name, text in running.texts.items():
        checked = check_metrics(text)
        # promtool prints each problem it finds (names, types, units, HELP) and exits 3.
        assert (checked.returncode, checked.stdout + checked.stderr) == (0, ""), name


def test_the_families_carry_no_label_of_a_peer_or_an_address(running: Running) -> None:
    for name, text in running.texts.items():
        for family in text_string_to_metric_families(text):
            assert family.documentation.strip(), family.name
            if family.name == "bus_build_info":
                continue  # the release and Python's: one series a process, never a peer's
            for sample in family.samples:
                assert set(sample.labels) <= LABELS, (name, sample)
                for value in sample.labels.values():
                    # No port numbers, addresses or identities (hex ids, UUIDs).
                    assert not re.search(r"\d{2,}|[:/]", value), (name, sample)
                    assert not re.fullmatch(r"[0-9a-f-]*\d[0-9a-f-]*", value), (name, sample)


def test_every_labelled_family_in_the_code_takes_a_label_of_the_list() -> None:
    """The families a running product has not filled yet (drops by reason, say) carry no
    sample to audit above: their labels are read where the code makes them."""
    call = re.compile(r"\b(?:counters_by|gauges_by)\(")
    labelled = re.compile(
        r'\b(?:counters_by|gauges_by)\(\s*f?"[^"]+",\s*(?:"(?:[^"\\]|\\.)*"\s*)+,\s*"(\w+)"'
    )
    # Families of several labels name them in a tuple of literals.
    several_call = re.compile(r"\bgauges_by_labels\(")
    several = re.compile(
        r'\bgauges_by_labels\(\s*f?"[^"]+",\s*(?:"(?:[^"\\]|\\.)*"\s*)+,\s*\(((?:\s*"\w+",?)+)\s*\)'
    )
    found: list[str] = []
    for path in (ROOT / "bus").rglob("*.py"):
        if path.name == "metrics.py":
            continue  # where they are defined
        text = path.read_text()
        labels = labelled.findall(text)
        assert len(labels) == len(call.findall(text)), f"{path}: a family this test cannot read"
        tuples = several.findall(text)
        assert len(tuples) == len(several_call.findall(text)), f"{path}: a family not read"
        labels += [label for names in tuples for label in re.findall(r'"(\w+)"', names)]
        found += labels
    assert len(found) >= 20
    assert sorted(set(found) - LABELS) == []


def test_promtool_check_metrics_finds_what_breaks_the_conventions() -> None:
    """The check above can fail: promtool names a counter without ``_total``."""
    checked = check_metrics("# HELP bus_things Things\n# TYPE bus_things counter\nbus_things 1\n")
    assert checked.returncode != 0
    assert 'counter metrics should have "_total" suffix' in checked.stdout + checked.stderr


# -- a real Prometheus -------------------------------------------------------------------------


def test_a_real_prometheus_scrapes_the_product_and_answers_its_series(running: Running) -> None:
    prometheus = running.prometheus
    wait_for(lambda: prometheus.targets_up(3), timeout=60, what="three targets up")

    def scraped() -> set[str]:
        found = prometheus.api("query", query='count by (__name__) ({job="bus"})')
        return {series["metric"]["__name__"] for series in found["result"]}

    exported = {
        sample.name
        for family in text_string_to_metric_families(running.texts["bus"])
        for sample in family.samples
    }
    wait_for(lambda: exported <= scraped(), timeout=60, what="every series of /metrics")
    for service in ("eventbus", "emqp", "emqp-pubsub", "mc0", "dbp", "zre", "http"):
        found = prometheus.api("query", query=f'bus_service_up{{job="bus", service="{service}"}}')
        [series] = found["result"]
        assert series["value"][1] == "1", service
    [sequence] = prometheus.api("query", query='eventbus_sequence{job="bus"}')["result"]
    assert sequence["metric"]["instance"] == running.products[0].http

    def values(query: str) -> list[tuple[str, str]]:
        found = prometheus.api("query", query=query)["result"]
        return [(series["metric"]["job"], series["value"][1]) for series in found]

    # The pair's primary, with no peer, goes on alone a second after its start.
    wait_for(lambda: values("eventbus_ha_alone") == [("bus-pair", "1")], timeout=30, what="alone")
    wait_for(
        lambda: values("eventbus_jetstream_connected") == [("bus-cluster", "1")],
        timeout=30,
        what="the front-end connected to NATS",
    )


def test_every_alert_reads_series_the_product_exports(running: Running) -> None:
    prometheus = running.prometheus

    def rules() -> list[dict[str, Any]]:
        groups = prometheus.api("rules")["groups"]
        return [rule for group in groups for rule in group["rules"]]

    # Each rule evaluated at least once against the running products, without error.
    wait_for(
        lambda: all(not r["lastEvaluation"].startswith("0001") for r in rules()),
        timeout=60,
        what="every rule evaluated",
    )
    loaded = rules()
    assert [(r["name"], r.get("lastError", "")) for r in loaded if r["health"] != "ok"] == []
    recorded = {rule["name"] for rule in loaded if rule["type"] == "recording"}
    alerts = {rule["name"] for rule in loaded if rule["type"] == "alerting"}
    assert alerts == set(re.findall(r"^\s*- alert: (\w+)$", RULES.read_text(), re.M))
    strings = source_strings()
    problems = [
        f"{rule['name']}: {problem}"
        for rule in loaded
        for selector in selectors(rule["query"])
        for problem in unexported(selector, running.exported, recorded, strings)
    ]
    assert problems == []

    # And the pair's primary, alone, is what EventBusPairAlone is about (pending: its
    # `for:` is longer than this test).
    def pair_alone() -> list[dict[str, Any]]:
        found = prometheus.api("alerts")["alerts"]
        return [a for a in found if a["labels"]["alertname"] == "EventBusPairAlone"]

    wait_for(pair_alone, timeout=30, what="EventBusPairAlone")
    assert [(a["labels"]["job"], a["labels"]["instance"]) for a in pair_alone()] == [
        ("bus-pair", running.products[1].http)
    ]


def dashboard_queries() -> list[str]:
    board = json.loads(DASHBOARD.read_text())
    queries: list[str] = []

    def walk(panels: list[dict[str, Any]]) -> None:
        for panel in panels:
            queries.extend(target["expr"] for target in panel.get("targets", []))
            walk(panel.get("panels", []))

    walk(board["panels"])
    return queries


def test_the_dashboard_reads_series_the_product_exports(running: Running) -> None:
    board = json.loads(DASHBOARD.read_text())
    assert board["title"] and board["uid"] and board["schemaVersion"] >= 30
    assert [i["pluginId"] for i in board["__inputs"]] == ["prometheus"]
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids))
    cells = [
        (x, y)
        for panel in board["panels"]
        for x in range(panel["gridPos"]["x"], panel["gridPos"]["x"] + panel["gridPos"]["w"])
        for y in range(panel["gridPos"]["y"], panel["gridPos"]["y"] + panel["gridPos"]["h"])
    ]
    assert len(cells) == len(set(cells)), "panels overlap"
    queries = dashboard_queries()
    assert len(queries) >= 30
    variables = {v["name"]: v for v in board["templating"]["list"]}
    label_values = re.fullmatch(
        r"label_values\((\w+), (\w+)\)", variables["instance"]["query"]["query"]
    )
    assert label_values is not None
    strings = source_strings()
    problems: list[str] = []
    if label_values[1] not in running.exported.labels:
        problems.append(f"the instance variable reads {label_values[1]}: not exported")
    for query in queries:
        for selector in selectors(query):
            problems += unexported(selector, running.exported, set(), strings)
        # Each one is PromQL a real Prometheus evaluates (Grafana's variables given values).
        concrete = query.replace("$__rate_interval", "1m").replace("$instance", ".*")
        running.prometheus.api("query", query=concrete)
    assert problems == []


def test_the_dashboard_draws_every_chart_of_the_console(running: Running) -> None:
    charts: set[tuple[str, str]] = set()
    for product in running.products:
        state = json.loads(get(f"http://{product.http}/api/v1/state"))
        for service in state["services"]:
            charts.update((service["name"], label) for label in service.get("counters", {}))
    assert ("eventbus", "events") in charts and ("spark-bridge", "journaled") in charts
    # A chart the console gains needs its series in CONSOLE_CHARTS and on the dashboard.
    assert sorted(charts - set(CONSOLE_CHARTS)) == []
    drawn = {selector.name for query in dashboard_queries() for selector in selectors(query)}
    assert sorted(set(CONSOLE_CHARTS.values()) - drawn) == []


def test_the_selectors_of_an_expression_are_read() -> None:
    found = selectors(
        'sum by (job, instance) (rate(zre_dropped_total{reason=~"a|b"}[5m])) > 0 '
        "and on (job) (emqp_queue_workers == 0) unless bus:x:rate5m offset 1m"
    )
    assert [(s.name, [(m.label, m.op, m.value) for m in s.matchers]) for s in found] == [
        ("zre_dropped_total", [("reason", "=~", "a|b")]),
        ("emqp_queue_workers", []),
        ("bus:x:rate5m", []),
    ]


# -- an alert that fires -----------------------------------------------------------------------


def quick_rules(directory: Path) -> Path:
    """The shipped rules with every ``for:`` made 1s, for a test that cannot wait minutes."""
    text, count = re.subn(r"(?m)^(\s+for:) \S+$", r"\1 1s", RULES.read_text())
    assert count >= 5
    path = directory / "alerts-quick.yml"
    path.write_text(text)
    return path


@pytest_twisted.inlineCallbacks
def test_a_real_prometheus_fires_the_storage_alert_on_a_full_disk(tmp_path: Path) -> Any:
    from bus.eventbus.client import EventBusPublisher
    from bus.testing import wait_until

    binary("prometheus")
    with small_tmpfs(tmp_path / "disk", "8m") as disk:
        data = disk / "data"
        data.mkdir()
        server = ServerProcess(
            data, "--services", "eventbus", log_path=tmp_path / "bus.log", http=True
        )
        prometheus = None
        publisher = None
        try:
            bus = Product("bus", server)
            yield wait_until(bus.up, timeout=60, interval=0.1, what="the bus up")
            prometheus = Prometheus(
                tmp_path / "prometheus", {"bus": [bus.http]}, [quick_rules(tmp_path)]
            )
            yield wait_until(prometheus.ready, timeout=60, interval=0.2, what="prometheus")
            yield wait_until(
                lambda: prometheus.targets_up(1), timeout=60, interval=0.2, what="scraped"
            )
            assert prometheus.firing("EventBusStoragePaused") == []

            filler = fill(disk, leave=256 * 1024)
            publisher = EventBusPublisher(server.address, producer_id="full-disk")
            payload = os.urandom(150).hex()
            published = 0
            while not server.live_status().get("collector_paused"):
                assert published < 60_000, "the store never refused on a full disk"
                for i in range(published, published + 1000):
                    publisher.publish("/disk/", [i, payload])
                published += 1000
                yield task.deferLater(reactor, 0.2, lambda: None)

            yield wait_until(
                lambda: prometheus.firing("EventBusStoragePaused"),
                timeout=60,
                interval=0.25,
                what="EventBusStoragePaused firing",
            )
            [paused] = prometheus.firing("EventBusStoragePaused")
            assert paused["labels"]["instance"] == bus.http
            assert paused["labels"]["severity"] == "critical"
            assert "collector paused" in paused["annotations"]["summary"]
            yield wait_until(
                lambda: prometheus.firing("EventBusStorageRefusing"),
                timeout=60,
                interval=0.25,
                what="EventBusStorageRefusing firing",
            )

            filler.unlink()  # space returns: the bus resumes, the alert resolves
            yield wait_until(
                lambda: not server.live_status().get("collector_paused"),
                timeout=60,
                interval=0.1,
                what="the bus resumed",
            )
            yield wait_until(
                lambda: not prometheus.firing("EventBusStoragePaused"),
                timeout=60,
                interval=0.25,
                what="EventBusStoragePaused resolved",
            )
        finally:
            if publisher is not None:
                publisher.close()
            if prometheus is not None:
                prometheus.stop()
            server.stop()


@pytest_twisted.inlineCallbacks
def test_emqp_says_which_queue_waits_with_no_worker(tmp_path: Path, cleanup: list[Any]) -> Any:
    """What EmqpQueueGrowingWithoutWorkers reads: a queue's depth beside its workers."""
    from bus.testing import wait_until
    from tests.emqp_helpers import RawClient, RawWorker, broker_in

    broker = broker_in(tmp_path, cleanup)
    worker = RawWorker(broker.endpoints["worker"], [[10, "served"]])
    client = RawClient(broker.endpoints["client"])
    cleanup += [worker, client]
    yield wait_until(worker.acked, what="ACK")
    for i in range(3):
        client.request("orphans", i)
    yield wait_until(lambda: broker.broker.requests == 3, what="the requests")
    samples = {
        (sample.name, sample.labels.get("queue")): sample.value
        for family in broker.metrics()
        for sample in family.samples
    }
    assert samples[("emqp_queue_depth", "orphans")] == 3
    assert samples[("emqp_queue_workers", "orphans")] == 0
    assert samples[("emqp_queue_workers", "served")] == 1
    assert samples[("emqp_queue_depth", "served")] == 0


def test_the_console_paints_a_lagging_replica_where_the_alerts_fire() -> None:
    """The console's amber for a replica behind its leader (console.js) is the shipped
    rules' threshold, for the Event BUS and eMQP alike."""
    script = (ROOT / "bus" / "web" / "console" / "static" / "console.js").read_text()
    [painted] = re.findall(r"^const REPLICA_LAG_WARN = (\d+);$", script, re.M)
    thresholds = re.findall(r"expr: (\w+)_jetstream_replica_lag > (\d+)$", RULES.read_text(), re.M)
    assert sorted(thresholds) == [("emqp", painted), ("eventbus", painted)]
