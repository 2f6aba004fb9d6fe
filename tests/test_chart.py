"""The Helm chart installs every compiled file, applying image, namespace and service account values."""

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.paths import CHART, helm_binary, shared_path
from workflows import compiler


def _run(cmd: list[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, input=stdin, capture_output=True, text=True, check=False)


@pytest.fixture
def chart_with_demo(tmp_path: Path) -> Path:
    """A copy of the chart whose files/ holds the fixture workflow only."""
    chart = tmp_path / "dsx"
    shutil.copytree(CHART, chart)
    for old in (chart / "files").glob("*.yaml"):
        old.unlink()
    compiler.write(compiler.compile_objects(["tests.workflows.fixtures.demo_templates"]), chart / "files")
    return chart


def _docs(rendered: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(rendered) if d]


def test_helm_lint_passes_on_the_chart() -> None:
    result = _run([helm_binary(), "lint", str(CHART)])
    assert result.returncode == 0, result.stdout + result.stderr


def test_helm_template_of_the_chart_passes_validate_manifests() -> None:
    tool = shared_path("tools", "validate-manifests")
    if not list((CHART / "files").glob("*.yaml")):
        pytest.skip("no compiled dsx workflow yet")
    rendered = _run([helm_binary(), "template", "dsx", str(CHART)])
    assert rendered.returncode == 0, rendered.stderr
    checked = _run([sys.executable, str(tool), "-"], stdin=rendered.stdout)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_chart_applies_values_and_keeps_argo_expressions(chart_with_demo: Path) -> None:
    rendered = _run(
        [
            helm_binary(),
            "template",
            "rel",
            str(chart_with_demo),
            "--namespace",
            "gpu-ops",
            "--set",
            "image.repository=registry.example/dsx",
            "--set",
            "image.tag=1.2.3",
            "--set",
            "serviceAccount.name=certifier",
        ]
    )
    assert rendered.returncode == 0, rendered.stderr
    docs = _docs(rendered.stdout)
    (wt,) = [d for d in docs if d["kind"] == "WorkflowTemplate"]
    assert wt["metadata"]["namespace"] == "gpu-ops"
    assert wt["spec"]["serviceAccountName"] == "certifier"
    greet = next(t for t in wt["spec"]["templates"] if t["name"] == "greet")
    assert greet["script"]["image"] == "registry.example/dsx:1.2.3"
    assert greet["script"]["source"] == "{{inputs.parameters}}"
    assert greet["retryStrategy"]["limit"] == 2
    task = wt["spec"]["templates"][0]["dag"]["tasks"][0]
    assert task["arguments"]["parameters"][0]["value"] == "{{workflow.parameters.nodes}}"
    (sa,) = [d for d in docs if d["kind"] == "ServiceAccount"]
    assert sa["metadata"]["name"] == "certifier"
    (role,) = [d for d in docs if d["kind"] == "Role" and d["metadata"]["name"] == "dsx-workflow"]
    assert {
        "apiGroups": ["argoproj.io"],
        "resources": ["workflowtaskresults"],
        "verbs": ["create", "patch"],
    } in (role["rules"])
    tool = shared_path("tools", "validate-manifests")
    checked = _run([sys.executable, str(tool), "-"], stdin=rendered.stdout)
    assert checked.returncode == 0, checked.stdout + checked.stderr
