"""``dsx run``: exit codes that match the final phase, dry runs, input errors, the cluster hint."""

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.paths import REPO
from tests.workflows.runner.conftest import FIXTURES
from workflows.cli.main import app

CASES = [
    ("bisect.yaml", "dsx-fixture-bisect", [], "Succeeded"),
    ("retry.yaml", "dsx-fixture-retry", ["-p", "state={tmp}/state"], "Succeeded"),
    ("retry.yaml", "dsx-fixture-retry", ["--entry", "exhausted"], "Failed"),
    ("when-default.yaml", "dsx-fixture-when", ["-p", "side=tails"], "Succeeded"),
    ("exit-handler.yaml", "dsx-fixture-exit", [], "Failed"),
    ("timeout.yaml", "dsx-fixture-timeout", [], "Failed"),
    ("depends.yaml", "dsx-fixture-depends", [], "Succeeded"),
    ("depends.yaml", "dsx-fixture-depends", ["--entry", "unhandled"], "Failed"),
    ("items.yaml", "dsx-fixture-items", ["-p", "count=2"], "Succeeded"),
    ("templateref.yaml", "dsx-fixture-templateref", [], "Succeeded"),
    ("suspend.yaml", "dsx-fixture-suspend", ["--approve", "approve-drain"], "Succeeded"),
    ("suspend.yaml", "dsx-fixture-suspend", [], "Failed"),
    ("parallelism.yaml", "dsx-fixture-serial", [], "Succeeded"),
    ("parallelism.yaml", "dsx-fixture-parallelism", [], "Succeeded"),
    ("steps.yaml", "dsx-fixture-steps", [], "Succeeded"),
    ("steps.yaml", "dsx-fixture-steps", ["--entry", "failing"], "Failed"),
    ("recursion.yaml", "dsx-fixture-recursion", [], "Error"),
    ("local-commands.yaml", "dsx-fixture-local", [], "Succeeded"),
    ("resource.yaml", "dsx-fixture-resource", ["--cluster", "sim:"], "Succeeded"),
]


def _invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize(
    ("filename", "name", "extra", "phase"),
    CASES,
    ids=[f"{c[1]}{c[2]}" if isinstance(c, tuple) else "dsx-fixture-resource" for c in CASES],
)
def test_exit_code_matches_the_final_phase(
    filename: str, name: str, extra: list[str], phase: str, tmp_path: Path
) -> None:
    args = [a.replace("{tmp}", str(tmp_path)) for a in extra]
    code, out, _ = _invoke(
        "run",
        name,
        "--local",
        "-f",
        str(FIXTURES / filename),
        "--out",
        str(tmp_path / "run"),
        "-o",
        "json",
        "--allow-host-commands",
        *args,
    )
    data = json.loads(out)
    assert data["phase"] == phase
    assert code == (0 if phase == "Succeeded" else 1)
    assert Path(data["runDir"]) == (tmp_path / "run").resolve()
    assert json.loads((tmp_path / "run" / "workflow.json").read_text())["status"]["phase"] == phase


def test_unsupported_constructs_exit_2_before_running(tmp_path: Path) -> None:
    code, _, err = _invoke(
        "run",
        "fixture-unsupported",
        "--local",
        "-f",
        str(FIXTURES / "unsupported.yaml"),
        "--out",
        str(tmp_path / "run"),
    )
    assert code == 2
    assert "unsupported construct 'volumes'" in err
    assert not (tmp_path / "run").exists()


def test_table_output_shows_the_tree_and_the_phase(tmp_path: Path) -> None:
    code, out, _ = _invoke(
        "run",
        "fixture-when",
        "--local",
        "-f",
        str(FIXTURES / "when-default.yaml"),
        "--out",
        str(tmp_path / "run"),
        "-p",
        "side=heads",
        "--allow-host-commands",
    )
    assert code == 0
    assert "Phase:      Succeeded" in out
    assert "├─○ tails" in out and "when 'heads == tails' evaluated false" in out
    assert "Succeeded  dsx-fixture-when-" in out  # plain progress lines when stdout is not a terminal


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-p", "colour=red"], "-p colour: the workflow has no parameter 'colour' (its parameters: side)"),
        (["-p", "side=edge"], "-p side=edge: not one of heads, tails"),
        (["-p", "side"], "-p 'side': expected KEY=VALUE"),
        (["--approve", "nothing"], "--approve nothing: the workflow has no suspend step"),
    ],
)
def test_input_errors_exit_2(args: list[str], message: str, tmp_path: Path) -> None:
    code, _, err = _invoke(
        "run",
        "dsx-fixture-when",
        "--local",
        "-f",
        str(FIXTURES / "when-default.yaml"),
        "--out",
        str(tmp_path / "run"),
        *args,
    )
    assert code == 2
    assert message in err
    assert not (tmp_path / "run").exists()


def test_unknown_workflow_names_the_known_ones() -> None:
    code, _, err = _invoke("run", "nope", "--local", "-f", str(FIXTURES / "templateref.yaml"))
    assert code == 2
    assert "no workflow named 'nope'" in err and "dsx-fixture-library, dsx-fixture-templateref" in err


