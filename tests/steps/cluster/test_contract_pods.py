"""Contract: pods, evictions under PodDisruptionBudgets, controllers that replace pods, events."""

from __future__ import annotations

from typing import Any

import pytest

from steps.cluster import ClusterError, ClusterPort, Pod
from tests.steps.cluster.conftest import FAST, Backend


def _all_pods(backend: Backend) -> dict[str, Pod]:
    return {p.ref: p for p in (Pod.from_manifest(o) for o in backend.port.list_objects("v1", "Pod"))}


def test_contract_pods_on_a_node_with_their_owners(backend: Backend) -> None:
    pods = backend.port.pods_on("node-01")
    assert [p.ref for p in pods] == [
        "gpu-operator/nvidia-dcgm-exporter-1",
        "gpu-operator/nvidia-device-plugin-daemonset-1",
        "serving/gateway-7f6d5b-0",
    ]
    owners = {p.name: (p.owner_kind, p.owner_name) for p in pods}
    (bare,) = [p for p in backend.port.pods_on("node-05") if p.name == "debug-shell"]  # the last node
    assert (bare.owner_kind, bare.owner_name) == ("", "")
    assert owners["nvidia-dcgm-exporter-1"] == ("DaemonSet", "nvidia-dcgm-exporter")
    assert owners["gateway-7f6d5b-0"] == ("ReplicaSet", "gateway-7f6d5b")
    assert all(p.node == "node-01" and p.phase == "Running" for p in pods)
    (job_pod,) = [p for p in backend.port.pods_on("node-03") if not p.daemonset]
    assert (job_pod.name, job_pod.owner_kind, job_pod.owner_name) == (
        "pretrain-llama-1",
        "Job",
        "pretrain-llama",
    )
    assert sum(p.daemonset for p in pods) == 2


def test_contract_evicting_a_bare_pod_removes_it_for_good(backend: Backend) -> None:
    port = backend.port
    result = port.evict("default/debug-shell")
    assert (result.pod, result.outcome) == ("default/debug-shell", "evicted")
    backend.settle()
    assert "default/debug-shell" not in _all_pods(backend)
    assert port.evict("default/debug-shell").outcome == "gone"
    assert port.delete_pod("default/debug-shell") is False


def test_contract_budget_allows_one_disruption_and_the_replica_set_replaces_the_pod(backend: Backend) -> None:
    port = backend.port
    port.cordon("node-00", "drain test")
    (victim,) = [p for p in port.pods_on("node-00") if p.owner_name == "inference-5d8f7c"]
    before = _all_pods(backend)
    result = port.evict(victim, grace_seconds=30)
    assert result.outcome == "evicted"
    backend.settle()
    pods = _all_pods(backend)
    assert victim.ref not in pods
    (replacement,) = [p for ref, p in pods.items() if ref not in before]
    assert replacement.owner_name == "inference-5d8f7c"
    assert replacement.name.startswith("inference-5d8f7c-")
    assert replacement.node not in ("node-00", "")  # never back on the cordoned node
    assert replacement.phase == "Running"
    # With the replacement running the budget allows the next disruption again.
    assert port.evict("serving/inference-5d8f7c-1").outcome == "evicted"


def test_contract_budget_that_allows_no_disruption_blocks_with_the_api_message(backend: Backend) -> None:
    result = backend.port.evict("serving/gateway-7f6d5b-0")
    assert result.outcome == "blocked"
    assert result.message == (
        "Cannot evict pod as it would violate the pod's disruption budget. "
        "The disruption budget gateway needs 2 healthy pods and has 2 currently"
    )
    assert "serving/gateway-7f6d5b-0" in _all_pods(backend)


def test_contract_two_budgets_on_one_pod_block_eviction(backend: Backend) -> None:
    backend.port.create_object(
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "inference-too", "namespace": "serving"},
            "spec": {"selector": {"matchLabels": {"app": "inference"}}, "maxUnavailable": 1},
        }
    )
    result = backend.port.evict("serving/inference-5d8f7c-0")
    assert result.outcome == "blocked"
    assert "more than one PodDisruptionBudget" in result.message


def test_contract_daemonset_pod_comes_back_on_its_node(backend: Backend) -> None:
    port = backend.port
    assert port.evict("gpu-operator/nvidia-dcgm-exporter-2").outcome == "evicted"
    backend.settle()
    (again,) = [p for p in port.pods_on("node-02") if p.owner_name == "nvidia-dcgm-exporter"]
    assert again.name != "nvidia-dcgm-exporter-2" and again.name.startswith("nvidia-dcgm-exporter-")
    assert (again.node, again.phase) == ("node-02", "Running")


