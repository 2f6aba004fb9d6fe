"""DAG templates: every task whose dependencies are done starts at once, as its own thread.

Mirrors ``workflow/controller/dag.go``: ``executeDAG`` (the targets, by default the tasks nothing depends
on, and only the tasks they need), ``depends`` / ``dependencies`` evaluated on the finished tasks'
results (Omitted when false), a fan-out's items under a TaskGroup node, and ``assessDAGPhase`` (each
target's branch decides the phase; an omitted or skipped task inherits its ancestors' failure). Each
task runs through :func:`workflows.runner.steps.run_member`, as ``dag.go`` uses ``steps.go``'s helpers.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from workflows.runner.depends import TaskResults, ancestors, depends_logic, evaluate_depends, task_names
from workflows.runner.library import TemplateScope
from workflows.runner.model import NodeStatus, Phase
from workflows.runner.nodes import error_node, finish, new_node
from workflows.runner.scope import aggregate_error, member_lookup, template_outputs
from workflows.runner.state import Ctx, Member, RunState
from workflows.runner.steps import continues, run_member

__all__ = ["assess_dag", "run_dag", "task_results"]


@dataclass(frozen=True)
class _Graph:
    """A dag's tasks as a graph: each task's ``depends`` logic, direct dependencies and ancestors."""

    continue_on: dict[str, Mapping[str, Any]]
    logic: dict[str, str]
    deps: dict[str, list[str]]
    ancestors: dict[str, set[str]]
    targets: list[str]
    needed: set[str]


def _graph(dag: Mapping[str, Any]) -> _Graph:
    """The graph of a dag; ``needed`` is the targets and everything they depend on."""
    tasks = list(dag.get("tasks") or [])
    continue_on = {str(t["name"]): t.get("continueOn") or {} for t in tasks}
    logic = {str(t["name"]): depends_logic(t, continue_on) for t in tasks}
    deps = {name: task_names(text) for name, text in logic.items()}
    above = {name: ancestors(name, deps) for name in logic}
    if dag.get("target"):
        targets = sorted(str(dag["target"]).split())
    else:
        depended = {d for name in deps for d in deps[name]}
        targets = sorted(name for name in deps if name not in depended)
    needed = set(targets).union(*(above[t] for t in targets)) if targets else set()
    return _Graph(continue_on, logic, deps, above, targets, needed)


def _task_ctx(child_ctx: Ctx, member: Member) -> Ctx:
    return replace(
        child_ctx,
        display=member.name,
        sort_key=(member.order,),
        step_name=member.name,
        depth=child_ctx.depth + 1,
    )


def run_dag(
    state: RunState, node: NodeStatus, body: Mapping[str, Any], scope: TemplateScope, ctx: Ctx
) -> None:
    """A dag template (Argo's executeDAG): run the needed tasks, then assess the phase and outputs."""
    if body.get("parallelism"):
        state.boundary_slots[node.id] = threading.BoundedSemaphore(int(body["parallelism"]))
    graph = _graph(body["dag"])
    tasks = body["dag"].get("tasks") or []
    members = {str(t["name"]): Member(str(t["name"]), dict(t), order) for order, t in enumerate(tasks)}
    _schedule(state, node, graph, members, scope, ctx)
    phase, culprit = assess_dag(graph.targets, members, graph.deps, graph.continue_on)
    if phase is not Phase.Succeeded:
        finish(state, node, phase, f"child '{culprit}' failed" if culprit else state.stopped_message)
        return
    failure = aggregate_error(members, members)  # Argo gathers every fan-out's outputs
    if failure is not None:
        finish(state, node, Phase.Error, failure)
        return
    lookup = member_lookup(state, "tasks", members, scope, None)
    node.outputs = template_outputs(body, lookup)
    finish(state, node, Phase.Succeeded, "")


def _schedule(
    state: RunState,
    node: NodeStatus,
    graph: _Graph,
    members: Mapping[str, Member],
    scope: TemplateScope,
    ctx: Ctx,
) -> None:
    """Start each needed task once its dependencies are done, until none runs and none can start.

    A stop starts nothing more; the tasks already running end as the stop ends them.
    """
    condition = threading.Condition()
    threads: list[threading.Thread] = []
    child_ctx = replace(ctx, boundary_id=node.id, parent_id=node.id)

    def task_thread(member: Member) -> None:
        name = f"{node.name}.{member.name}"

        def group() -> NodeStatus:
            return new_node(
                state, name, _task_ctx(child_ctx, member), "TaskGroup", Phase.Running, holder=member.holder
            )

        try:
            above = graph.ancestors[member.name]
            run_member(state, "tasks", node, member, members, above, scope, child_ctx, name, group)
        finally:
            with condition:
                member.done = True
                condition.notify_all()

    with condition:
        while True:
            started_any = False
            for member in members.values():
                if member.name not in graph.needed or member.started or state.stop.is_set():
                    continue
                if not all(members[d].done for d in graph.deps[member.name]):
                    continue
                member.started = True
                started_any = True
                if _should_run(state, node, graph, member, members, child_ctx):
                    thread = threading.Thread(target=task_thread, args=(member,), daemon=True)
                    thread.start()
                    threads.append(thread)
            if started_any:
                continue
            if not any(m.started and not m.done for m in members.values()):
                break
            condition.wait()
    for thread in threads:
        thread.join()


def _should_run(
    state: RunState,
    node: NodeStatus,
    graph: _Graph,
    member: Member,
    members: Mapping[str, Member],
    child_ctx: Ctx,
) -> bool:
    """Whether a task whose dependencies are done runs: its ``depends`` on their results.

    When it does not, its node is made here, done: Omitted for a false condition, Error for one that
    cannot be evaluated.
    """
    name = f"{node.name}.{member.name}"
    member_ctx = _task_ctx(child_ctx, member)
    results = {d: task_results(members[d]) for d in graph.deps[member.name]}
    try:
        execute = evaluate_depends(graph.logic[member.name], results)
    except ValueError as exc:
        member.node = error_node(state, name, member_ctx, str(exc), member.holder)
        member.done = True
        return False
    if not execute:
        member.node = new_node(
            state,
            name,
            member_ctx,
            "Skipped",
            Phase.Omitted,
            holder=member.holder,
            message="omitted: depends condition not met",
        )
        member.done = True
    return execute


def task_results(member: Member) -> TaskResults:
    """A finished task's results as ``depends`` reads them (``.Succeeded``, ``.AnySucceeded``...)."""
    node = member.node
    phase = node.phase if node is not None else Phase.Succeeded
    items = member.items or []
    return TaskResults(
        Succeeded=phase is Phase.Succeeded,
        Failed=phase is Phase.Failed,
        Errored=phase is Phase.Error,
        Skipped=phase is Phase.Skipped,
        Omitted=phase is Phase.Omitted,
        AnySucceeded=any(n.phase is Phase.Succeeded for n in items),
        AllFailed=bool(items) and all(n.phase is Phase.Failed for n in items),
    )


def assess_dag(
    targets: list[str],
    members: Mapping[str, Member],
    deps: Mapping[str, list[str]],
    continue_on: Mapping[str, Mapping[str, Any]],
) -> tuple[Phase, str | None]:
    """Argo's assessDAGPhase: each target's branch phase; an omitted or skipped task inherits failure."""
    memo: dict[str, tuple[Phase, str | None]] = {}

    def branch(name: str) -> tuple[Phase, str | None]:
        if name in memo:
            return memo[name]
        node = members[name].node
        if node is None:
            result: tuple[Phase, str | None] = (Phase.Failed, None)
        elif node.phase in (Phase.Succeeded, Phase.Failed, Phase.Error):
            culprit = node.id
            if node.type == "TaskGroup" and node.phase.failed_or_error:
                culprit = next((n.id for n in members[name].items or [] if n.phase.failed_or_error), node.id)
            result = (node.phase, culprit)
        else:
            result = (Phase.Succeeded, None)
            for dep in deps.get(name, []):
                inherited = branch(dep)
                if inherited[0].failed_or_error:
                    result = inherited
                    break
        memo[name] = result
        return result

    for target in targets:
        phase, culprit = branch(target)
        if phase.failed_or_error and not continues(phase, continue_on.get(target) or {}):
            return phase, culprit
    return Phase.Succeeded, None
