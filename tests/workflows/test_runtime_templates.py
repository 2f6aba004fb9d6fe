"""The runtime workflows compile cleanly and run on this machine with the local runner."""

import json
import subprocess
from pathlib import Path
from typing import Any

from steps.runtime.criteria import ALLOWED, ANY, FIELDS
from steps.runtime.drift import SCOPES
from tests import yamltext
from workflows import compiler
from workflows.compiler import trusted_steps
from workflows.runner import RunOptions, run

CRITERIA = {"service": "eks", "accelerator": "h100", "os": "ubuntu", "intent": "training"}


def _compiled() -> dict[str, dict[str, Any]]:
    return {
        f.manifest["metadata"]["name"]: f.manifest
        for f in compiler.compile_objects(["workflows.templates.runtime"])
    }


def _artifacts(out: Path, step: str, name: str) -> Path:
    (folder,) = (out / "nodes").glob(f"{step}*/artifacts/{name}")
    return folder


def test_the_three_runtime_workflows_compile() -> None:
    manifests = _compiled()
    assert {name: m["kind"] for name, m in manifests.items()} == {
        "dsx-recipe": "WorkflowTemplate",
        "dsx-bundle": "WorkflowTemplate",
        "dsx-drift": "CronWorkflow",
    }
    cron = manifests["dsx-drift"]["spec"]
    assert cron["schedules"] == ["0 6 * * *"] and cron["concurrencyPolicy"] == "Forbid"


def test_recipe_and_bundle_workflows_leave_their_artifacts(tmp_path: Path) -> None:
    manifests = _compiled()
    recipe = run(
        manifests["dsx-recipe"],
        (),
        CRITERIA,
        RunOptions(out_dir=tmp_path / "recipe", trusted=trusted_steps()),
    )
    assert recipe.phase == "Succeeded", recipe.message
    folder = _artifacts(tmp_path / "recipe", "resolve-recipe", "recipe")
    assert sorted(p.name for p in folder.iterdir()) == ["graph.dot", "graph.json", "graph.mmd", "recipe.yaml"]
    assert yamltext.load((folder / "recipe.yaml").read_text())["kind"] == "RecipeResult"

    parameters = {**CRITERIA, "format": "argocd", "repo-url": "https://git.example.org/gitops.git"}
    bundle = run(
        manifests["dsx-bundle"],
        (),
        parameters,
        RunOptions(out_dir=tmp_path / "bundle", trusted=trusted_steps()),
    )
    assert bundle.phase == "Succeeded", bundle.message
    folder = _artifacts(tmp_path / "bundle", "bundle-recipe", "bundle")
    check = subprocess.run(["sha256sum", "-c", "checksums.txt"], cwd=folder, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout
    assert (folder / "app-of-apps.yaml").is_file()


def test_drift_workflow_labels_drifted_nodes_and_fails(tmp_path: Path) -> None:
    cron = _compiled()["dsx-drift"]
    workflow = {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {"name": "dsx-drift-run"},
        "spec": cron["spec"]["workflowSpec"],
    }
    fleet = "sim:nodes=4,gpu=h100,faults=node-00:driver=570.124.06;node-02:driver=570.124.06"
    options = RunOptions(out_dir=tmp_path / "drift", cluster=fleet, trusted=trusted_steps())
    result = run(workflow, (), {**CRITERIA, "scope": "nodes"}, options)
    assert result.phase == "Failed"  # two nodes run an older driver than the recipe pins
    folder = _artifacts(tmp_path / "drift", "detect-drift", "drift")
    report = json.loads((folder / "drift.json").read_text())
    assert report["driftedNodes"] == ["node-00", "node-02"]
    assert {f["field"] for f in report["findings"]} == {"driverVersion"}
    (stdout,) = (tmp_path / "drift" / "nodes").glob("detect-drift*/stdout.log")
    assert json.loads(stdout.read_text().strip().splitlines()[-1])["labelled"] == report["driftedNodes"]
    (gate,) = (tmp_path / "drift" / "nodes").glob("gate*/stderr.log")
    assert "nodes node-00, node-02" in gate.read_text()


def test_every_runtime_steps_result_is_referenced_so_argo_keeps_it() -> None:
    """Argo records a step's outputs.result only when its parent template references it (the controller's
    hasOutputResultRef); without an artifact repository the result is what the user gets."""
    for name, manifest in _compiled().items():
        spec = manifest["spec"].get("workflowSpec", manifest["spec"])
        entry = next(t for t in spec["templates"] if t["name"] == spec["entrypoint"])
        text = json.dumps(entry)
        for task in entry["dag"]["tasks"]:
            if task["name"] != "gate":
                assert f"tasks.{task['name']}.outputs.result" in text, f"{name}: {task['name']}"


def test_recipe_and_bundle_results_are_the_workflows_outputs(tmp_path: Path) -> None:
    manifests = _compiled()
    recipe = run(
        manifests["dsx-recipe"],
        (),
        CRITERIA,
        RunOptions(out_dir=tmp_path / "recipe", trusted=trusted_steps()),
    )
    assert recipe.phase == "Succeeded", recipe.message
    (output,) = recipe.outputs["parameters"]
    summary = json.loads(output["value"])
    assert output["name"] == "recipe" and "gpu-operator" in summary["versions"]
    bundle = run(
        manifests["dsx-bundle"],
        (),
        CRITERIA,
        RunOptions(out_dir=tmp_path / "bundle", trusted=trusted_steps()),
    )
    assert bundle.phase == "Succeeded", bundle.message
    (output,) = bundle.outputs["parameters"]
    assert output["name"] == "bundle" and json.loads(output["value"])["digest"] == summary["digest"]


def test_runtime_steps_retry_only_infrastructure_errors() -> None:
    for name, manifest in _compiled().items():
        spec = manifest["spec"].get("workflowSpec", manifest["spec"])
        for template in spec["templates"]:
            if "retryStrategy" in template:
                assert template["retryStrategy"]["retryPolicy"] == "OnError", f"{name}: {template['name']}"


def test_the_submit_form_offers_exactly_the_values_the_steps_accept() -> None:
    """Every criterion's enum is the recipe's vocabulary (a value picked in the Argo UI never fails as
    unknown, and a value the steps accept is never missing); the drift scopes are drift's own."""
    for name, manifest in _compiled().items():
        spec = manifest["spec"].get("workflowSpec", manifest["spec"])
        params = {p["name"]: p for p in spec["arguments"]["parameters"]}
        for field in FIELDS:
            assert params[field]["value"] == ANY, f"{name}: {field}"
            assert params[field].get("enum") == ([ANY, *ALLOWED[field]] if field in ALLOWED else None)
    drift = _compiled()["dsx-drift"]["spec"]["workflowSpec"]["arguments"]["parameters"]
    assert next(p for p in drift if p["name"] == "scope")["enum"] == list(SCOPES)
