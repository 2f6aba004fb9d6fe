"""Remediation scenarios written once and run on both doubles (:mod:`tests.workflows.remediation_doubles`),
the simulated fleet and the emulated API server with its kubelet double: a repair that never comes, one
that leaves the node failing its recertification, the breaker open, two runs for one node, an operator's
uncordon, a node gone mid-drain, API errors retried, and a run stopped part-way, picked up where it
stopped when the workflow is submitted again. After each, the promises of
:mod:`tests.workflows.test_remediate_faults` hold (``assert_lost_nothing``)."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from steps.cluster import vocabulary as vocab
from steps.sentinel import ledger
from steps.sentinel.policy import Breaker, BreakerSettings
from tests.emulator.kubelet import EmulatedCluster
from tests.workflows.remediation_doubles import (
    Double,
    assert_in_service,
    drain_policy,
    in_background,
    running,
    start,
    state,
    states,
)
from tests.workflows.test_remediate_faults import NODE, _wait_for, assert_one_after_the_other
from workflows.runner import Phase


def _resumed_once(double: Double, stopped_at: str) -> None:
    """The second run said it resumed from ``stopped_at``, and the node was quarantined once only."""
    entries = ledger.entries(double.port, NODE)
    resumed = [e for e in entries if e.state == "requested" and "resumed" in e.detail]
    assert resumed and stopped_at in resumed[0].detail
    assert len([e for e in entries if e.state == "quarantined"]) == 1  # not quarantined twice


@pytest.mark.story
@pytest.mark.parametrize("kind", ["sim", "kube"])
def test_the_repair_never_comes(
    kind: str, tmp_path: Path, k8s_cluster: Callable[..., EmulatedCluster]
) -> None:
    double = start(kind, tmp_path, k8s_cluster, "sim:nodes=4,gpu=h100", repair="never", cordoned=("node-03",))
    with double.repairs():
        assert double.run(tmp_path / "run", **{"repair-timeout": "2s"}) == Phase.Failed
    node = double.port.get_node(NODE)
    assert node.unschedulable and node.labels[vocab.LABEL_STATE] == "escalated"
    assert node.labels[vocab.LABEL_REPLACE] == vocab.REPLACE_REQUESTED
    # the repair it asked for stays asked, with its evidence: the case for the vendor
    assert node.labels[vocab.LABEL_REPAIR] == "reboot"
    assert double.port.get_object("v1", "ConfigMap", f"dsx-repair-{NODE}", double.port.namespace) is not None
    assert states(double)[-2:] == ["escalated", "ended"]
    reasons = [e.get("reason") for e in double.port.list_objects("v1", "Event", "default")]
    assert "DsxRemediationEscalated" in reasons
    double.assert_lost_nothing(cordoned_before=frozenset({"node-03"}))


@pytest.mark.story
@pytest.mark.parametrize("kind", ["sim", "kube"])
def test_recertification_fails_on_the_repaired_node(
    kind: str, tmp_path: Path, k8s_cluster: Callable[..., EmulatedCluster]
) -> None:
    """The repair brings node-01 back on a new boot, its condition cleared, but it still fails: on the
    fleet the repair leaves the fault, on the emulator every pod on the node exits 1 (certification's rank
    Jobs there). The node stays out, escalated for replacement."""
    double = start(kind, tmp_path, k8s_cluster, "sim:nodes=4,gpu=h100", repair="fails", cordoned=("node-02",))
    with double.repairs():
        assert double.run(tmp_path / "run") == Phase.Failed
    node = double.port.get_node(NODE)
    assert node.unschedulable and node.labels[vocab.LABEL_STATE] == "escalated"
    assert node.labels[vocab.LABEL_CERTIFICATION] == "failed"
    assert node.labels[vocab.LABEL_REPLACE] == vocab.REPLACE_REQUESTED
    assert vocab.LABEL_RECERTIFY not in node.labels
    found = states(double)
    assert "recertifying" in found and found[-2:] == ["escalated", "ended"]
    escalated = [e for e in ledger.entries(double.port, NODE) if e.state == "escalated"][-1]
    assert escalated.detail.startswith("recertification failed: allreduce-sweep error: "), escalated.detail
    warnings = [e for e in double.port.list_objects("v1", "Event", "default") if e.get("type") == "Warning"]
    assert "DsxRemediationEscalated" in [e.get("reason") for e in warnings]
    double.assert_lost_nothing(cordoned_before=frozenset({"node-02"}))


@pytest.mark.story
@pytest.mark.parametrize("kind", ["sim", "kube"])
def test_the_breaker_is_open(kind: str, tmp_path: Path, k8s_cluster: Callable[..., EmulatedCluster]) -> None:
    double = start(kind, tmp_path, k8s_cluster, "sim:nodes=4,gpu=h100")
    breaker = Breaker(double.port, BreakerSettings(max_share=0.25))
    assert breaker.admit("node-02", 4)[0] and not breaker.admit("node-03", 4)[0]  # tripped, stays open
    assert double.run(tmp_path / "run", **{"breaker-share": "0.25"}) == Phase.Failed
    node = double.port.get_node(NODE)
    assert not node.unschedulable and vocab.LABEL_STATE not in node.labels  # nothing changed on it
    assert "refused" in states(double)
    assert double.touched_nothing()
    double.assert_lost_nothing()


@pytest.mark.story
@pytest.mark.parametrize("kind", ["sim", "kube"])
def test_two_events_for_one_node_run_one_remediation_at_a_time(
    kind: str, tmp_path: Path, k8s_cluster: Callable[..., EmulatedCluster]
) -> None:
    double = start(kind, tmp_path, k8s_cluster, "sim:nodes=4,gpu=h100")
    with double.repairs():
        first, phases_a = in_background(double, tmp_path / "a")
        second, phases_b = in_background(double, tmp_path / "b")
        first.join(300)
        second.join(300)
    # The mutex lets one in; the other waits, then finds the node back in service and remediates a
    # healthy node again (a second attempt), never both at once.
    assert phases_a + phases_b == [Phase.Succeeded, Phase.Succeeded]
    assert_one_after_the_other(double.port)
    assert_in_service(double)
    double.assert_lost_nothing()


@pytest.mark.story
@pytest.mark.parametrize("kind", ["sim", "kube"])
def test_an_operator_uncordons_by_hand_mid_remediation(
    kind: str, tmp_path: Path, k8s_cluster: Callable[..., EmulatedCluster]
) -> None:
    double = start(kind, tmp_path, k8s_cluster, "sim:nodes=4,gpu=h100", repair="never")
    with double.repairs():
        thread, phases = in_background(double, tmp_path / "run", **{"repair-timeout": "3s"})
        _wait_for(lambda: state(double) == "awaiting-repair", 60)
        double.uncordon_by_hand()
        thread.join(120)
    assert phases == [Phase.Failed]
    node = double.port.get_node(
        NODE
    )  # never cordoned again after the operator's uncordon, nothing saying why
    assert not node.unschedulable and vocab.LABEL_STATE not in node.labels
    assert "cancelled" in states(double) and "escalated" not in states(double)
    reasons = [e.get("reason") for e in double.port.list_objects("v1", "Event", "default")]
    assert "DsxRemediationCancelled" in reasons
    double.assert_lost_nothing()


@pytest.mark.story
@pytest.mark.parametrize("kind", ["sim", "kube"])
def test_the_node_disappears_mid_drain(
    kind: str, tmp_path: Path, k8s_cluster: Callable[..., EmulatedCluster]
) -> None:
    double = start(kind, tmp_path, k8s_cluster, "sim:nodes=4,gpu=h100,blocking-pdb=true")
    thread, phases = in_background(double, tmp_path / "run")
    _wait_for(double.eviction_refused, 60)  # the gateway's budget holds
    assert double.port.delete_object("v1", "Node", NODE)
    thread.join(120)
    assert phases == [Phase.Failed]
    entries = ledger.entries(double.port, NODE)
    assert "draining" in [e.state for e in entries] and entries[-1].state == "ended"
    assert "disappeared" in entries[-2].detail
    double.assert_lost_nothing()


@pytest.mark.story
@pytest.mark.parametrize("kind", ["sim", "kube"])
def test_api_500s_and_409s_are_retried_and_the_node_comes_back(
    kind: str, tmp_path: Path, k8s_cluster: Callable[..., EmulatedCluster]
) -> None:
    double = start(kind, tmp_path, k8s_cluster, "sim:nodes=4,gpu=h100")
    double.fail_api()
    with double.repairs():
        assert double.run(tmp_path / "run") == Phase.Succeeded
    assert double.api_failures_met()
    assert_in_service(double)
    double.assert_lost_nothing()


@pytest.mark.story
@pytest.mark.parametrize("kind", ["sim", "kube"])
@pytest.mark.parametrize("stop_at", ["draining", "awaiting-repair", "recertifying"])
def test_stopped_and_resubmitted_picks_up_where_it_stopped(
    kind: str, stop_at: str, tmp_path: Path, k8s_cluster: Callable[..., EmulatedCluster]
) -> None:
    double = start(kind, tmp_path, k8s_cluster, "sim:nodes=4,gpu=h100,blocking-pdb=true", repair_delay=2)
    # The gateway's budget blocks its pod for 1.5 s, then its namespace mode deletes it: the drain lasts.
    policy = drain_policy(namespaces={"serving": {"mode": "delete-after-timeout", "timeout_s": 1.5}})
    with double.repairs():
        with running(double, tmp_path / "first", **{"drain-policy": policy}) as first:
            _wait_for(lambda: state(double) == stop_at, 120)
            first.send_signal(signal.SIGTERM)  # argo terminate: running steps killed, no exit handler
            assert first.wait(60) != 0
        assert double.port.get_node(NODE).unschedulable and state(double)  # cordoned, and says why
        # resubmitted: the same workflow run to its end, in this process (its ranks from this worker's server)
        assert double.run(tmp_path / "again", **{"drain-policy": policy}) == Phase.Succeeded
    assert_in_service(double)
    _resumed_once(double, stop_at)
    double.assert_lost_nothing(deleted="gateway")  # the one deletion the namespace's mode asks for


@pytest.mark.story
@pytest.mark.parametrize("kind", ["sim", "kube"])
def test_stopped_right_after_the_quarantine_step_is_picked_up_from_there(
    kind: str, tmp_path: Path, k8s_cluster: Callable[..., EmulatedCluster], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The quarantine state lasts too short a time to stop a run in it by polling: the first run's guard and
    quarantine steps run as that run would run them (the same step functions, its workflow name), and the
    run stops there; the resubmitted workflow picks the node up quarantined, never quarantining it twice."""
    from steps.sentinel import remediate

    double = start(kind, tmp_path, k8s_cluster, "sim:nodes=4,gpu=h100")
    for name, value in double.step_env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(vocab.ENV_OUTPUT_DIR, str(tmp_path / "first"))
    remediate.guard(NODE, "xid", workflow_name="dsx-remediate-first")
    remediate.quarantine(NODE, "xid", workflow_name="dsx-remediate-first")
    assert double.port.get_node(NODE).unschedulable
    assert state(double) == vocab.NodeState.quarantined.value
    with double.repairs():
        assert double.run(tmp_path / "again") == Phase.Succeeded
    assert_in_service(double)
    _resumed_once(double, "quarantined")
    double.assert_lost_nothing()
