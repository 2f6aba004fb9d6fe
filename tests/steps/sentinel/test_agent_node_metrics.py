"""What the agent's node carries, in its metrics (``dsx_sentinel_node_*``): the taint the moment the agent
makes it, and the state, certification, drift and cordon read from the node, at most every
``node_read_s`` seconds. Alerts read these (charts/dsx/monitoring/rules.yaml)."""

from __future__ import annotations

import datetime as dt

from steps.cluster import vocabulary as vocab
from steps.cluster.port import ClusterPort
from steps.cluster.sim import SimCluster
from steps.sentinel.agent import Agent
from steps.sentinel.catalogue import load_catalogue
from steps.sentinel.probes import NodeProbes
from tests.steps.sentinel.conftest import Fleet

NODE = "node-01"


def _agent(port: ClusterPort, hardware: SimCluster, node_read_s: float) -> Agent:
    class Source:  # the fleet's hardware behind whichever port the writes go through
        def node_report(self, node: str) -> object:
            return hardware.node_report(node)

    catalogue = load_catalogue()
    probes = NodeProbes(NODE, catalogue, Source(), lambda: dt.datetime.now(dt.UTC), 8)  # type: ignore[arg-type]
    return Agent(NODE, port, probes.probes(), catalogue, node_read_s=node_read_s)


def _value(agent: Agent, name: str, labels: dict[str, str] | None = None) -> float | None:
    return agent.metrics.registry.get_sample_value(name, labels or {})


def test_a_fatal_fault_counts_the_taint_at_once(fleet: Fleet) -> None:
    port, hardware, _ = fleet(f"sim:nodes=2,gpu=h100,workloads=false,faults={NODE}:xid=79@3")
    agent = _agent(port, hardware, node_read_s=3600)
    agent.read_node(force=True)
    assert _value(agent, "dsx_sentinel_node_tainted") == 0
    agent.run_once()  # the node is not read again (an hour has not passed): the taint is the agent's own
    assert port.get_node(NODE).has_taint(vocab.TAINT_UNHEALTHY, vocab.TAINT_UNHEALTHY_EFFECT)
    assert _value(agent, "dsx_sentinel_node_tainted") == 1
    assert _value(agent, "dsx_sentinel_node_state", {"state": "none"}) == 1
    assert _value(agent, "dsx_sentinel_node_state_since_timestamp_seconds") == 0


def test_state_certification_drift_and_cordon_come_from_the_node(fleet: Fleet) -> None:
    port, hardware, _ = fleet("sim:nodes=2,gpu=h100,workloads=false")
    agent = _agent(port, hardware, node_read_s=0)
    since, certified = "2026-03-01T10:00:00Z", "2026-02-20T08:30:00Z"
    port.cordon(NODE, "test", by="dsx")
    port.set_labels(
        NODE,
        {
            vocab.LABEL_STATE: "awaiting-repair",
            vocab.LABEL_CERTIFICATION: "failed",
            vocab.LABEL_DRIFT: "true",
        },
    )
    port.set_annotations(
        NODE, {vocab.ANNOTATION_STATE_SINCE: since, vocab.ANNOTATION_CERTIFIED_AT: certified}
    )
    before = dt.datetime.now(dt.UTC).timestamp()
    agent.run_once()
    states = {s: _value(agent, "dsx_sentinel_node_state", {"state": s}) for s in ["none", *vocab.NodeState]}
    assert states == {
        "none": 0,
        "quarantined": 0,
        "draining": 0,
        "awaiting-repair": 1,
        "recertifying": 0,
        "escalated": 0,
    }
    assert (
        _value(agent, "dsx_sentinel_node_state_since_timestamp_seconds")
        == dt.datetime(2026, 3, 1, 10, tzinfo=dt.UTC).timestamp()
    )
    assert _value(agent, "dsx_sentinel_node_certification", {"certification": "failed"}) == 1
    assert _value(agent, "dsx_sentinel_node_certification", {"certification": "passed"}) == 0
    assert (
        _value(agent, "dsx_sentinel_node_certified_timestamp_seconds")
        == dt.datetime(2026, 2, 20, 8, 30, tzinfo=dt.UTC).timestamp()
    )
    assert _value(agent, "dsx_sentinel_node_drift") == 1
    assert _value(agent, "dsx_sentinel_node_cordoned") == 1
    assert (_value(agent, "dsx_sentinel_node_read_timestamp_seconds") or 0) >= before

    # back in service: the next read says so
    port.uncordon(NODE, by="dsx")
    port.set_labels(
        NODE, {vocab.LABEL_STATE: None, vocab.LABEL_CERTIFICATION: "passed", vocab.LABEL_DRIFT: None}
    )
    port.set_annotations(NODE, {vocab.ANNOTATION_STATE_SINCE: "not a time"})
    agent.run_once()
    assert _value(agent, "dsx_sentinel_node_state", {"state": "none"}) == 1
    assert _value(agent, "dsx_sentinel_node_state", {"state": "awaiting-repair"}) == 0
    assert _value(agent, "dsx_sentinel_node_state_since_timestamp_seconds") == 0
    assert _value(agent, "dsx_sentinel_node_certification", {"certification": "passed"}) == 1
    assert _value(agent, "dsx_sentinel_node_drift") == 0
    assert _value(agent, "dsx_sentinel_node_cordoned") == 0


def test_the_node_is_read_at_most_every_node_read_s(fleet: Fleet) -> None:
    port, hardware, _ = fleet("sim:nodes=2,gpu=h100,workloads=false")
    agent = _agent(port, hardware, node_read_s=3600)
    agent.run_once()
    assert _value(agent, "dsx_sentinel_node_drift") == 0
    port.set_labels(NODE, {vocab.LABEL_DRIFT: "true"})
    agent.run_once()
    assert _value(agent, "dsx_sentinel_node_drift") == 0  # not due yet: the figures of the last read stand
    agent.read_node(force=True)
    assert _value(agent, "dsx_sentinel_node_drift") == 1
