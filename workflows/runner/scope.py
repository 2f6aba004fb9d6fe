"""What a ``{{...}}`` name resolves to: the workflow's globals, and the tasks' and steps' results.

Mirrors ``workflow/controller/scope.go`` (``wfScope``: ``resolveParameter``, and
``addSkippedNodeOutputsToScope`` for a skipped task's declared defaults) with the parts of
``operator.go`` that fill a scope: ``setGlobalParameters`` (``workflow.*``),
``processAggregateNodeOutputs`` (a fan-out's outputs as one JSON list) and
``getTemplateOutputsFromScope`` (a dag or steps template's own outputs). Lookups are functions of a tag,
so templating can stay ignorant of nodes.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from workflows.runner.errors import NodeError
from workflows.runner.library import TemplateScope
from workflows.runner.model import NodeStatus, Phase, timestamp
from workflows.runner.state import Member, RunState
from workflows.runner.templating import Unresolved, render
from workflows.runner.values import go_json, go_unmarshal, no_constant, params_json, sorted_keys

__all__ = [
    "ABSENT",
    "Dropped",
    "Lookup",
    "NoResult",
    "aggregate",
    "aggregate_error",
    "global_lookup",
    "member_lookup",
    "template_outputs",
    "workflow_globals",
]

Lookup = Callable[[str], str | None]
"""A scope: the value of a tag, or None where the scope does not hold it."""
_MEMBER_VAR = re.compile(r"(?P<prefix>tasks|steps)\.(?P<name>[-\w]+)\.(?P<field>.+)")
_OUTPUT_PARAM = "outputs.parameters."


ABSENT = "__argo-internal.absent-optional-output__"
"""What an argument that is nothing but a reference to an absent optional becomes (Argo v4's
``common.AbsentOptionalArgumentValue``): the template it goes to takes its input's own default, or
errors when there is none (``common.ProcessArgs``)."""


class Dropped(Exception):
    """A reference to an output parameter of a skipped or omitted task that declares no default.

    Argo v4 calls it an absent optional (``scope.go``, ``addSkippedNodeOutputsToScope``): an argument that
    is only that reference becomes :data:`ABSENT`; anywhere else (inside a longer argument, a ``when``, a
    template's outputs without a default) it is a terminal error, never an empty string.
    """

    def __init__(self, tag: str) -> None:
        self.tag = tag
        super().__init__(
            f"unable to substitute {{{{{tag}}}}}: output is an absent optional (skipped/omitted node with no "
            "default)"
        )


class NoResult(Unresolved):
    """The result of a skipped or omitted task: Argo has none in scope, so it requeues the task that
    reads it until the workflow ends (``buildLocalScope`` sets outputs only for nodes that have them)."""

    def __init__(self, tag: str) -> None:
        super().__init__(tag)
        self.args = (
            f"failed to resolve {{{{{tag}}}}}: the task was skipped and has no result (Argo v4 waits for "
            "it until the workflow ends)",
        )


def workflow_globals(state: RunState) -> dict[str, str]:
    """The global scope at the start of the run (Argo's setGlobalParameters)."""
    options, spec = state.options, state.spec
    namespace = options.namespace or (state.library.entry.get("metadata") or {}).get("namespace") or "default"
    values = {
        "workflow.name": state.workflow,
        "workflow.namespace": str(namespace),
        "workflow.uid": state.uid,
        "workflow.mainEntrypoint": str(options.entrypoint or spec.get("entrypoint")),
        "workflow.serviceAccountName": str(spec.get("serviceAccountName") or "default"),
        "workflow.creationTimestamp": str(timestamp(state.created)),
        # Until the exit handler, Argo gives the workflow's phase while it runs; the exit handler
        # gets the final one (and workflow.failures, which nothing else may read).
        "workflow.status": "Running",
    }
    declared = (spec.get("arguments") or {}).get("parameters") or []
    listed = []
    for param in declared:
        name = str(param.get("name"))
        values[f"workflow.parameters.{name}"] = state.parameters.get(name, "")
        listed.append({**param, "value": state.parameters.get(name, "")})
    values["workflow.parameters"] = params_json(listed)
    metadata = spec.get("workflowMetadata") or {}
    for key, value in (metadata.get("labels") or {}).items():
        values[f"workflow.labels.{key}"] = str(value)
    for key, value in (metadata.get("annotations") or {}).items():
        values[f"workflow.annotations.{key}"] = str(value)
    return values


def global_lookup(state: RunState, tag: str) -> str | None:
    """A global variable (``workflow.*``), including ``workflow.creationTimestamp.<strftime letter>``."""
    if tag in state.globals:
        return state.globals[tag]
    if tag == "workflow.duration":  # seconds since the workflow started, at the time of asking
        return f"{time.time() - state.created:f}"
    if tag.startswith("workflow.creationTimestamp."):
        letter = tag.rsplit(".", 1)[1]
        moment = dt.datetime.fromtimestamp(state.created, dt.UTC)
        if letter == "RFC3339":
            return moment.strftime("%Y-%m-%dT%H:%M:%SZ")
        if letter == "s":
            return str(int(state.created))
        if len(letter) == 1:
            return moment.strftime(f"%{letter}")
    return None


def member_lookup(
    state: RunState,
    prefix: str,
    members: Mapping[str, Member],
    scope: TemplateScope,
    allowed: set[str] | None,
) -> Lookup:
    """The scope of a dag's tasks (``prefix="tasks"``) or a steps template's steps, as they finish.

    ``allowed`` limits it to the members a task or step may read (its ancestors, earlier groups);
    None lets every member be read (the template's own outputs).
    """

    def lookup(tag: str) -> str | None:
        match = _MEMBER_VAR.fullmatch(tag)
        if match is None or match.group("prefix") != prefix:
            return None
        name, field_name = match.group("name"), match.group("field")
        if allowed is not None and name not in allowed:
            return None
        member = members.get(name)
        if member is None or (member.node is None and member.items is None):
            return None
        return _member_value(state, tag, member, field_name, scope)

    return lookup


def _member_value(
    state: RunState, tag: str, member: Member, field_name: str, scope: TemplateScope
) -> str | None:
    node = member.node
    if field_name == "status":
        if node is not None:
            return str(node.phase)
        failed = [n.phase for n in member.items or [] if n.phase.failed_or_error]
        return str(failed[-1] if failed else Phase.Succeeded)
    if node is not None and field_name == "id":
        return node.id
    if node is not None and field_name in ("startedAt", "finishedAt"):
        return timestamp(node.started_at if field_name == "startedAt" else node.finished_at)
    if node is not None and field_name == "exitCode":
        return node.outputs.get("exitCode")
    if member.items is not None:
        return aggregate(member.items, field_name)
    assert node is not None
    if node.phase in (Phase.Skipped, Phase.Omitted):
        if not field_name.startswith(_OUTPUT_PARAM):
            raise NoResult(tag)
        default = _output_default(state, member.holder, scope, field_name[len(_OUTPUT_PARAM) :])
        if default is not None:
            return default
        raise Dropped(tag)
    if field_name == "outputs.result":
        return node.outputs.get("result")
    if field_name.startswith(_OUTPUT_PARAM):
        wanted = field_name[len(_OUTPUT_PARAM) :]
        for param in node.outputs.get("parameters") or []:
            if param.get("name") == wanted:
                return str(param.get("value"))
    return None


def _output_default(
    state: RunState, holder: Mapping[str, Any], scope: TemplateScope, name: str
) -> str | None:
    """A skipped task's declared default for an output (Argo's addSkippedNodeOutputsToScope)."""
    try:
        template, _ = state.library.resolve(holder, scope)
    except KeyError:
        return None
    for param in (template.get("outputs") or {}).get("parameters") or []:
        value_from = param.get("valueFrom") or {}
        if param.get("name") == name and "default" in value_from:
            return str(value_from["default"])
    return None


def aggregate(items: list[NodeStatus], field_name: str) -> str | None:
    """A fan-out's outputs as Argo's processAggregateNodeOutputs gathers them (succeeded items only).

    Raises:
        NodeError: an item kept a result that is not JSON; Argo then errors whatever needs the
            fan-out's outputs.
    """
    succeeded = [n for n in sorted(items, key=lambda n: n.sort_key) if n.phase is Phase.Succeeded]
    if field_name == "outputs.result":
        values = [go_unmarshal(n.outputs["result"]) for n in succeeded if "result" in n.outputs]
        return go_json(values)
    if field_name == "outputs.parameters":
        listed = [
            {p["name"]: str(p["value"]) for p in n.outputs.get("parameters") or []}
            for n in succeeded
            if n.outputs.get("parameters")
        ]
        return go_json(sorted_keys(listed))
    if field_name.startswith(_OUTPUT_PARAM):
        wanted = field_name[len(_OUTPUT_PARAM) :]
        found = [
            str(param["value"])
            for node in succeeded
            for param in node.outputs.get("parameters") or []
            if param.get("name") == wanted
        ]
        return _json_value_list(found)
    return None


def _json_value_list(found: list[str]) -> str:
    """Argo's aggregatedJSONValueList: the values parsed only if every one is a JSON list or object."""
    parsed: list[Any] = []
    for value in found:
        try:
            item = json.loads(value, parse_constant=no_constant)
        except ValueError:
            return go_json(found)
        if not isinstance(item, list | dict):
            return go_json(found)
        parsed.append(item)
    return go_json(sorted_keys(parsed))


def aggregate_error(members: Mapping[str, Member], names: Iterable[str]) -> str | None:
    """Why Argo could not build the scope of a task whose ancestors include these fan-outs."""
    for name in sorted(names):
        member = members.get(name)
        if member is None or member.items is None:
            continue
        try:
            aggregate(member.items, "outputs.result")
        except NodeError as exc:
            return str(exc)
    return None


def template_outputs(body: Mapping[str, Any], lookup: Lookup) -> dict[str, Any]:
    """A dag or steps template's outputs from its members' (Argo's getTemplateOutputsFromScope).

    Raises:
        NodeError: an output names a value the scope does not hold and declares no default.
    """
    params = []
    for param in (body.get("outputs") or {}).get("parameters") or []:
        value_from = param.get("valueFrom") or {}
        if "parameter" in value_from:
            try:
                value = render(str(value_from["parameter"]), lookup)
            except Dropped as exc:
                if "default" not in value_from:
                    raise NodeError(
                        f"output parameter {json.dumps(param['name'])}: "
                        f"{json.dumps(value_from['parameter'])} is an absent optional (skipped/omitted node "
                        "output with no default)"
                    ) from exc
                value = str(value_from["default"])
            except Unresolved as exc:
                if "default" not in value_from:
                    raise NodeError(f"Unable to resolve outputs from scope: {exc}") from exc
                value = str(value_from["default"])
        elif "default" in value_from:
            value = str(value_from["default"])
        else:
            continue
        params.append({"name": param["name"], "value": value})
    return {"parameters": params} if params else {}
