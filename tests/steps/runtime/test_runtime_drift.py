"""Drift: the node or component at fault, the field, expected, actual and severity; silence if conforming."""

import base64
import gzip
import json
from pathlib import Path

import pytest

from steps.errors import InputError
from steps.runtime.catalogue import load_catalogue
from steps.runtime.criteria import parse_criteria
from steps.runtime.drift import compare, expected_node_facts, version_key
from steps.runtime.resolve import RecipeResult, resolve
from steps.runtime.snapshot import (
    NodeSnapshot,
    ReleaseSnapshot,
    Snapshot,
    WorkloadImage,
    _latest_releases,
    decode_helm_release,
    read_snapshot,
)


@pytest.fixture(scope="module")
def recipe() -> RecipeResult:
    query = parse_criteria({"service": "eks", "accelerator": "h100", "os": "ubuntu", "intent": "training"})
    return resolve(load_catalogue(), query)


def _node(name: str, **changes: object) -> NodeSnapshot:
    fields: dict[str, object] = {
        "name": name,
        "osImage": "Ubuntu 22.04.5 LTS",
        "kernelVersion": "5.15.0-130-generic",
        "kubeletVersion": "v1.31.4",
        "containerRuntimeVersion": "containerd://1.7.24",
        "gpuProduct": "NVIDIA-H100-80GB-HBM3",
        "gpuCount": 8,
        "driverVersion": "580.82.07",
        "cudaVersion": "13.0",
    }
    fields.update(changes)
    return NodeSnapshot.model_validate(fields)


def _conforming(recipe: RecipeResult, nodes: int = 8) -> Snapshot:
    releases = [
        ReleaseSnapshot(
            name=c.release, namespace=c.namespace, chart=c.chart, version=c.version, status="deployed"
        )
        for c in recipe.components
    ]
    images = [
        WorkloadImage(namespace=c.namespace, kind="Deployment", name=c.name, container=role, image=image)
        for c in recipe.components
        for role, image in c.images.items()
    ]
    system = _node("system-0", gpuProduct="", gpuCount=0, driverVersion="", cudaVersion="")
    return Snapshot(
        cluster="test",
        nodes=[system, *(_node(f"gpu-{i:02d}") for i in range(nodes))],
        releases=releases,
        images=images,
    )


def test_a_conforming_cluster_has_no_drift(recipe: RecipeResult) -> None:
    report = compare(_conforming(recipe), recipe)
    assert report.findings == []
    assert not report.drifted and not report.fails()
    assert report.checked == {"nodes": 9, "gpuNodes": 8, "components": len(recipe.components)}


def test_an_older_driver_names_the_node_and_field(recipe: RecipeResult) -> None:
    snapshot = _conforming(recipe)
    snapshot.nodes[4] = _node("gpu-03", driverVersion="570.124.06")
    report = compare(snapshot, recipe)
    assert report.drifted and report.fails("critical")
    assert report.driftedNodes == ["gpu-03"]
    (finding,) = report.findings
    assert (finding.scope, finding.subject, finding.field) == ("node", "gpu-03", "driverVersion")
    assert (finding.expected, finding.actual, finding.severity) == ("580.82.07", "570.124.06", "critical")
    assert "older" in finding.message


def test_node_fields_are_judged_against_the_recipe(recipe: RecipeResult) -> None:
    snapshot = _conforming(recipe, nodes=0)
    snapshot.nodes += [
        _node("old-kernel", kernelVersion="5.4.0-200-generic"),
        _node("old-kubelet", kubeletVersion="v1.29.9"),
        _node("rhel", osImage="Red Hat Enterprise Linux 9.4 (Plow)"),
        _node("wrong-gpu", gpuProduct="NVIDIA-A100-SXM4-80GB"),
        _node("lost-gpu", gpuCount=7),
        _node("new-driver", driverVersion="580.95.05"),
        _node("no-driver", driverVersion=""),
    ]
    report = compare(snapshot, recipe)
    by_node = {(f.subject, f.field): f for f in report.findings}
    assert by_node[("old-kernel", "kernel")].severity == "critical"
    assert by_node[("old-kubelet", "kubernetes")].expected == ">= 1.30"
    assert by_node[("rhel", "os")].severity == "critical"
    assert by_node[("wrong-gpu", "gpuProduct")].expected == "H100"
    assert by_node[("lost-gpu", "gpuCount")].actual == "7"
    assert by_node[("new-driver", "driverVersion")].severity == "warning"
    assert by_node[("no-driver", "driverVersion")].severity == "critical"
    assert ("system-0", "driverVersion") not in by_node  # CPU nodes are not judged on GPU fields
    assert len(report.findings) == 7
    assert report.fails("warning") and report.fails("critical")


