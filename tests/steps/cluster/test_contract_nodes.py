"""Contract: both adapters read and change nodes alike (run with ``pytest -k contract``)."""

from __future__ import annotations

import pytest

from steps.cluster import NotFoundError
from steps.cluster import vocabulary as vocab
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


def test_contract_cordon_records_who_why_and_earlier_state(backend: Backend) -> None:
    port = backend.port
    node = port.cordon("node-01", "xid 79 on GPU 3", by="sentinel")
    assert node.unschedulable
    assert node.annotations[vocab.ANNOTATION_CORDONED_BY] == "sentinel"
    assert node.annotations[vocab.ANNOTATION_CORDON_REASON] == "xid 79 on GPU 3"
    assert node.annotations[vocab.ANNOTATION_CORDONED_BEFORE] == "false"
    again = port.cordon("node-01", "xid 79 on GPU 3", by="sentinel")
    assert again.resource_version == node.resource_version  # nothing written the second time
    assert port.get_node("node-01") == node

    restored = port.uncordon("node-01")
    assert not restored.unschedulable
    assert not set(vocab.CORDON_ANNOTATIONS) & set(restored.annotations)
    assert port.uncordon("node-01").resource_version == restored.resource_version


def test_contract_cordon_of_a_node_cordoned_by_someone_else_says_so(backend: Backend) -> None:
    port = backend.port
    port.patch_object("v1", "Node", "node-02", {"spec": {"unschedulable": True}})
    node = port.cordon("node-02", "suspect NIC")
    assert node.annotations[vocab.ANNOTATION_CORDONED_BEFORE] == "true"
    node = port.cordon("node-02", "now sure", by="sentinel")
    assert node.annotations[vocab.ANNOTATION_CORDONED_BEFORE] == "true"  # the first answer is kept
    assert node.annotations[vocab.ANNOTATION_CORDON_REASON] == "now sure"


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
