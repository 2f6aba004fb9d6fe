"""dsx-remediate on the real control plane, started by the dsx-reconcile CronWorkflow's step (a Workflow it
creates, as for an edge the Sensor missed): a node the sentinel marked is quarantined, drained, rebooted by
the process kubelet as a real node reboots (the boot id first, Ready 20 s later, the sentinel's condition
cleared 40 s after that), recertified alone and beside a known-good partner whose GPUs are free (the first
known-good node is kept busy by a training pod; the partner is cordoned for the test and given back), and put
back in service."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest

from steps.cluster import vocabulary as vocab
from tests.e2e.cluster import NAMESPACE, Cluster
from tests.e2e.conftest import RealCluster, audit_events, pinned_workload
from tests.e2e.test_certify import CPU_RUN, DRILL_P_MIN, held_leases

pytestmark = pytest.mark.e2e

NODE = "node-01"
WORKLOADS = "research"


def _mark(real_cluster: RealCluster, node: str) -> None:
    """What the sentinel agent writes on a fatal XID: its condition True, then the taint."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    condition = {
        "type": vocab.CONDITION_GPU_XID,
        "status": "True",
        "reason": "FatalResetGpu",
        "message": "fatal (reset-gpu): XID 79 on GPU 0: GPU has fallen off the bus",
        "lastTransitionTime": stamp,
        "lastHeartbeatTime": stamp,
    }
    patch = json.dumps({"status": {"conditions": [condition]}})
    real_cluster.kubectl("patch", "node", node, "--subresource=status", "--type=strategic", "-p", patch)
    real_cluster.kubectl("taint", "node", node, f"{vocab.TAINT_UNHEALTHY}=:{vocab.TAINT_UNHEALTHY_EFFECT}")


def _busy(real_cluster: RealCluster, node: str) -> None:
    """A training pod holding every GPU of ``node``."""
    gpus = real_cluster.get("node", node)["status"]["allocatable"]["nvidia.com/gpu"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"train-{node}", "namespace": WORKLOADS},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "terminationGracePeriodSeconds": 5,
            "containers": [
                {
                    "name": "main",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"limits": {"nvidia.com/gpu": gpus}},
                }
            ],
        },
    }
    real_cluster.run("kubectl", "apply", "-f", "-", input=json.dumps(pod))
    real_cluster.kubectl(
        "wait", "-n", WORKLOADS, "--for=condition=Ready", f"pod/train-{node}", "--timeout=120s"
    )


def _repair_system(real_cluster: RealCluster, cluster: Cluster, node: str, stop: threading.Event) -> None:
    """A provider's repair service: once dsx asks for a repair, the node reboots."""
    while not stop.wait(1.0):
        annotations = real_cluster.get("node", node)["metadata"].get("annotations") or {}
        if vocab.ANNOTATION_REPAIR_REQUESTED_AT in annotations:
            (cluster.dir / "kubelet" / "nodes" / node / "reboot").touch()
            return


def _watch_cordons(
    real_cluster: RealCluster, nodes: list[str], seen: set[tuple[str, str]], stop: threading.Event
) -> None:
    """Note each (node, cordon owner) seen while the node is cordoned: the pair test's hold on its partner."""
    while not stop.wait(1.0):
        for name in nodes:
            node = real_cluster.get("node", name)
            if node["spec"].get("unschedulable"):
                owner = (node["metadata"].get("annotations") or {}).get(vocab.ANNOTATION_CORDONED_BY, "")
                seen.add((name, owner))


def _condition(node: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in node["status"]["conditions"] if c["type"] == kind)


