"""Variables, targets and outputs on small workflows written inline."""

import json
import secrets
from pathlib import Path
from typing import Any

from tests.workflows.runner.conftest import printed, shell, workflow
from workflows.runner import Phase, RunOptions, check, run


def test_workflow_variables_are_substituted(tmp_path: Path) -> None:
    doc = workflow(
        [
            shell(
                "main",
                "echo {{workflow.name}} {{workflow.namespace}} {{workflow.uid}} "
                "{{workflow.creationTimestamp}} "
                "{{workflow.parameters.size}} '{{workflow.parameters}}' {{pod.name}}",
            )
        ],
        arguments={"parameters": [{"name": "size", "value": "4"}]},
    )
    result = run(
        doc,
        [],
        {"size": "8"},
        RunOptions(allow_host_commands=True, out_dir=tmp_path / "run", workflow_name="dsx-inline-abcde"),
    )
    assert result.phase is Phase.Succeeded
    name, namespace, uid, created, size, params, pod = printed(result, result.nodes[result.root_id]).split(
        " "
    )
    assert (name, namespace, size) == ("dsx-inline-abcde", "default", "8")
    assert len(uid) == 36 and created.endswith("Z") and created[:4].isdigit()
    assert json.loads(params) == [{"name": "size", "value": "8"}]
    assert pod == "dsx-inline-abcde"  # the root node's pod carries the workflow's name


def test_dag_target_runs_only_the_targets_and_their_dependencies(tmp_path: Path) -> None:
    doc = workflow(
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
            shell("ok", "true"),
        ]
    )
    result = run(
        doc, [], {}, RunOptions(allow_host_commands=True, out_dir=tmp_path / "run", workflow_name="wf")
    )
    assert result.phase is Phase.Succeeded
    assert sorted(n.display_name for n in result.nodes.values()) == ["a", "b", "wf"]


def test_a_missing_output_file_is_an_error_unless_it_has_a_default(tmp_path: Path) -> None:
    outputs = {
        "parameters": [
            {"name": "kept", "valueFrom": {"path": "/tmp/dsx-out/absent", "default": "fallback"}},
            {"name": "lost", "valueFrom": {"path": "/tmp/dsx-out/also-absent"}},
        ]
    }
    doc = workflow([shell("main", "true", outputs=outputs)])
    result = run(
        doc, [], {}, RunOptions(allow_host_commands=True, out_dir=tmp_path / "run", workflow_name="wf")
    )
    root = result.nodes[result.root_id]
    assert result.phase is Phase.Error
    # the wait container's error, staged where Argo's emissary keeps output files
    assert root.message == (
        "wait: Error (exit code 64): "
        "open /var/run/argo/outputs/parameters/tmp/dsx-out/also-absent: no such file or directory"
    )
    assert result.message == root.message


def test_an_unresolvable_reference_errors_the_task(tmp_path: Path) -> None:
    doc = workflow(
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
            shell("ok", "true"),
            shell("show", "echo {{inputs.parameters.x}}", inputs={"parameters": [{"name": "x"}]}),
        ]
    )
    result = run(
        doc, [], {}, RunOptions(allow_host_commands=True, out_dir=tmp_path / "run", workflow_name="wf")
    )
    b = result.node("b")
    assert (b.phase, b.message) == (Phase.Error, "failed to resolve {{tasks.a.outputs.parameters.none}}")
    assert result.phase is Phase.Error


def test_exit_handler_failure_fails_a_successful_workflow(tmp_path: Path) -> None:
    doc = workflow([shell("main", "true"), shell("bye", "exit 4")], onExit="bye")
    result = run(
        doc, [], {}, RunOptions(allow_host_commands=True, out_dir=tmp_path / "run", workflow_name="wf")
    )
    assert result.nodes[result.root_id].phase is Phase.Succeeded
    assert (result.phase, result.message) == (Phase.Failed, "main: Error (exit code 4)")


def test_a_skipped_tasks_result_is_never_in_scope(tmp_path: Path) -> None:
    doc = workflow(
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
            shell("ok", "echo never"),
            shell("show", "echo {{inputs.parameters.x}}", inputs={"parameters": [{"name": "x"}]}),
        ]
    )
    result = run(
        doc, [], {}, RunOptions(allow_host_commands=True, out_dir=tmp_path / "run", workflow_name="wf")
    )
    assert result.node("a").phase is Phase.Skipped
    b = result.node("b")
    assert b.phase is Phase.Error
    assert b.message.startswith("failed to resolve {{tasks.a.outputs.result}}: the task was skipped")


