"""Which ``{{...}}`` variables a template may use: checked before the run, named with where they are.

Mirrors the variable checks of Argo's ``workflow/validate/validate.go`` (``resolveAllVariables`` and
the scopes it builds per template): a template may read its own inputs, the workflow's globals, the
``item`` of a fan-out, and the outputs of the tasks it depends on or the steps of earlier groups.
``{{workflow.failures}}`` exists only for the workflow's exit handler, and ``{{=...}}`` expressions
are not run here at all. Argo refuses such a workflow on submit; the local runner refuses it too,
before any step runs, rather than failing halfway.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from workflows.runner.depends import DependsError, ancestors, depends_logic, task_names
from workflows.runner.templating import expression_tags, tags, walk_strings

__all__ = ["expression_problem", "variable_problems"]

_WORKFLOW_VARS = re.compile(
    r"workflow\.(name|namespace|uid|serviceAccountName|mainEntrypoint|status|failures|duration"
    r"|creationTimestamp(\.[A-Za-z]+)?|parameters|parameters\.[-\w.]+|labels\.[-\w./]+|annotations\.[-\w./]+)"
)
_NODE_VARS = re.compile(
    r"(tasks|steps)\.(?P<name>[-\w]+)\.(outputs\.result|outputs\.parameters|outputs\.parameters\.(?P<param>[-\w]+)"
    r"|status|id|startedAt|finishedAt|exitCode)"
)


@dataclass
class _Members:
    """A template's tasks or steps as variables see them: who may read whom, and where each one is."""

    tasks: dict[str, dict[str, Any]] = field(default_factory=dict)
    ancestors: dict[str, set[str]] = field(default_factory=dict)
    step_group: dict[str, int] = field(default_factory=dict)
    owners: dict[str, str] = field(default_factory=dict)


def _members(tmpl: Mapping[str, Any], base: str, kind: str) -> _Members:
    members = _Members()
    if kind == "dag":
        task_list = [t for t in tmpl["dag"].get("tasks") or [] if isinstance(t, dict)]
        members.tasks = {str(t.get("name")): t for t in task_list}
        members.owners = {f"{base}.dag.tasks[{i}]": str(t.get("name")) for i, t in enumerate(task_list)}
        continue_on = {n: t.get("continueOn") or {} for n, t in members.tasks.items()}
        direct: dict[str, list[str]] = {}
        for task_name, task in members.tasks.items():
            try:
                direct[task_name] = [
                    d for d in task_names(depends_logic(task, continue_on)) if d in members.tasks
                ]
            except DependsError:
                direct[task_name] = []
        members.ancestors = {task_name: ancestors(task_name, direct) for task_name in members.tasks}
    elif kind == "steps":
        for group_index, group in enumerate(tmpl.get("steps") or []):
            for index, step in enumerate(group or []):
                if isinstance(step, dict):
                    members.tasks[str(step.get("name"))] = step
                    members.step_group[str(step.get("name"))] = group_index
                    members.owners[f"{base}.steps[{group_index}][{index}]"] = str(step.get("name"))
    return members


def _owner(path: str, owners: Mapping[str, str]) -> str | None:
    """Which task or step a field path lies in (None for fields outside tasks and steps)."""
    for prefix, name in owners.items():
        if path == prefix or path.startswith(prefix + ".") or path.startswith(prefix + "["):
            return name
    return None


def expression_problem(expr: str) -> tuple[str, str]:
    """What is wrong with an ``{{=...}}`` expression tag, and the hint: dsx templates use none."""
    return (
        f"unsupported construct '{{{{{expr[:40]}}}}}'",
        "expression tags {{=...}} are forbidden in dsx templates: use plain {{...}} variables and 'when'",
    )


def variable_problems(
    tmpl: Mapping[str, Any], base: str, kind: str, workflow_params: set[str], before_exit: bool
) -> list[tuple[str, str, str]]:
    """Every tag of the template that names nothing it may read: (field path, problem, hint).

    ``before_exit`` says the template runs before the workflow's exit handler, where Argo has no
    ``{{workflow.failures}}``.
    """
    inputs = {
        str(p.get("name")) for p in (tmpl.get("inputs") or {}).get("parameters") or [] if isinstance(p, dict)
    }
    members = _members(tmpl, base, kind)
    problems = []
    for path, text in walk_strings({k: v for k, v in tmpl.items() if k != "name"}, base):
        for expr in expression_tags(text):
            problems.append((path, *expression_problem(expr)))
        for tag in tags(text):
            if tag == "workflow.failures" and before_exit:
                problems.append(
                    (
                        path,
                        f"variable {{{{{tag}}}}} is set only for the workflow's exit handler (spec.onExit)",
                        "Argo refuses the workflow: failed to resolve {{workflow.failures}}",
                    )
                )
                continue
            why = _variable(tag, _owner(path, members.owners), kind, inputs, members, workflow_params)
            if why:
                problems.append((path, f"variable {{{{{tag}}}}} {why}", ""))
    return problems


def _variable(
    tag: str, owner: str | None, kind: str, inputs: set[str], members: _Members, workflow_params: set[str]
) -> str:
    """Why ``tag`` names nothing here ("" when it does); ``owner`` is the task or step it is written in."""
    if tag == "inputs.parameters":
        return ""
    if tag.startswith("inputs.parameters."):
        return (
            "" if tag[len("inputs.parameters.") :] in inputs else "is not a declared input of this template"
        )
    if tag.startswith("inputs.artifacts"):
        return "is not supported (input artifacts are not supported locally)"
    if tag in ("pod.name", "retries", "node.name", "tasks.name", "steps.name"):
        return ""
    if _WORKFLOW_VARS.fullmatch(tag):
        if (
            tag.startswith("workflow.parameters.")
            and tag[len("workflow.parameters.") :] not in workflow_params
        ):
            return "names no parameter of the workflow"
        return ""
    if tag == "item" or tag.startswith("item."):
        if owner is None or not ({"withItems", "withParam"} & set(members.tasks.get(owner, {}))):
            return "is only defined in a task or step with withItems or withParam"
        return ""
    match = _NODE_VARS.fullmatch(tag)
    if match is None:
        return "is not a variable the local runner knows"
    prefix, target = match.group(1), match.group("name")
    if (prefix == "tasks") != (kind == "dag") or target not in members.tasks:
        return f"names no {'task' if prefix == 'tasks' else 'step'} of this template"
    if owner is not None:
        if kind == "dag" and target not in members.ancestors.get(owner, set()):
            return f"names task '{target}', which task '{owner}' does not depend on"
        if kind == "steps" and members.step_group.get(target, 0) >= members.step_group.get(owner, 0):
            return f"names step '{target}', which does not run before step '{owner}'"
    return ""
