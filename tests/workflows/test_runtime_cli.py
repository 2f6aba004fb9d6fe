"""``dsx recipe``, ``dsx bundle``, ``dsx drift``: what the acceptance runs, from any folder."""

import json
import subprocess
from pathlib import Path

import pytest

from tests.cli import dsx as _dsx
from tests.paths import REPO

CRITERIA = ["--service", "eks", "--accelerator", "h100", "--os", "ubuntu", "--intent", "training"]
FLEET = REPO / "recipes" / "fleets" / "eks-h100-training.yaml"
"""A simulated fleet running exactly what the packaged recipe pins for CRITERIA."""


def test_recipe_resolve_json_gives_versions_order_overlays_and_digest(tmp_path: Path) -> None:
    run = _dsx("recipe", "resolve", *CRITERIA, "-o", "json", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    data = json.loads(run.stdout)
    assert data["kind"] == "RecipeResult"
    versions = {c["name"]: c["version"] for c in data["components"]}
    assert versions["gpu-operator"] == "v25.3.4"
    assert versions["cert-manager"] == "v1.18.2"
    order = data["deploymentOrder"]
    for component in data["components"]:
        for dep in component["dependsOn"]:
            assert order.index(dep) < order.index(component["name"])
    assert data["appliedOverlays"][0]["name"] == "base"
    assert data["digest"].startswith("sha256:")
    (tmp_path / "recipe.json").write_text(run.stdout)

    bundle = _dsx("bundle", "--format", "helm", "--out", "out", "--recipe", "recipe.json", cwd=tmp_path)
    assert bundle.returncode == 0, bundle.stderr
    check = subprocess.run(["sha256sum", "-c", "checksums.txt"], cwd=tmp_path / "out", capture_output=True)
    assert check.returncode == 0

    edited = json.loads(run.stdout)
    edited["components"][0]["version"] = "9.9.9"
    (tmp_path / "edited.json").write_text(json.dumps(edited))
    refused = _dsx("bundle", "--format", "helm", "--out", "out2", "--recipe", "edited.json", cwd=tmp_path)
    assert refused.returncode == 2
    assert "digest" in refused.stderr and not (tmp_path / "out2").exists()


def test_bad_input_exits_2_with_a_message_naming_it(tmp_path: Path) -> None:
    unknown = _dsx("recipe", "resolve", "--accelerator", "mi300", cwd=tmp_path)
    assert unknown.returncode == 2
    assert "--accelerator: unknown value 'mi300'" in unknown.stderr

    no_repo = _dsx("bundle", "--format", "argocd", "--out", "b", *CRITERIA, cwd=tmp_path)
    assert no_repo.returncode == 2 and "--repo-url" in no_repo.stderr
    assert not (tmp_path / "b").exists()

    catalogue = tmp_path / "cat"
    (catalogue / "overlays").mkdir(parents=True)
    (catalogue / "registry.yaml").write_text(
        "apiVersion: dsx.dev/v1alpha1\nkind: ComponentRegistry\n"
        "metadata: {name: x}\nspec:\n  components: {}\n"
    )
    (catalogue / "overlays" / "broken.yaml").write_text("apiVersion: dsx.dev/v1alpha1\nkind: [Recipe\n")
    broken = _dsx("recipe", "list", "--recipes", str(catalogue), cwd=tmp_path)
    assert broken.returncode == 2
    assert f"{catalogue}/overlays/broken.yaml:" in broken.stderr


def test_graph_and_list_outputs(tmp_path: Path) -> None:
    dot = _dsx("recipe", "graph", *CRITERIA, "-o", "dot", cwd=tmp_path)
    assert dot.returncode == 0, dot.stderr
    assert dot.stdout.startswith("digraph recipe {")
    assert '"kube-prometheus-stack" -> "gpu-operator";' in dot.stdout
    listing = _dsx("recipe", "list", "-o", "json", cwd=tmp_path)
    names = {o["name"] for o in json.loads(listing.stdout)}
    assert {"base", "eks", "h100", "local-cpu-training"} <= names


@pytest.mark.story
def test_drift_names_the_node_on_an_older_driver_and_exits_1(tmp_path: Path) -> None:
    conforming = _dsx("drift", "--cluster", f"sim:{FLEET}", *CRITERIA, "-o", "json", cwd=tmp_path)
    assert conforming.returncode == 0, conforming.stdout + conforming.stderr
    report = json.loads(conforming.stdout)
    assert not report["drifted"] and report["findings"] == []
    assert report["checked"]["gpuNodes"] == 8 and report["checked"]["components"] == 8  # EFA plugin too

    older = f"sim:{FLEET},faults=node-03:driver=570.124.06"
    run = _dsx("drift", "--cluster", older, *CRITERIA, "-o", "json", cwd=tmp_path)
    assert run.returncode == 1, run.stderr
    report = json.loads(run.stdout)
    assert report["driftedNodes"] == ["node-03"] and report["driftedComponents"] == []
    assert [
        (f["subject"], f["field"], f["expected"], f["actual"], f["severity"]) for f in report["findings"]
    ] == [("node-03", "driverVersion", "580.82.07", "570.124.06", "critical")]

    table = _dsx("drift", "--cluster", older, *CRITERIA, cwd=tmp_path)
    assert table.returncode == 1 and "node-03" in table.stdout and "driverVersion" in table.stdout
    clean = _dsx("drift", "--cluster", f"sim:{FLEET}", *CRITERIA, cwd=tmp_path)
    assert clean.returncode == 0 and "no drift" in clean.stdout
