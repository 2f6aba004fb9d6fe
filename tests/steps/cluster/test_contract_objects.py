"""Contract: any object by apiVersion and kind (what resource templates and snapshots use), and deletion
propagation to the objects an object owns."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from steps.cluster import ClusterError, ConflictError, NotFoundError, load_fleet
from steps.cluster.base import PortBase
from steps.errors import InputError
from tests.steps.cluster.conftest import Backend

WORKFLOW = {
    "apiVersion": "argoproj.io/v1alpha1",
    "kind": "Workflow",
    "metadata": {"name": "remediate-node-03", "namespace": "dsx", "labels": {"dsx.dev/node": "node-03"}},
    "spec": {"workflowTemplateRef": {"name": "remediate"}},
}


def test_contract_custom_object_create_get_patch_list_delete(backend: Backend) -> None:
    port = backend.port
    created = port.create_object(WORKFLOW)
    assert created["metadata"]["name"] == "remediate-node-03"
    assert created["metadata"]["resourceVersion"]
    got = port.get_object("argoproj.io/v1alpha1", "Workflow", "remediate-node-03", "dsx")
    assert got is not None and got["spec"] == WORKFLOW["spec"]

    patched = port.patch_object(
        "argoproj.io/v1alpha1", "Workflow", "remediate-node-03", {"status": {"phase": "Running"}}, "dsx"
    )
    assert patched["status"] == {"phase": "Running"}
    assert patched["metadata"]["resourceVersion"] != created["metadata"]["resourceVersion"]
    listed = port.list_objects("argoproj.io/v1alpha1", "Workflow", "dsx", "dsx.dev/node=node-03")
    assert [(o["apiVersion"], o["kind"], o["metadata"]["name"]) for o in listed] == [
        ("argoproj.io/v1alpha1", "Workflow", "remediate-node-03")
    ]
    assert port.list_objects("argoproj.io/v1alpha1", "Workflow", "dsx", "dsx.dev/node=node-04") == []

    with pytest.raises(ConflictError, match="create_object workflow/dsx/remediate-node-03: conflict"):
        port.create_object(WORKFLOW)
    assert port.delete_object("argoproj.io/v1alpha1", "Workflow", "remediate-node-03", "dsx") is True
    assert port.delete_object("argoproj.io/v1alpha1", "Workflow", "remediate-node-03", "dsx") is False
    assert port.get_object("argoproj.io/v1alpha1", "Workflow", "remediate-node-03", "dsx") is None
    with pytest.raises(NotFoundError, match="patch_object workflow/dsx/remediate-node-03"):
        port.patch_object("argoproj.io/v1alpha1", "Workflow", "remediate-node-03", {"x": 1}, "dsx")


def test_contract_namespaced_objects_default_to_default_and_list_across_namespaces(backend: Backend) -> None:
    port = backend.port
    port.create_object(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "sh.helm.release.v1.gpu.v1"},
            "type": "helm.sh/release.v1",
            "data": {"release": "H4sI"},
        }
    )
    port.create_object(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "a", "namespace": "gpu-operator", "labels": {"owner": "helm"}},
        }
    )
    assert port.get_object("v1", "Secret", "sh.helm.release.v1.gpu.v1") is not None
    assert port.get_object("v1", "Secret", "sh.helm.release.v1.gpu.v1", "gpu-operator") is None
    everywhere = port.list_objects("v1", "Secret")
    assert [(o["metadata"]["namespace"], o["metadata"]["name"]) for o in everywhere] == [
        ("default", "sh.helm.release.v1.gpu.v1"),
        ("gpu-operator", "a"),
    ]
    assert [
        o["metadata"]["name"] for o in port.list_objects("v1", "Secret", label_selector="owner=helm")
    ] == ["a"]


def test_contract_nodes_and_pods_are_objects_too(backend: Backend) -> None:
    port = backend.port
    node = port.get_object("v1", "Node", "node-00")
    assert (
        node is not None and node["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    )
    assert len(port.list_objects("v1", "Node", label_selector="topology.dsx.dev/rack=rack-00")) == 3
    pdbs = port.list_objects("policy/v1", "PodDisruptionBudget", "serving")
    assert [p["metadata"]["name"] for p in pdbs] == ["gateway", "inference"]


def test_contract_helm_release_secrets_of_a_simulated_fleet_list_alike(
    make_backend: Callable[..., Backend],
) -> None:
    backend = make_backend(
        "sim:nodes=2,releases=cert-manager@v1.18.2;monitoring/kube-prometheus-stack@75.15.0"
    )
    secrets = backend.port.list_objects("v1", "Secret", None, "owner=helm")
    assert [(s["metadata"]["namespace"], s["metadata"]["name"]) for s in secrets] == [
        ("cert-manager", "sh.helm.release.v1.cert-manager.v1"),
        ("monitoring", "sh.helm.release.v1.kube-prometheus-stack.v1"),
    ]
    assert {s["type"] for s in secrets} == {"helm.sh/release.v1"}
    stored = {
        o["metadata"]["name"]: o
        for o in load_fleet("sim:nodes=2,releases=cert-manager@v1.18.2").objects.values()
    }
    assert secrets[0]["data"] == stored["sh.helm.release.v1.cert-manager.v1"]["data"]


def _job_with_dependents(port: PortBase, name: str) -> str:
    """A batch/v1 Job in ``gpu-ops`` with a pod and a ConfigMap it owns; returns the Job's uid."""
    job = port.create_object(
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": name, "namespace": "gpu-ops"},
            "spec": {
                "parallelism": 0,  # its controller starts no pod of its own
                "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "i"}]}},
            },
        }
    )
    uid = job["metadata"]["uid"]
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": uid, "controller": True}
    for kind, extra in (
        ("Pod", {"spec": {"containers": [{"name": "c", "image": "i"}]}}),
        ("ConfigMap", {"data": {"k": "v"}}),
    ):
        port.create_object(
            {
                "apiVersion": "v1",
                "kind": kind,
                "metadata": {"name": f"{name}-0", "namespace": "gpu-ops", "ownerReferences": [owner]},
                **extra,
            }
        )
    return str(uid)


