"""The shipped alerting rules, defined once: ``docs/prometheus/alerts.yml`` is generated
from them (``make alerts-yml``, or ``python -m bus.web.alerts.rules > FILE``; a test fails
when the file and this module differ), and the console evaluates the same conditions over
the product's own samples (:mod:`bus.web.alerts.engine`).

Thresholds and ``for`` durations are starting points: tune them to your traffic (here, and
regenerate the file).
"""

from __future__ import annotations

import json
import sys
import textwrap
from dataclasses import dataclass, field

from bus.web.alerts.expr import (
    And,
    Compare,
    Expr,
    Or,
    Recorded,
    SecondsSince,
    Series,
    count_without,
    deriv,
    duration,
    increase,
    rate,
    sum_by,
)


@dataclass(frozen=True)
class Alert:
    """One alerting rule."""

    name: str
    expr: Expr
    severity: str
    summary: str
    description: str
    #: Seconds the condition must hold before the alert fires (0: at once).
    for_: float = 0.0
    #: The console's card the alert belongs to when its series has no ``service`` label.
    service: str = ""


@dataclass(frozen=True)
class Group:
    """A group of rules, as Prometheus evaluates them together."""

    name: str
    rules: tuple[Alert, ...] = ()
    #: Recording rules of the group (written before its alerts).
    records: tuple[Recorded, ...] = field(default=())


def _curve_refusals() -> Recorded:
    def per_service(metric: Series) -> Expr:
        return sum_by(("job", "instance"), rate(metric, 300))

    return Recorded(
        "bus:curve_refusals:rate5m",
        tuple(
            (per_service(metric), {"service": service})
            for metric, service in (
                (Series("eventbus_curve_refusals_total"), "eventbus"),
                (Series("emqp_curve_refusals_total"), "emqp"),
                (Series("emqp_pubsub_curve_refusals_total"), "emqp-pubsub"),
                (Series("dbp_curve_refusals_total"), "dbp"),
                (Series("zre_curve_refusals_total"), "zre"),
                (Series("mc0_handshake_failures_total", (("kind", "=", "auth"),)), "mc0"),
            )
        ),
        comment=(
            "CURVE handshakes refused (unknown key, a role the key lacks, a bad handshake), per "
            "second, one series per service, so that one alert watches every port."
        ),
    )


CURVE_REFUSALS = _curve_refusals()


def _is(name: str, value: float) -> Compare:
    return Compare(Series(name), "==", value)


def _grew(name: str, window: float = 300, *matchers: tuple[str, str, str]) -> Compare:
    return Compare(increase(Series(name, matchers), window), ">", 0)


def _above(name: str, value: float) -> Compare:
    return Compare(Series(name), ">", value)


_QUEUE = ("job", "instance", "queue")

_NOT_CURRENT = (
    "Its server is down, cut off or catching up: the stream has one replica less to lose. "
    "Restart or reconnect that nats-server; a rolling restart waits for this to clear before "
    "the next host (docs/cluster.md)."
)
_LAGGING = (
    "A follower that stays behind for minutes has a slow disk or link; it is not current "
    "until it catches up."
)

