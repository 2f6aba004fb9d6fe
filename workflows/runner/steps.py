"""Steps templates, and running one task or step: references, items, ``when``, the template, ``onExit``.

Mirrors ``workflow/controller/steps.go``: ``executeSteps`` (groups in order, the steps of a group at
once, the first failed step failing its group and the template), and the helpers ``dag.go`` uses as well:
``resolveReferences`` (a member's ``{{tasks.*}}`` / ``{{steps.*}}``), ``expandStep`` (``withItems`` and
``withParam`` fanned out as ``name(index:label)``) and ``shouldExecute`` (``when``). :func:`run_member`
is that shared path, so :mod:`workflows.runner.dag` runs its tasks through it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from workflows.runner.errors import NodeError
from workflows.runner.exit_handler import run_member_exit
from workflows.runner.library import TemplateScope
from workflows.runner.model import NodeStatus, Phase
from workflows.runner.nodes import error_node, finish, new_node
from workflows.runner.scope import ABSENT, Dropped, Lookup, aggregate_error, member_lookup, template_outputs
from workflows.runner.state import Ctx, Member, RunState, Stopped
from workflows.runner.templating import TAG, Unresolved, render, render_all
from workflows.runner.values import item_label, item_text
from workflows.runner.when import WhenError, evaluate_when

__all__ = ["continues", "expand", "render_member", "run_member", "run_steps", "when_skip"]


def continues(phase: Phase, flags: Mapping[str, Any]) -> bool:
    """Whether ``continueOn`` lets the template go on past a member that ended in ``phase``."""
    return bool(
        (phase is Phase.Failed and flags.get("failed")) or (phase is Phase.Error and flags.get("error"))
    )


def render_member(holder: Mapping[str, Any], lookup: Lookup) -> tuple[dict[str, Any], dict[str, str]]:
    """The task or step with its references resolved, and its arguments.

    An argument that is nothing but a reference to an absent optional (a skipped task's output parameter
    without a default) becomes :data:`~workflows.runner.scope.ABSENT`, as in Argo v4
    (``markAbsentOptionalArgs``); a longer one raises :class:`~workflows.runner.scope.Dropped`.
    """

    def defer(tag: str) -> bool:
        return tag == "item" or tag.startswith("item.")

    def skip(path: tuple[str | int, ...]) -> bool:
        return path == ("arguments",)

    rendered = render_all(dict(holder), lookup, defer, skip)
    args: dict[str, str] = {}
    kept = []
    for param in (holder.get("arguments") or {}).get("parameters") or []:
        text = item_text(param.get("value", ""))
        try:
            value = render(text, lookup, defer)
        except Dropped:
            if len(TAG.findall(text)) != 1 or TAG.fullmatch(text.strip()) is None:
                raise
            value = ABSENT
        args[str(param["name"])] = value
        kept.append({"name": param["name"], "value": value})
    rendered["arguments"] = {"parameters": kept}
    return rendered, args


def expand(holder: Mapping[str, Any]) -> list[tuple[str, dict[str, str]]] | None:
    """A fan-out's items as (label, item scope) pairs; None for a member without items.

    Raises:
        NodeError: ``withParam`` is not a JSON list (Argo's message).
    """
    if "withItems" in holder:
        items = holder["withItems"]
    elif "withParam" in holder:
        text = str(holder["withParam"])
        try:
            items = json.loads(text)
        except ValueError as exc:
            raise NodeError(
                f"withParam value could not be parsed as a JSON list: {text.strip()}: {exc}"
            ) from exc
        if not isinstance(items, list):
            raise NodeError(f"withParam value could not be parsed as a JSON list: {text.strip()}")
    else:
        return None
    expanded = []
    for item in items:
        scope = {"item": item_text(item)}
        if isinstance(item, dict):
            for key, value in item.items():
                scope[f"item.{key}"] = item_text(value)
        expanded.append((item_label(item), scope))
    return expanded


def when_skip(state: RunState, name: str, holder: Mapping[str, Any], ctx: Ctx) -> NodeStatus | None:
    """The Skipped node of a member whose ``when`` is false (Error if it cannot be read); else None."""
    when = holder.get("when")
    if when is None or str(when).strip() == "":
        return None
    try:
        proceed = evaluate_when(str(when))
    except WhenError as exc:
        return error_node(state, name, ctx, str(exc), holder)
    if proceed:
        return None
    return new_node(
        state, name, ctx, "Skipped", Phase.Skipped, holder=holder, message=f"when '{when}' evaluated false"
    )


def run_member(
    state: RunState,
    prefix: str,
    parent: NodeStatus,
    member: Member,
    members: Mapping[str, Member],
    allowed: set[str] | None,
    scope: TemplateScope,
    ctx: Ctx,
    name: str,
    item_parent: Callable[[], NodeStatus | None],
) -> None:
    """Run one task or step: resolve references, expand items, check ``when``, run, then ``onExit``.

    ``item_parent`` makes the node a fan-out's items hang under (a dag's TaskGroup), or returns None
    (a steps template's items hang under the group). The member's node (or items) is left on ``member``.
    """
    member_ctx = Ctx(
        boundary_id=parent.id,
        parent_id=ctx.parent_id,
        depth=ctx.depth + 1,
        display=member.name,
        sort_key=(member.order,),
        step_name=member.name,
        local={f"{prefix}.name": member.name},
    )
    lookup = member_lookup(state, prefix, members, scope, allowed)
    if prefix == "tasks":  # Argo gathers the outputs of every fan-out among a task's ancestors
        failure = aggregate_error(members, allowed or ())
        if failure is not None:
            member.node = error_node(state, name, member_ctx, failure, member.holder)
            return
    try:
        holder, args = render_member(member.holder, lookup)
        items = expand(holder)
    except (Unresolved, Dropped, NodeError) as exc:
        member.node = error_node(state, name, member_ctx, str(exc), member.holder)
        return
    if items is None:
        skipped = when_skip(state, name, holder, member_ctx)
        member.node = (
            skipped if skipped is not None else state.execute(state, name, holder, scope, args, member_ctx)
        )
    elif not items:
        member.node = new_node(
            state, name, member_ctx, "Skipped", Phase.Skipped, holder=holder, message="Skipped, empty params"
        )
    else:
        _run_items(state, member, name, holder, items, scope, member_ctx, item_parent())
    run_member_exit(state, member, name, scope, member_ctx)


def _run_items(
    state: RunState,
    member: Member,
    name: str,
    holder: Mapping[str, Any],
    items: list[tuple[str, dict[str, str]]],
    scope: TemplateScope,
    member_ctx: Ctx,
    group: NodeStatus | None,
) -> None:
    """Run a fan-out's items at once, as ``<name>(<index>:<label>)``; a TaskGroup ends as its worst item."""
    member.items = []
    results: list[NodeStatus | None] = [None] * len(items)
    bare = {k: v for k, v in holder.items() if k not in ("withItems", "withParam")}

    def run_item(index: int, label: str, item_scope: dict[str, str]) -> None:
        item_name = f"{name}({index}:{label})"
        item_ctx = replace(
            member_ctx,
            display=f"{member.name}({index}:{label})",
            parent_id=group.id if group is not None else member_ctx.parent_id,
            sort_key=(member.order, index) if group is None else (index,),
        )
        try:
            item_holder = render_all(bare, item_scope)
            item_args = {
                str(p["name"]): str(p["value"])
                for p in (item_holder.get("arguments") or {}).get("parameters") or []
            }
        except Unresolved as exc:
            results[index] = error_node(state, item_name, item_ctx, str(exc), holder)
            return
        node = when_skip(state, item_name, item_holder, item_ctx)
        results[index] = (
            node
            if node is not None
            else state.execute(state, item_name, item_holder, scope, item_args, item_ctx)
        )

    threads = []
    for index, (label, item_scope) in enumerate(items):
        thread = threading.Thread(target=run_item, args=(index, label, item_scope), daemon=True)
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join()
    member.items = [n for n in results if n is not None]
    if group is not None:
        failed = [n.phase for n in member.items if n.phase.failed_or_error]
        finish(state, group, failed[-1] if failed else Phase.Succeeded)
        member.node = group


def _no_item_parent() -> NodeStatus | None:
    """A step's items hang under its step group, with no node of their own."""
    return None


def run_steps(
    state: RunState, node: NodeStatus, body: Mapping[str, Any], scope: TemplateScope, ctx: Ctx
) -> None:
    """A steps template (Argo's executeSteps): its groups in order; its outputs from its steps'.

    Raises:
        Stopped: the run stopped between groups.
    """
    if body.get("parallelism"):
        state.boundary_slots[node.id] = threading.BoundedSemaphore(int(body["parallelism"]))
    members: dict[str, Member] = {}
    for group_index, group in enumerate(body.get("steps") or []):
        if state.stop.is_set():
            raise Stopped
        if not _run_group(state, node, group_index, group or [], members, scope, ctx):
            return
    lookup = member_lookup(state, "steps", members, scope, None)
    node.outputs = template_outputs(body, lookup)
    finish(state, node, Phase.Succeeded, "")


def _run_group(
    state: RunState,
    node: NodeStatus,
    group_index: int,
    group: list[Mapping[str, Any]],
    members: dict[str, Member],
    scope: TemplateScope,
    ctx: Ctx,
) -> bool:
    """Run one group's steps at once (Argo's executeStepGroup); False when it ended the steps node.

    A step may read the steps of earlier groups only. A failed step (unless ``continueOn``) fails its
    group and the template; a fan-out whose results are not JSON errors the template.
    """
    group_name = f"{node.name}[{group_index}]"
    group_ctx = replace(
        ctx,
        boundary_id=node.id,
        parent_id=node.id,
        display=f"[{group_index}]",
        sort_key=(group_index,),
        step_name=None,
    )
    group_node = new_node(state, group_name, group_ctx, "StepGroup", Phase.Running)
    allowed = set(members)
    step_ctx = replace(ctx, boundary_id=node.id, parent_id=group_node.id)
    threads = []
    current = []
    for index, step in enumerate(group):
        member = Member(str(step["name"]), dict(step), index)
        members[member.name] = member
        current.append(member)
        args = (
            state,
            "steps",
            node,
            member,
            members,
            allowed,
            scope,
            step_ctx,
            f"{group_name}.{member.name}",
        )
        thread = threading.Thread(target=run_member, args=(*args, _no_item_parent), daemon=True)
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join()
    message = _group_failure(current)
    if message is not None:
        finish(state, group_node, Phase.Failed, message)
        finish(state, node, Phase.Failed, message)
        return False
    finish(state, group_node, Phase.Succeeded)
    failure = aggregate_error(members, [m.name for m in current])
    if failure is not None:
        finish(state, node, Phase.Error, failure)
        return False
    return True


def _group_failure(current: list[Member]) -> str | None:
    """Why a group failed: its first failed or errored step (or item) that ``continueOn`` does not excuse."""
    for member in current:
        flags = member.holder.get("continueOn") or {}
        candidates = member.items if member.items is not None else [member.node]
        for child in candidates:
            if child is None or not child.phase.failed_or_error or continues(child.phase, flags):
                continue
            return f"child '{child.id}' failed"
    return None
