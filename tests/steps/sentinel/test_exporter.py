"""``dsx exporter``: the fleet's state that lives in dsx's ConfigMaps (breaker, taint budget, goodput
report), read at most every refresh, each source up or down on its own."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from prometheus_client import CollectorRegistry

from steps.cluster import connect
from steps.cluster.port import ClusterPort
from steps.sentinel.budget import BUDGET_CONFIGMAP
from steps.sentinel.exporter import FleetExporter
from steps.sentinel.goodput.keep import REPORT_CONFIGMAP
from steps.sentinel.goodput.ledger_report import report
from steps.sentinel.goodput.metrics import exposition
from steps.sentinel.policy import BREAKER_CONFIGMAP
from tests.cli import dsx_here

TRIPPED = "2026-03-02T04:05:06Z"


def _registry(
    port: ClusterPort, refresh_s: float = 0.0, clock: list[float] | None = None
) -> CollectorRegistry:
    times = clock if clock is not None else [0.0]
    registry = CollectorRegistry()
    registry.register(FleetExporter(port, refresh_s=refresh_s, clock=lambda: times[0]))
    return registry


def _put(port: ClusterPort, name: str, data: dict[str, str]) -> None:
    port.update_state(name, lambda _old: data)


def test_breaker_and_budget_as_stored() -> None:
    port = connect("sim:nodes=4,gpu=h100")
    registry = _registry(port)
    assert registry.get_sample_value("dsx_sentinel_breaker_open") == 0
    assert registry.get_sample_value("dsx_sentinel_taint_budget_held") == 0
    _put(
        port,
        BREAKER_CONFIGMAP,
        {
            "state": "open",
            "admitted": json.dumps({"node-01": TRIPPED, "node-02": TRIPPED}),
            "tripped-at": TRIPPED,
            "tripped-reason": "too many",
        },
    )
    _put(
        port,
        BUDGET_CONFIGMAP,
        {"state": "held", "tainted": json.dumps({"node-03": TRIPPED}), "held-at": TRIPPED},
    )
    assert registry.get_sample_value("dsx_sentinel_breaker_open") == 1
    assert registry.get_sample_value("dsx_sentinel_breaker_admitted_nodes") == 2
    stamp = dt.datetime(2026, 3, 2, 4, 5, 6, tzinfo=dt.UTC).timestamp()
    assert registry.get_sample_value("dsx_sentinel_breaker_tripped_timestamp_seconds") == stamp
    assert registry.get_sample_value("dsx_sentinel_taint_budget_held") == 1
    assert registry.get_sample_value("dsx_sentinel_taint_budget_held_timestamp_seconds") == stamp
    assert registry.get_sample_value("dsx_sentinel_taint_budget_tainted_nodes") == 1
    for source in ("breaker", "taint-budget", "goodput"):
        assert registry.get_sample_value("dsx_exporter_source_up", {"source": source}) == 1


def test_the_goodput_reports_own_metrics_are_served() -> None:
    port = connect("sim:nodes=4,gpu=h100")
    registry = _registry(port)
    assert registry.get_sample_value("dsx_goodput_report_present") == 0
    assert registry.get_sample_value("dsx_goodput_until_timestamp_seconds") is None
    until = dt.datetime(2026, 3, 8, tzinfo=dt.UTC)
    text = exposition(report(port, until - dt.timedelta(days=7), until))
    port.create_object(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": REPORT_CONFIGMAP, "namespace": port.namespace},
            "data": {"metrics.prom": text},
        }
    )
    assert registry.get_sample_value("dsx_goodput_report_present") == 1
    assert registry.get_sample_value("dsx_goodput_until_timestamp_seconds") == until.timestamp()
    assert registry.get_sample_value("dsx_goodput_availability_ratio") == 1


def test_a_source_that_cannot_be_read_is_down_and_the_others_still_export() -> None:
    port = connect("sim:nodes=4,gpu=h100")
    _put(port, BREAKER_CONFIGMAP, {"state": "open", "admitted": "not json"})
    registry = _registry(port)
    assert registry.get_sample_value("dsx_exporter_source_up", {"source": "breaker"}) == 0
    assert registry.get_sample_value("dsx_sentinel_breaker_open") is None
    assert registry.get_sample_value("dsx_exporter_source_up", {"source": "taint-budget"}) == 1
    assert registry.get_sample_value("dsx_sentinel_taint_budget_held") == 0


def test_sources_are_read_at_most_every_refresh() -> None:
    port = connect("sim:nodes=4,gpu=h100")
    clock = [100.0]
    registry = _registry(port, refresh_s=30, clock=clock)
    assert registry.get_sample_value("dsx_sentinel_breaker_open") == 0
    _put(port, BREAKER_CONFIGMAP, {"state": "open", "admitted": "{}"})
    clock[0] = 129.0
    assert registry.get_sample_value("dsx_sentinel_breaker_open") == 0
    clock[0] = 130.0
    assert registry.get_sample_value("dsx_sentinel_breaker_open") == 1


def test_dsx_exporter_once_prints_the_metrics(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = dsx_here(capsys, "exporter", "--once", "--cluster", "sim:nodes=2,gpu=h100")
    assert code == 0, err
    assert "dsx_sentinel_breaker_open 0.0" in out
    assert "dsx_certification_report_present 0.0" in out
    code, _, err = dsx_here(capsys, "exporter", "--port", "0")
    assert code == 2 and "--port" in err


def test_served_over_http() -> None:
    import urllib.request

    from steps.sentinel.exporter import serve

    server = serve(FleetExporter(connect("sim:nodes=2,gpu=h100")), "127.0.0.1", 0)
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        with urllib.request.urlopen(f"{base}/metrics", timeout=5) as response:
            assert "dsx_sentinel_breaker_open 0.0" in response.read().decode()
        with urllib.request.urlopen(f"{base}/healthz", timeout=5) as response:
            assert response.status == 200
    finally:
        server.shutdown()