#: Every group, in the order of the generated file.
GROUPS: tuple[Group, ...] = (
    Group("bus-recording", records=(CURVE_REFUSALS,)),
    Group(
        "bus-storage",
        (
            Alert(
                "EventBusStoragePaused",
                _is("eventbus_collector_paused", 1),
                "critical",
                "Event BUS on {{ $labels.instance }}: collector paused, the store refuses writes",
                "Events wait for the store (a full disk, an I/O error) and the collector is not "
                "read: publishers see ZeroMQ backpressure. The bus resumes by itself once the "
                "store takes writes again; free space under its data directory.",
                60,
                "eventbus",
            ),
            Alert(
                "EventBusStorageRefusing",
                Or(
                    _grew("eventbus_events_refused_storage_total"),
                    _grew("eventbus_storage_errors_total"),
                ),
                "warning",
                "Event BUS on {{ $labels.instance }}: the store refused writes in the last 5 "
                "minutes",
                "Appends, checkpoints or retention failed (eventbus_events_refused_storage_total, "
                'eventbus_storage_errors_total); the log line "cannot write" says why.',
                0,
                "eventbus",
            ),
            Alert(
                "EmqpStoragePaused",
                _is("emqp_client_port_paused", 1),
                "critical",
                "eMQP on {{ $labels.instance }}: client port paused, the job store refuses commits",
                "Guaranteed requests and schedule changes wait for the job store; the client port "
                "is not read until it takes commits again.",
                60,
                "emqp",
            ),
            Alert(
                "EmqpStorageRefusing",
                Or(_grew("emqp_storage_errors_total"), _grew("emqp_refused_unstored_total")),
                "warning",
                "eMQP on {{ $labels.instance }}: the job store refused commits in the last 5 "
                "minutes",
                "Job store commits failed (emqp_storage_errors_total) or guaranteed requests were "
                "refused unstored (emqp_refused_unstored_total).",
                0,
                "emqp",
            ),
            Alert(
                "SparkBridgeJournalBlocked",
                _is("spark_bridge_journal_blocked", 1),
                "critical",
                "Spark bridge on {{ $labels.instance }}: the journal cannot be written",
                "Journal writes fail (a full disk?): the bridge stopped reading the bus and "
                "retries; it catches up by itself once the journal takes writes.",
                60,
                "spark-bridge",
            ),
        ),
    ),
    Group(
        "bus-eventbus-pair",
        (
            Alert(
                "EventBusPairAlone",
                _is("eventbus_ha_alone", 1),
                "warning",
                "Event BUS pair: {{ $labels.instance }} serves alone",
                "The active server has no passive copy of what it releases: one more failure "
                "loses the service. Bring its peer back.",
                120,
                "eventbus",
            ),
            Alert(
                "EventBusPairTwoActives",
                Compare(
                    count_without(
                        ("instance",),
                        Compare(Series("eventbus_ha_state", (("state", "=", "active"),)), "==", 1),
                    ),
                    ">",
                    1,
                ),
                "critical",
                "Event BUS pair ({{ $labels.job }}): {{ $value }} servers are active",
                "More than one server of a pair says it is active (a partition?): publishers may "
                "be split between them. Each pair must have its own job or target label for this "
                "to hold.",
                30,
                "eventbus",
            ),
        ),
    ),
    Group(
        "bus-emqp",
        (
            Alert(
                "EmqpQueueGrowingWithoutWorkers",
                And(
                    Compare(deriv(Series("emqp_queue_depth"), 300), ">", 0),
                    _is("emqp_queue_workers", 0),
                    _QUEUE,
                ),
                "warning",
                "eMQP on {{ $labels.instance }}: queue {{ $labels.queue }} grows and no worker "
                "serves it",
                "Requests keep arriving on a queue that no connected worker serves.",
                120,
                "emqp",
            ),
            Alert(
                "EmqpQueueWithoutWorkers",
                And(_above("emqp_queue_depth", 0), _is("emqp_queue_workers", 0), _QUEUE),
                "warning",
                "eMQP on {{ $labels.instance }}: queue {{ $labels.queue }} has waited 15 minutes "
                "for a worker",
                "{{ $value }} requests wait on a queue that no connected worker serves.",
                900,
                "emqp",
            ),
            Alert(
                "EmqpWorkersLost",
                _grew("emqp_workers_lost_total"),
                "warning",
                "eMQP on {{ $labels.instance }}: workers lost in the last 5 minutes",
                "Workers went silent past their heartbeats or disconnected without a goodbye; "
                "their requests in flight are retried or failed.",
                0,
                "emqp",
            ),
        ),
    ),
    Group(
        "bus-security",
        (
            Alert(
                "CurveRefusalsSpiking",
                Compare(CURVE_REFUSALS, ">", 1),
                "warning",
                "{{ $labels.service }} on {{ $labels.instance }} refuses {{ $value | humanize }} "
                "CURVE handshakes a second",
                "Peers with unknown keys, keys without the role, or a wrong server key keep "
                "trying: a misconfigured client, or someone probing. /status names the keys "
                "refused last.",
                300,
            ),
            Alert(
                "BusInboundConnectionsRefused",
                _grew("bus_inbound_connections_refused_total"),
                "warning",
                "{{ $labels.instance }} closed connections beyond its {{ $labels.reason }} limit",
                "Connections were closed at once for passing a bound (per port, per address or "
                "the descriptor share): a flood, or clients that need --max-connections raised.",
                0,
                "http",
            ),
        ),
    ),
    Group(
        "bus-discovery",
        (
            Alert(
                "ZreBoundsHit",
                _grew("zre_dropped_total", 300, ("reason", "=~", "pending-full|descriptor-budget")),
                "warning",
                "ZRE on {{ $labels.instance }}: peers dropped at a bound ({{ $labels.reason }})",
                "Too many peers found and not greeted (--max-pending-peers), or the node's share "
                "of descriptors is used: new peers are not met (a beacon flood?).",
                0,
                "zre",
            ),
            Alert(
                "DbpRegistryFull",
                _grew("dbp_dropped_total", 300, ("reason", "=", "registry-full")),
                "warning",
                "DBP on {{ $labels.instance }}: registrations refused, the catalog is full",
                "New service names were refused past --max-services.",
                0,
                "dbp",
            ),
        ),
    ),
    Group(
        "bus-spark-bridge",
        (
            Alert(
                "SparkBridgeBehind",
                _above("spark_bridge_journal_lag_events", 10000),
                "warning",
                "Spark bridge on {{ $labels.instance }} is {{ $value }} events behind the bus",
                "The journal has not held what the bus announced for 5 minutes.",
                300,
                "spark-bridge",
            ),
            Alert(
                "SparkBridgePaused",
                _is("spark_bridge_paused", 1),
                "warning",
                "Spark bridge on {{ $labels.instance }} has not read the bus for 5 minutes",
                "Its writer is behind or the journal cannot be written.",
                300,
                "spark-bridge",
            ),
            Alert(
                "SparkBridgeFailed",
                _is("spark_bridge_failed", 1),
                "critical",
                "Spark bridge on {{ $labels.instance }} stopped journaling",
                "A fatal error (e.g. the journal belongs to another bus store); its log and "
                "/status (failed) say which. It does not resume by itself.",
                0,
                "spark-bridge",
            ),
        ),
    ),
    Group(
        "bus-cluster",
        (
            Alert(
                "EventBusNatsUnreachable",
                _is("eventbus_jetstream_connected", 0),
                "critical",
                "Event BUS front-end {{ $labels.instance }} cannot reach NATS",
                "Its NATS data connections (appends, feed) are down: it accepts no event until "
                "one of the --nats servers answers again.",
                60,
                "eventbus",
            ),
            Alert(
                "EventBusNatsReconnecting",
                Compare(increase(Series("eventbus_jetstream_disconnects_total"), 600), ">", 3),
                "warning",
                "Event BUS front-end {{ $labels.instance }} lost its NATS connection "
                "{{ $value }} times in 10 minutes",
                "A NATS server or the network to it is unstable.",
                0,
                "eventbus",
            ),
            Alert(
                "EventBusStreamWithoutLeader",
                _is("eventbus_jetstream_stream_leader", 0),
                "critical",
                "Event BUS stream {{ $labels.stream }} has had no leader for a minute, as "
                "front-end {{ $labels.instance }} reads it",
                "No quorum of its replicas' servers (or none answers): no event is stored or "
                "broadcast. An election takes 4-9 s; see /status (jetstream.stream_cluster, "
                "jetstream.servers) and the nats-servers' logs.",
                60,
                "eventbus",
            ),
            Alert(
                "EventBusStreamReplicaNotCurrent",
                _is("eventbus_jetstream_replica_current", 0),
                "warning",
                "Event BUS stream {{ $labels.stream }}'s replica {{ $labels.replica }} is not "
                "current (front-end {{ $labels.instance }})",
                _NOT_CURRENT,
                120,
                "eventbus",
            ),
            Alert(
                "EventBusStreamReplicaLagging",
                _above("eventbus_jetstream_replica_lag", 10000),
                "warning",
                "Event BUS stream {{ $labels.stream }}'s replica {{ $labels.replica }} is "
                "{{ $value }} operations behind its leader (front-end {{ $labels.instance }})",
                _LAGGING,
                300,
                "eventbus",
            ),
            Alert(
                "EmqpNatsUnreachable",
                _is("emqp_jetstream_connected", 0),
                "critical",
                "eMQP broker {{ $labels.instance }} cannot reach NATS",
                "Its guaranteed requests and schedules live in JetStream (--store jetstream): its "
                "client port waits until one of the --nats servers answers again.",
                60,
                "emqp",
            ),
            Alert(
                "Mc0NatsUnreachable",
                _is("mc0_nats_connected", 0),
                "critical",
                "mc0 broker {{ $labels.instance }} cannot reach NATS",
                "Its clients' PUTs reach its own subscribers only, held until their TTL and then "
                "refused (expired), and nothing PUT at other brokers reaches it, until one of "
                "the --nats servers answers again.",
                60,
                "mc0",
            ),
            Alert(
                "EmqpJetStreamRefusing",
                _is("emqp_jetstream_refusing", 1),
                "critical",
                "JetStream does not store eMQP broker {{ $labels.instance }}'s guaranteed requests",
                "No leader or no quorum for the EMQP stream: the client port is paused until the "
                "stream takes appends again.",
                120,
                "emqp",
            ),
            Alert(
                "EmqpQueueNotPulled",
                And(
                    And(
                        _above("emqp_jetstream_queue_pending", 0),
                        _above("emqp_jetstream_queue_ready_slots", 0),
                        _QUEUE,
                    ),
                    Compare(
                        SecondsSince(
                            Series("emqp_jetstream_queue_last_delivery_timestamp_seconds")
                        ),
                        ">",
                        60,
                    ),
                    _QUEUE,
                ),
                "critical",
                "eMQP queue {{ $labels.queue }} on {{ $labels.instance }} has requests and ready "
                "workers but gets none",
                "Its JetStream consumer holds requests and this broker's workers are ready, but "
                "nothing was delivered here for minutes: see the broker's /status "
                "(jetstream.queues) and its log.",
                120,
                "emqp",
            ),
            Alert(
                "EmqpStreamWithoutLeader",
                _is("emqp_jetstream_stream_leader", 0),
                "critical",
                "eMQP stream {{ $labels.stream }} has had no leader for a minute, as broker "
                "{{ $labels.instance }} reads it",
                "No quorum of its replicas' servers (or none answers): the requests' stream "
                "stores no guaranteed request (client ports wait), the schedules' bucket "
                "(KV_...) takes no change and fires no run. An election takes 4-9 s; see "
                "/status (jetstream.stream_clusters, jetstream.servers) and the nats-servers' "
                "logs.",
                60,
                "emqp",
            ),
            Alert(
                "EmqpQueueConsumerWithoutLeader",
                _is("emqp_jetstream_queue_consumer_leader", 0),
                "critical",
                "eMQP queue {{ $labels.queue }}'s JetStream consumer has had no leader for a "
                "minute, as broker {{ $labels.instance }} reads it",
                "No broker is delivered the queue's requests until its consumer has a leader "
                "again: see /status (jetstream.consumers, jetstream.servers) and the "
                "nats-servers' logs.",
                60,
                "emqp",
            ),
            Alert(
                "EmqpStreamReplicaNotCurrent",
                _is("emqp_jetstream_replica_current", 0),
                "warning",
                "eMQP stream {{ $labels.stream }}'s replica {{ $labels.replica }} is not current "
                "(broker {{ $labels.instance }})",
                _NOT_CURRENT,
                120,
                "emqp",
            ),
            Alert(
                "EmqpStreamReplicaLagging",
                _above("emqp_jetstream_replica_lag", 10000),
                "warning",
                "eMQP stream {{ $labels.stream }}'s replica {{ $labels.replica }} is "
                "{{ $value }} operations behind its leader (broker {{ $labels.instance }})",
                _LAGGING,
                300,
                "emqp",
            ),
        ),
    ),
    Group(
        "bus-services",
        (
            Alert(
                "BusServiceDown",
                _is("bus_service_up", 0),
                "critical",
                "{{ $labels.service }} on {{ $labels.instance }} is not running",
                "A composed service stopped while its process goes on.",
                60,
            ),
        ),
    ),
)


