"""Variables, targets and outputs on small workflows written inline."""

import json
from pathlib import Path
from typing import Any

from workflows.runner import Phase, RunOptions, run


def _workflow(templates: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "WorkflowTemplate",
        "metadata": {"name": "dsx-inline"},
        "spec": {"entrypoint": "main", "templates": templates, **spec},
    }


def _shell(name: str, command: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "container": {"image": "alpine", "command": ["sh", "-c"], "args": [command]},
        **extra,
    }


def test_workflow_variables_are_substituted(tmp_path: Path) -> None:
    doc = _workflow(
        [
            _shell(
                "main",
                "echo {{workflow.name}} {{workflow.namespace}} {{workflow.uid}} "
                "{{workflow.creationTimestamp}} "
                "{{workflow.parameters.size}} '{{workflow.parameters}}' {{pod.name}}",
            )
        ],
        arguments={"parameters": [{"name": "size", "value": "4"}]},
    )
    result = run(
        doc, [], {"size": "8"}, RunOptions(out_dir=tmp_path / "run", workflow_name="dsx-inline-abcde")
    )
    assert result.phase is Phase.Succeeded
    name, namespace, uid, created, size, params, pod = (
        result.nodes[result.root_id].outputs["result"].split(" ")
    )
    assert (name, namespace, size) == ("dsx-inline-abcde", "default", "8")
    assert len(uid) == 36 and created.endswith("Z") and created[:4].isdigit()
    assert json.loads(params) == [{"name": "size", "value": "8"}]
    assert pod == "dsx-inline-abcde"  # the root node's pod carries the workflow's name


def test_dag_target_runs_only_the_targets_and_their_dependencies(tmp_path: Path) -> None:
    doc = _workflow(
        [
            {
                "name": "main",
                "dag": {
                    "target": "b",
                    "tasks": [
                        {"name": "a", "template": "ok"},
                        {"name": "b", "template": "ok", "depends": "a"},
                        {"name": "c", "template": "ok"},
                    ],
                },
            },
            _shell("ok", "true"),
        ]
    )
    result = run(doc, [], {}, RunOptions(out_dir=tmp_path / "run", workflow_name="wf"))
    assert result.phase is Phase.Succeeded
    assert sorted(n.display_name for n in result.nodes.values()) == ["a", "b", "wf"]


def test_a_missing_output_file_is_an_error_unless_it_has_a_default(tmp_path: Path) -> None:
    outputs = {
        "parameters": [
            {"name": "kept", "valueFrom": {"path": "/tmp/dsx-out/absent", "default": "fallback"}},
            {"name": "lost", "valueFrom": {"path": "/tmp/dsx-out/also-absent"}},
        ]
    }
    doc = _workflow([_shell("main", "true", outputs=outputs)])
    result = run(doc, [], {}, RunOptions(out_dir=tmp_path / "run", workflow_name="wf"))
    root = result.nodes[result.root_id]
    assert result.phase is Phase.Error
    assert root.message == "failed to save outputs: open /tmp/dsx-out/also-absent: no such file or directory"
    assert result.message == root.message


def test_an_unresolvable_reference_errors_the_task(tmp_path: Path) -> None:
    doc = _workflow(
        [
            {
                "name": "main",
                "dag": {
                    "tasks": [
                        {"name": "a", "template": "ok"},
                        {
                            "name": "b",
                            "template": "show",
                            "depends": "a",
                            "arguments": {
                                "parameters": [{"name": "x", "value": "{{tasks.a.outputs.parameters.none}}"}]
                            },
                        },
                    ]
                },
            },
            _shell("ok", "true"),
            _shell("show", "echo {{inputs.parameters.x}}", inputs={"parameters": [{"name": "x"}]}),
        ]
    )
    result = run(doc, [], {}, RunOptions(out_dir=tmp_path / "run", workflow_name="wf"))
    b = result.node("b")
    assert (b.phase, b.message) == (Phase.Error, "failed to resolve {{tasks.a.outputs.parameters.none}}")
    assert result.phase is Phase.Error


def test_exit_handler_failure_fails_a_successful_workflow(tmp_path: Path) -> None:
    doc = _workflow([_shell("main", "true"), _shell("bye", "exit 4")], onExit="bye")
    result = run(doc, [], {}, RunOptions(out_dir=tmp_path / "run", workflow_name="wf"))
    assert result.nodes[result.root_id].phase is Phase.Succeeded
    assert (result.phase, result.message) == (Phase.Failed, "Error (exit code 4)")


def test_a_skipped_output_without_defaults_leaves_the_input_unsupplied(tmp_path: Path) -> None:
    doc = _workflow(
        [
            {
                "name": "main",
                "dag": {
                    "tasks": [
                        {"name": "a", "template": "ok", "when": "1 > 2"},
                        {
                            "name": "b",
                            "template": "show",
                            "depends": "a",
                            "arguments": {
                                "parameters": [{"name": "x", "value": "{{tasks.a.outputs.result}}"}]
                            },
                        },
                    ]
                },
            },
            _shell("ok", "echo never"),
            _shell("show", "echo {{inputs.parameters.x}}", inputs={"parameters": [{"name": "x"}]}),
        ]
    )
    result = run(doc, [], {}, RunOptions(out_dir=tmp_path / "run", workflow_name="wf"))
    assert result.node("a").phase is Phase.Skipped
    b = result.node("b")
    assert (b.phase, b.message) == (Phase.Error, "inputs.parameters.x was not supplied")


def test_steps_get_their_output_folder_and_the_cluster_settings(tmp_path: Path) -> None:
    doc = _workflow(
        [_shell("main", "echo $DSX_OUTPUT_DIR $hera__outputs_directory $KUBECONFIG $DSX_KUBE_CONTEXT")]
    )
    options = RunOptions(out_dir=tmp_path / "run", workflow_name="wf", kubeconfig="/k/config", context="lab")
    result = run(doc, [], {}, options)
    root = result.nodes[result.root_id]
    artifacts = str(result.run_dir / str(root.folder) / "artifacts")
    assert root.outputs["result"] == f"{artifacts} {artifacts} /k/config lab"
