"""``dsx run --local --file``: a workflow's own commands run on this machine only when the user allows it,
and its output paths never reach outside the step's folder."""

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from tests import yamltext
from workflows.cli.main import app
from workflows.compiler import trusted_steps
from workflows.runner.host import host_templates
from workflows.runner.library import Library
from workflows.runner.model import NOTHING_TRUSTED


def _invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def _file(tmp_path: Path, *templates: dict[str, Any], params: tuple[str, ...] = ()) -> Path:
    doc = {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {"generateName": "mine-"},
        "spec": {
            "entrypoint": templates[0]["name"],
            "arguments": {"parameters": [{"name": p} for p in params]},
            "templates": list(templates),
        },
    }
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


GREET = {
    "name": "greet",
    "inputs": {"parameters": [{"name": "who", "value": "{{workflow.parameters.who}}"}]},
    "container": {
        "image": "alpine:3.20",
        "command": ["sh", "-c"],
        "args": ["echo hello {{inputs.parameters.who}}"],
    },
}


def _dsx_step(entry: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": "step",
        "script": {
            "image": "ghcr.io/dsx-dev/dsx:0.1.0",
            "command": ["python"],
            "args": ["-m", "hera.workflows.runner", "-e", entry],
            "source": "{{inputs.parameters}}",
            **extra,
        },
    }


def test_a_host_command_is_refused_before_anything_runs(tmp_path: Path) -> None:
    marker = tmp_path / "touched"
    path = _file(tmp_path, GREET, params=("who",))
    out = tmp_path / "run"
    code, _, err = _invoke(
        "run", "mine", "--local", "-f", str(path), "--out", str(out), "-p", f"who=$(touch {marker})"
    )
    assert code == 2
    assert (
        "template 'greet' (container, image alpine:3.20: sh -c 'echo hello {{inputs.parameters.who}}')" in err
    )
    assert "--allow-host-commands" in err and "as this user" in err
    assert not marker.exists() and not out.exists()