def _left(port: PortBase, name: str) -> dict[str, list[Any]]:
    return {
        kind: (obj["metadata"].get("ownerReferences") or [])
        for kind in ("Pod", "ConfigMap")
        if (obj := port.get_object("v1", kind, f"{name}-0", "gpu-ops")) is not None
    }


def test_contract_deleting_a_job_takes_its_pods_with_it_in_the_background(backend: Backend) -> None:
    port = backend.port
    _job_with_dependents(port, "sweep")
    assert port.delete_object("batch/v1", "Job", "sweep", "gpu-ops") is True  # Background by default
    _wait_until(lambda: _left(port, "sweep") == {})
    assert port.get_object("batch/v1", "Job", "sweep", "gpu-ops") is None


def test_contract_a_batch_v1_job_deleted_without_a_policy_orphans_its_pods(backend: Backend) -> None:
    port = backend.port
    _job_with_dependents(port, "plain")
    assert port.delete_object("batch/v1", "Job", "plain", "gpu-ops", propagation=None) is True
    _wait_until(lambda: _left(port, "plain") == {"Pod": [], "ConfigMap": []})
    _job_with_dependents(port, "kept")
    assert port.delete_object("batch/v1", "Job", "kept", "gpu-ops", propagation="Orphan") is True
    _wait_until(lambda: _left(port, "kept") == {"Pod": [], "ConfigMap": []})


def test_contract_an_unknown_propagation_policy_is_an_input_error(backend: Backend) -> None:
    with pytest.raises(InputError, match="propagation must be Background, Foreground or Orphan"):
        backend.port.delete_object("v1", "ConfigMap", "x", "dsx", propagation="Cascade")  # type: ignore[arg-type]


def _wait_until(check: Callable[[], bool], seconds: float = 5.0) -> None:
    """The garbage collector works after the deletion's answer; give it a moment."""
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "the dependents were not collected as expected"
        time.sleep(0.02)


def test_contract_a_configmap_over_one_mebibyte_is_refused(backend: Backend) -> None:
    """The API server holds a ConfigMap's values to 1 MiB; dsx's stored outcomes must fit, on both."""
    port = backend.port
    half = "x" * (512 * 1024)
    made = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "full", "namespace": "dsx"}}
    port.create_object({**made, "data": {"a": half, "b": half}})  # exactly 1 MiB: accepted
    with pytest.raises(ClusterError, match=r"422.*Too long: may not be more than 1048576 bytes"):
        port.patch_object("v1", "ConfigMap", "full", {"data": {"c": "z"}}, "dsx")
    with pytest.raises(ClusterError, match=r"422.*Too long"):
        over = {"name": "over", "namespace": "dsx"}
        port.create_object({**made, "metadata": over, "data": {"a": half * 3}})
    assert port.get_object("v1", "ConfigMap", "over", "dsx") is None
