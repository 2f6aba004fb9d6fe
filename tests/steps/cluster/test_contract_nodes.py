"""Contract: both adapters read and change nodes alike (run with ``pytest -k contract``)."""

from __future__ import annotations

import pytest

from steps.cluster import NotFoundError
from steps.cluster import vocabulary as vocab
from steps.cluster.errors import CordonRefusedError
from steps.errors import InputError
from tests.steps.cluster.conftest import Backend


def test_contract_list_nodes_sorted_with_gpu_and_topology_labels(backend: Backend) -> None:
    nodes = backend.port.list_nodes()
    assert [n.name for n in nodes] == [f"node-0{i}" for i in range(6)]
    first = nodes[0]
    assert first.gpu_product == "NVIDIA-H100-80GB-HBM3"
    assert first.labels["nvidia.com/gpu.count"] == "8"
    assert first.labels["nvidia.com/cuda.driver.major"] == "580"
    assert first.gpu_count == 8
    assert first.ready
    assert first.node_info.kubelet_version.startswith("v1.")
    assert {n.labels[vocab.LABEL_RACK] for n in nodes} == {"rack-00", "rack-01"}


def test_contract_list_nodes_by_selector(backend: Backend) -> None:
    port = backend.port
    assert [n.name for n in port.list_nodes(f"{vocab.LABEL_RACK}=rack-01")] == [
        "node-03",
        "node-04",
        "node-05",
    ]
    assert [
        n.name for n in port.list_nodes(f"{vocab.LABEL_RACK} notin (rack-01),kubernetes.io/hostname")
    ] == [
        "node-00",
        "node-01",
        "node-02",
    ]
    assert port.list_nodes(f"!{vocab.LABEL_RACK}") == []
    with pytest.raises(InputError, match="cannot read the term"):
        port.list_nodes("rack in rack-01")


def test_contract_unknown_node_names_the_node_and_the_call(backend: Backend) -> None:
    for call in (
        lambda: backend.port.get_node("node-99"),
        lambda: backend.port.cordon("node-99", "test"),
        lambda: backend.port.set_labels("node-99", {"a": "b"}),
        lambda: backend.port.pods_on("node-99"),
    ):
        with pytest.raises(NotFoundError) as caught:
            call()
        assert "node/node-99" in str(caught.value)
        assert "\n" not in str(caught.value)
    with pytest.raises(NotFoundError, match=r"^pods_on node/node-99: not found \(404\)"):
        backend.port.pods_on("node-99")


def test_contract_cordon_records_owner_reason_time_and_earlier_state(backend: Backend) -> None:
    port, clock = backend.port, backend.clock
    result = port.cordon("node-01", "xid 79 on GPU 3", by="sentinel")
    node = result.node
    assert node.unschedulable
    assert {k: v for k, v in node.annotations.items() if k in vocab.CORDON_ANNOTATIONS} == {
        vocab.ANNOTATION_CORDONED_BY: "sentinel",
        vocab.ANNOTATION_CORDON_REASON: "xid 79 on GPU 3",
        vocab.ANNOTATION_CORDONED_AT: "2025-03-01T12:00:00Z",
        vocab.ANNOTATION_CORDONED_BEFORE: "false",
    }
    assert (result.previous, result.changed, result.forced) == (None, True, False)
    assert result.summary == "node-01 cordoned by sentinel: xid 79 on GPU 3"
    assert node.cordon is not None and node.cordon.owner == "sentinel"

    again = port.cordon("node-01", "xid 79 on GPU 3", by="sentinel")
    assert not again.changed
    assert again.node.resource_version == node.resource_version  # nothing written the second time
    clock.advance(60)
    update = port.cordon("node-01", "xid 79 on GPU 3 and 5", by="sentinel")
    assert update.node.annotations[vocab.ANNOTATION_CORDON_REASON] == "xid 79 on GPU 3 and 5"
    assert update.node.annotations[vocab.ANNOTATION_CORDONED_AT] == "2025-03-01T12:00:00Z"  # same cordon

    released = port.uncordon("node-01", by="sentinel")
    assert not released.node.unschedulable
    assert not set(vocab.CORDON_ANNOTATIONS) & set(released.node.annotations)
    assert released.previous is not None and released.previous.owner == "sentinel"
    assert released.summary == (
        "node-01 uncordoned: released sentinel's cordon (xid 79 on GPU 3 and 5, since 2025-03-01T12:00:00Z)"
    )
    assert port.get_node("node-01") == released.node
    twice = port.uncordon("node-01", by="sentinel")
    assert (twice.changed, twice.summary) == (False, "node-01 was not cordoned")