def test_dry_run_prints_the_plan(tmp_path: Path) -> None:
    code, out, _ = _invoke(
        "run", "fixture-templateref", "--local", "--dry-run", "-f", str(FIXTURES / "templateref.yaml")
    )
    assert code == 0
    assert "Entrypoint: main" in out
    assert "WorkflowTemplate dsx-fixture-library" in out
    code, out, _ = _invoke(
        "run", "dsx-fixture-suspend", "--dry-run", "-o", "json", "-f", str(FIXTURES / "suspend.yaml")
    )
    plan = json.loads(out)
    code, out, _ = _invoke(
        "run", "dsx-fixture-suspend", "--dry-run", "-o", "yaml", "-f", str(FIXTURES / "suspend.yaml")
    )
    assert code == 0 and "approvals:\n- approval\n" in out
    assert code == 0
    assert plan["approvals"] == ["approval", "approve-drain", "pause"]
    assert {t["name"]: t["type"] for t in plan["templates"]}["echo"] == "script"
    assert {t["name"]: t["runs"] for t in plan["templates"]}[
        "echo"
    ] == "tests.workflows.runner.fixture_steps:echo"


def test_without_local_it_prints_the_argo_submit_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DSX_NAMESPACE", raising=False)
    code, out, err = _invoke(
        "run", "fixture-when", "-f", str(FIXTURES / "when-default.yaml"), "-p", "side=tails"
    )
    assert code == 2
    assert out.strip() == "argo submit -n gpu-ops --from workflowtemplate/dsx-fixture-when -p side=tails"
    assert "--local" in err


def test_the_argo_submit_command_names_the_namespace_and_quotes_every_value(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DSX_NAMESPACE", "ops")
    hostile = "pool in (a,b),!dsx.dev/managed"  # a valid selector the shell would mangle unquoted
    code, out, _ = _invoke("run", "certify", "-p", f"nodes={hostile}", "-p", "iters=5")
    assert code == 2
    assert shlex.split(out.strip()) == [
        "argo", "submit", "-n", "ops", "--from", "workflowtemplate/dsx-certify",
        "-p", f"nodes={hostile}", "-p", "iters=5",
    ]  # fmt: skip
    code, out, _ = _invoke("run", "drift", "--namespace", "gpu ops")
    assert shlex.split(out.strip())[:6] == [
        "argo",
        "submit",
        "-n",
        "gpu ops",
        "--from",
        "cronworkflow/dsx-drift",
    ]


@pytest.mark.story
def test_the_dsx_process_exits_with_the_phase(tmp_path: Path) -> None:
    def dsx(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "workflows.cli", *args],
            capture_output=True,
            text=True,
            cwd=REPO,
            check=False,
        )

    ok = dsx(
        "run",
        "fixture-depends",
        "--local",
        "-f",
        str(FIXTURES / "depends.yaml"),
        "--out",
        str(tmp_path / "a"),
        "--allow-host-commands",
    )
    assert ok.returncode == 0, ok.stderr
    failed = dsx(
        "run",
        "fixture-depends",
        "--local",
        "-f",
        str(FIXTURES / "depends.yaml"),
        "--entry",
        "unhandled",
        "--out",
        str(tmp_path / "b"),
        "--allow-host-commands",
    )
    assert failed.returncode == 1
    assert "Phase:      Failed" in failed.stdout


def test_names_are_looked_up_among_dsxs_compiled_workflows() -> None:
    from workflows.compiler import compiled_documents

    kinds = ("Workflow", "WorkflowTemplate", "ClusterWorkflowTemplate", "CronWorkflow")
    known = sorted(
        str(d["metadata"]["name"]) for d in compiled_documents().values() if d.get("kind") in kinds
    )
    code, _, err = _invoke("run", "no-such-workflow", "--local")
    assert code == 2
    assert (
        f"no workflow named 'no-such-workflow' in dsx's workflows (known: {', '.join(known) or 'none'})"
        in err
    )


def test_a_file_may_reference_templates_it_does_not_hold(tmp_path: Path) -> None:
    workflow = tmp_path / "uses.yaml"
    workflow.write_text(
        "apiVersion: argoproj.io/v1alpha1\nkind: Workflow\nmetadata: {generateName: uses-dsx-}\nspec:\n"
        "  entrypoint: main\n  templates:\n  - name: main\n    dag:\n      tasks:\n      - name: x\n"
        "        templateRef: {name: dsx-no-such-template, template: t}\n"
    )
    code, _, err = _invoke("run", "uses-dsx", "--local", "-f", str(workflow))
    assert code == 2
    assert "templateRef names WorkflowTemplate 'dsx-no-such-template', which is not in the library" in err
    assert "template 'main', spec.templates[0].dag.tasks[0]" in err


def test_a_file_that_is_not_yaml_names_the_line(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("kind: Workflow\nmetadata: {name: x\n")
    code, _, err = _invoke("run", "x", "--local", "-f", str(broken))
    assert code == 2
    assert f"{broken}:" in err and "not valid YAML" in err


def test_artifact_repository_none_plays_a_cluster_without_one(tmp_path: Path) -> None:
    args = ["run", "dsx-fixture-artifacts", "--local", "-f", str(FIXTURES / "artifacts.yaml"), "-o", "json"]
    args.append("--allow-host-commands")
    code, out, err = _invoke(*args, "--out", str(tmp_path / "local"))
    assert code == 0 and json.loads(out)["phase"] == "Succeeded"
    (warning,) = [line for line in err.splitlines() if line.startswith("warning: ") and "artifact" in line]
    assert "templates keep, maybe, saved-on-retry declare output artifacts" in warning
    assert "--artifact-repository none" in warning
    code, out, err = _invoke(*args, "--out", str(tmp_path / "none"), "--artifact-repository", "none")
    assert code == 1
    data = json.loads(out)
    assert data["phase"] == "Error"
    messages = {n["displayName"]: n.get("message", "") for n in data["nodes"].values()}
    assert "artifact storage is not configured" in messages["keep"]
    assert "artifact repository" not in err
    code, _, err = _invoke(*args, "--artifact-repository", "s3")
    assert code == 2 and "--artifact-repository" in err
