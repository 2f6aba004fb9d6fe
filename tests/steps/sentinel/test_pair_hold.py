"""The pair test's hold on its partner: a cordon owned by ``dsx-pair`` and the Leases of both nodes under the
remediation's Workflow, given back by the verdict, by the exit handler, or by the next pair test when the
run that took it has ended."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from steps.cluster import ClusterPort, connect, holds
from steps.cluster import vocabulary as vocab
from steps.errors import DsxError, InputError
from steps.readiness import certify
from steps.sentinel import recertify as recert
from steps.sentinel.remediate import OWNER, conclude

NODE = "node-01"


def _workflow(port: ClusterPort, name: str, phase: str = "Running") -> str:
    """A remediation Workflow in the API; its uid."""
    made = port.create_object(
        {
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "Workflow",
            "metadata": {"name": name, "namespace": port.namespace},
            "status": {"phase": phase},
        }
    )
    return str(made["metadata"]["uid"])


def _partner(tmp_path: Path) -> str:
    return (tmp_path / "out" / "params" / "partner").read_text()


def test_the_partner_is_held_while_the_test_runs_and_given_back_by_the_verdict(
    sim_fleet: Callable[[str], str], tmp_path: Path
) -> None:
    port = connect(sim_fleet("sim:nodes=4,gpu=h100,faults=node-00:busy"))
    uid = _workflow(port, "dsx-remediate-a")
    note = recert.pair_partner(NODE, "dsx-remediate-a", uid)
    assert note == f"{NODE}: pair test running beside node-02 (passed over node-00: its GPUs are in use)"
    assert _partner(tmp_path) == "node-02"
    held_by = holds.run_holder(port.namespace, "dsx-remediate-a", uid)
    partner = port.get_node("node-02")
    assert partner.cordon is not None and partner.cordon.owner == recert.PAIR_OWNER
    assert partner.cordon.reason == f"pair test of {NODE}"
    assert holds.lease_holder(port, "node-02") == holds.lease_holder(port, NODE) == held_by
    # A certification started meanwhile cannot take the pair: it would measure it.
    with pytest.raises(InputError, match=r"node node-01 is held by dsx-certify/dsx/dsx-remediate-a/"):
        certify.plan()
    assert recert.pair_verdict(NODE, "node-02", "Succeeded", "dsx-remediate-a", uid) == (
        f"{NODE}: pair test passed beside node-02"
    )
    partner = port.get_node("node-02")
    assert not partner.unschedulable and vocab.ANNOTATION_CORDONED_BY not in partner.annotations
    assert holds.lease_holder(port, "node-02") == holds.lease_holder(port, NODE) == ""
    assert not port.list_nodes(recert.PAIR_SELECTOR)


def test_the_exit_handler_gives_the_hold_back_however_the_run_ended(sim_fleet) -> None:  # type: ignore[no-untyped-def]
    port = connect(sim_fleet("sim:nodes=3,gpu=h100"))
    uid = _workflow(port, "dsx-remediate-b")
    recert.pair_partner(NODE, "dsx-remediate-b", uid)  # the run is stopped during the test
    assert port.get_node("node-00").unschedulable
    assert recert.release_pair("dsx-remediate-b", uid) == "pair hold given back: node-00, node-01"
    assert not port.get_node("node-00").unschedulable
    assert holds.lease_holder(port, "node-00") == holds.lease_holder(port, NODE) == ""
    assert not port.list_nodes(recert.PAIR_SELECTOR)
    assert recert.release_pair("dsx-remediate-b", uid) == "no pair hold to give back"


def test_a_partner_another_run_holds_is_passed_over(sim_fleet) -> None:  # type: ignore[no-untyped-def]
    port = connect(sim_fleet("sim:nodes=4,gpu=h100"))
    certifying = _workflow(port, "dsx-certify-c")
    assert port.acquire_lock("node-00", holds.run_holder(port.namespace, "dsx-certify-c", certifying), 600)
    uid = _workflow(port, "dsx-remediate-c")
    note = recert.pair_partner(NODE, "dsx-remediate-c", uid)
    assert note.startswith(
        f"{NODE}: pair test running beside node-02 (passed over node-00 held by dsx-certify/"
    )
    assert not port.get_node("node-00").unschedulable  # nothing of it was touched


def test_a_hold_whose_run_ended_is_lifted_by_the_next_pair_test_and_a_live_one_is_not(sim_fleet) -> None:  # type: ignore[no-untyped-def]
    port = connect(sim_fleet("sim:nodes=6,gpu=h100"))
    old = _workflow(port, "dsx-remediate-old")
    recert.pair_partner(NODE, "dsx-remediate-old", old)  # node-00 held; the run is killed, no exit handler
    live = _workflow(port, "dsx-remediate-live")
    recert.pair_partner("node-02", "dsx-remediate-live", live)  # node-00 is cordoned: node-03 is taken
    assert port.get_node("node-03").cordon.owner == recert.PAIR_OWNER  # type: ignore[union-attr]
    assert port.get_node("node-00").unschedulable  # the old run's Workflow is still Running
    port.patch_object(
        "argoproj.io/v1alpha1",
        "Workflow",
        "dsx-remediate-old",
        {"status": {"phase": "Failed"}},
        port.namespace,
    )
    uid = _workflow(port, "dsx-remediate-new")
    note = recert.pair_partner("node-04", "dsx-remediate-new", uid)
    # The old hold was lifted (its run ended), so node-00 and node-01 are free again: node-00 is taken anew.
    assert note == "node-04: pair test running beside node-00"
    assert port.get_node("node-00").cordon.reason == "pair test of node-04"  # type: ignore[union-attr]
    assert holds.lease_holder(port, "node-00") == holds.run_holder(port.namespace, "dsx-remediate-new", uid)
    assert port.get_node("node-03").cordon.reason == "pair test of node-02"  # type: ignore[union-attr]


def test_every_partner_busy_is_no_verdict_in_one_write(sim_fleet) -> None:  # type: ignore[no-untyped-def]
    port = connect(sim_fleet("sim:nodes=3,gpu=h100,faults=node-00:busy;node-02:busy"))
    uid = _workflow(port, "dsx-remediate-d")
    note = recert.pair_partner(NODE, "dsx-remediate-d", uid)
    assert (
        note == f"{NODE}: pair test no verdict: every known-good partner's GPUs are in use (node-00, node-02)"
    )
    node = port.get_node(NODE)
    assert node.labels[vocab.LABEL_CERTIFICATION] == "pending"
    assert node.annotations[vocab.ANNOTATION_PAIR_TEST].startswith(recert.NO_VERDICT)
    assert holds.lease_holder(port, NODE) == ""  # nothing held for a test that does not run


def _recertifying(port: ClusterPort, workflow: str) -> None:
    port.cordon(NODE, f"dsx-remediate {workflow}: xid", by=OWNER)
    port.add_taint(NODE)
    port.set_node_metadata(
        NODE,
        labels={vocab.LABEL_STATE: vocab.NodeState.recertifying.value, vocab.LABEL_CERTIFICATION: "pending"},
        annotations={vocab.ANNOTATION_REMEDIATION: workflow},
    )


def test_a_certification_that_gave_no_verdict_keeps_the_node_recertifying(sim_fleet) -> None:  # type: ignore[no-untyped-def]
    port = connect(sim_fleet("sim:nodes=2,gpu=h100"))
    _recertifying(port, "dsx-remediate-e")
    port.set_node_metadata(
        NODE, annotations={vocab.ANNOTATION_CERTIFICATION_REASON: "unschedulable: 0/2 nodes are available"}
    )
    with pytest.raises(DsxError, match=r"no verdict \(certification pending: unschedulable"):
        conclude(NODE, "xid", "dsx-remediate-e")
    node = port.get_node(NODE)
    assert node.labels[vocab.LABEL_STATE] == "recertifying" and node.unschedulable
    assert vocab.LABEL_REPLACE not in node.labels


def test_a_certification_that_failed_escalates(sim_fleet) -> None:  # type: ignore[no-untyped-def]
    port = connect(sim_fleet("sim:nodes=2,gpu=h100"))
    _recertifying(port, "dsx-remediate-f")
    port.set_labels(NODE, {vocab.LABEL_CERTIFICATION: "failed"})
    with pytest.raises(DsxError, match="escalated: recertification failed"):
        conclude(NODE, "xid", "dsx-remediate-f")
    assert port.get_node(NODE).labels[vocab.LABEL_STATE] == "escalated"
