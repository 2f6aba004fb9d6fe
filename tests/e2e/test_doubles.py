"""The emulated API server against the real one: the same request, the same answer.

Each scenario runs on :class:`tests.k8s_emulator.Emulator` and on the real control plane, and the test
compares what each said. Where they differ, the double changes.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from steps.cluster import load_fleet
from steps.cluster.kube import load_api_client
from tests.e2e.conftest import RealCluster
from tests.k8s_emulator import POD_SECURITY_ENFORCE, Emulator, write_kubeconfig
from tests.pods import bare_pod, rank_pod

pytestmark = pytest.mark.e2e


def _answers(core: client.CoreV1Api, namespace: str, dry_run: str | None) -> dict[str, Any]:
    """What the server says to a restricted namespace, a bare pod and a rank pod in it."""
    core.create_namespace({"metadata": {"name": namespace, "labels": {POD_SECURITY_ENFORCE: "restricted"}}})
    deadline = time.monotonic() + 30
    while (
        dry_run and time.monotonic() < deadline
    ):  # the service-account controller makes "default" soon after
        try:
            core.read_namespaced_service_account("default", namespace)
            break
        except ApiException:
            time.sleep(0.2)
    answers: dict[str, Any] = {}
    for name, pod in (("bare", bare_pod()), ("rank", rank_pod(namespace))):
        try:
            if dry_run:
                core.create_namespaced_pod(namespace, pod, dry_run=dry_run)
            else:
                core.create_namespaced_pod(namespace, pod)
            answers[name] = "created"
        except ApiException as exc:
            answers[name] = (exc.status, json.loads(exc.body)["message"])
    return answers


def test_pod_security_restricted_refuses_and_admits_the_same_pods(
    real_cluster: RealCluster, tmp_path: Path
) -> None:
    namespace = f"psa-{uuid.uuid4().hex[:8]}"
    real_api, _ = load_api_client(str(real_cluster.kubeconfig))
    try:
        real = _answers(client.CoreV1Api(real_api), namespace, dry_run="All")
    finally:
        client.CoreV1Api(real_api).delete_namespace(namespace)
    with Emulator() as emulator:
        fake_api, _ = load_api_client(str(write_kubeconfig(tmp_path / "kubeconfig", emulator.url)))
        emulated = _answers(client.CoreV1Api(fake_api), namespace, dry_run=None)
    assert real["rank"] == "created", real
    assert real["bare"][0] == 403 and 'violates PodSecurity "restricted:latest"' in real["bare"][1]
    assert emulated == real


def _gpu_pod(name: str, node: str, gpus: int) -> dict[str, Any]:
    """A pod that asks for ``gpus`` GPUs on ``node`` (its node selector), and sleeps."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [
                {
                    "name": "main",
                    "image": "registry.k8s.io/pause:3.10",
                    "command": ["sleep", "600"],
                    "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                }
            ],
        },
    }


def _scheduled(core: client.CoreV1Api, namespace: str, name: str) -> dict[str, Any]:
    """The pod's PodScheduled condition once the scheduler has written one (status, reason, message)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        pod = core.read_namespaced_pod(name, namespace)
        for condition in pod.status.conditions or []:
            if condition.type == "PodScheduled":
                return {"status": condition.status, "reason": condition.reason, "message": condition.message}
        time.sleep(0.5)
    raise AssertionError(f"pod {name}: the scheduler wrote no PodScheduled condition in 60 s")


def _busy(core: client.CoreV1Api, namespace: str, node: str, gpus: int) -> dict[str, Any]:
    """A workload holds every GPU of ``node``; what the scheduler says to a test pod that wants them."""
    core.create_namespace({"metadata": {"name": namespace}})
    core.create_namespaced_pod(namespace, _gpu_pod("workload", node, gpus))
    assert _scheduled(core, namespace, "workload")["status"] == "True"
    core.create_namespaced_pod(namespace, _gpu_pod("test", node, gpus))
    return _scheduled(core, namespace, "test")


def test_a_node_whose_gpus_a_workload_holds_leaves_a_test_pod_unschedulable_alike(
    real_cluster: RealCluster, tmp_path: Path
) -> None:
    namespace = f"busy-{uuid.uuid4().hex[:8]}"
    real_api, _ = load_api_client(str(real_cluster.kubeconfig))
    nodes = client.CoreV1Api(real_api).list_node().items
    gpus = int(nodes[0].status.allocatable["nvidia.com/gpu"])
    core = client.CoreV1Api(real_api)
    try:
        real = _busy(core, namespace, "node-03", gpus)
    finally:
        core.delete_namespace(namespace)
        deadline = time.monotonic() + 120  # the GPUs are free again only once the workload is gone
        while core.list_namespaced_pod(namespace).items and time.monotonic() < deadline:
            time.sleep(1)
    with Emulator() as emulator:
        emulator.seed(
            load_fleet(f"sim:nodes={len(nodes)},gpu=h100,gpus={gpus},racks=2,workloads=false").manifests()
        )
        fake_api, _ = load_api_client(str(write_kubeconfig(tmp_path / "kubeconfig", emulator.url)))
        emulated = _busy(client.CoreV1Api(fake_api), namespace, "node-03", gpus)
    assert real["status"] == "False" and real["reason"] == "Unschedulable", real
    assert "Insufficient nvidia.com/gpu" in real["message"], real
    assert emulated == real
