"""Exit handlers: a task's or step's ``onExit``, and the workflow's, with what the latter may read.

Mirrors ``runOnExitNode`` in ``workflow/controller/exit_handler.go`` (a task's handler runs once the node
it follows is done, as that node's child) and the part of ``operator.go`` that runs ``spec.onExit``
after the entrypoint, with ``workflow.status`` set to the final phase and ``workflow.failures`` listing
every failed node.
"""

from __future__ import annotations

from dataclasses import replace

from workflows.runner.library import TemplateScope
from workflows.runner.model import NodeStatus, Phase, timestamp
from workflows.runner.names import pod_name
from workflows.runner.state import Ctx, Member, RunState
from workflows.runner.values import go_json, go_quote

__all__ = ["run_member_exit", "run_workflow_exit"]


def run_member_exit(
    state: RunState, member: Member, name: str, scope: TemplateScope, member_ctx: Ctx
) -> None:
    """Run the member's ``onExit`` template as ``<name>.onExit``, once its node has ended."""
    top = member.node
    exit_template = member.holder.get("onExit")
    if not exit_template or top is None or top.phase not in (Phase.Succeeded, Phase.Failed, Phase.Error):
        return
    exit_ctx = replace(
        member_ctx,
        parent_id=top.id,
        display=f"{member.name}.onExit",
        sort_key=(10**9,),
        step_name=None,
    )
    state.execute(state, f"{name}.onExit", {"template": exit_template}, scope, state.parameters, exit_ctx)


def run_workflow_exit(state: RunState, root: NodeStatus, on_exit: str) -> NodeStatus:
    """Run ``spec.onExit`` as ``<workflow>.onExit`` beside the root, with the final status in scope."""
    status = {Phase.Failed: "Failed", Phase.Error: "Error"}.get(root.phase, "Succeeded")
    state.globals["workflow.status"] = status
    # Argo marshals the list (null when empty) and then Go-quotes it, so the value a step gets
    # is a JSON string holding the JSON list: `"[{\"displayName\":...}]"`.
    state.globals["workflow.failures"] = go_quote(go_json(_failures(state) or None))
    exit_ctx = Ctx(
        boundary_id=None, parent_id=None, depth=1, display=f"{state.workflow}.onExit", sort_key=(1,)
    )
    return state.execute(
        state,
        f"{state.workflow}.onExit",
        {"template": on_exit},
        state.library.entry_scope,
        state.parameters,
        exit_ctx,
    )


def _failures(state: RunState) -> list[dict[str, str | None]]:
    """Every failed or errored node so far, in the order they finished (``workflow.failures``)."""
    with state.lock:
        nodes = list(state.nodes.values())
    failures = []
    for failed in sorted(nodes, key=lambda n: (n.finished_at or 0, n.name)):
        if failed.phase.failed_or_error:
            failures.append(
                {
                    "displayName": failed.display_name,
                    "message": failed.message,
                    "templateName": failed.template_name or "",
                    "phase": str(failed.phase),
                    "podName": pod_name(state.workflow, failed.name, failed.template_name),
                    "finishedAt": timestamp(failed.finished_at),
                }
            )
    return failures
