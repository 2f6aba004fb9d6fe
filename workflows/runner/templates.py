"""Invoking a template: inputs, retries, rendering, then the kind of template it is.

Mirrors ``executeTemplate`` in ``workflow/controller/operator.go``: resolve the template a task names,
process its inputs (``common.ProcessArgs``), refuse past the maximum depth, wrap it in a Retry node when
it has a ``retryStrategy`` (``processNodeRetries``, in Argo's order of checks), then run it by kind:
pods (:mod:`workflows.runner.workflowpod`), resources (:mod:`workflows.runner.resource`), suspend
(``executeSuspend``, here), dag and steps (:mod:`workflows.runner.dag`, :mod:`workflows.runner.steps`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from steps.durations import humanize_duration, parse_duration
from workflows.runner import dag, resource, steps, workflowpod
from workflows.runner.errors import NodeError
from workflows.runner.library import TemplateScope
from workflows.runner.model import NodeStatus, Phase
from workflows.runner.names import pod_name
from workflows.runner.nodes import error_node, finish, new_node, running, set_message, slot
from workflows.runner.resume import resumed_by
from workflows.runner.scope import ABSENT, global_lookup
from workflows.runner.state import Ctx, RunState, Stopped
from workflows.runner.synchronization import hold
from workflows.runner.templating import Unresolved, render_all
from workflows.runner.values import item_text, params_json

__all__ = ["DEPTH_MESSAGE", "MAX_DEPTH", "Invocation", "execute", "process_inputs", "transient"]

MAX_DEPTH = 100
_RESUME_POLL_S = 0.2
"""How often a suspended node looks for a ``dsx resume``."""
DEPTH_MESSAGE = (
    "Maximum recursion depth exceeded. See https://argo-workflows.readthedocs.io/en/latest/scaling/"
    "#maximum-recursion-depth"
)
_NODE_TYPES = {
    "script": "Pod",
    "container": "Pod",
    "resource": "Pod",
    "dag": "DAG",
    "steps": "Steps",
    "suspend": "Suspend",
}
_KINDS = ("dag", "steps", "script", "container", "resource", "suspend")
_POD_KINDS = ("script", "container", "resource")
# What Argo's IsTransientErr finds in a message alone (util/errors: the network, etcd and rate-limiter
# texts it matches by substring, case-sensitive); OnTransientError retries only these.
_TRANSIENT_TEXTS = (
    "unexpected error when reading response body",
    "stream error when reading response body",
    "Connection closed by foreign host",
    "net/http: TLS handshake timeout",
    "i/o timeout",
    "connection timed out",
    "connection reset by peer",
    "http2: client connection lost",
    "http2: server sent GOAWAY and closed the connection",
    "request did not complete within requested timeout",
    "connect: connection refused",
    "invalid connection",
    "etcdserver: leader changed",
    "etcdserver: request timed out",
    "etcdserver: too many requests",
    "client rate limiter Wait returned an error",
    "upper: no more rows in",
)


def transient(message: str) -> bool:
    """Whether Argo's OnTransientError retry policy counts a node's message as a transient error."""
    return any(text in message for text in _TRANSIENT_TEXTS)


@dataclass(frozen=True)
class Invocation:
    """A template invocation with its inputs processed: what one node (or one retry attempt) runs."""

    name: str
    template: Mapping[str, Any]
    scope: TemplateScope
    holder: Mapping[str, Any]
    inputs: list[dict[str, Any]]
    local: dict[str, str]
    ctx: Ctx
    kind: str

    @property
    def pod(self) -> bool:
        """Whether it runs as a pod in Argo (and so counts against the workflow's parallelism)."""
        return self.kind in _POD_KINDS


def execute(
    state: RunState,
    name: str,
    holder: Mapping[str, Any],
    scope: TemplateScope,
    args: Mapping[str, str],
    ctx: Ctx,
) -> NodeStatus:
    """Invoke the template ``holder`` names as node ``name`` (Argo's executeTemplate)."""
    if ctx.depth >= MAX_DEPTH:
        return error_node(state, name, ctx, DEPTH_MESSAGE, holder)
    try:
        template, template_scope = state.library.resolve(holder, scope)
    except KeyError as exc:
        return error_node(state, name, ctx, str(exc.args[0]), holder)
    try:
        inputs = process_inputs(template, args)
    except NodeError as exc:
        return error_node(state, name, ctx, str(exc), holder)
    kind = next(k for k in _KINDS if k in template)
    local = dict(ctx.local)
    local["node.name"] = name
    for param in inputs:
        local[f"inputs.parameters.{param['name']}"] = str(param["value"])
    local["inputs.parameters"] = params_json(inputs)
    retry = template.get("retryStrategy")
    if retry is None and kind in _POD_KINDS:
        local["pod.name"] = pod_name(state.workflow, name, template.get("name"))
    call = Invocation(name, template, template_scope, holder, inputs, local, ctx, kind)
    return execute_body(state, call) if retry is None else execute_retry(state, call, retry)


def process_inputs(template: Mapping[str, Any], args: Mapping[str, str]) -> list[dict[str, Any]]:
    """The template's input parameters with their values: the argument, else its value or default.

    An argument that references an absent optional (:data:`~workflows.runner.scope.ABSENT`) counts as
    not given, as Argo v4's ``common.ProcessArgs`` has it.

    Raises:
        NodeError: an input has no argument, value or default.
    """
    inputs = []
    for param in (template.get("inputs") or {}).get("parameters") or []:
        name = str(param.get("name"))
        entry = {k: param[k] for k in ("name", "default", "enum", "description") if k in param}
        if args.get(name) == ABSENT and "value" not in param and "default" not in param:
            raise NodeError(
                f"inputs.parameters.{name}: argument references an absent optional (skipped/omitted node "
                "output with no default)"
            )
        if name in args and args[name] != ABSENT:
            value = args[name]
        elif "value" in param:
            value = param["value"]
        elif "default" in param:
            value = param["default"]
        else:
            raise NodeError(f"inputs.parameters.{name} was not supplied")
        entry["value"] = item_text(value) if not isinstance(value, str) else value
        if "default" in entry and not isinstance(entry["default"], str):
            entry["default"] = item_text(entry["default"])
        inputs.append(entry)
    return inputs


def execute_retry(state: RunState, call: Invocation, retry: Mapping[str, Any]) -> NodeStatus:
    """A Retry node whose children are the attempts, until one succeeds or the strategy gives up."""
    node = new_node(state, call.name, call.ctx, "Retry", Phase.Running, call.template, call.holder)
    node.inputs = {"parameters": call.inputs} if call.inputs else {}
    limit = int(str(retry["limit"])) if retry.get("limit") is not None else None
    policy = str(retry.get("retryPolicy") or "OnFailure")
    backoff = retry.get("backoff") or {}
    first_start: float | None = None
    attempt = 0
    while True:
        child = execute_body(state, _attempt(state, call, node, attempt, first_start, backoff))
        if first_start is None:
            first_start = child.started_at or time.time()
        # Argo's processNodeRetries, in its order: success, stop, backoff (max duration, then the wait,
        # which only a numeric limit with retries left allows), the policy, then the limit.
        node.outputs = dict(child.outputs)
        if child.phase is Phase.Succeeded:
            return finish(state, node, Phase.Succeeded, "")
        if state.stop.is_set():
            return finish(state, node, child.phase, child.message)
        if backoff:
            ended = _backoff(state, node, child, backoff, first_start, attempt, limit)
            if ended is not None:
                return finish(state, node, child.phase, ended)
        retry_failed, retry_error = {
            "Always": (True, True),
            "OnFailure": (True, False),
            "OnError": (False, True),
            "OnTransientError": (transient(child.message),) * 2,
        }[policy]
        if (child.phase is Phase.Failed and not retry_failed) or (
            child.phase is Phase.Error and not retry_error
        ):
            return finish(state, node, child.phase, child.message)
        if limit is not None and attempt + 1 > limit:
            return finish(state, node, child.phase, "No more retries left")
        attempt += 1


def _attempt(
    state: RunState,
    call: Invocation,
    node: NodeStatus,
    attempt: int,
    first_start: float | None,
    backoff: Mapping[str, Any],
) -> Invocation:
    """Attempt ``attempt`` of a retried template: node ``<name>(<attempt>)``, under the Retry node.

    Its deadline is the nearer of its parent's and what ``backoff.maxDuration`` leaves of the time since
    the first attempt started.
    """
    child_name = f"{call.name}({attempt})"
    local = dict(call.local)
    local["retries"] = str(attempt)
    local["node.name"] = child_name
    if call.pod:
        local["pod.name"] = pod_name(state.workflow, child_name, call.template.get("name"))
    deadlines = [call.ctx.deadline] if call.ctx.deadline is not None else []
    if backoff.get("maxDuration") is not None and first_start is not None:
        remaining = first_start + parse_duration(backoff["maxDuration"]) - time.time()
        deadlines.append(time.monotonic() + remaining)
    ctx = replace(
        call.ctx,
        parent_id=node.id,
        display=f"{call.ctx.display}({attempt})",
        sort_key=(attempt,),
        deadline=min(deadlines) if deadlines else None,
    )
    return replace(call, name=child_name, local=local, ctx=ctx)


def _backoff(
    state: RunState,
    node: NodeStatus,
    child: NodeStatus,
    backoff: Mapping[str, Any],
    first_start: float,
    attempt: int,
    limit: int | None,
) -> str | None:
    """Wait out the backoff after a failed attempt; the message the Retry node ends with, if it ends.

    Argo's order: past ``maxDuration`` ends it; a wait that would pass ``maxDuration`` ends it; the
    wait itself (``duration * factor^attempt``, at most ``cap``) only with a numeric limit and retries
    left. A stop during the wait ends it with the attempt's own message.
    """
    finished = child.finished_at or time.time()
    max_at = None
    if backoff.get("maxDuration") is not None:
        max_at = first_start + parse_duration(backoff["maxDuration"])
        if time.time() > max_at:
            return "Max duration limit exceeded"
    wait = parse_duration(backoff["duration"])
    factor = int(str(backoff.get("factor") or 0))
    if factor > 0:
        wait *= factor**attempt
    if backoff.get("cap") is not None:
        wait = min(wait, parse_duration(backoff["cap"]))
    if max_at is not None and finished + wait > max_at:
        return "Backoff would exceed max duration limit"
    if time.time() < finished + wait and limit is not None and attempt + 1 <= limit:
        set_message(state, node, f"Backoff for {humanize_duration(wait)}")
        if state.stop.wait(max(0.0, finished + wait - time.time())):
            return child.message
        with state.lock:
            node.message = ""
    return None


def _defer_members(tag: str) -> bool:
    """Tags a template's body leaves for its dag or steps to resolve (their members, their items)."""
    return tag.startswith(("tasks.", "steps.")) or tag == "item" or tag.startswith("item.")


def execute_body(state: RunState, call: Invocation) -> NodeStatus:
    """Render the template with its scope, make its node, and run it under parallelism by its kind.

    Whatever goes wrong ends the node, never the run: a stop ends it Failed, a NodeError ends it Error
    with its message, and an unexpected exception (a runner bug) ends it Error naming the exception.
    """
    local = call.local

    def lookup(tag: str) -> str | None:
        return local.get(tag) if tag in local else global_lookup(state, tag)

    try:
        body = render_all(dict(call.template), lookup, _defer_members)
    except Unresolved as exc:
        return error_node(state, call.name, call.ctx, str(exc), call.holder)
    node = new_node(
        state, call.name, call.ctx, _NODE_TYPES[call.kind], Phase.Pending, call.template, call.holder
    )
    if call.kind in ("dag", "steps"):
        # The boundary of the steps it runs, as written (Argo marshals the stored template to JSON).
        text = json.dumps(call.template, ensure_ascii=False)
        with state.lock:
            state.boundary_templates[node.id] = ("tasks" if call.kind == "dag" else "steps", text)
    node.inputs = {"parameters": call.inputs} if call.inputs else {}
    if call.pod:
        node.pod_name = local.get("pod.name")
    try:
        namespace = global_lookup(state, "workflow.namespace") or "default"
        with (
            hold(state, body.get("synchronization"), namespace, lambda text: set_message(state, node, text)),
            slot(state, call.ctx, pod=call.pod),
        ):
            running(state, node)
            _run_kind(state, node, body, call)
    except Stopped:
        finish(state, node, Phase.Failed, state.stopped_message)
    except NodeError as exc:
        finish(state, node, Phase.Error, str(exc))
    except Exception as exc:  # a runner bug must not leave the node running for ever
        finish(state, node, Phase.Error, f"local runner error: {type(exc).__name__}: {exc}")
    return node


def _run_kind(state: RunState, node: NodeStatus, body: Mapping[str, Any], call: Invocation) -> None:
    if call.kind in ("script", "container"):
        workflowpod.run_pod(state, node, body, call.kind, call.ctx)
    elif call.kind == "resource":
        resource.run_resource(state, node, body, call.ctx)
    elif call.kind == "suspend":
        run_suspend(state, node, body, call.ctx)
    elif call.kind == "dag":
        dag.run_dag(state, node, body, call.scope, call.ctx)
    else:
        steps.run_steps(state, node, body, call.scope, call.ctx)


def run_suspend(state: RunState, node: NodeStatus, body: Mapping[str, Any], ctx: Ctx) -> None:
    """A suspend template (Argo's executeSuspend): resumed by ``--approve``, or after its duration.

    While its duration runs, ``dsx resume`` (:mod:`workflows.runner.resume`) resumes it, as ``argo
    resume`` does. With neither an approval nor a duration, the node ends Failed saying how to approve
    it: a local run does not wait without a bound.

    Raises:
        Stopped: the run stopped during the suspend's duration.
    """
    names = [n for n in (ctx.step_name, body.get("name")) if n]
    approved = next((n for n in names if n in state.options.approve), None)
    params = []
    for param in (body.get("outputs") or {}).get("parameters") or []:
        value_from = param.get("valueFrom") or {}
        if "default" in value_from:
            params.append({"name": param["name"], "value": str(value_from["default"])})
    if params:
        node.outputs["parameters"] = params
    if approved is not None:
        finish(state, node, Phase.Succeeded, f"resumed by --approve {approved}")
        return
    duration = (body.get("suspend") or {}).get("duration")
    if duration is not None:
        seconds = parse_duration(duration)
        set_message(state, node, f"suspended for {duration}")
        started = node.started_at if node.started_at is not None else time.time()
        ends = time.monotonic() + seconds
        while (left := ends - time.monotonic()) > 0:
            if state.stop.wait(min(left, _RESUME_POLL_S)):
                raise Stopped
            if (by := resumed_by(state.run_dir, names, started)) is not None:
                finish(state, node, Phase.Succeeded, f"resumed by dsx resume ({by})")
                return
        finish(state, node, Phase.Succeeded, "")
        return
    name = ctx.step_name or body.get("name")
    finish(
        state,
        node,
        Phase.Failed,
        f"suspended, waiting for approval: run again with --approve {name} to resume it",
    )
