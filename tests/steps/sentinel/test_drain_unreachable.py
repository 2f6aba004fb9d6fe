"""A drain of a node that is down, on the emulated API server with the kubelet double holding the node
down, and on the simulated fleet with its not-ready fault: an evicted pod stays terminating (no kubelet
confirms it), the drain stops waiting for it after ``unreachable_wait_s`` and records it ``stranded``, and
the pod goes once a person marks the node out of service (the pod garbage collector's rule). The e2e tier
checks the same on the real control plane."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from steps.cluster import Pod, RetryPolicy, load_fleet
from steps.cluster import vocabulary as vocab
from steps.cluster.sim import MemoryStore, SimCluster
from steps.sentinel.drain import DrainPolicy, drain
from tests.emulator.kubelet import NodeBehaviour, emulated_cluster

NODE = "node-01"
FAST = RetryPolicy(attempts=2, base_delay=0.0, max_delay=0.0, jitter=0.0)


def _replica(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "default",
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": "web-1",
                    "uid": "u1",
                    "controller": True,
                }
            ],
        },
        "spec": {
            "nodeName": NODE,
            "containers": [{"name": "c", "image": "busybox", "command": ["sleep", "3600"]}],
        },
        "status": {"phase": "Running"},
    }


def _ready(status: str) -> Any:
    def change(node: dict[str, Any]) -> None:
        for c in node["status"]["conditions"]:
            if c["type"] == "Ready":
                c.update(
                    status=status, reason="NodeStatusUnknown", message="Kubelet stopped posting node status."
                )

    return change


def down_node_outcomes(folder: Path) -> tuple[str, bool, bool]:
    """The scenario on the emulator: a ReplicaSet's pod on a node that is down (the kubelet double holds it
    down; Ready Unknown), drained; then a person's out-of-service taint. (the pod's drain outcome, whether
    it was still terminating after the drain, whether it was gone within 5 s of the taint)."""
    with emulated_cluster(folder, nodes=2, racks=1, behaviours={NODE: NodeBehaviour(down=True)}) as cluster:
        emulator = cluster.emulator
        emulator.seed([_replica("web-1-abcde")])
        emulator.update("nodes", "", NODE, _ready("Unknown"))
        port = cluster.port()
        report = drain(port, NODE, DrainPolicy(unreachable_wait_s=0.3, poll_s=0.05, deadline_s=30))
        assert report.complete and not report.escalate, report.summary()
        (pod,) = report.pods
        assert "not Ready (Ready Unknown)" in pod.message
        assert report.message == "drained; left terminating on a node that is not Ready: default/web-1-abcde"
        left = emulator.get("pods", "web-1-abcde", "default")
        terminating = left is not None and bool(left["metadata"].get("deletionTimestamp"))
        port.add_taint(NODE, vocab.TAINT_OUT_OF_SERVICE, "nodeshutdown", "NoExecute")
        deadline = time.monotonic() + 5
        while emulator.get("pods", "web-1-abcde", "default") is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        return pod.outcome, terminating, emulator.get("pods", "web-1-abcde", "default") is None


def test_a_pod_evicted_from_a_node_that_is_down_is_stranded_not_waited_for(tmp_path: Path) -> None:
    # stranded; still terminating (no kubelet confirms it); gone once a person marks the node out of service
    assert down_node_outcomes(tmp_path) == ("stranded", True, True)


def test_a_pod_on_a_ready_node_is_waited_for_until_its_kubelet_confirms_it(tmp_path: Path) -> None:
    with emulated_cluster(tmp_path, nodes=2, racks=1) as cluster:
        cluster.emulator.seed([_replica("web-1-fghij")])
        report = drain(cluster.port(), NODE, DrainPolicy(unreachable_wait_s=0, poll_s=0.05, deadline_s=30))
        assert report.complete and [p.outcome for p in report.pods] == ["evicted"], report.summary()
        assert cluster.emulator.get("pods", "web-1-fghij", "default") is None


def sim_down_node_outcomes() -> tuple[str, bool, bool]:
    """The same scenario on the simulated fleet: its ``not-ready`` fault (Ready False), a ReplicaSet's pod
    on the node, the drain, then the out-of-service taint."""
    port = SimCluster(MemoryStore(load_fleet("sim:nodes=2,gpu=h100,racks=1,workloads=false")), retry=FAST)
    with port.store.transaction() as fleet:
        pod = Pod(name="web-1-abcde", namespace="default", uid="u-web", node=NODE, owner_kind="ReplicaSet",
                  owner_name="web-1")  # fmt: skip
        fleet.pods[pod.ref] = pod
    port.inject(NODE, "not-ready")
    report = drain(port, NODE, DrainPolicy(unreachable_wait_s=0.3, poll_s=0.05, deadline_s=30))
    assert report.complete and not report.escalate, report.summary()
    (outcome,) = [p for p in report.pods if p.pod == "default/web-1-abcde"]
    terminating = any(p.name == "web-1-abcde" and p.terminating for p in port.pods_on(NODE))
    port.add_taint(NODE, vocab.TAINT_OUT_OF_SERVICE, "nodeshutdown", "NoExecute")
    gone = all(p.name != "web-1-abcde" for p in port.pods_on(NODE))
    return outcome.outcome, terminating, gone


def test_the_simulated_fleet_keeps_a_pod_evicted_from_a_node_that_is_down_as_the_real_cluster_does() -> None:
    assert sim_down_node_outcomes() == ("stranded", True, True)
    # a Ready node's kubelet confirms at once: the pod is gone, its ReplicaSet's replacement made
    port = SimCluster(MemoryStore(load_fleet("sim:nodes=2,gpu=h100,racks=1,workloads=false")), retry=FAST)
    with port.store.transaction() as fleet:
        pod = Pod(name="web-1-fghij", namespace="default", uid="u-web", node=NODE, owner_kind="ReplicaSet",
                  owner_name="web-1")  # fmt: skip
        fleet.pods[pod.ref] = pod
    assert port.evict(pod).outcome == "evicted"
    names = {p.name for n in ("node-00", "node-01") for p in port.pods_on(n)}
    assert "web-1-fghij" not in names and any(n.startswith("web-1-") for n in names)
