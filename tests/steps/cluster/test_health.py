"""The health seam: the simulated fleet reports its GPUs and NICs; a real cluster's API reports none."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from steps.cluster import GpuReport, NodeHealthSource, NotFoundError, connect, health_source
from tests.steps.cluster.conftest import Backend

FAULTY = "sim:nodes=3,gpu=h100,faults=node-00:slow-nic;node-01:failing-gpu=5;node-02:slow-nvlink=100@2"


def test_the_simulated_fleet_reports_what_its_faults_left() -> None:
    source = health_source(connect(FAULTY))
    assert isinstance(source, NodeHealthSource)
    slow_nic = source.node_report("node-00")
    assert slow_nic.node == "node-00"
    assert slow_nic.link_gbps == slow_nic.nominal_link_gbps / 4
    assert all(g.healthy and g.nvlink_gbps == g.nominal_nvlink_gbps for g in slow_nic.gpus)
    failing = source.node_report("node-01")
    assert [g.index for g in failing.gpus if not g.healthy] == [5]
    assert failing.link_gbps == failing.nominal_link_gbps
    slow_nvlink = source.node_report("node-02").gpus[2]
    assert isinstance(slow_nvlink, GpuReport)
    assert slow_nvlink.nvlink_gbps == 100.0 < slow_nvlink.nominal_nvlink_gbps


def test_a_report_is_a_copy_the_reader_cannot_change() -> None:
    source = health_source(connect("sim:nodes=1"))
    assert source is not None
    report = source.node_report("node-00")
    with pytest.raises(ValueError, match="frozen"):
        report.link_gbps = 0.0  # type: ignore[misc]
    assert source.node_report("node-00").link_gbps > 0


def test_an_unknown_node_is_named() -> None:
    source = health_source(connect("sim:nodes=1"))
    assert source is not None
    with pytest.raises(NotFoundError, match="node-09"):
        source.node_report("node-09")


def test_only_the_simulated_fleet_is_a_health_source(make_backend: Callable[..., Backend]) -> None:
    backend = make_backend()
    assert (health_source(backend.port) is not None) == (backend.kind == "sim")
