"""Constructs the runner does not carry out are rejected before anything runs, named with where they are."""

import copy
from pathlib import Path
from typing import Any

import pytest

from tests.workflows.runner.conftest import load
from workflows.runner import RunOptions, UnsupportedConstruct, check, run, validate


def test_a_malformed_workflow_is_rejected_before_it_starts(tmp_path: Path) -> None:
    entry, library = load("unsupported.yaml", "dsx-fixture-unsupported")
    out = tmp_path / "run"
    with pytest.raises(UnsupportedConstruct) as caught:
        run(entry, library, {}, RunOptions(out_dir=out))
    problems = caught.value.problems
    where = "WorkflowTemplate dsx-fixture-unsupported"
    assert f"unsupported construct 'volumes' at {where}, spec.volumes" in problems[0]
    assert any(
        f"unsupported construct 'artifacts' at {where}, template 'consume', "
        "spec.templates[1].inputs.artifacts" in p
        for p in problems
    )
    expression = next(p for p in problems if "{{=" in p)
    assert "template 'main', spec.templates[0].dag.tasks[0].arguments.parameters[0].value" in expression
    assert "forbidden in dsx templates" in expression
    assert not out.exists()


def _workflow(**template: Any) -> dict[str, Any]:
    body = {"name": "main", **template}
    return {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {"generateName": "probe-"},
        "spec": {"entrypoint": "main", "templates": [body]},
    }


_SCRIPT = {"image": "x", "command": ["python"], "source": "print(1)"}


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        (
            {"script": {**_SCRIPT, "volumeMounts": [{"name": "v", "mountPath": "/v"}]}},
            "unsupported construct 'volumeMounts' at Workflow probe, template 'main', "
            "spec.templates[0].script.volumeMounts",
        ),
        (
            {
                "script": {
                    **_SCRIPT,
                    "env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
                }
            },
            "unsupported construct 'valueFrom' at Workflow probe, template 'main', "
            "spec.templates[0].script.env[0].valueFrom",
        ),
        (
            {
                "script": _SCRIPT,
                "outputs": {"parameters": [{"name": "p", "valueFrom": {"path": "/etc/hostname"}}]},
            },
            "output files must be under /tmp/dsx-out/",
        ),
        (
            {"script": _SCRIPT, "outputs": {"artifacts": [{"name": "a", "path": "/data/out"}]}},
            "output artifacts must be under /tmp/dsx-out/",
        ),
        (
            {"script": _SCRIPT, "memoize": {"key": "k", "cache": {"configMap": {"name": "c"}}}},
            "unsupported construct 'memoize'",
        ),
        (
            {"container": {"image": "busybox", "command": ["definitely-not-a-command-here"]}},
            "command 'definitely-not-a-command-here' is not available on this machine",
        ),
        ({"container": {"image": "busybox"}}, "unsupported construct 'image entrypoint'"),
        (
            {"resource": {"action": "replace", "manifest": "kind: X"}},
            "unsupported construct 'action 'replace''",
        ),
        (
            {"dag": {"tasks": [{"name": "a", "template": "main", "depends": "b"}]}},
            "depends on unknown task 'b'",
        ),
        (
            {"dag": {"tasks": [{"name": "a", "template": "main", "depends": "a.Completed"}]}},
            "task result 'Completed' for task 'a' is invalid",
        ),
        (
            {
                "dag": {
                    "tasks": [
                        {"name": "a", "template": "main", "depends": "b"},
                        {"name": "b", "template": "main", "depends": "a"},
                    ]
                }
            },
            "dependency cycle: a -> b -> a",
        ),
        (
            {"dag": {"tasks": [{"name": "a", "template": "nope"}]}},
            "template 'nope' does not exist in Workflow probe",
        ),
        (
            {"dag": {"tasks": [{"name": "a", "template": "main", "hooks": {"exit": {"template": "main"}}}]}},
            "unsupported construct 'hooks'",
        ),
        (
            {
                "dag": {
                    "tasks": [
                        {"name": "a", "template": "main"},
                        {"name": "b", "template": "main", "when": "{{tasks.a.outputs.result}} == x"},
                    ]
                }
            },
            "names task 'a', which task 'b' does not depend on",
        ),
        (
            {"script": {**_SCRIPT, "source": "{{inputs.parameters.missing}}"}},
            "variable {{inputs.parameters.missing}} is not a declared input of this template",
        ),
        (
            {"script": {**_SCRIPT, "source": "{{workflow.outputs.parameters.x}}"}},
            "is not a variable the local runner",
        ),
        (
            {"script": _SCRIPT, "retryStrategy": {"limit": 2, "expression": "true"}},
            "unsupported construct 'expression'",
        ),
        (
            # Argo refuses it (validate.go, and the CRD's rule, which the real API server applied to a
            # WorkflowTemplate the local runner had run).
            {
                "dag": {
                    "tasks": [
                        {"name": "a", "template": "main", "continueOn": {"failed": True}},
                        {"name": "b", "template": "main", "depends": "a.Succeeded || a.Failed"},
                    ]
                }
            },
            "cannot use continueOn when using depends",
        ),
        ({"dag": {"tasks": []}, "timeout": "1m"}, "'timeout' on a dag template has no effect in Argo"),
        ({"script": _SCRIPT, "timeout": "ten minutes"}, "invalid duration 'ten minutes'"),
        (
            {"suspend": {}, "outputs": {"parameters": [{"name": "p", "valueFrom": {"supplied": {}}}]}},
            "unsupported construct 'supplied'",
        ),
    ],
)
def test_unsupported_and_invalid_constructs_are_named(template: dict[str, Any], expected: str) -> None:
    problems = check(_workflow(**template))
    assert any(expected in p for p in problems), problems


def test_a_dsx_style_workflow_is_accepted() -> None:
    entry, library = load("bisect.yaml", "dsx-fixture-bisect")
    validate(entry, library)
    assert check(entry, library) == []


def test_template_ref_to_a_missing_workflow_template() -> None:
    entry, _ = load("templateref.yaml", "dsx-fixture-templateref")
    problems = check(entry, [])
    assert any(
        "templateRef names WorkflowTemplate 'dsx-fixture-library', which is not in the library" in p
        for p in problems
    )


def test_unknown_entrypoint_and_spec_fields() -> None:
    entry, library = load("bisect.yaml", "dsx-fixture-bisect")
    broken = copy.deepcopy(entry)
    broken["spec"]["entrypoint"] = "nowhere"
    broken["spec"]["volumeClaimTemplates"] = []
    problems = check(broken, library)
    assert any("entrypoint 'nowhere' is not a template of this workflow" in p for p in problems)
    assert any("unsupported construct 'volumeClaimTemplates'" in p for p in problems)
    # fields with no local meaning are accepted and ignored
    relaxed = copy.deepcopy(entry)
    relaxed["spec"]["podGC"] = {"strategy": "OnPodCompletion"}
    relaxed["spec"]["templates"][1]["nodeSelector"] = {"gpu": "h100"}
    assert check(relaxed, library) == []
