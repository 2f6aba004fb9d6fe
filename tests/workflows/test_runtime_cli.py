"""``dsx recipe``, ``dsx bundle``, ``dsx drift``: what the acceptance runs, from any folder."""

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

CRITERIA = ["--service", "eks", "--accelerator", "h100", "--os", "ubuntu", "--intent", "training"]


def _dsx(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "workflows.cli", *args], capture_output=True, text=True, cwd=cwd, check=False
    )


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


def _snapshot_file(path: Path, recipe: dict[str, Any], old_driver_on: str | None) -> Path:
    driver = next(c for c in recipe["components"] if c["name"] == "gpu-operator")["values"]["driver"][
        "version"
    ]
    nodes = [
        {
            "name": f"node-{i:02d}",
            "osImage": "Ubuntu 22.04.5 LTS",
            "kernelVersion": "5.15.0-130-generic",
            "kubeletVersion": "v1.31.4",
            "containerRuntimeVersion": "containerd://1.7.24",
            "gpuProduct": "NVIDIA-H100-80GB-HBM3",
            "gpuCount": 8,
            "driverVersion": "570.124.06" if f"node-{i:02d}" == old_driver_on else driver,
        }
        for i in range(8)
    ]
    releases = [
        {"name": c["release"], "namespace": c["namespace"], "chart": c["chart"], "version": c["version"]}
        for c in recipe["components"]
    ]
    images = [
        {
            "namespace": c["namespace"],
            "kind": "Deployment",
            "name": c["name"],
            "container": role,
            "image": image,
        }
        for c in recipe["components"]
        for role, image in c["images"].items()
    ]
    snapshot = {
        "kind": "ClusterSnapshot",
        "cluster": "fleet",
        "nodes": nodes,
        "releases": releases,
        "images": images,
    }
    path.write_text(json.dumps(snapshot))
    return path


def test_drift_names_the_node_on_an_older_driver_and_exits_1(tmp_path: Path) -> None:
    recipe = json.loads(_dsx("recipe", "resolve", *CRITERIA, "-o", "json", cwd=tmp_path).stdout)
    drifted = _snapshot_file(tmp_path / "drifted.json", recipe, old_driver_on="node-03")
    run = _dsx("drift", "--snapshot", str(drifted), *CRITERIA, "-o", "json", cwd=tmp_path)
    assert run.returncode == 1, run.stderr
    report = json.loads(run.stdout)
    assert report["driftedNodes"] == ["node-03"]
    assert [(f["subject"], f["field"], f["severity"]) for f in report["findings"]] == [
        ("node-03", "driverVersion", "critical")
    ]
    table = _dsx("drift", "--snapshot", str(drifted), *CRITERIA, cwd=tmp_path)
    assert table.returncode == 1 and "node-03" in table.stdout and "driverVersion" in table.stdout

    conforming = _snapshot_file(tmp_path / "conforming.json", recipe, old_driver_on=None)
    clean = _dsx("drift", "--snapshot", str(conforming), *CRITERIA, cwd=tmp_path)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "no drift" in clean.stdout
