"""The scheduler double binds a pod only where kube-scheduler would, and says why not as it does."""

from __future__ import annotations

from typing import Any

from kubernetes import client

from steps.cluster.kube import KubeCluster
from tests.emulator.apiserver import Emulator, ManualClock
from tests.emulator.objects import conditions, group_job, job_pods

Quiet = tuple[Emulator, Any, ManualClock]
RACK_0 = ["node-00", "node-01", "node-02", "node-03"]


def _pod(name: str, **spec: Any) -> dict[str, Any]:
    container = {"name": "main", "image": "busybox", "command": ["sleep", "600"]}
    if "limits" in spec:
        container["resources"] = {"limits": spec.pop("limits")}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "dsx", "labels": spec.pop("labels", {})},
        "spec": {"containers": [container], **spec},
    }


def _node(emulator: Emulator, pod: str) -> str:
    found = emulator.get("pods", pod, "dsx")
    assert found is not None
    return str(found["spec"].get("nodeName", ""))


def _why(emulator: Emulator, pod: str) -> str:
    scheduled = conditions(emulator.get("pods", pod, "dsx"))["PodScheduled"]
    assert (scheduled["status"], scheduled["reason"]) == ("False", "Unschedulable")
    return str(scheduled["message"])


def test_two_jobs_asking_for_every_gpu_of_a_rack_cannot_both_run_there(quiet: Quiet) -> None:
    emulator, api, _ = quiet
    jobs = client.BatchV1Api(api)
    jobs.create_namespaced_job("dsx", group_job("first", RACK_0))
    jobs.create_namespaced_job("dsx", group_job("second", RACK_0))
    emulator.settle()
    first, second = job_pods(emulator, "first"), job_pods(emulator, "second")
    assert sorted(p["spec"]["nodeName"] for p in first) == RACK_0
    assert all(conditions(p)["PodScheduled"]["status"] == "True" for p in first)
    assert all(not p["spec"].get("nodeName") for p in second)
    assert _why(emulator, second[0]["metadata"]["name"]) == (
        "0/16 nodes are available: 12 node(s) didn't match Pod's node affinity/selector, "
        "4 Insufficient nvidia.com/gpu. preemption: 0/16 nodes are available: "
        "12 Preemption is not helpful for scheduling, 4 No preemption victims found for incoming pod."
    )
    # The first job's pods end: their GPUs free up and the waiting pods are bound.
    for pod in first:
        emulator.update(
            "pods", "dsx", pod["metadata"]["name"], lambda p: p["status"].update(phase="Succeeded")
        )
    emulator.settle()
    assert sorted(p["spec"]["nodeName"] for p in job_pods(emulator, "second")) == RACK_0


def test_pods_of_one_group_never_share_a_node(quiet: Quiet) -> None:
    emulator, api, _ = quiet
    job = group_job("small", ["node-00", "node-01"], gpus=1)
    job["spec"]["completions"] = job["spec"]["parallelism"] = 3  # three pods, two nodes
    client.BatchV1Api(api).create_namespaced_job("dsx", job)
    emulator.settle()
    pods = job_pods(emulator, "small")
    assert sorted(p["spec"].get("nodeName", "") for p in pods) == ["", "node-00", "node-01"]
    waiting = next(p for p in pods if not p["spec"].get("nodeName"))
    assert _why(emulator, waiting["metadata"]["name"]).startswith(
        "0/16 nodes are available: 14 node(s) didn't match Pod's node affinity/selector, "
        "2 node(s) didn't match pod anti-affinity rules."
    )


def test_cordoned_tainted_and_unready_nodes_take_only_pods_that_tolerate_them(quiet: Quiet) -> None:
    emulator, api, _ = quiet
    core = client.CoreV1Api(api)
    port = KubeCluster(api, namespace="dsx")
    port.cordon("node-00", "repair")
    port.add_taint("node-01")  # dsx.dev/unhealthy:NoSchedule
    emulator.update(
        "nodes",
        "",
        "node-02",
        lambda n: [c.update(status="False") for c in n["status"]["conditions"] if c["type"] == "Ready"],
    )
    three = {"nodeSelector": {"topology.dsx.dev/rack": "rack-00"}}
    pin = {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["node-03"]}
                            ]
                        }
                    ]
                }
            }
        }
    }
    core.create_namespaced_pod("dsx", _pod("plain", **three, **pin))
    tolerant = [
        {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "dsx.dev/unhealthy", "operator": "Exists"},
    ]
    core.create_namespaced_pod("dsx", _pod("tolerant", tolerations=tolerant, **three, **pin))
    emulator.settle()
    assert _why(emulator, "plain").startswith(
        "0/16 nodes are available: 1 node(s) had untolerated taint {dsx.dev/unhealthy: }, "
        "1 node(s) had untolerated taint {node.kubernetes.io/not-ready: }, "
        "1 node(s) were unschedulable, 13 node(s) didn't match Pod's node affinity/selector."
    )
    assert _node(emulator, "tolerant") in ("node-00", "node-01")


def test_extended_resources_count_their_limits_against_allocatable(quiet: Quiet) -> None:
    emulator, api, _ = quiet
    core = client.CoreV1Api(api)
    emulator.update(
        "nodes", "", "node-05", lambda n: n["status"]["allocatable"].update({"vpc.amazonaws.com/efa": "4"})
    )
    fabric = {"nodeSelector": {"kubernetes.io/hostname": "node-05"}}
    core.create_namespaced_pod(
        "dsx", _pod("a", limits={"vpc.amazonaws.com/efa": "3", "nvidia.com/gpu": "4"}, **fabric)
    )
    core.create_namespaced_pod(
        "dsx", _pod("b", limits={"vpc.amazonaws.com/efa": "2", "nvidia.com/gpu": "4"}, **fabric)
    )
    core.create_namespaced_pod("dsx", _pod("c", limits={"rdma/hca_shared_devices_a": "1"}, **fabric))
    emulator.settle()
    assert _node(emulator, "a") == "node-05"
    assert _why(emulator, "b").startswith(
        "0/16 nodes are available: 1 Insufficient vpc.amazonaws.com/efa, "
        "15 node(s) didn't match Pod's node affinity/selector."
    )
    assert "1 Insufficient rdma/hca_shared_devices_a" in _why(emulator, "c")
    core.delete_namespaced_pod("a", "dsx")
    emulator.settle()
    assert _node(emulator, "b") == "node-05"


def test_pending_pods_are_retried_in_creation_order_when_capacity_frees(quiet: Quiet) -> None:
    emulator, api, _ = quiet
    core = client.CoreV1Api(api)
    one_node = {"nodeSelector": {"kubernetes.io/hostname": "node-09"}}
    for name in ("holder", "older", "newer"):
        core.create_namespaced_pod("dsx", _pod(name, limits={"nvidia.com/gpu": "8"}, **one_node))
    emulator.settle()
    assert [_node(emulator, n) for n in ("holder", "older", "newer")] == ["node-09", "", ""]
    core.delete_namespaced_pod("holder", "dsx")
    emulator.settle()
    assert [_node(emulator, n) for n in ("older", "newer")] == ["node-09", ""]