def test_components_are_judged_by_release_version_and_images(recipe: RecipeResult) -> None:
    snapshot = _conforming(recipe)
    gpu_operator = recipe.component("gpu-operator")
    snapshot.releases = [r for r in snapshot.releases if r.name != "cert-manager"]
    for release in snapshot.releases:
        if release.name == "gpu-operator":
            release.version = "v25.3.1"
        if release.name == "argo-workflows":
            release.version = "1.0.1"
    for image in snapshot.images:
        if image.namespace == gpu_operator.namespace:
            image.image = "nvcr.io/nvidia/gpu-operator:v25.3.1"
    report = compare(snapshot, recipe, scopes=("components",))
    found = {(f.subject, f.field): f for f in report.findings}
    assert found[("cert-manager", "release")].severity == "critical"
    assert found[("gpu-operator", "chartVersion")].severity == "critical"
    assert found[("argo-workflows", "chartVersion")].severity == "warning"
    assert found[("gpu-operator", "image.operator")].actual == "nvcr.io/nvidia/gpu-operator:v25.3.1"
    assert report.driftedComponents == ["argo-workflows", "cert-manager", "gpu-operator"]
    assert report.driftedNodes == [] and report.checked["nodes"] == 0


def test_a_cpu_only_cluster_fails_a_gpu_recipe(recipe: RecipeResult) -> None:
    snapshot = _conforming(recipe, nodes=0)
    report = compare(snapshot, recipe, scopes=("nodes",))
    assert [(f.scope, f.field) for f in report.findings] == [("cluster", "gpuNodes")]


def test_expected_facts_and_versions() -> None:
    assert version_key("containerd://1.7.24") == (1, 7, 24)
    assert version_key("v1.31.4") == (1, 31, 4)
    assert version_key("Ubuntu 22.04.5 LTS") == (22, 4, 5)
    assert version_key("") is None
    a100 = resolve(load_catalogue(), parse_criteria({"accelerator": "a100"}))
    assert expected_node_facts(a100) == {"driverVersion": "570.172.08"}


def _helm_secret(name: str, namespace: str, revision: int, status: str, version: str) -> dict[str, object]:
    release = {
        "name": name,
        "namespace": namespace,
        "version": revision,
        "info": {"status": status},
        "chart": {"metadata": {"name": "gpu-operator", "version": version, "appVersion": version}},
    }
    helm_payload = base64.b64encode(gzip.compress(json.dumps(release).encode()))  # what Helm stores
    return {
        "type": "helm.sh/release.v1",
        "metadata": {
            "name": f"sh.helm.release.v1.{name}.v{revision}",
            "namespace": namespace,
            "labels": {"owner": "helm", "name": name, "status": status, "version": str(revision)},
        },
        "data": {"release": base64.b64encode(helm_payload).decode()},  # what the API returns
    }


def test_helm_release_secrets_are_decoded_to_the_deployed_revision() -> None:
    secrets = [
        _helm_secret("gpu-operator", "gpu-operator", 1, "superseded", "v25.3.1"),
        _helm_secret("gpu-operator", "gpu-operator", 2, "deployed", "v25.3.4"),
        _helm_secret("gpu-operator", "gpu-operator", 3, "failed", "v25.10.0"),
    ]
    decoded = decode_helm_release(secrets[1])
    assert decoded is not None and decoded["chart"]["metadata"]["version"] == "v25.3.4"
    (release,) = _latest_releases(secrets)
    assert (release.name, release.chart, release.version, release.revision) == (
        "gpu-operator",
        "gpu-operator",
        "v25.3.4",
        2,
    )
    assert decode_helm_release({"data": {"release": "not base64!"}}) is None


def test_snapshots_round_trip_and_bad_files_name_the_line(recipe: RecipeResult, tmp_path: Path) -> None:
    snapshot = _conforming(recipe)
    path = tmp_path / "snapshot.json"
    path.write_text(snapshot.model_dump_json(indent=2))
    assert read_snapshot(path) == snapshot
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: dsx.dev/v1alpha1\nkind: ClusterSnapshot\nnodes:\n  - name: a\n    gpuCount: many\n"
    )
    with pytest.raises(InputError, match=r"bad\.yaml:5: not a ClusterSnapshot: nodes\[0\]\.gpuCount"):
        read_snapshot(bad)