@pytest.mark.e2e_heavy
def test_a_marked_node_is_repaired_recertified_and_back_in_service(
    real_cluster: RealCluster, own_cluster: Cluster
) -> None:
    before = real_cluster.get("node", NODE)["status"]["nodeInfo"]["bootID"]
    # The certification tests before this one leave known-good nodes: the pair test takes one whose GPUs
    # are free, never the first of them, which a training pod keeps busy.
    partners = sorted(
        n
        for n, marks in real_cluster.node_labels().items()
        if n != NODE and marks.get(vocab.LABEL_CERTIFICATION) == "passed"
    )
    evicted = pinned_workload(real_cluster, NODE, WORKLOADS, "trainer")  # for the drain to evict
    if partners:
        _busy(real_cluster, partners[0])
    _mark(real_cluster, NODE)
    stop = threading.Event()
    repairs = threading.Thread(
        target=_repair_system, args=(real_cluster, own_cluster, NODE, stop), daemon=True
    )
    repairs.start()
    cordons: set[tuple[str, str]] = set()
    watcher = threading.Thread(
        target=_watch_cordons, args=(real_cluster, partners[1:], cordons, stop), daemon=True
    )
    watcher.start()
    try:
        # No Sensor in this tier (the chart sets remediate=false): the reconciler, told to remediate, finds
        # the marked node (tainted, its condition fatal, no state, no run naming it) and creates the
        # dsx-remediate Workflow, as it does for a missed edge.
        parameters = {k: v for k, _, v in (p.partition("=") for p in CPU_RUN[1::2])}
        parameters["repair-timeout"] = "5m"
        # The pair test screens the node twice (p-min 0.9), as the drill does, not the default 21 (p-min
        # 0.2): 10 to 20 s a sweep on 2 cores, the flow is the same.
        parameters["p-min"] = DRILL_P_MIN
        reconciled = real_cluster.argo(
            "submit", "-n", NAMESPACE, "--from", "cronwf/dsx-reconcile", "--wait", "-o", "name",
            "-p", f"remediate-parameters={json.dumps(parameters)}", "-p", "remediate=true",
            check=False, timeout=300,
        )  # fmt: skip
        reconciler = reconciled.stdout.strip().splitlines()[-1] if reconciled.stdout.strip() else ""
        assert reconciler, reconciled.stderr + real_cluster.debug()
        assert real_cluster.workflow(reconciler)["status"].get("phase") == "Succeeded", real_cluster.debug()
        started = [
            wf["metadata"]["name"]
            for wf in real_cluster.get("workflows", "-n", NAMESPACE)["items"]
            if (wf["spec"].get("workflowTemplateRef") or {}).get("name") == "dsx-remediate"
            and (wf["metadata"].get("annotations") or {}).get("dsx.dev/started-by") == reconciler
        ]
        assert len(started) == 1, started
        result = real_cluster.argo("wait", "-n", NAMESPACE, started[0], check=False, timeout=1500)
        result.stdout = started[0]
    finally:
        stop.set()
        repairs.join(5)
        watcher.join(10)
        pods = real_cluster.get("pods", "-n", WORKLOADS, "-l", "app=trainer")["items"]
        real_cluster.kubectl("delete", "namespace", WORKLOADS, "--wait=false")
    name = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    assert name, result.stderr + real_cluster.debug()
    workflow = real_cluster.workflow(name)
    status = workflow["status"]
    failed = {
        n["displayName"]: n.get("message", "")
        for n in status.get("nodes", {}).values()
        if n.get("phase") in ("Failed", "Error")
    }
    assert status.get("phase") == "Succeeded", (
        f"{name}: {status.get('phase')} {failed}\n{real_cluster.debug()}"
    )

    node = real_cluster.get("node", NODE)
    assert node["status"]["nodeInfo"]["bootID"] != before, "the node never rebooted"
    assert not node["spec"].get("unschedulable"), "left cordoned"
    assert not [t for t in node["spec"].get("taints") or [] if t["key"] == vocab.TAINT_UNHEALTHY]
    labels = node["metadata"].get("labels") or {}
    assert vocab.LABEL_STATE not in labels and labels.get(vocab.LABEL_CERTIFICATION) == "passed", labels
    assert _condition(node, vocab.CONDITION_GPU_XID)["status"] == "False"
    booted = node["metadata"].get("annotations", {}).get(vocab.ANNOTATION_REPAIR_BOOTED_AT)
    assert booted is None, "the remediation's notes are cleared once the node is back"

    # The ledger: one ConfigMap per node and month, found by its label.
    ledger = real_cluster.get("configmaps", "-n", NAMESPACE, "-l", "dsx.dev/ledger=true")["items"]
    assert {cm["metadata"]["labels"]["dsx.dev/node"] for cm in ledger} >= {NODE}, ledger
    entries = "\n".join(value for cm in ledger for value in (cm.get("data") or {}).values())
    assert "escalated" not in entries, entries[-3000:]
    for state in ("quarantined", "draining", "awaiting-repair", "recertifying", "in-service"):
        assert state in entries, f"no {state} entry in the ledger:\n{entries[-3000:]}"
    if len(partners) > 1:
        assert f"pair test passed beside {partners[1]}" in entries, entries[-3000:]
        # The partner was held while the test ran (a cordon of dsx's pair owner, which the test's pods
        # tolerate and a workload does not), and given back after.
        assert (partners[1], "dsx-pair") in cordons, cordons
        assert not real_cluster.get("node", partners[1])["spec"].get("unschedulable"), "partner left cordoned"
    assert held_leases(real_cluster) == {}, "certification Leases still held"
    # The drain evicted the workload's pod; its replacement waited for the node and went back on it.
    assert evicted["metadata"]["uid"] not in {p["metadata"]["uid"] for p in pods}, "the drain left the pod"
    evictions = [
        e
        for e in audit_events(own_cluster)
        if (e.get("objectRef") or {}).get("subresource") == "eviction"
        and e["user"]["username"].endswith(":dsx-remediate")
    ]
    assert evictions, "the workload's pod did not leave through the Eviction API"