def test_contract_replacement_waits_pending_when_no_node_is_schedulable(backend: Backend) -> None:
    port = backend.port
    for node in port.list_nodes():
        port.add_taint(node.name)
    before = _all_pods(backend)
    assert port.delete_pod("research/pretrain-llama-0") is True
    backend.settle()
    (pending,) = [p for ref, p in _all_pods(backend).items() if ref not in before]
    assert (pending.owner_name, pending.node, pending.phase) == ("pretrain-llama", "", "Pending")


def test_contract_events_are_recorded_about_the_node(backend: Backend) -> None:
    port = backend.port
    assert port.record_event("node-03", "DsxCordoned", "cordoned: xid 79", "Warning") is True
    events = port.list_objects("v1", "Event", "default")
    assert len(events) == 1
    event = events[0]
    assert event["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": "node-03"}
    assert (event["reason"], event["message"], event["type"]) == (
        "DsxCordoned",
        "cordoned: xid 79",
        "Warning",
    )
    assert event["firstTimestamp"] == "2025-03-01T12:00:00Z"


def test_contract_a_pod_replaced_under_its_name_reads_as_gone_the_newcomer_stays(backend: Backend) -> None:
    port = backend.port
    (old,) = [p for p in port.pods_on("node-05") if p.name == "debug-shell"]
    assert old.uid
    assert port.delete_pod(old) is True
    backend.settle()
    port.create_object(old.model_copy(update={"uid": ""}).to_manifest())  # created again under its name
    backend.settle()
    (new,) = [p for p in port.pods_on("node-05") if p.name == "debug-shell"]
    assert new.uid and new.uid != old.uid

    result = port.evict(old, grace_seconds=30)  # e.g. a drain retrying with the pod it listed
    assert (result.pod, result.outcome) == ("default/debug-shell", "gone")
    assert old.uid in result.message and new.uid in result.message
    assert port.delete_pod(old) is False
    assert _all_pods(backend)["default/debug-shell"].uid == new.uid  # the newcomer was not touched

    assert port.evict("default/debug-shell").outcome == "evicted"  # by name: the pod there now
    backend.settle()
    assert "default/debug-shell" not in _all_pods(backend)
    assert port.delete_pod(new) is False


def test_contract_node_events_of_a_step_in_another_namespace_land_in_default(
    backend: Backend, capsys: pytest.CaptureFixture[str]
) -> None:
    port = backend.new_port()
    port.namespace = "gpu-ops"
    assert port.record_event("node-01", "DsxCertificationPassed", "dsx certification passed") is True
    assert [e["involvedObject"]["name"] for e in port.list_objects("v1", "Event", "default")] == ["node-01"]
    assert port.list_objects("v1", "Event", "gpu-ops") == []
    assert capsys.readouterr().err == ""


def _node_events(port: ClusterPort) -> list[dict[str, Any]]:
    """The Events about nodes, in every namespace: a real cluster's controllers record Events of their
    own (the disruption controller, about a budget), which a test of dsx's Events leaves aside."""
    return [e for e in port.list_objects("v1", "Event") if e["involvedObject"].get("kind") == "Node"]


def test_contract_the_api_refuses_a_node_event_outside_default(backend: Backend) -> None:
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": "node-01.1", "namespace": "gpu-ops"},
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": "node-01"},
        "reason": "Tested",
        "message": "x",
        "type": "Normal",
    }
    with pytest.raises(ClusterError, match=r"rejected \(422\): .*does not match event.namespace"):
        backend.port.create_object(event)
    assert _node_events(backend.port) == []


def test_contract_recording_an_event_never_fails_the_caller(
    backend: Backend, capsys: pytest.CaptureFixture[str]
) -> None:
    port = backend.port
    backend.inject_errors(FAST.attempts)
    assert port.record_event("node-02", "DsxCordoned", "z") is False
    assert "warning: record_event node/node-02: the API answered 500" in capsys.readouterr().err
    backend.forbid("create", "events")
    failed = port.record_event("node-02", "DsxCertificationFailed", "certification failed", "Warning")
    assert failed is False
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("warning: record_event node/node-02: forbidden (403): ")
    assert lines[0].endswith("(event DsxCertificationFailed not recorded)")
    assert port.record_event("node-02", "X", "y", "Error") is False
    assert "event type must be Normal or Warning, not 'Error'" in capsys.readouterr().err
    assert _node_events(port) == []
