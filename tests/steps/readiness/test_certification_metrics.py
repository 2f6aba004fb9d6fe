"""The newest certification report's figures as metrics (a source of ``dsx exporter``): bandwidth per
subject against its floor, the stragglers a verdict names, each node's result."""

from __future__ import annotations

import datetime as dt

import pytest
from prometheus_client import CollectorRegistry

from steps.cluster import connect
from steps.cluster.port import ClusterPort
from steps.errors import DsxError
from steps.readiness.metrics import certification_metrics
from steps.readiness.models import Subject, Verdict
from steps.readiness.outcomes import RunRef, keep_report, newest_report
from steps.readiness.report import CertificationReport, NodeResult
from steps.sentinel.exporter import FleetExporter


def _report(status: str, finished: str) -> CertificationReport:
    node = Subject(kind="node", name="node-00")
    rack = Subject(kind="group", name="rack-01", members=["node-02", "node-03"])
    return CertificationReport(
        status=status,  # type: ignore[arg-type]
        summary="test",
        finished_at=finished,
        nodes=[NodeResult(name="node-00", status="passed"), NodeResult(name="node-02", status="failed")],
        verdicts=[
            Verdict(
                subject=node,
                test="node-nccl",
                status="pass",
                measured=181.5,
                threshold=150.0,
                unit="GB/s",
                message="ok",
            ),
            Verdict(
                subject=rack,
                test="group-nccl",
                status="fail",
                measured=0.46,
                threshold=0.15,
                unit="skew",
                node="node-02",
                message="straggler",
            ),
        ],
    )


def _registry(port: ClusterPort) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(FleetExporter(port, [("certification", certification_metrics)], refresh_s=0))
    return registry


def keep_sample_report(port: ClusterPort) -> None:
    """Keep a failed report of a node that passed and a rack whose straggler is node-02."""
    run = RunRef(name="dsx-certify-a", uid="a", namespace=port.namespace)
    keep_report(port, run, _report("failed", "2026-03-01T00:00:00Z").model_dump_json(), "# report")


def test_the_newest_reports_figures() -> None:
    port = connect("sim:nodes=4,gpu=h100")
    registry = _registry(port)
    assert registry.get_sample_value("dsx_certification_report_present") == 0
    keep_sample_report(port)
    assert registry.get_sample_value("dsx_certification_report_present") == 1
    assert registry.get_sample_value("dsx_certification_report_passed") == 0
    assert (
        registry.get_sample_value("dsx_certification_report_finished_timestamp_seconds")
        == dt.datetime(2026, 3, 1, tzinfo=dt.UTC).timestamp()
    )
    node = {"subject": "node-00", "subject_kind": "node", "test": "node-nccl"}
    assert registry.get_sample_value("dsx_certification_busbw_gigabytes_per_second", node) == 181.5
    assert registry.get_sample_value("dsx_certification_busbw_floor_gigabytes_per_second", node) == 150.0
    straggler = {"subject": "rack-01", "subject_kind": "group", "test": "group-nccl", "node": "node-02"}
    assert registry.get_sample_value("dsx_certification_straggler_skew", straggler) == 0.46
    assert registry.get_sample_value("dsx_certification_straggler_skew_threshold", straggler) == 0.15
    assert registry.get_sample_value("dsx_certification_verdict", {**node, "status": "pass"}) == 1
    assert (
        registry.get_sample_value("dsx_certification_node_result", {"node": "node-02", "result": "failed"})
        == 1
    )


def test_an_unreadable_report_is_an_error_naming_its_configmap() -> None:
    port = connect("sim:nodes=4,gpu=h100")
    port.create_object(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": "dsx-report-x",
                "namespace": port.namespace,
                "labels": {"dsx.dev/certification-report": "true"},
            },
            "binaryData": {"report.json.gz": "bm90IGd6aXA="},
        }
    )
    with pytest.raises(DsxError, match="dsx-report-x"):
        certification_metrics(port)
    assert _registry(port).get_sample_value("dsx_exporter_source_up", {"source": "certification"}) == 0


def test_the_newest_report_is_read_and_only_the_newest_are_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DSX_REPORTS_KEPT", "2")
    port = connect("sim:nodes=4,gpu=h100")
    for name, status in (
        ("dsx-certify-a", "failed"),
        ("dsx-certify-b", "failed"),
        ("dsx-certify-c", "passed"),
    ):
        run = RunRef(name=name, uid=name[-1], namespace=port.namespace)
        keep_report(port, run, _report(status, "2026-03-01T00:00:00Z").model_dump_json(), "# report")
    kept = port.list_objects("v1", "ConfigMap", port.namespace, "dsx.dev/certification-report=true")
    assert sorted(o["metadata"]["name"] for o in kept) == [
        "dsx-report-dsx-certify-b",
        "dsx-report-dsx-certify-c",
    ]
    found = newest_report(port, port.namespace)
    assert found is not None and found[0] == "dsx-report-dsx-certify-c"
    assert _registry(port).get_sample_value("dsx_certification_report_passed") == 1