def alerts() -> list[Alert]:
    """Every alerting rule, in the file's order."""
    return [rule for group in GROUPS for rule in group.rules]


HEADER = """\
# Prometheus alerting rules for bus (`twistd -n eventbus` and each service's own plugin).
#
# GENERATED from bus/web/alerts/rules.py by `make alerts-yml`: edit the definition there, not
# this file (tests/test_alert_rules.py fails when the two differ). The console evaluates the
# same definition over the product's own samples (/api/v1/alerts).
#
# Load it with `rule_files: [alerts.yml]` in prometheus.yml (docs/operations.md, "Prometheus").
# Every expression reads series the product's /metrics exports (tests/test_prometheus.py checks
# it against running servers); the logic is unit-tested with `promtool test rules alerts_test.yml`.
#
# Alerts carry the target's `job` and `instance`. The pair's two servers are told apart from
# other pairs by their labels other than `instance`: give each pair its own job (or a `pair`
# target label) in the scrape configuration.
#
# Thresholds and `for:` durations are starting points: tune them to your traffic.
"""

_WIDTH = 96


def _folded(key: str, text: str, indent: str) -> list[str]:
    """``key: >-`` and ``text`` wrapped under it (YAML folds it back to one line)."""
    body = textwrap.wrap(
        text, _WIDTH - len(indent) - 2, break_long_words=False, break_on_hyphens=False
    )
    return [f"{indent}{key}: >-", *(f"{indent}  {line}" for line in body)]