def test_steps_get_their_output_folder_and_the_cluster_settings(tmp_path: Path) -> None:
    doc = workflow(
        [shell("main", "echo $DSX_OUTPUT_DIR $hera__outputs_directory $KUBECONFIG $DSX_KUBE_CONTEXT")]
    )
    options = RunOptions(
        allow_host_commands=True,
        out_dir=tmp_path / "run",
        workflow_name="wf",
        kubeconfig="/k/config",
        context="lab",
    )
    result = run(doc, [], {}, options)
    root = result.nodes[result.root_id]
    artifacts = str(result.run_dir / str(root.folder) / "artifacts")
    assert printed(result, root) == f"{artifacts} {artifacts} /k/config lab"


def _show(*names: str) -> dict[str, Any]:
    params = [{"name": n} for n in names]
    return shell("show", "true", inputs={"parameters": params})


def _args(**values: str) -> dict[str, Any]:
    return {"parameters": [{"name": k, "value": v} for k, v in values.items()]}


def test_workflow_status_is_running_until_the_exit_handler_gets_the_final_one(tmp_path: Path) -> None:
    tasks = [
        {"name": "a", "template": "show", "arguments": _args(x="{{workflow.status}} {{workflow.duration}}")},
        {
            "name": "b",
            "template": "show",
            "when": "{{workflow.status}} == Running",
            "arguments": _args(x="b"),
        },
    ]
    report = {
        "name": "report",
        "template": "show",
        "arguments": _args(x="{{workflow.status}} {{workflow.failures}}"),
    }
    doc = workflow(
        [{"name": "main", "dag": {"tasks": tasks}}, {"name": "bye", "dag": {"tasks": [report]}}, _show("x")],
        onExit="bye",
    )
    result = run(
        doc, [], {}, RunOptions(allow_host_commands=True, out_dir=tmp_path / "run", workflow_name="wf")
    )
    assert result.phase is Phase.Succeeded
    status, duration = result.node("a").inputs["parameters"][0]["value"].split(" ")
    assert status == "Running" and float(duration) >= 0
    assert result.node("b").phase is Phase.Succeeded
    # no failures: Go marshals the empty list as null, then quotes it
    assert result.node("report").inputs["parameters"][0]["value"] == 'Succeeded "null"'


def test_workflow_failures_is_refused_outside_the_exit_handler() -> None:
    tasks = [{"name": "a", "template": "show", "arguments": _args(x="{{workflow.failures}}")}]
    doc = workflow(
        [{"name": "main", "dag": {"tasks": tasks}}, {"name": "bye", "dag": {"tasks": tasks}}, _show("x")]
    )
    assert check({**doc, "spec": {**doc["spec"], "onExit": "bye"}}) == [
        "variable {{workflow.failures}} is set only for the workflow's exit handler (spec.onExit) at "
        "WorkflowTemplate dsx-inline, template 'main', spec.templates[0].dag.tasks[0].arguments.parameters[0]"
        ".value (Argo refuses the workflow: failed to resolve {{workflow.failures}})"
    ]
    only_exit = workflow(
        [shell("main", "true"), {"name": "bye", "dag": {"tasks": tasks}}, _show("x")], onExit="bye"
    )
    assert check(only_exit) == []


def test_a_bare_number_is_no_timeout_for_argo() -> None:
    doc = workflow([shell("main", "true", timeout="60")])
    assert check(doc) == [
        "main has invalid duration format in timeout at WorkflowTemplate dsx-inline, template 'main', "
        "spec.templates[0].timeout (Argo refuses a bare number: write a Go duration such as 60s)"
    ]
    assert check(workflow([shell("main", "true", timeout="60s")])) == []


def test_a_run_whose_workflow_object_argo_could_not_store_is_named(tmp_path: Path) -> None:
    tasks = [
        {
            "name": "fan",
            "template": "show",
            "withItems": list(range(24)),
            "arguments": _args(x="{{workflow.parameters.blob}}"),
        }
    ]
    blob = secrets.token_urlsafe(48 * 1024)  # incompressible: every item's inputs hold it
    doc = workflow(
        [{"name": "main", "dag": {"tasks": tasks}}, _show("x")], arguments={"parameters": [{"name": "blob"}]}
    )
    result = run(
        doc,
        [],
        {"blob": blob},
        RunOptions(allow_host_commands=True, out_dir=tmp_path / "big", workflow_name="wf"),
    )
    assert result.phase is Phase.Succeeded
    (warning,) = result.warnings
    assert "Argo refuses more than 1048576 (workflow is longer than maximum allowed size)" in warning
    small = run(
        doc,
        [],
        {"blob": "x"},
        RunOptions(allow_host_commands=True, out_dir=tmp_path / "small", workflow_name="wf"),
    )
    assert small.warnings == []
