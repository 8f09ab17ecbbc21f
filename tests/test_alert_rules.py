"""The shipped alerting rules, defined once (bus/web/alerts/rules.py):

- docs/prometheus/alerts.yml is what the definition generates (``make alerts-yml``);
- the product's evaluator fires what promtool's unit tests of the file
  (docs/prometheus/alerts_test.yml) expect, at the same times, on the same series, with the
  same labels and annotations: every test of that file is replayed through
  :class:`bus.web.alerts.engine.AlertEngine` (tests/test_prometheus.py runs it through
  promtool);
- the evaluator's pieces: pending then firing after ``for``, resolution, counter resets,
  Go's formatting of ``$value``, ``--http-alert-for``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from bus.web.alerts.engine import AlertEngine, go_float, humanize, parse_for, seconds
from bus.web.alerts.expr import Series, increase
from bus.web.alerts.rules import alerts, to_yaml

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "docs" / "prometheus" / "alerts.yml"
RULE_TESTS = ROOT / "docs" / "prometheus" / "alerts_test.yml"


def test_the_rules_file_is_what_the_definition_generates() -> None:
    assert RULES.read_text() == to_yaml(), "docs/prometheus/alerts.yml differs: make alerts-yml"


def test_every_rule_of_the_file_is_defined_once() -> None:
    names = [rule.name for rule in alerts()]
    assert (
        len(names) == len(set(names)) == len(re.findall(r"^\s+- alert: ", RULES.read_text(), re.M))
    )


# -- promtool's unit tests, replayed ---------------------------------------------------------------


def _series(text: str) -> tuple[str, dict[str, str]]:
    match = re.fullmatch(r"\s*([\w:]+)\s*(?:\{(.*)\})?\s*", text)
    assert match is not None, text
    labels = dict(re.findall(r'(\w+)\s*=\s*"([^"]*)"', match.group(2) or ""))
    return match.group(1), labels


def _values(text: str) -> list[float | None]:
    """promtool's expanding notation: ``1 2 _ 0+5x3 7x2``."""
    out: list[float | None] = []
    for token in text.split():
        match = re.fullmatch(r"(_|[-+]?[\d.e]+)(?:([-+][\d.e]+))?(?:x(\d+))?", token)
        assert match is not None, token
        start, step, times = match.groups()
        if start == "_":
            out += [None] * (int(times or 0) + 1)
            continue
        first, delta = float(start), float(step or 0)
        out += [first + delta * i for i in range(int(times or 0) + 1)]
    return out


def _run(case: dict[str, Any], interval: float) -> dict[float, list[tuple[str, dict[str, Any]]]]:
    """Every firing alert at each evaluation time of ``case``, by the product's engine."""
    step = seconds(case.get("interval", "1m"))
    points: dict[float, list[tuple[str, dict[str, str], float]]] = {}
    for series in case["input_series"]:
        name, labels = _series(series["series"])
        for index, value in enumerate(_values(str(series["values"]))):
            if value is not None:
                points.setdefault(index * step, []).append((name, labels, value))
    wanted = {seconds(test["eval_time"]) for test in case["alert_rule_test"]}
    engine = AlertEngine({})
    firing: dict[float, list[tuple[str, dict[str, Any]]]] = {}
    times = sorted(set(points) | {i * interval for i in range(int(max(wanted) / interval) + 1)})
    for now in times:
        if now in points:
            engine.sampler.add(now, points[now])
        if now % interval == 0:
            engine.step(now)
            firing[now] = [
                (alert.rule.name, {"labels": alert.labels, "annotations": alert.annotations})
                for alert in engine.alerts()
                if alert.state == "firing"
            ]
    return firing


def _cases() -> list[Any]:
    document = yaml.safe_load(RULE_TESTS.read_text())
    interval = seconds(document.get("evaluation_interval", "1m"))
    return [pytest.param(case, interval, id=f"case{i}") for i, case in enumerate(document["tests"])]


@pytest.mark.parametrize(("case", "interval"), _cases())
def test_the_product_fires_what_promtool_expects(case: dict[str, Any], interval: float) -> None:
    firing = _run(case, interval)
    for test in case["alert_rule_test"]:
        # As promtool: the alerts of the last evaluation at or before eval_time.
        at = max(t for t in firing if t <= seconds(test["eval_time"]))
        got = sorted(
            (
                {k: v for k, v in alert["labels"].items() if k != "alertname"},
                alert["annotations"],
            )
            for name, alert in firing[at]
            if name == test["alertname"]
        )
        expected = sorted(
            (
                {k: str(v) for k, v in alert.get("exp_labels", {}).items()},
                alert.get("exp_annotations", {}),
            )
            for alert in test.get("exp_alerts") or []
        )

        def key(pair: tuple[dict[str, str], dict[str, str]]) -> str:
            return repr(sorted(pair[0].items()))

        assert sorted(got, key=key) == sorted(expected, key=key), (test["alertname"], at)