def _scalar(key: str, text: str, indent: str) -> list[str]:
    """``key: text``, plain (however long) when YAML reads it back as the same string, else
    folded."""
    plain = f"{indent}{key}: {text}"
    risky = ": " in text or " #" in text or text[:1] in "!&*{}[]|>'\"%@`#,?-"
    if risky:
        return _folded(key, text, indent)
    return [plain]


def _quoted(key: str, text: str, indent: str) -> list[str]:
    return [f"{indent}{key}: {json.dumps(text, ensure_ascii=False)}"]


def to_yaml() -> str:
    """The rules file, as ``docs/prometheus/alerts.yml`` holds it."""
    lines = [HEADER.rstrip("\n"), "groups:"]
    for index, group in enumerate(GROUPS):
        if index:
            lines.append("")
        lines += [f"  - name: {group.name}", "    rules:"]
        for record in group.records:
            if record.comment:
                lines += [f"      # {line}" for line in textwrap.wrap(record.comment, _WIDTH - 8)]
            for expr, labels in record.parts:
                lines += [f"      - record: {record.name}"]
                lines += _scalar("expr", expr.promql(), "        ")
                if labels:
                    lines.append("        labels:")
                    lines += [f"          {k}: {v}" for k, v in sorted(labels.items())]
        for rule in group.rules:
            lines.append(f"      - alert: {rule.name}")
            lines += _scalar("expr", rule.expr.promql(), "        ")
            if rule.for_:
                lines.append(f"        for: {duration(rule.for_)}")
            lines += ["        labels:", f"          severity: {rule.severity}"]
            lines.append("        annotations:")
            lines += _quoted("summary", rule.summary, "          ")
            lines += _folded("description", rule.description, "          ")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(to_yaml())
