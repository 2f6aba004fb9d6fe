"""Prometheus metrics of a goodput report, in the text exposition format (a node-exporter textfile or
a file any scraper can read).

Gauges: nodes per state at the end of the period, node-hours and GPU-hours per state and GPU-hours lost
by cause over the period, the recertification pass ratio, the period; histograms: remediation duration
(quarantine to back in service) and detection latency (fault observed to quarantine). The report's own
period is in ``dsx_goodput_period_seconds`` and its end in ``dsx_goodput_until_timestamp_seconds``.
"""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest

from steps.cluster import changes
from steps.sentinel.goodput.ledger_report import STATES, GoodputReport

__all__ = ["DETECTION_BUCKETS", "REMEDIATION_BUCKETS", "exposition"]

REMEDIATION_BUCKETS = (300.0, 900.0, 1800.0, 3600.0, 7200.0, 14400.0, 28800.0, 86400.0, 172800.0, 604800.0)
"""Seconds: 5 min to a week."""
DETECTION_BUCKETS = (1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
"""Seconds: 1 s to an hour."""


def _registry(report: GoodputReport) -> CollectorRegistry:
    registry = CollectorRegistry()
    fleet = report.fleet
    nodes = Gauge(
        "dsx_goodput_nodes", "Nodes in each state at the end of the period.", ["state"], registry=registry
    )
    node_hours = Gauge(
        "dsx_goodput_node_hours",
        "Node-hours spent in each state over the period.",
        ["state"],
        registry=registry,
    )
    gpu_hours = Gauge(
        "dsx_goodput_gpu_hours",
        "GPU-hours spent in each state over the period.",
        ["state"],
        registry=registry,
    )
    for state in STATES:
        nodes.labels(state).set(fleet.nodes_by_state[state])
        node_hours.labels(state).set(fleet.hours_by_state[state])
        gpu_hours.labels(state).set(fleet.gpu_hours_by_state[state])
    lost = Gauge(
        "dsx_goodput_lost_gpu_hours",
        "GPU-hours out of service over the period, by cause.",
        ["cause"],
        registry=registry,
    )
    for cause, value in sorted(fleet.lost_by_cause.items()):
        lost.labels(cause).set(value)
    Gauge(
        "dsx_goodput_availability_ratio",
        "In-service GPU-hours over the fleet's: availability (work lost inside them is not counted).",
        registry=registry,
    ).set(math.nan if fleet.availability is None else fleet.availability)
    Gauge(
        "dsx_goodput_recertification_pass_ratio",
        "Recertifications of remediated nodes that passed (NaN: none in the period).",
        registry=registry,
    ).set(math.nan if fleet.recertification_pass_rate is None else fleet.recertification_pass_rate)
    Gauge("dsx_goodput_period_seconds", "The period the report covers.", registry=registry).set(
        report.period_hours * 3600
    )
    Gauge("dsx_goodput_until_timestamp_seconds", "The end of the period (Unix time).", registry=registry).set(
        changes.parse_time(report.until).timestamp()
    )
    repair = Histogram(
        "dsx_goodput_remediation_duration_seconds",
        "Remediations that brought their node back in the period: quarantine (cordon) to in service "
        "(uncordon).",
        buckets=REMEDIATION_BUCKETS,
        registry=registry,
    )
    detect = Histogram(
        "dsx_goodput_detection_latency_seconds",
        "Remediations in the period: fault observed by the agent to quarantine.",
        buckets=DETECTION_BUCKETS,
        registry=registry,
    )
    for remediation in report.remediations:
        if remediation.repair_s is not None:
            repair.observe(remediation.repair_s)
        if remediation.detect_s is not None:
            detect.observe(remediation.detect_s)
    return registry


def exposition(report: GoodputReport) -> str:
    """The report's metrics as Prometheus text. The client's ``_created`` series (the time this process
    made each histogram) are left out: the same report gives the same text."""
    kept = []
    for line in generate_latest(_registry(report)).decode().splitlines():
        words = line.split()
        name = words[2] if line.startswith("# ") and len(words) > 2 else line.split("{")[0].split(" ")[0]
        if not name.endswith("_created"):  # no metric of this report's own ends so
            kept.append(line)
    return "\n".join(kept) + "\n"
