"""Contract: any object by apiVersion and kind (what resource templates and snapshots use), and deletion
policies."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from steps.cluster import ConflictError, NotFoundError, load_fleet
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


def test_contract_an_unknown_propagation_policy_is_an_input_error(backend: Backend) -> None:
    with pytest.raises(InputError, match="propagation must be Background, Foreground or Orphan"):
        backend.port.delete_object("v1", "ConfigMap", "x", "dsx", propagation="Cascade")  # type: ignore[arg-type]