def test_contract_a_second_owner_is_refused_and_the_first_record_kept(backend: Backend) -> None:
    port = backend.port
    first = port.cordon("node-02", "bad NIC", by="alice").node
    with pytest.raises(CordonRefusedError) as caught:
        port.cordon("node-02", "drain for RMA", by="bob")
    message = str(caught.value)
    assert message.startswith("cordon node/node-02: refused: node-02 carries alice's cordon (bad NIC, since ")
    assert "\n" not in message
    with pytest.raises(CordonRefusedError, match=r"^uncordon node/node-02: refused: .*alice's cordon"):
        port.uncordon("node-02", by="bob")
    assert port.get_node("node-02") == first  # neither refusal wrote anything

    taken = port.cordon("node-02", "drain for RMA", by="bob", force=True)
    assert taken.forced and taken.previous is not None and taken.previous.owner == "alice"
    assert taken.node.annotations[vocab.ANNOTATION_CORDONED_BY] == "bob"
    assert taken.summary.startswith(
        "node-02 cordoned by bob: drain for RMA; took over alice's cordon (bad NIC"
    )
    released = port.uncordon("node-02", by="carol", force=True)
    assert released.forced and not released.node.unschedulable
    assert released.summary.startswith("node-02 uncordoned: released bob's cordon (drain for RMA, since ")
    assert released.summary.endswith("(forced)")


def test_contract_a_cordon_made_outside_dsx_is_never_released(backend: Backend) -> None:
    kubectl = backend.kubectl()
    kubectl.patch_object("v1", "Node", "node-02", {"spec": {"unschedulable": True}})  # kubectl cordon
    port = backend.port
    with pytest.raises(CordonRefusedError) as caught:
        port.uncordon("node-02", by="alice")
    assert str(caught.value).startswith(
        "uncordon node/node-02: refused: node-02 carries a cordon made outside dsx"
    )

    recorded = port.cordon("node-02", "suspect NIC", by="alice")
    assert recorded.node.annotations[vocab.ANNOTATION_CORDONED_BEFORE] == "true"
    assert recorded.node.annotations[vocab.ANNOTATION_CORDONED_BY] == "alice"
    assert recorded.previous is not None and (recorded.previous.owner, recorded.forced) == ("", False)
    assert "was already cordoned: a cordon made outside dsx" in recorded.summary
    assert recorded.summary.endswith("and dsx will not uncordon it")
    assert port.cordon("node-02", "now sure", by="alice").node.annotations[
        vocab.ANNOTATION_CORDONED_BEFORE
    ] == (
        "true"  # the same owner again keeps the first answer
    )
    for who in ("alice", "dsx"):  # not even the owner of the record: the cordon itself is not dsx's
        with pytest.raises(CordonRefusedError, match="before alice cordoned it through dsx"):
            port.uncordon("node-02", by=who)
    with pytest.raises(
        CordonRefusedError, match=r"before alice cordoned it through dsx \(now sure\); dsx does"
    ):
        port.cordon("node-02", "mine", by="bob")
    assert port.get_node("node-02").unschedulable

    forced = port.uncordon("node-02", by="alice", force=True)
    assert forced.forced and not forced.node.unschedulable
    assert "released a cordon made outside dsx" in forced.summary
    assert "before alice cordoned it through dsx (now sure)" in forced.summary