# -- the pieces --------------------------------------------------------------------------------


def _queue(depth: float, workers: float) -> list[tuple[str, dict[str, str], float]]:
    labels = {"queue": "orders"}
    return [("emqp_queue_depth", labels, depth), ("emqp_queue_workers", labels, workers)]


def test_an_alert_is_pending_then_firing_after_its_for_and_gone_when_the_condition_is() -> None:
    engine = AlertEngine({"job": "bus", "instance": "h:1"}, for_seconds=parse_for("*=10s"))
    engine.evaluate(100.0, _queue(0, 0))
    assert engine.alerts() == []
    engine.evaluate(101.0, _queue(3, 0))
    [waiting] = [a for a in engine.alerts() if a.rule.name == "EmqpQueueWithoutWorkers"]
    assert (waiting.state, waiting.active_at) == ("pending", 101.0)
    assert waiting.labels == {
        "alertname": "EmqpQueueWithoutWorkers",
        "severity": "warning",
        "job": "bus",
        "instance": "h:1",
        "queue": "orders",
    }
    engine.evaluate(110.5, _queue(3, 0))
    assert waiting.state == "pending"
    engine.evaluate(111.0, _queue(4, 0))
    assert (waiting.state, waiting.active_at) == ("firing", 101.0)  # since when: kept
    assert waiting.annotations["description"].startswith("4 requests wait")
    engine.evaluate(112.0, _queue(4, 1))  # a worker came
    assert [a.rule.name for a in engine.alerts()] == []


def test_increase_counts_across_a_counter_reset() -> None:
    engine = AlertEngine({}, rules=[])
    engine.sampler = type(engine.sampler)(["c"], {"c": 300.0}, {})
    for t, value in ((0, 5.0), (60, 8.0), (120, 2.0), (180, 4.0)):
        engine.sampler.add(float(t), [("c", {}, value)])
    [grown] = increase(Series("c"), 300).evaluate(engine.sampler).values()
    # 3, then a reset (2 from zero), then 2: 7 over 180 s, extrapolated as Prometheus does
    # (the window begins two intervals before the first sample: half of one is added).
    assert grown == pytest.approx(7 * (180 + 30 + 0) / 180)


@pytest.mark.parametrize(
    ("value", "text"),
    [(0.0, "0"), (2.0, "2"), (1.5, "1.5"), (12000.0, "12000"), (123456.0, "123456"),
     (1e6, "1e+06"), (1234567.0, "1.234567e+06"), (0.0001, "0.0001"), (0.00001, "1e-05"),
     (-3.0, "-3")],
)  # fmt: skip
def test_value_is_printed_as_go_prints_a_float(value: float, text: str) -> None:
    assert go_float(value) == text


def test_humanize_uses_si_prefixes() -> None:
    assert [humanize(v) for v in (3.0, 1500.0, 2.5e6, 0.25)] == ["3", "1.5k", "2.5M", "250m"]


def test_alert_for_names_rules_and_durations() -> None:
    hold = parse_for("*=2s, EmqpQueueWithoutWorkers=1m")
    by_name = {rule.name: rule for rule in alerts()}
    assert hold(by_name["EmqpQueueWithoutWorkers"]) == 60
    assert hold(by_name["BusServiceDown"]) == 2
    assert parse_for("BusServiceDown=0")(by_name["EmqpQueueWithoutWorkers"]) == 900
    for wrong in ("NoSuchRule=1s", "BusServiceDown", "BusServiceDown=-1", "BusServiceDown=x"):
        with pytest.raises(ValueError):
            parse_for(wrong)


def test_a_window_keeps_about_sixty_points_whatever_the_sampling_period() -> None:
    engine = AlertEngine({}, rules=[])
    engine.sampler = type(engine.sampler)(["c"], {"c": 300.0}, {})
    for t in range(1000):  # a counter growing by 2 a second, sampled every second
        engine.sampler.add(float(t), [("c", {}, 2.0 * t)])
    [window] = engine.sampler._ranges["c"].values()
    assert len(window.points) <= 62
    [grown] = increase(Series("c"), 300).evaluate(engine.sampler).values()
    assert grown == pytest.approx(600, rel=0.02)
