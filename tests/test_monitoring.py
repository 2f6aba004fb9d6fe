"""dsx's alerts, recording rules and dashboards (charts/dsx/monitoring), checked by Debian's promtool: the
rules are valid, each alert fires on a synthetic series of its fault and stays silent on a healthy one, every
metric a rule or a dashboard reads is one dsx exports, and every dashboard query parses."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests import yamltext
from tests.monitoring import (
    PROMETHEUS_OWN,
    RULES,
    alerts,
    concrete,
    dashboard_queries,
    dashboards,
    metric_names,
    rules,
)
from tests.paths import REPO, prometheus_binaries

AGENT = {"job": "dsx-sentinel", "instance": "10.0.0.1:9400", "node": "node-01"}
EXPORTER = {"job": "dsx-exporter", "instance": "10.0.0.9:9401"}
DAY = 86400


def _series(name: str, labels: dict[str, str], values: str) -> dict[str, str]:
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return {"series": f"{name}{{{inner}}}", "values": values}


def _node_state(state: str, labels: dict[str, str] = AGENT, minutes: int = 40) -> list[dict[str, str]]:
    """The one-hot dsx_sentinel_node_state of a node in ``state``, flat for ``minutes``."""
    values = ["none", "quarantined", "draining", "awaiting-repair", "recertifying", "escalated"]
    return [
        _series("dsx_sentinel_node_state", {**labels, "state": s}, f"{int(s == state)}x{minutes}")
        for s in values
    ]


def _certification(verdict: str, minutes: int = 90) -> list[dict[str, str]]:
    return [
        _series(
            "dsx_sentinel_node_certification", {**AGENT, "certification": c}, f"{int(c == verdict)}x{minutes}"
        )
        for c in ("none", "passed", "failed", "pending")
    ]


@dataclass
class Case:
    """One alert's test: the series of a fault (it fires at ``at`` with ``labels``) and of a healthy fleet
    (silent at ``at``)."""

    fault: list[dict[str, str]]
    healthy: list[dict[str, str]]
    at: str
    labels: dict[str, str] = field(default_factory=dict)
    before: str | None = None
    """A time within the alert's ``for:`` when the fault's series must not fire yet."""


STAMP_OLD = 1_700_000_000  # the state or certification began long before the test's time 0
CASES: dict[str, Case] = {
    "DsxNodeTaintedWithoutRemediation": Case(
        fault=[_series("dsx_sentinel_node_tainted", AGENT, "1x40"), *_node_state("none")],
        healthy=[_series("dsx_sentinel_node_tainted", AGENT, "1x40"), *_node_state("draining")],
        at="20m",
        before="10m",
        labels=AGENT,
    ),
    "DsxQuarantineBreakerOpen": Case(
        fault=[_series("dsx_sentinel_breaker_open", EXPORTER, "1x10")],
        healthy=[_series("dsx_sentinel_breaker_open", EXPORTER, "0x10")],
        at="5m",
        labels=EXPORTER,
    ),
    "DsxTaintBudgetReached": Case(
        fault=[_series("dsx_sentinel_taint_budget_held", EXPORTER, "1x10")],
        healthy=[_series("dsx_sentinel_taint_budget_held", EXPORTER, "0x10")],
        at="5m",
        labels=EXPORTER,
    ),
    "DsxRemediationEscalated": Case(
        fault=_node_state("escalated"),
        healthy=_node_state("recertifying"),
        at="5m",
        labels={**AGENT, "state": "escalated"},
    ),
    "DsxNodeAwaitingRepairPastDeadline": Case(
        # in awaiting-repair since 5 h before time 0 (the test's clock starts at the Unix epoch)
        fault=[
            _series("dsx_sentinel_node_state_since_timestamp_seconds", AGENT, f"{-5 * 3600}x40"),
            *_node_state("awaiting-repair"),
        ],
        healthy=[
            _series("dsx_sentinel_node_state_since_timestamp_seconds", AGENT, "0x40"),
            *_node_state("awaiting-repair"),
        ],
        at="20m",
        before="10m",
        labels=AGENT,
    ),
    "DsxSentinelAgentDown": Case(
        fault=[_series("up", AGENT, "0x10")],
        healthy=[_series("up", AGENT, "1x10")],
        at="7m",
        labels=AGENT,
    ),
    "DsxSentinelAgentGone": Case(
        # reported for 10 minutes, then no more (the series ends), while node-02's agent goes on
        fault=[
            _series("dsx_sentinel_last_pass_timestamp_seconds", AGENT, "0+60x10"),
            _series("dsx_sentinel_last_pass_timestamp_seconds", {**AGENT, "node": "node-02"}, "0+60x40"),
        ],
        # restarted: a new pod (instance) on the same node reports on
        healthy=[
            _series("dsx_sentinel_last_pass_timestamp_seconds", AGENT, "0+60x10"),
            _series(
                "dsx_sentinel_last_pass_timestamp_seconds",
                {**AGENT, "instance": "10.0.0.2:9400"},
                "_x10 600+60x30",
            ),
        ],
        at="25m",
        labels={"node": "node-01"},
    ),
    "DsxSentinelAgentNotReporting": Case(
        fault=[_series("dsx_sentinel_last_pass_timestamp_seconds", AGENT, "0x30")],
        healthy=[_series("dsx_sentinel_last_pass_timestamp_seconds", AGENT, "0+60x30")],
        at="15m",
        labels=AGENT,
    ),
    "DsxCertificationFailed": Case(
        fault=_certification("failed", 20),
        healthy=_certification("passed", 20),
        at="10m",
        labels={**AGENT, "certification": "failed"},
    ),
    "DsxCertificationStale": Case(
        fault=[
            _series("dsx_sentinel_node_certified_timestamp_seconds", AGENT, f"{-40 * DAY}x90"),
            *_certification("passed"),
        ],
        healthy=[
            _series("dsx_sentinel_node_certified_timestamp_seconds", AGENT, f"{-2 * DAY}x90"),
            *_certification("passed"),
        ],
        at="80m",
        labels=AGENT,
    ),
    "DsxDriftFound": Case(
        fault=[_series("dsx_sentinel_node_drift", AGENT, "1x20")],
        healthy=[_series("dsx_sentinel_node_drift", AGENT, "0x20")],
        at="15m",
        labels=AGENT,
    ),
    "DsxGoodputReportMissing": Case(
        fault=[_series("dsx_goodput_report_present", EXPORTER, "0x90")],
        healthy=[
            _series("dsx_goodput_report_present", EXPORTER, "1x90"),
            _series("dsx_goodput_until_timestamp_seconds", EXPORTER, f"{-2 * DAY}x90"),
        ],
        at="80m",
        labels=EXPORTER,
    ),
    "DsxExporterAbsent": Case(
        fault=[_series("dsx_sentinel_breaker_open", EXPORTER, "0x30")],
        healthy=[_series("dsx_exporter_refresh_timestamp_seconds", EXPORTER, "0+60x30")],
        at="20m",
        labels={},
    ),
    "DsxExporterSourceDown": Case(
        fault=[_series("dsx_exporter_source_up", {**EXPORTER, "source": "breaker"}, "0x30")],
        healthy=[_series("dsx_exporter_source_up", {**EXPORTER, "source": "breaker"}, "1x30")],
        at="20m",
        labels={**EXPORTER, "source": "breaker"},
    ),
}


def _rendered(text: str, labels: dict[str, str]) -> str:
    """An annotation as Prometheus renders it for an alert of ``labels`` (they use only ``$labels``)."""
    return re.sub(r"\{\{\s*\$labels\.(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), text)


def _unit_tests(tmp: Path) -> Path:
    tests: list[dict[str, Any]] = []
    for rule in alerts():
        case = CASES[rule["alert"]]
        labels = {**case.labels, **rule["labels"]}
        expected = {
            "exp_labels": labels,
            "exp_annotations": {k: _rendered(v, labels) for k, v in rule["annotations"].items()},
        }
        checks = [{"eval_time": case.at, "alertname": rule["alert"], "exp_alerts": [expected]}]
        if case.before is not None:
            checks.append({"eval_time": case.before, "alertname": rule["alert"], "exp_alerts": []})
        tests.append(
            {
                "name": f"{rule['alert']} fires",
                "interval": "1m",
                "input_series": case.fault,
                "alert_rule_test": checks,
            }
        )
        tests.append(
            {
                "name": f"{rule['alert']} stays silent on a healthy fleet",
                "interval": "1m",
                "input_series": case.healthy,
                "alert_rule_test": [{"eval_time": case.at, "alertname": rule["alert"], "exp_alerts": []}],
            }
        )
    path = tmp / "dsx_rules_test.yaml"
    path.write_text(yaml.safe_dump({"rule_files": [str(RULES)], "evaluation_interval": "1m", "tests": tests}))
    return path


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    _, promtool = prometheus_binaries()
    return subprocess.run([promtool, *args], capture_output=True, text=True, check=False, timeout=120)


def test_the_rules_pass_promtool_check_rules() -> None:
    checked = _promtool("check", "rules", str(RULES))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS" in checked.stdout


def test_each_alert_fires_on_its_fault_and_stays_silent_on_a_healthy_fleet(tmp_path: Path) -> None:
    assert sorted(CASES) == sorted(a["alert"] for a in alerts()), "every alert has its case, and only those"
    tested = _promtool("test", "rules", str(_unit_tests(tmp_path)))
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def test_a_test_that_expects_the_wrong_thing_fails(tmp_path: Path) -> None:
    """The harness can fail: the healthy series of the tainted-node alert made to expect it."""
    path = _unit_tests(tmp_path)
    data = yamltext.load(path.read_text())
    silent = next(t for t in data["tests"] if t["name"] == "DsxNodeTaintedWithoutRemediation fires")
    silent["input_series"] = CASES["DsxNodeTaintedWithoutRemediation"].healthy
    path.write_text(yaml.safe_dump(data))
    assert _promtool("test", "rules", str(path)).returncode != 0


def test_every_alert_says_what_where_how_bad_and_where_to_look() -> None:
    readme = (REPO / "README.md").read_text()
    runbook = readme[readme.index("\n## Runbook") :]
    for rule in alerts():
        name, notes = rule["alert"], rule["annotations"]
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, name
        assert {"summary", "description", "runbook"} <= set(notes), name
        assert "`dsx " in notes["description"], f"{name}: its description names no dsx command"
        if "node" in CASES[name].labels:
            assert "{{ $labels.node }}" in notes["description"], f"{name}: its description names no node"
        assert f"\n### {name}\n" in runbook, f"{name}: no runbook section in the README"


# ----------------------------------------------------------------- metric names


def _exported_names() -> set[str]:
    """Every series name dsx's registries expose: the agent's, the exporter's sources' and the goodput
    report's, read from the code's prometheus-client collectors on a simulated fleet."""
    import datetime as dt

    from prometheus_client import CollectorRegistry

    from steps.cluster import connect
    from steps.readiness.metrics import certification_metrics
    from steps.sentinel.agent import Metrics
    from steps.sentinel.exporter import SENTINEL_SOURCES, FleetExporter
    from steps.sentinel.goodput.keep import REPORT_CONFIGMAP
    from steps.sentinel.goodput.ledger_report import report
    from steps.sentinel.goodput.metrics import exposition
    from tests.steps.readiness.test_certification_metrics import keep_sample_report

    names: set[str] = set()
    agent = Metrics()
    agent.unhealthy.labels("xid", "gpu", "GPU-0", "fatal").set(1)
    agent.events.labels("xid", "fatal", "false").inc()
    for counter in (agent.probe_errors, agent.probe_timeouts, agent.dropped, agent.taint_withheld):
        counter.labels("x").inc()
    agent.node_state.labels("none").set(1)
    agent.node_certification.labels("none").set(1)
    agent.pass_seconds.observe(0.01)
    port = connect("sim:nodes=2,gpu=h100")
    until = dt.datetime(2026, 3, 8, tzinfo=dt.UTC)
    port.create_object(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": REPORT_CONFIGMAP, "namespace": port.namespace},
            "data": {"metrics.prom": exposition(report(port, until - dt.timedelta(days=7), until))},
        }
    )
    keep_sample_report(port)
    fleet = CollectorRegistry()
    fleet.register(
        FleetExporter(port, [*SENTINEL_SOURCES, ("certification", certification_metrics)], refresh_s=0)
    )
    suffixes = {
        "counter": ["_total"],
        "histogram": ["_bucket", "_sum", "_count"],
        "summary": ["_sum", "_count"],
    }
    for registry in (agent.registry, fleet):
        for (
            family
        ) in registry.collect():  # a family without samples yet (no label set) still names its series
            names.update(family.name + suffix for suffix in suffixes.get(family.type, [""]))
            names.update(sample.name for sample in family.samples)
    return names


def _recorded() -> set[str]:
    return {r["record"] for g in rules()["groups"] for r in g["rules"] if "record" in r}


def test_every_metric_a_rule_or_dashboard_reads_is_one_dsx_exports() -> None:
    exported = _exported_names()
    known = exported | _recorded() | PROMETHEUS_OWN
    assert {
        "dsx_sentinel_node_tainted",
        "dsx_sentinel_breaker_open",
        "dsx_goodput_until_timestamp_seconds",
        "dsx_certification_busbw_gigabytes_per_second",
        "dsx_sentinel_health_events_total",
    } <= exported
    unknown: dict[str, set[str]] = {}
    for group in rules()["groups"]:
        for rule in group["rules"]:
            missing = metric_names(rule["expr"]) - known
            if missing:
                unknown[rule.get("alert") or rule["record"]] = missing
    for name, dashboard in dashboards().items():
        for query in dashboard_queries(dashboard):
            missing = metric_names(concrete(query)) - known
            if missing:
                unknown[f"{name}: {query}"] = missing
    assert unknown == {}


def test_the_metric_name_check_can_fail() -> None:
    assert metric_names('sum by (node) (rate(dsx_sentinel_health_events_total{check="xid"}[5m])) > 0') == {
        "dsx_sentinel_health_events_total"
    }
    assert metric_names("dsx_sentinel_node_taint == 1 and ignoring (state) up") == {
        "dsx_sentinel_node_taint",
        "up",
    }
    assert "dsx_sentinel_node_taint" not in _exported_names()


def test_every_dashboard_query_parses(tmp_path: Path) -> None:
    """Each dashboard's queries as recording rules of one rules file, read by promtool."""
    found = dashboards()
    assert sorted(found) == [
        "dsx-certification.json",
        "dsx-fleet-health.json",
        "dsx-goodput.json",
        "dsx-remediation.json",
    ]
    groups = []
    for name, dashboard in found.items():
        queries = dashboard_queries(dashboard)
        assert queries, name
        records = [{"record": f"dsx_dashboard:q{i}", "expr": concrete(q)} for i, q in enumerate(queries)]
        groups.append({"name": name, "rules": records})
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": groups}))
    checked = _promtool("check", "rules", str(path))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    path.write_text(
        yaml.safe_dump({"groups": [{"name": "bad", "rules": [{"record": "x", "expr": "sum(rate(x[5m])"}]}]})
    )
    assert _promtool("check", "rules", str(path)).returncode != 0