def test_contract_a_stale_record_is_no_cordon(backend: Backend) -> None:
    port, kubectl = backend.port, backend.kubectl()
    port.cordon("node-03", "bad NIC", by="alice")
    kubectl.patch_object("v1", "Node", "node-03", {"spec": {"unschedulable": None}})  # kubectl uncordon
    node = port.get_node("node-03")
    assert node.cordon is None and node.annotations[vocab.ANNOTATION_CORDONED_BY] == "alice"
    fresh = port.cordon("node-03", "xid 48", by="bob")  # alice's record is stale: no refusal
    assert fresh.previous is None and fresh.node.annotations[vocab.ANNOTATION_CORDONED_BY] == "bob"
    assert fresh.node.annotations[vocab.ANNOTATION_CORDONED_BEFORE] == "false"
    kubectl.patch_object("v1", "Node", "node-03", {"spec": {"unschedulable": None}})
    cleared = port.uncordon("node-03", by="carol")
    assert cleared.summary == "node-03 was not cordoned; a stale dsx cordon record was cleared"
    assert not set(vocab.CORDON_ANNOTATIONS) & set(cleared.node.annotations)


def test_contract_a_cordon_that_races_another_writer_is_decided_on_a_fresh_read(backend: Backend) -> None:
    port = backend.port
    port.cordon("node-05", "bad NIC", by="alice")
    backend.inject_conflicts(2)  # the node will change twice between dsx's read and its write
    with pytest.raises(CordonRefusedError):
        port.uncordon("node-05", by="bob")
    assert backend.conflicts() == 0  # a refusal tries no write
    assert not port.uncordon("node-05", by="alice").node.unschedulable
    assert backend.conflicts() == 2  # the release was read again and decided again, twice
    with pytest.raises(InputError, match="the owner"):
        port.cordon("node-05", "x", by=" ")


def test_contract_taints_are_added_once_replaced_and_removed(backend: Backend) -> None:
    port = backend.port
    node = port.add_taint("node-03")
    assert [str(t) for t in node.taints] == ["dsx.dev/unhealthy:NoSchedule"]
    assert node.has_taint(vocab.TAINT_UNHEALTHY, "NoSchedule")
    assert port.add_taint("node-03").resource_version == node.resource_version
    node = port.add_taint("node-03", "dsx.dev/unhealthy", "xid-79", "NoSchedule")
    assert [str(t) for t in node.taints] == ["dsx.dev/unhealthy=xid-79:NoSchedule"]
    node = port.add_taint("node-03", "maintenance", "", "NoExecute")
    assert len(node.taints) == 2
    node = port.remove_taint("node-03")
    assert [str(t) for t in node.taints] == ["maintenance:NoExecute"]
    assert port.remove_taint("node-03").resource_version == node.resource_version
    assert port.remove_taint("node-03", "maintenance", "NoExecute").taints == []


def test_contract_labels_and_annotations_merge(backend: Backend) -> None:
    port = backend.port
    node = port.set_labels(
        "node-04", {vocab.LABEL_CERTIFICATION: vocab.Certification.passed, vocab.LABEL_STATE: "recertifying"}
    )
    assert node.labels[vocab.LABEL_CERTIFICATION] == "passed"
    assert node.labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"  # the others stay
    node = port.set_labels("node-04", {vocab.LABEL_STATE: None})
    assert vocab.LABEL_STATE not in node.labels
    assert node.labels[vocab.LABEL_CERTIFICATION] == "passed"
    node = port.set_annotations("node-04", {"dsx.dev/last-check": "nccl all-reduce 412 GB/s", "other": "x"})
    assert node.annotations["dsx.dev/last-check"] == "nccl all-reduce 412 GB/s"
    assert "other" not in port.set_annotations("node-04", {"other": None}).annotations
    assert port.get_node("node-04") == port.list_nodes("dsx.dev/certification=passed")[0]
    with pytest.raises(InputError, match="set_labels node/node-04"):
        port.set_labels("node-04", {"dsx.dev/state": "not a valid value!"})


