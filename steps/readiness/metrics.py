"""The newest certification report's figures as Prometheus metrics (a source of ``dsx exporter``).

Read from the report ConfigMap the report step keeps (``dsx-report-<workflow>``, the newest of the
namespace): when it finished and whether it passed, each node's result, every verdict's status, and the
figures a dashboard draws against their thresholds: bus bandwidth per subject against the floor, and the
skew of the stragglers a verdict names.
"""

from __future__ import annotations

from prometheus_client.core import GaugeMetricFamily, Metric

from steps.cluster.changes import timestamp_or_zero
from steps.cluster.port import ClusterPort
from steps.errors import DsxError
from steps.readiness.outcomes import newest_report
from steps.readiness.report import CertificationReport

__all__ = ["certification_metrics"]

_SUBJECT = ["subject", "subject_kind", "test"]


def certification_metrics(port: ClusterPort) -> list[Metric]:
    """The newest report's metrics (only ``dsx_certification_report_present`` 0 when none is kept).

    Raises:
        DsxError: the newest report's ConfigMap holds no readable report.
    """
    found = newest_report(port, port.namespace)
    present = GaugeMetricFamily(
        "dsx_certification_report_present",
        "1 when a certification report is kept in the namespace.",
        value=found is not None,
    )
    if found is None:
        return [present]
    name, text = found
    try:
        report = CertificationReport.model_validate_json(text)
    except ValueError as exc:
        raise DsxError(f"ConfigMap {name}: not a certification report ({exc})") from None
    return [present, *_report_metrics(name, report), *_verdict_metrics(report)]


def _report_metrics(name: str, report: CertificationReport) -> list[Metric]:
    """The report's own figures: which it is, when it finished, whether it passed, each node's result."""
    info = GaugeMetricFamily(
        "dsx_certification_report_info",
        "The newest certification report (1).",
        labels=["configmap", "status"],
    )
    info.add_metric([name, report.status], 1)
    finished = GaugeMetricFamily(
        "dsx_certification_report_finished_timestamp_seconds",
        "When the newest certification report was written.",
        value=timestamp_or_zero(report.finished_at),
    )
    passed = GaugeMetricFamily(
        "dsx_certification_report_passed",
        "1 when the newest certification passed.",
        value=report.status == "passed",
    )
    nodes = GaugeMetricFamily(
        "dsx_certification_node_result",
        "1 for each node's result in the newest report (passed, failed, pending).",
        labels=["node", "result"],
    )
    for node in report.nodes:
        nodes.add_metric([node.name, node.status], 1)
    return [info, finished, passed, nodes]


def _verdict_metrics(report: CertificationReport) -> list[Metric]:
    """Every verdict's status, and the figures a dashboard draws against their thresholds."""
    verdicts = GaugeMetricFamily(
        "dsx_certification_verdict",
        "1 for each verdict of the newest report, by status.",
        labels=[*_SUBJECT, "status"],
    )
    busbw = GaugeMetricFamily(
        "dsx_certification_busbw_gigabytes_per_second",
        "Bus bandwidth a verdict measured (GB/s).",
        labels=_SUBJECT,
    )
    floor = GaugeMetricFamily(
        "dsx_certification_busbw_floor_gigabytes_per_second",
        "The bus bandwidth the verdict's subject had to reach (GB/s).",
        labels=_SUBJECT,
    )
    skew = GaugeMetricFamily(
        "dsx_certification_straggler_skew",
        "Skew of the rank a verdict names as a straggler (time outside the collective against the median).",
        labels=[*_SUBJECT, "node"],
    )
    skew_limit = GaugeMetricFamily(
        "dsx_certification_straggler_skew_threshold",
        "The skew past which a rank is a straggler.",
        labels=[*_SUBJECT, "node"],
    )
    seen: set[tuple[str, ...]] = set()
    for verdict in report.verdicts:
        key = [verdict.subject.name, verdict.subject.kind, verdict.test]
        if (*key, verdict.status, verdict.node or "") in seen:
            continue  # one series each: a repeated verdict (a retried check) is the same figure
        seen.add((*key, verdict.status, verdict.node or ""))
        verdicts.add_metric([*key, verdict.status], 1)
        if verdict.unit == "GB/s" and verdict.measured is not None:
            busbw.add_metric(key, verdict.measured)
            if verdict.threshold is not None:
                floor.add_metric(key, verdict.threshold)
        if verdict.unit == "skew" and verdict.node and verdict.measured is not None:
            skew.add_metric([*key, verdict.node], verdict.measured)
            if verdict.threshold is not None:
                skew_limit.add_metric([*key, verdict.node], verdict.threshold)
    return [verdicts, busbw, floor, skew, skew_limit]