def test_allowed_host_commands_warn_once_and_substitute_as_argo_does(tmp_path: Path) -> None:
    marker = tmp_path / "touched"
    path = _file(tmp_path, GREET, params=("who",))
    args = [
        "run",
        "mine",
        "--local",
        "-f",
        str(path),
        "--out",
        str(tmp_path / "run"),
        "--allow-host-commands",
    ]
    code, _, err = _invoke(*args, "-p", f"who=$(touch {marker})", "-o", "json")
    assert code == 0
    warnings = [line for line in err.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 1, err
    assert "template greet runs as processes of this machine, as this user" in warnings[0]
    assert "greet: {{inputs.parameters.who}}" in warnings[0] and "$(...)" in warnings[0]
    assert marker.exists()  # Argo substitutes the value into `sh -c` text too: it ran, as it would in the pod


def test_help_names_the_flag_and_what_it_allows() -> None:
    code, out, _ = _invoke("run", "--help")
    assert code == 0
    text = " ".join(re.sub("[│╭╮╰╯─]", " ", out).split())  # rich draws a box around the options
    assert "--allow-host-commands" in text and "images ignored" in text


@pytest.mark.parametrize(
    ("template", "reason"),
    [
        (
            _dsx_step("steps.readiness.launchers.local:launch_local"),
            "steps.readiness.launchers.local:launch_local is not a function dsx's templates run",
        ),
        (
            _dsx_step("steps.runtime.tasks:resolve_recipe", env=[{"name": "PYTHONPATH", "value": "/tmp/x"}]),
            "it sets PYTHONPATH, which dsx's steps never set",
        ),
        (
            {"name": "step", "script": {"image": "python:3.12", "command": ["python"], "source": "print(1)"}},
            "template 'step' (script, image python:3.12: python with an inline script)",
        ),
    ],
    ids=["a-steps-function-no-template-runs", "a-dsx-step-with-foreign-env", "an-inline-script"],
)
def test_only_dsx_own_steps_run_without_the_flag(
    template: dict[str, Any], reason: str, tmp_path: Path
) -> None:
    code, _, err = _invoke("run", "mine", "--local", "-f", str(_file(tmp_path, template)))
    assert code == 2
    assert reason in " ".join(err.split())


def test_dsx_own_steps_run_from_a_file_without_the_flag(tmp_path: Path) -> None:
    step = _dsx_step("steps.runtime.tasks:resolve_recipe")
    criteria = ("service", "accelerator", "os", "intent", "platform", "nodes")
    step["inputs"] = {"parameters": [{"name": c, "value": "any"} for c in criteria]}
    step["inputs"]["parameters"] += [{"name": "recipes", "value": ""}]
    path = _file(tmp_path, step)
    code, out, err = _invoke(
        "run", "mine", "--local", "-f", str(path), "--out", str(tmp_path / "run"), "-o", "json"
    )
    assert code == 0, err
    assert json.loads(out)["phase"] == "Succeeded"
    assert "--allow-host-commands" not in err


ESCAPE = "/tmp/dsx-out/" + "../" * 40 + "etc/hostname"


@pytest.mark.parametrize(
    "outputs",
    [
        {"parameters": [{"name": "leak", "valueFrom": {"path": ESCAPE}}]},
        {"artifacts": [{"name": "leak", "path": ESCAPE}]},
    ],
    ids=["valueFrom.path", "artifact-path"],
)
def test_an_output_path_leading_out_of_the_step_is_refused_before_the_run(
    outputs: dict[str, Any], tmp_path: Path
) -> None:
    step = {**_dsx_step("steps.runtime.tasks:resolve_recipe"), "outputs": outputs}
    out = tmp_path / "run"
    code, _, err = _invoke("run", "mine", "--local", "-f", str(_file(tmp_path, step)), "--out", str(out))
    assert code == 2
    assert f"output path {ESCAPE!r} leads out of the step's folder (/tmp/dsx-out) through '..'" in err
    assert "template 'step'" in err and not out.exists()


def test_an_output_path_made_of_a_parameter_or_a_link_cannot_leave_the_step(tmp_path: Path) -> None:
    reader = {
        "name": "reader",
        "inputs": {"parameters": [{"name": "file", "value": "{{workflow.parameters.file}}"}]},
        "outputs": {
            "parameters": [{"name": "leak", "valueFrom": {"path": "/tmp/dsx-out/{{inputs.parameters.file}}"}}]
        },
        "container": {
            "image": "alpine:3.20",
            "command": ["ln"],
            "args": ["-s", "/etc/hostname", "/tmp/dsx-out/link"],
        },
    }
    path = _file(tmp_path, reader, params=("file",))
    messages = {}
    for name, value in (("dots", "../" * 40 + "etc/hostname"), ("link", "link")):
        args = ["run", "mine", "--local", "-f", str(path), "--allow-host-commands", "-o", "json"]
        code, out, _ = _invoke(*args, "--out", str(tmp_path / name), "-p", f"file={value}")
        data = json.loads(out)
        assert code == 1 and data["phase"] == "Error"
        (node,) = [n for n in data["nodes"].values() if n["displayName"].startswith("mine-")]
        assert "parameters" not in node.get("outputs", {})
        messages[name] = node["message"]
    assert messages["dots"].startswith("template 'reader', output parameter 'leak': output path ")
    assert "leads out of the step's folder (/tmp/dsx-out) through '..'; refused" in messages["dots"]
    assert messages["link"] == (
        "template 'reader', output parameter 'leak': output path '/tmp/dsx-out/link' is a link that leads "
        "out of the step's folder; refused"
    )


def test_the_runner_trusts_only_the_steps_it_is_handed(tmp_path: Path) -> None:
    # The runner reads YAML only: which steps are dsx's own comes from its caller (the CLI hands it the
    # steps of dsx's compiled templates); handed nothing, it takes even dsx's step for a host command.
    entry = yamltext.load(_file(tmp_path, _dsx_step("steps.runtime.tasks:resolve_recipe")).read_text())
    library = Library(entry, [])
    (alone,) = host_templates(library, "step", NOTHING_TRUSTED)
    assert alone.label == "step" and alone.reason.endswith("is not a function dsx's templates run")
    assert host_templates(library, "step", trusted_steps()) == []
    assert "steps.runtime.tasks:resolve_recipe" in trusted_steps().entries


def test_the_fork_server_imports_the_step_modules_and_the_port_of_the_runs_cluster(tmp_path: Path) -> None:
    from workflows.runner.engine import preload

    entry = yamltext.load(_file(tmp_path, _dsx_step("steps.runtime.tasks:resolve_recipe")).read_text())
    library = Library(entry, [])
    assert preload(library, "step", "sim:nodes=2") == ["steps.runtime.tasks", "steps.cluster.sim"]
    assert preload(library, "step", "kube") == ["steps.runtime.tasks", "steps.cluster.kube", "kubernetes"]
    container = {"name": "echo", "container": {"image": "busybox", "command": ["true"]}}
    plain = yamltext.load(_file(tmp_path, container).read_text())
    assert preload(Library(plain, []), "echo", "sim:") == []  # no step runs in Hera's runner: no server