def test_contract_labels_and_annotations_change_together_in_one_write(backend: Backend) -> None:
    port = backend.port
    reason = vocab.ANNOTATION_CERTIFICATION_REASON
    port.set_node_metadata(
        "node-04",
        labels={vocab.LABEL_CERTIFICATION: "failed", vocab.LABEL_STATE: "recertifying"},
        annotations={reason: "bus bandwidth 180 GB/s", "dsx.dev/evidence": "run-1"},
    )
    backend.inject_conflicts(1)  # someone else writes the node between dsx's read and its write
    node = port.set_node_metadata(
        "node-04",
        labels={vocab.LABEL_CERTIFICATION: "passed", vocab.LABEL_STATE: None},
        annotations={reason: "bus bandwidth 412 GB/s", "dsx.dev/evidence": None},
    )
    assert backend.conflicts() == 1  # the write named the version it read; the stale one was refused
    assert node.labels[vocab.LABEL_CERTIFICATION] == "passed"
    assert vocab.LABEL_STATE not in node.labels
    assert node.annotations[reason] == "bus bandwidth 412 GB/s"
    assert "dsx.dev/evidence" not in node.annotations
    assert node.labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"  # the others stay
    assert port.get_node("node-04") == node
    again = port.set_node_metadata(
        "node-04", {vocab.LABEL_CERTIFICATION: "passed"}, {reason: "bus bandwidth 412 GB/s"}
    )
    assert again.resource_version == node.resource_version  # nothing to change, nothing written
    with pytest.raises(InputError, match=r"^set_node_metadata node/node-04: label .* not a valid label"):
        port.set_node_metadata("node-04", {vocab.LABEL_CERTIFICATION: "no good!"}, {reason: "x"})
    assert port.get_node("node-04").annotations[reason] == "bus bandwidth 412 GB/s"  # neither was written


def test_contract_opt_out_label_marks_node_unmanaged(backend: Backend) -> None:
    node = backend.port.set_labels("node-05", {vocab.LABEL_MANAGED: vocab.MANAGED_FALSE})
    assert not node.managed
    assert backend.port.get_node("node-04").managed


def test_contract_conditions_go_through_the_status_subresource(backend: Backend) -> None:
    port, clock = backend.port, backend.clock
    node = port.set_condition("node-00", vocab.CONDITION_GPU_XID, True, "Xid79", "GPU 3 fell off the bus")
    condition = node.condition(vocab.CONDITION_GPU_XID)
    assert condition is not None
    assert (condition.status, condition.reason, condition.message) == (
        "True",
        "Xid79",
        "GPU 3 fell off the bus",
    )
    assert condition.last_transition_time == "2025-03-01T12:00:00Z"
    assert node.ready  # the kubelet's conditions stay
    assert [c.type for c in node.conditions].count(vocab.CONDITION_GPU_XID) == 1

    clock.advance(60)
    node = port.set_condition(
        "node-00", vocab.CONDITION_GPU_XID, True, "Xid79", "GPU 3 fell off the bus twice"
    )
    condition = node.condition(vocab.CONDITION_GPU_XID)
    assert condition is not None
    assert condition.last_transition_time == "2025-03-01T12:00:00Z"  # same status: no transition
    assert condition.last_heartbeat_time == "2025-03-01T12:01:00Z"

    clock.advance(60)
    node = port.set_condition("node-00", vocab.CONDITION_GPU_XID, False, "Recovered", "reset worked")
    condition = node.condition(vocab.CONDITION_GPU_XID)
    assert condition is not None
    assert (condition.status, condition.last_transition_time) == ("False", "2025-03-01T12:02:00Z")
    assert port.get_node("node-00").condition(vocab.CONDITION_GPU_XID) == condition


def test_contract_status_cannot_be_changed_through_the_main_resource(backend: Backend) -> None:
    patched = backend.port.patch_object(
        "v1", "Node", "node-00", {"metadata": {"labels": {"x": "y"}}, "status": {"conditions": []}}
    )
    assert patched["metadata"]["labels"]["x"] == "y"
    assert backend.port.get_node("node-00").ready


def test_contract_a_port_says_whether_its_checks_run_as_pods(backend: Backend) -> None:
    # an API server's kubelets run a check's Jobs; a simulated fleet's checks run as local ranks
    assert backend.port.runs_pods is (backend.kind != "sim")
