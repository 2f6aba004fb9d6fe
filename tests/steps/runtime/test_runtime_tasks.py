"""The runtime workflow steps: results returned, evidence written under DSX_OUTPUT_DIR."""

import json
import subprocess
from pathlib import Path

import pytest

from steps.runtime.tasks import bundle_recipe, detect_drift, gate, resolve_recipe
from tests import yamltext
from tests.paths import REPO

CRITERIA = {"service": "eks", "accelerator": "h100", "os": "ubuntu", "intent": "training"}


def test_resolve_step_writes_the_recipe_and_its_graph(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DSX_OUTPUT_DIR", str(tmp_path))
    summary = resolve_recipe(**CRITERIA)
    folder = tmp_path / "recipe"
    assert sorted(p.name for p in folder.iterdir()) == summary.files
    recipe = yamltext.load((folder / "recipe.yaml").read_text())
    assert recipe["digest"] == summary.digest
    assert summary.versions["gpu-operator"] == "v25.3.4"
    assert summary.thresholds == recipe["thresholds"] and summary.criteria["accelerator"] == "h100"
    assert summary.thresholds["nccl"]["allReduce"][0] == {"size": "1GiB", "busBwGBps": 360, "scope": "node"}
    assert json.loads((folder / "graph.json").read_text())["deploymentOrder"] == summary.deploymentOrder
    assert (folder / "graph.dot").read_text().startswith("digraph recipe {")
    assert json.loads(summary.model_dump_json())["tiers"] == summary.tiers


def test_bundle_step_writes_a_verifiable_bundle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DSX_OUTPUT_DIR", str(tmp_path))
    summary = bundle_recipe("flux", **CRITERIA)
    folder = Path(summary.folder)
    assert folder == tmp_path / "bundle" and (folder / "kustomization.yaml").is_file()
    check = subprocess.run(["sha256sum", "-c", "checksums.txt"], cwd=folder, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout
    again = bundle_recipe("flux", **CRITERIA)
    assert again.checksumsSha256 == summary.checksumsSha256


def test_drift_step_reports_and_labels_drifted_nodes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DSX_OUTPUT_DIR", str(tmp_path))
    fleet = "sim:nodes=4,gpu=h100,faults=node-01:driver=570.124.06;node-03:driver=570.124.06"
    summary = detect_drift(fleet, scope="nodes", label="dsx.dev/drift", **CRITERIA)
    assert summary.drifted and summary.critical == 2
    assert summary.driftedNodes == summary.labelled == ["node-01", "node-03"]
    report = json.loads((tmp_path / "drift" / "drift.json").read_text())
    assert {(f["field"], f["actual"]) for f in report["findings"]} == {("driverVersion", "570.124.06")}
    assert len(json.loads((tmp_path / "drift" / "snapshot.json").read_text())["nodes"]) == 4


def test_drift_step_on_a_conforming_fleet_reports_nothing_and_labels_no_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DSX_OUTPUT_DIR", str(tmp_path))
    fleet = f"sim:{REPO / 'recipes' / 'fleets' / 'eks-h100-training.yaml'}"
    summary = detect_drift(fleet, scope="all", label="dsx.dev/drift", **CRITERIA)
    assert not summary.drifted and summary.labelled == [] and summary.driftedComponents == []
    assert gate(summary) == f"no drift from recipe {summary.digest}"
