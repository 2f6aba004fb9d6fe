"""Outputs of skipped tasks as Argo v4 treats them: absent optionals, never an empty string.

Argo v4 (``workflow/controller/scope.go``, ``addSkippedNodeOutputsToScope``; ``common.ProcessArgs``;
``util/template/simple_template.go``): a skipped task's output parameter is its declared default; without
one it is an *absent optional*. An argument that is nothing but that reference lets the consumer's input
default apply, and errors when there is none; the reference inside a longer value is a terminal error. A
skipped task has no ``outputs.result`` at all: the controller waits for it for ever. The recursive
``dsx-bisect`` relies on this: its skipped halves must declare defaults.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.workflows.runner.conftest import shell, workflow
from workflows.runner import Phase, RunOptions, RunResult, run


def _run(tmp_path: Path, consumer_value: str, consumer_default: str | None) -> RunResult:
    """``skipped`` never runs (its ``when`` is false); ``use`` reads its output ``out`` (no default)."""
    inputs: dict[str, Any] = {"name": "text"}
    if consumer_default is not None:
        inputs["default"] = consumer_default
    tasks = [
        {"name": "skipped", "template": "produce", "when": "1 == 2"},
        {
            "name": "use",
            "template": "consume",
            "depends": "skipped",
            "arguments": {"parameters": [{"name": "text", "value": consumer_value}]},
        },
    ]
    produce = shell(
        "produce",
        "mkdir -p /tmp/dsx-out && echo made > /tmp/dsx-out/out",
        outputs={"parameters": [{"name": "out", "valueFrom": {"path": "/tmp/dsx-out/out"}}]},
    )
    consume = shell("consume", "echo '{{inputs.parameters.text}}'", inputs={"parameters": [inputs]})
    doc = workflow([{"name": "main", "dag": {"tasks": tasks}}, produce, consume])
    options = RunOptions(allow_host_commands=True, out_dir=tmp_path / "run", workflow_name="wf")
    return run(doc, [], {}, options)


def test_a_bare_reference_to_an_absent_output_takes_the_consumers_default(tmp_path: Path) -> None:
    result = _run(tmp_path, "{{tasks.skipped.outputs.parameters.out}}", "none")
    assert result.node("skipped").phase is Phase.Skipped
    use = result.node("use")
    assert use.phase is Phase.Succeeded
    assert use.inputs["parameters"][0]["value"] == "none"


def test_a_bare_reference_with_no_default_anywhere_errors_as_in_argo(tmp_path: Path) -> None:
    result = _run(tmp_path, "{{tasks.skipped.outputs.parameters.out}}", None)
    use = result.node("use")
    assert (use.phase, use.message) == (
        Phase.Error,
        "inputs.parameters.text: argument references an absent optional (skipped/omitted node output with "
        "no default)",
    )
    assert result.phase is Phase.Error


def test_an_absent_output_inside_a_longer_argument_is_an_error_not_a_default(tmp_path: Path) -> None:
    result = _run(tmp_path, "got {{tasks.skipped.outputs.parameters.out}}", "none")
    use = result.node("use")
    assert (use.phase, use.message) == (
        Phase.Error,
        "unable to substitute {{tasks.skipped.outputs.parameters.out}}: output is an absent optional "
        "(skipped/omitted node with no default)",
    )
    assert result.phase is Phase.Error


def test_the_result_of_a_skipped_task_never_resolves(tmp_path: Path) -> None:
    result = _run(tmp_path, "{{tasks.skipped.outputs.result}}", "none")
    use = result.node("use")
    assert use.phase is Phase.Error
    assert use.message.startswith("failed to resolve {{tasks.skipped.outputs.result}}")
    assert result.phase is Phase.Error
