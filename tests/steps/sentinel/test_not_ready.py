"""The ``not-ready`` check: Kubernetes' own Ready condition judged by the catalogue's threshold, written by
the reconciler for nodes whose agent is down with them and cleared by the agent when the node is back."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path

import pytest

from steps.cluster import RetryPolicy, connect, load_fleet, shareable
from steps.cluster import vocabulary as vocab
from steps.cluster.node import Condition, Node, Taint
from steps.cluster.sim import MemoryStore, SimCluster
from steps.errors import InputError
from steps.sentinel.agent import Agent
from steps.sentinel.catalogue import FaultOverrides, given_catalogue, load_catalogue
from steps.sentinel.node import Sentinel
from steps.sentinel.probes import NodeProbes
from steps.sentinel.reconcile import mark_not_ready, plan, reconcile, remediations
from steps.sentinel.unready import not_ready_events
from tests.cli import dsx_here

NOW = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)
CONDITION = vocab.CONDITION_SENTINEL["not-ready"]
FAST = RetryPolicy(attempts=2, base_delay=0.0, max_delay=0.0, jitter=0.0)


def _node(status: str, minutes: float, *taints: Taint, unschedulable: bool = False, **notes: str) -> Node:
    since = (NOW - dt.timedelta(minutes=minutes)).strftime("%Y-%m-%dT%H:%M:%SZ")
    ready = Condition(
        type="Ready",
        status=status,  # type: ignore[arg-type]
        reason="NodeStatusUnknown" if status == "Unknown" else "KubeletNotReady",
        message="Kubelet stopped posting node status." if status == "Unknown" else "PLEG is not healthy",
        last_transition_time=since,
    )
    return Node(
        name="node-01",
        conditions=[ready],
        taints=list(taints),
        unschedulable=unschedulable,
        annotations=notes,
        allocatable={"nvidia.com/gpu": "8"},
    )


def _overrides(**threshold: float) -> FaultOverrides:
    return FaultOverrides.model_validate(
        {
            "apiVersion": "dsx.dev/v1alpha1",
            "kind": "FaultOverrides",
            "entries": [
                {"check": "not-ready", "code": c.replace("_", "-"), "threshold": t}
                for c, t in threshold.items()
            ],
        }
    )


def test_ready_not_true_is_a_fault_only_past_the_catalogues_threshold() -> None:
    catalogue = load_catalogue()
    assert catalogue.rule("not-ready", "ready-unknown").threshold == 900  # longer than a GPU server's reboot
    (healthy,) = not_ready_events(_node("True", 60), catalogue, NOW)
    assert healthy.healthy and healthy.check == "not-ready"
    assert not_ready_events(_node("Unknown", 14), catalogue, NOW) == []  # a reboot, perhaps: nothing yet
    (down,) = not_ready_events(_node("Unknown", 16), catalogue, NOW)
    assert (down.healthy, down.code, down.severity, down.action) == (
        False,
        "ready-unknown",
        "fatal",
        "reboot",
    )
    assert down.message == (
        "node: Ready Unknown (NodeStatusUnknown) since 2026-03-01T11:44:00Z (over 900s): "
        "Kubelet stopped posting node status."
    )
    (sick,) = not_ready_events(_node("False", 16), catalogue, NOW)
    assert sick.code == "ready-false" and "PLEG is not healthy" in sick.message
    quick = load_catalogue(changes=_overrides(ready_false=60), source="test")
    assert not_ready_events(_node("False", 2), quick, NOW)[0].code == "ready-false"
    assert not_ready_events(_node("Unknown", 2), quick, NOW) == []


def test_a_node_cordoned_by_someone_else_is_theirs_unless_a_person_confirmed_it_down() -> None:
    catalogue = load_catalogue()
    kured = _node("Unknown", 60, unschedulable=True)  # kured cordons before it reboots
    assert not_ready_events(kured, catalogue, NOW) == []
    ours = _node(
        "Unknown",
        60,
        Taint(key=vocab.TAINT_UNHEALTHY),
        unschedulable=True,
        **{vocab.ANNOTATION_CORDONED_BY: "dsx-remediate", vocab.ANNOTATION_CORDON_REASON: "xid"},
    )
    assert not_ready_events(ours, catalogue, NOW)[0].code == "ready-unknown"
    down = _node(
        "Unknown", 1, Taint(key=vocab.TAINT_OUT_OF_SERVICE, value="nodeshutdown", effect="NoExecute")
    )
    (event,) = not_ready_events(down, catalogue, NOW)  # at once: a person said so
    assert event.code == "out-of-service" and "a person confirmed it down" in event.message
    cordoned_down = down.model_copy(update={"unschedulable": True})
    assert not_ready_events(cordoned_down, catalogue, NOW)[0].code == "out-of-service"


def _sim(tmp_path: Path, nodes: int = 4) -> str:
    return shareable(f"sim:nodes={nodes},gpu=h100,racks=2,workloads=false", tmp_path)


def test_the_reconciler_marks_a_node_down_for_the_threshold_and_starts_its_remediation(
    sim_fleet: Callable[[str], str], capsys: pytest.CaptureFixture[str]
) -> None:
    fleet = sim_fleet("sim:nodes=4,gpu=h100,racks=2,workloads=false")
    port = connect(fleet)
    port.inject("node-01", "not-ready")  # type: ignore[attr-defined]
    quick = load_catalogue(changes=_overrides(ready_false=0), source="test")
    assert mark_not_ready(port, load_catalogue(), dry_run=True) == []  # not for 15 minutes yet
    since = port.get_node("node-01").condition("Ready").last_transition_time  # type: ignore[union-attr]
    assert mark_not_ready(port, quick, dry_run=True) == [
        "node-01: would mark DsxNodeNotReady (ready-false: node: Ready False (KubeletNotReady) since "
        f"{since} (over 0s): container runtime is down)"
    ]
    assert port.get_node("node-01").condition(CONDITION) is None  # a dry run writes nothing
    (line,) = mark_not_ready(port, quick)
    assert line.startswith("node-01: marked DsxNodeNotReady (ready-false")
    node = port.get_node("node-01")
    condition = node.condition(CONDITION)
    assert condition is not None and (condition.status, condition.reason) == ("True", "FatalReboot")
    assert condition.message.startswith("fatal (reboot): node: Ready False")
    assert node.has_taint(vocab.TAINT_UNHEALTHY, vocab.TAINT_UNHEALTHY_EFFECT)
    assert mark_not_ready(port, quick) == []  # written once
    (start,) = plan(port).starts
    assert (start.node, start.check) == ("node-01", "not-ready")

    # Where the Sensor is not installed the chart's dsx-reconcile marks and lists, and starts nothing.
    assert reconcile(remediate=False) == "would start 1 remediation(s); 0 tainted node(s) left alone"
    assert "remediate=false: nothing started" in capsys.readouterr().out
    assert remediations(port) == {}

    port.set_labels("node-01", {vocab.LABEL_STATE: vocab.NodeState.awaiting_repair.value})
    port.set_condition("node-01", CONDITION, False, "NoProblem", "node: Ready")
    assert mark_not_ready(port, quick) == []  # under remediation: its own reboot is not a fault


def test_most_nodes_down_at_once_is_the_control_planes_fault_and_marks_none(tmp_path: Path) -> None:
    port = connect(_sim(tmp_path))
    for name in ("node-01", "node-02", "node-03"):
        port.inject(name, "not-ready")  # type: ignore[attr-defined]
    quick = load_catalogue(changes=_overrides(ready_false=0), source="test")
    assert mark_not_ready(port, quick) == [
        "3 of 4 managed GPU nodes are not Ready: the control plane or the network, not the nodes; no node "
        "marked DsxNodeNotReady"
    ]
    assert all(n.condition(CONDITION) is None for n in port.list_nodes())


def test_the_reconciler_reads_the_clusters_overrides_and_refuses_bad_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(
        vocab.ENV_FAULT_OVERRIDES,
        '{"entries": [{"check": "not-ready", "code": "ready-unknown", "threshold": 60}]}',
    )
    assert given_catalogue().rule("not-ready", "ready-unknown").threshold == 60
    monkeypatch.setenv(vocab.ENV_FAULT_OVERRIDES, '{"entries": [{"check": "not-ready", "code": "nope"}]}')
    with pytest.raises(InputError, match=r"\$DSX_FAULT_OVERRIDES: entries: not-ready has no code 'nope'"):
        given_catalogue()
    monkeypatch.setenv(vocab.ENV_FAULT_OVERRIDES, "[1, 2")
    with pytest.raises(InputError, match=r"\$DSX_FAULT_OVERRIDES: not YAML or JSON"):
        given_catalogue()


def test_the_agent_of_a_node_back_in_service_clears_the_reconcilers_condition() -> None:
    """The reconciler wrote DsxNodeNotReady on a node that was down; the node reboots and its agent starts:
    its first pass reads the node Ready and clears the condition (the repair wait needs a reading of the
    new boot), as it would any condition of its own."""
    port = SimCluster(MemoryStore(load_fleet("sim:nodes=2,gpu=h100,workloads=false")), retry=FAST)
    port.set_condition("node-01", CONDITION, True, "FatalReboot", "fatal (reboot): node: Ready Unknown ...")
    catalogue = load_catalogue()
    probes = NodeProbes("node-01", catalogue, port, lambda: dt.datetime.now(dt.UTC), 8)
    sentinel = Sentinel(
        Agent("node-01", port, probes.probes(), catalogue, probe_timeout=None, node_read_s=0), probes, None
    )
    sentinel.run_once()  # reads the node after its probes ...
    sentinel.run_once()  # ... and judges its Ready condition on the next pass
    condition = port.get_node("node-01").condition(CONDITION)
    assert condition is not None and condition.status == "False"


@pytest.mark.story
def test_reconcile_puts_a_node_that_was_down_back_in_service_on_the_simulated_fleet(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    sim_fleet: Callable[[str], str],
) -> None:
    """``dsx sentinel reconcile`` with the cluster's overrides (a threshold of 0): the node down is marked
    and its remediation runs to the end: drained, rebooted by the fleet's repair service, recertified,
    ``DsxNodeNotReady`` cleared and the node back in service."""
    fleet = sim_fleet("sim:nodes=4,gpu=h100,racks=2,workloads=false,repair-delay=1")
    monkeypatch.setenv(
        vocab.ENV_FAULT_OVERRIDES,
        '{"entries": [{"check": "not-ready", "code": "ready-false", "threshold": 0}]}',
    )
    connect(fleet).inject("node-02", "not-ready")  # type: ignore[attr-defined]
    code, out, err = dsx_here(
        capsys, "sentinel", "reconcile", "--cluster", fleet, "-p", "iters=2", "-p", "p-min=0.9",
        "--out", str(tmp_path / "runs"),
    )  # fmt: skip
    assert code == 0, out + err
    assert "node-02: marked DsxNodeNotReady (ready-false" in out
    assert "node-02: started dsx-remediate-" in out
    node = connect(fleet).get_node("node-02")
    assert node.ready and not node.unschedulable and not node.has_taint(vocab.TAINT_UNHEALTHY)
    assert vocab.LABEL_STATE not in node.labels
    assert node.condition(CONDITION).status == "False"  # type: ignore[union-attr]
