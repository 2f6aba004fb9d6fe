"""Snapshot and drift through the cluster port, on the simulated fleet."""

import json
from pathlib import Path

import pytest

from steps.cluster import connect
from steps.cluster.sim import GPU_MODELS
from steps.runtime.catalogue import load_catalogue
from steps.runtime.criteria import parse_criteria
from steps.runtime.drift import compare
from steps.runtime.resolve import RecipeResult, resolve
from steps.runtime.snapshot import take_snapshot
from tests.cli import dsx as _dsx
from tests.paths import REPO

H100 = ["--service", "eks", "--accelerator", "h100", "--os", "ubuntu", "--intent", "training"]
CONFORMING = REPO / "recipes" / "fleets" / "eks-h100-training.yaml"


def _recipe(accelerator: str) -> RecipeResult:
    query = {"service": "eks", "accelerator": accelerator, "os": "ubuntu", "intent": "training"}
    return resolve(load_catalogue(), parse_criteria(query))


def test_snapshot_reads_node_software_and_gpu_labels() -> None:
    snapshot = take_snapshot(connect("sim:nodes=4,gpu=h100"), cluster="sim")
    assert [n.name for n in snapshot.nodes] == ["node-00", "node-01", "node-02", "node-03"]
    node = snapshot.nodes[0]
    assert node.gpuProduct == "NVIDIA-H100-80GB-HBM3"
    assert node.gpuCount == 8
    assert (node.driverVersion, node.cudaVersion) == ("580.82.07", "13.0")
    assert node.kubeletVersion.startswith("v1.")
    assert node.osImage.startswith("Ubuntu")
    assert node.kernelVersion and node.containerRuntimeVersion.startswith("containerd://")
    assert snapshot.releases == [] and snapshot.images == []


@pytest.mark.parametrize("accelerator", sorted(GPU_MODELS))
def test_every_simulated_gpu_node_runs_what_the_packaged_recipe_pins(accelerator: str) -> None:
    snapshot = take_snapshot(connect(f"sim:nodes=2,gpu={accelerator}"))
    report = compare(snapshot, _recipe(accelerator), ("nodes",))
    assert report.findings == [] and report.checked["gpuNodes"] == 2


def test_snapshot_reads_the_simulated_helm_releases_and_their_images() -> None:
    snapshot = take_snapshot(connect(f"sim:{CONFORMING}"))
    recipe = _recipe("h100")
    assert {(r.namespace, r.name, r.chart, r.version, r.status) for r in snapshot.releases} == {
        (c.namespace, c.release, c.chart, c.version, "deployed") for c in recipe.components
    }
    assert {i.image for i in snapshot.images} == {i for c in recipe.components for i in c.images.values()}
    assert compare(snapshot, recipe).findings == []


def test_component_drift_on_the_simulated_fleet_names_the_release() -> None:
    fleet = "sim:nodes=2,gpu=h100,releases=gpu-operator@v25.3.1;cert-manager/cm@v1.18.2"
    report = compare(take_snapshot(connect(fleet)), _recipe("h100"), ("components",))
    found = [(f.subject, f.field, f.actual, f.severity) for f in report.findings]
    assert ("gpu-operator", "chartVersion", "v25.3.1", "critical") in found
    assert ("gpu-operator", "image.operator", "(not running)", "warning") in found
    # cert-manager was released under another name; the rest were never installed.
    absent = sorted(subject for subject, field, _, _ in found if field == "release")
    assert absent == sorted(c.name for c in _recipe("h100").components if c.name != "gpu-operator")
    assert len(found) == len(absent) + 2


@pytest.mark.story
def test_drift_against_the_fleet_names_nodes_and_exits_by_result(tmp_path: Path) -> None:
    fleet = "sim:nodes=8,gpu=h100"
    clean = _dsx("drift", "--cluster", fleet, *H100, "--scope", "nodes", cwd=tmp_path)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "no drift" in clean.stdout

    skewed = f"{fleet},faults=node-03:driver=570.124.06;node-05:kernel=5.4.0-216-generic"
    drifted = _dsx("drift", "--cluster", skewed, *H100, "--scope", "nodes", "-o", "json", cwd=tmp_path)
    assert drifted.returncode == 1, drifted.stderr
    report = json.loads(drifted.stdout)
    assert report["driftedNodes"] == ["node-03", "node-05"]
    assert [(f["subject"], f["field"], f["expected"], f["actual"]) for f in report["findings"]] == [
        ("node-03", "driverVersion", "580.82.07", "570.124.06"),
        ("node-05", "kernel", ">= 5.15", "5.4.0-216-generic"),
    ]

    snapshot_file = tmp_path / "snapshot.json"
    written = _dsx("snapshot", "--cluster", skewed, "-o", "json", cwd=tmp_path)
    assert written.returncode == 0, written.stderr
    snapshot_file.write_text(written.stdout)
    offline = _dsx(
        "drift", "--snapshot", str(snapshot_file), *H100, "--scope", "nodes", "-o", "json", cwd=tmp_path
    )
    assert offline.returncode == 1
    assert json.loads(offline.stdout)["findings"] == report["findings"]
