"""The engine: Argo's semantics for one workflow, carried out on this machine.

One thread per running node. A DAG starts every task whose dependencies are done, as threads; a steps
template runs its groups in order, the steps of a group in parallel. Leaf templates (script, container,
resource) run through :mod:`workflows.runner.executor`; ``parallelism`` bounds them with semaphores.
Node names, IDs, pod names, messages and phases follow the Argo controller.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from workflows.runner.conditions import ConditionError, json_path, matches, parse_condition
from workflows.runner.depends import TaskResults, depends_logic, evaluate_depends, task_names
from workflows.runner.durations import humanize_duration, parse_duration
from workflows.runner.errors import NodeError
from workflows.runner.executor import Launcher, ProcessSpec, hera_entrypoint, wait_for
from workflows.runner.library import Library, TemplateScope, spec_of
from workflows.runner.model import NodeStatus, Phase, RunOptions, timestamp
from workflows.runner.templating import Unresolved, render, render_all
from workflows.runner.validate import LOCAL_PREFIXES, local_path, outside_message
from workflows.runner.when import WhenError, evaluate_when

__all__ = [
    "ARTIFACT_REPOSITORY_MESSAGE",
    "DEADLINE_MESSAGE",
    "DEPTH_MESSAGE",
    "MAX_DEPTH",
    "MAX_RESULT_BYTES",
    "STOPPED_MESSAGE",
    "Engine",
    "go_json",
    "go_quote",
    "node_id",
    "pod_name",
    "step_or_task_name",
    "transient",
]

MAX_DEPTH = 100
DEPTH_MESSAGE = (
    "Maximum recursion depth exceeded. See https://argo-workflows.readthedocs.io/en/latest/scaling/"
    "#maximum-recursion-depth"
)
DEADLINE_MESSAGE = "Pod was active on the node longer than the specified deadline"
STOPPED_MESSAGE = "Stopped with strategy 'Terminate'"
ARTIFACT_REPOSITORY_MESSAGE = (
    "artifact storage is not configured; see the docs for setup instructions: "
    "https://argo-workflows.readthedocs.io/en/latest/configure-artifact-repository/"
)
"""The executor's error for an output artifact when the cluster has no artifact repository."""
MAX_RESULT_BYTES = 256 * (1 << 10)
"""The executor keeps only the last 256 kB of a step's stdout as ``outputs.result``."""
WAIT_EXIT_CODE = 64
"""argoexec's exit code when the wait container ends with an error (its message is the first error)."""
VAR_RUN_ARGO = "/var/run/argo"
"""Where the emissary stages a step's output parameters and artifacts for the wait container."""
_NODE_TYPES = {
    "script": "Pod",
    "container": "Pod",
    "resource": "Pod",
    "dag": "DAG",
    "steps": "Steps",
    "suspend": "Suspend",
}
_KINDS = ("dag", "steps", "script", "container", "resource", "suspend")
_MEMBER_VAR = re.compile(r"(?P<prefix>tasks|steps)\.(?P<name>[-\w]+)\.(?P<field>.+)")
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


def _fnv32a(text: str) -> int:
    value = 0x811C9DC5
    for byte in text.encode():
        value ^= byte
        value = (value * 0x01000193) & 0xFFFFFFFF
    return value


def node_id(workflow: str, name: str) -> str:
    """Argo's node ID: the workflow name for the root, else ``<workflow>-<fnv32a(node name)>``."""
    return workflow if name == workflow else f"{workflow}-{_fnv32a(name)}"


def pod_name(workflow: str, name: str, template: str | None) -> str:
    """Argo's (v2) pod name: ``<workflow>-<template>-<fnv32a(node name)>``."""
    if name == workflow:
        return workflow
    prefix = f"{workflow}-{template}" if template else workflow
    return f"{prefix[:242]}-{_fnv32a(name)}"


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def go_json(value: Any) -> str:
    """``value`` as Go's ``json.Marshal`` writes it: compact, with ``<``, ``>``, ``&`` escaped."""
    text = _json(value)
    for char, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026")):
        text = text.replace(char, escaped)
    return text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


_GO_ESCAPES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v"}


def go_quote(text: str) -> str:
    """Go's ``strconv.Quote``: a double-quoted literal, ``"`` and ``\\`` escaped, unprintables as escapes."""
    out = ['"']
    for char in text:
        if char in ('"', "\\"):
            out.append("\\" + char)
        elif char in _GO_ESCAPES:
            out.append(_GO_ESCAPES[char])
        elif char.isprintable() or char == " ":
            out.append(char)
        elif ord(char) < 0x80:
            out.append(f"\\x{ord(char):02x}")
        elif ord(char) < 0x10000:
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(f"\\U{ord(char):08x}")
    out.append('"')
    return "".join(out)


def step_or_task_name(node_name: str) -> str:
    """Argo's getStepOrDAGTaskName: ``wf.fan(0:a)(1)`` -> ``fan``, ``wf[0].flip`` -> ``flip``."""
    name = node_name
    opener = ""
    for index in range(len(name) - 1, -1, -1):
        char = name[index]
        if opener and char == opener:
            opener = ""
        elif opener:
            continue
        elif char == ")":
            opener = "("
        elif char == "]":
            opener = "["
        else:
            name = name[: index + 1]
            break
    return name.rsplit(".", 1)[-1]


def script_result(stdout: bytes) -> str:
    """The executor's ``outputs.result``: stdout less one trailing newline, its last 256 kB only."""
    if stdout.endswith(b"\n"):
        stdout = stdout[:-1]
    if len(stdout) > MAX_RESULT_BYTES:
        stdout = stdout[-MAX_RESULT_BYTES:]
    return stdout.decode("utf-8", errors="replace")


def _no_constant(name: str) -> Any:
    raise ValueError(f"invalid character '{name[0]}' looking for beginning of value")


def _go_unmarshal(text: str) -> Any:
    """``text`` as JSON, refused where Go's ``json.Unmarshal`` refuses it (with its message)."""
    stripped = text.strip(" \t\r\n")
    if not stripped:
        raise NodeError("unexpected end of JSON input")
    if stripped[0] not in '{["-0123456789tfn':
        raise NodeError(f"invalid character {stripped[0]!r} looking for beginning of value")
    try:
        return json.loads(stripped, parse_constant=_no_constant)
    except ValueError as exc:
        raise NodeError(f"invalid JSON in a result: {exc}") from exc


def _sorted_keys(value: Any) -> Any:
    """Maps with their keys sorted, as Go marshals a map."""
    if isinstance(value, dict):
        return {k: _sorted_keys(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted_keys(v) for v in value]
    return value


def _item_text(value: Any) -> str:
    """How Argo writes an item (or an item field) into a template."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
    return _json(value)


def _item_label(value: Any) -> str:
    if isinstance(value, dict):
        return ",".join(sorted(f"{k}:{_item_text(v)}" for k, v in value.items()))
    return _item_text(value)


def _trim_newline(text: str) -> str:
    return text[:-1] if text.endswith("\n") else text


def _params_json(params: Iterable[Mapping[str, Any]]) -> str:
    """A parameter list as Argo marshals it (Go field order: name, default, value, enum, description).

    ``default``, ``value`` and ``description`` are pointers in Argo's types, so an empty string is kept
    (``omitempty`` drops only nil); ``enum`` is a slice, dropped when empty.
    """
    out = []
    for param in params:
        entry = {"name": param.get("name")}
        for key in ("default", "value", "enum", "description"):
            if param.get(key) is not None and param.get(key) != []:
                entry[key] = param[key]
        out.append(entry)
    return _json(out)


def _last_line(path: Path) -> str:
    """The last non-blank line of a log file, at most 500 characters ("" when there is none)."""
    try:
        lines = path.read_bytes().decode("utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    last = next((line.strip() for line in reversed(lines) if line.strip()), "")
    return last[:500]


class _Dropped(Exception):
    """A reference to an output of a skipped or omitted task that declares no default."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        super().__init__(f"failed to resolve {{{{{tag}}}}}")


class _Stopped(Exception):
    """The run is being stopped."""


@dataclass
class Ctx:
    """Where a template invocation sits: its boundary, parent, depth and how it is shown."""

    boundary_id: str | None
    parent_id: str | None
    depth: int
    display: str
    sort_key: tuple[Any, ...] = ()
    step_name: str | None = None
    local: dict[str, str] = field(default_factory=dict)
    deadline: float | None = None


@dataclass
class Member:
    """A task of a DAG or a step of a steps template, while its template runs."""

    name: str
    holder: dict[str, Any]
    order: int
    node: NodeStatus | None = None
    items: list[NodeStatus] | None = None
    started: bool = False
    done: bool = False


class Engine:
    """Runs one workflow; create one per run."""

    def __init__(
        self,
        library: Library,
        options: RunOptions,
        run_dir: Path,
        workflow_name: str,
        parameters: Mapping[str, str],
        cluster_spec: str | None,
    ) -> None:
        self.library = library
        self.options = options
        self.run_dir = run_dir
        self.workflow = workflow_name
        self.parameters = dict(parameters)
        self.cluster_spec = cluster_spec
        self.spec = spec_of(library.entry)
        self.lock = threading.RLock()
        self.nodes: dict[str, NodeStatus] = {}
        self.stop = threading.Event()
        self.created = time.time()
        self.uid = str(uuid.uuid4())
        parallelism = self.spec.get("parallelism")
        self.workflow_slots = threading.BoundedSemaphore(int(parallelism)) if parallelism else None
        self.boundary_slots: dict[str, threading.BoundedSemaphore] = {}
        self.boundary_templates: dict[str, tuple[str, str]] = {}
        self.approve = set(options.approve)
        self.folders: set[str] = set()
        self.globals = self._globals()
        self.launcher = Launcher(self._preload())
        if self.launcher.needed:
            threading.Thread(target=self.launcher.warm, name="dsx-warm", daemon=True).start()
        self._port: Any = None
        self.processes: set[Any] = set()
        self._port_lock = threading.Lock()
        roots = [os.getcwd(), str(Path(__file__).resolve().parents[2])]
        self.sys_path = list(dict.fromkeys(roots))

    # -- scope --------------------------------------------------------------------------------------

    def _globals(self) -> dict[str, str]:
        namespace = (
            self.options.namespace or (self.library.entry.get("metadata") or {}).get("namespace") or "default"
        )
        values = {
            "workflow.name": self.workflow,
            "workflow.namespace": str(namespace),
            "workflow.uid": self.uid,
            "workflow.mainEntrypoint": str(self.options.entrypoint or self.spec.get("entrypoint")),
            "workflow.serviceAccountName": str(self.spec.get("serviceAccountName") or "default"),
            "workflow.creationTimestamp": str(timestamp(self.created)),
            # Until the exit handler, Argo gives the workflow's phase while it runs; the exit handler
            # gets the final one (and workflow.failures, which nothing else may read).
            "workflow.status": "Running",
        }
        declared = (self.spec.get("arguments") or {}).get("parameters") or []
        listed = []
        for param in declared:
            name = str(param.get("name"))
            values[f"workflow.parameters.{name}"] = self.parameters.get(name, "")
            listed.append({**param, "value": self.parameters.get(name, "")})
        values["workflow.parameters"] = _params_json(listed)
        metadata = self.spec.get("workflowMetadata") or {}
        for key, value in (metadata.get("labels") or {}).items():
            values[f"workflow.labels.{key}"] = str(value)
        for key, value in (metadata.get("annotations") or {}).items():
            values[f"workflow.annotations.{key}"] = str(value)
        return values

    def global_lookup(self, tag: str) -> str | None:
        """A global variable (``workflow.*``), including ``workflow.creationTimestamp.<strftime letter>``."""
        if tag in self.globals:
            return self.globals[tag]
        if tag == "workflow.duration":  # seconds since the workflow started, at the time of asking
            return f"{time.time() - self.created:f}"
        if tag.startswith("workflow.creationTimestamp."):
            import datetime as dt

            letter = tag.rsplit(".", 1)[1]
            moment = dt.datetime.fromtimestamp(self.created, dt.UTC)
            if letter == "RFC3339":
                return moment.strftime("%Y-%m-%dT%H:%M:%SZ")
            if letter == "s":
                return str(int(self.created))
            if len(letter) == 1:
                return moment.strftime(f"%{letter}")
        return None

    def _preload(self) -> list[str]:
        """The step modules the run can reach, for the zygote to import once."""
        modules: list[str] = []
        start = str(self.options.entrypoint or self.spec.get("entrypoint"))
        for scope, name in self.library.reachable(start):
            script = scope.templates[name].get("script") or {}
            entry = hera_entrypoint(script.get("command") or [], script.get("args") or [])
            if entry and ":" in entry:
                modules.append(entry.split(":", 1)[0])
        return sorted(set(modules))

    # -- nodes --------------------------------------------------------------------------------------

    def notify(self, node: NodeStatus) -> None:
        if self.options.on_update is not None:
            with contextlib.suppress(Exception):
                self.options.on_update(node)

    def new_node(
        self,
        name: str,
        ctx: Ctx,
        node_type: str,
        phase: Phase,
        template: Mapping[str, Any] | None = None,
        holder: Mapping[str, Any] | None = None,
        message: str = "",
        display: str | None = None,
    ) -> NodeStatus:
        template_name = (template or {}).get("name")
        ref = dict((holder or {}).get("templateRef") or {}) or None
        if template_name is None and holder is not None:
            template_name = holder.get("template") or (ref or {}).get("template")
        now = time.time()
        node = NodeStatus(
            id=node_id(self.workflow, name),
            name=name,
            display_name=display if display is not None else ctx.display,
            type=node_type,
            phase=phase,
            template_name=template_name,
            template_ref={k: str(v) for k, v in ref.items()} if ref else None,
            boundary_id=ctx.boundary_id,
            parent_id=ctx.parent_id,
            message=message,
            started_at=now,
            finished_at=now if phase.fulfilled else None,
            sort_key=ctx.sort_key,
            step_name=ctx.step_name,
        )
        with self.lock:
            self.nodes[node.id] = node
            if ctx.parent_id is not None and ctx.parent_id in self.nodes:
                parent = self.nodes[ctx.parent_id]
                parent.children.append(node.id)
                parent.children.sort(
                    key=lambda child: self.nodes[child].sort_key if child in self.nodes else ()
                )
        self.notify(node)
        return node

    def finish(self, node: NodeStatus, phase: Phase, message: str | None = None) -> NodeStatus:
        with self.lock:
            node.phase = phase
            if message is not None:
                node.message = message
            if phase.fulfilled:
                node.finished_at = time.time()
        self.notify(node)
        return node

    def running(self, node: NodeStatus, message: str | None = None) -> None:
        with self.lock:
            node.phase = Phase.Running
            node.started_at = time.time()
            if message is not None:
                node.message = message
        self.notify(node)

    def error_node(
        self, name: str, ctx: Ctx, message: str, holder: Mapping[str, Any] | None = None
    ) -> NodeStatus:
        return self.new_node(name, ctx, "Skipped", Phase.Error, holder=holder, message=message)

    def folder(self, node: NodeStatus) -> Path:
        """The node's own folder in the run folder (``nodes/<name>``), created with ``artifacts/``."""
        short = node.name[len(self.workflow) :].lstrip(".") or "root"
        safe = re.sub(r"[^A-Za-z0-9._()\[\]:,=-]", "_", short)
        if len(safe) > 120:
            safe = f"{safe[:100]}-{_fnv32a(node.name)}"
        with self.lock:
            base = safe
            count = 1
            while safe in self.folders:
                count += 1
                safe = f"{base}-{count}"
            self.folders.add(safe)
        path = self.run_dir / "nodes" / safe
        (path / "artifacts").mkdir(parents=True, exist_ok=True)
        node.folder = str(path.relative_to(self.run_dir))
        return path

    @contextlib.contextmanager
    def slot(self, ctx: Ctx, pod: bool) -> Any:
        """Hold a place under the boundary's and (for pods) the workflow's ``parallelism``."""
        semaphores = []
        if ctx.boundary_id is not None and ctx.boundary_id in self.boundary_slots:
            semaphores.append(self.boundary_slots[ctx.boundary_id])
        if pod and self.workflow_slots is not None:
            semaphores.append(self.workflow_slots)
        held: list[threading.BoundedSemaphore] = []
        try:
            for semaphore in semaphores:
                while not semaphore.acquire(timeout=0.2):
                    if self.stop.is_set():
                        raise _Stopped
                held.append(semaphore)
            if self.stop.is_set():
                raise _Stopped
            yield
        finally:
            for semaphore in reversed(held):
                semaphore.release()

    # -- templates ----------------------------------------------------------------------------------

    def execute(
        self,
        name: str,
        holder: Mapping[str, Any],
        scope: TemplateScope,
        args: Mapping[str, str],
        ctx: Ctx,
    ) -> NodeStatus:
        """Invoke the template ``holder`` names as node ``name`` (Argo's executeTemplate)."""
        if ctx.depth >= MAX_DEPTH:
            return self.error_node(name, ctx, DEPTH_MESSAGE, holder)
        try:
            template, template_scope = self.library.resolve(holder, scope)
        except KeyError as exc:
            return self.error_node(name, ctx, str(exc.args[0]), holder)
        try:
            inputs = self.process_inputs(template, args)
        except NodeError as exc:
            return self.error_node(name, ctx, str(exc), holder)
        kind = next(k for k in _KINDS if k in template)
        local = dict(ctx.local)
        local["node.name"] = name
        for param in inputs:
            local[f"inputs.parameters.{param['name']}"] = str(param["value"])
        local["inputs.parameters"] = _params_json(inputs)
        retry = template.get("retryStrategy")
        if retry is None:
            if kind in ("script", "container", "resource"):
                local["pod.name"] = pod_name(self.workflow, name, template.get("name"))
            return self.execute_body(name, template, template_scope, holder, inputs, local, ctx, kind)
        return self.execute_retry(name, template, template_scope, holder, inputs, local, ctx, kind, retry)

    def process_inputs(self, template: Mapping[str, Any], args: Mapping[str, str]) -> list[dict[str, Any]]:
        inputs = []
        for param in (template.get("inputs") or {}).get("parameters") or []:
            name = str(param.get("name"))
            entry = {k: param[k] for k in ("name", "default", "enum", "description") if k in param}
            if name in args:
                value = args[name]
            elif "value" in param:
                value = param["value"]
            elif "default" in param:
                value = param["default"]
            else:
                raise NodeError(f"inputs.parameters.{name} was not supplied")
            entry["value"] = _item_text(value) if not isinstance(value, str) else value
            if "default" in entry and not isinstance(entry["default"], str):
                entry["default"] = _item_text(entry["default"])
            inputs.append(entry)
        return inputs

    def execute_retry(
        self,
        name: str,
        template: Mapping[str, Any],
        scope: TemplateScope,
        holder: Mapping[str, Any],
        inputs: list[dict[str, Any]],
        local: dict[str, str],
        ctx: Ctx,
        kind: str,
        retry: Mapping[str, Any],
    ) -> NodeStatus:
        node = self.new_node(name, ctx, "Retry", Phase.Running, template, holder)
        node.inputs = {"parameters": inputs} if inputs else {}
        limit = int(str(retry["limit"])) if retry.get("limit") is not None else None
        policy = str(retry.get("retryPolicy") or "OnFailure")
        backoff = retry.get("backoff") or {}
        first_start: float | None = None
        attempt = 0
        while True:
            child_name = f"{name}({attempt})"
            attempt_local = dict(local)
            attempt_local["retries"] = str(attempt)
            attempt_local["node.name"] = child_name
            if kind in ("script", "container", "resource"):
                attempt_local["pod.name"] = pod_name(self.workflow, child_name, template.get("name"))
            deadlines = [ctx.deadline] if ctx.deadline is not None else []
            if backoff.get("maxDuration") is not None and first_start is not None:
                remaining = first_start + parse_duration(backoff["maxDuration"]) - time.time()
                deadlines.append(time.monotonic() + remaining)
            child_ctx = replace(
                ctx,
                parent_id=node.id,
                display=f"{ctx.display}({attempt})",
                sort_key=(attempt,),
                deadline=min(deadlines) if deadlines else None,
            )
            child = self.execute_body(
                child_name, template, scope, holder, inputs, attempt_local, child_ctx, kind
            )
            if first_start is None:
                first_start = child.started_at or time.time()
            # Argo's processNodeRetries, in its order: success, stop, backoff (max duration, then the wait,
            # which only a numeric limit with retries left allows), the policy, then the limit.
            node.outputs = dict(child.outputs)
            if child.phase is Phase.Succeeded:
                return self.finish(node, Phase.Succeeded, "")
            if self.stop.is_set():
                return self.finish(node, child.phase, child.message)
            if backoff:
                finished = child.finished_at or time.time()
                max_at = None
                if backoff.get("maxDuration") is not None:
                    max_at = first_start + parse_duration(backoff["maxDuration"])
                    if time.time() > max_at:
                        return self.finish(node, child.phase, "Max duration limit exceeded")
                wait = parse_duration(backoff["duration"])
                factor = int(str(backoff.get("factor") or 0))
                if factor > 0:
                    wait *= factor**attempt
                if backoff.get("cap") is not None:
                    wait = min(wait, parse_duration(backoff["cap"]))
                if max_at is not None and finished + wait > max_at:
                    return self.finish(node, child.phase, "Backoff would exceed max duration limit")
                if time.time() < finished + wait and limit is not None and attempt + 1 <= limit:
                    with self.lock:
                        node.message = f"Backoff for {humanize_duration(wait)}"
                    self.notify(node)
                    if self.stop.wait(max(0.0, finished + wait - time.time())):
                        return self.finish(node, child.phase, child.message)
                    with self.lock:
                        node.message = ""
            retry_failed, retry_error = {
                "Always": (True, True),
                "OnFailure": (True, False),
                "OnError": (False, True),
                "OnTransientError": (transient(child.message),) * 2,
            }[policy]
            if (child.phase is Phase.Failed and not retry_failed) or (
                child.phase is Phase.Error and not retry_error
            ):
                return self.finish(node, child.phase, child.message)
            if limit is not None and attempt + 1 > limit:
                return self.finish(node, child.phase, "No more retries left")
            attempt += 1

    def execute_body(
        self,
        name: str,
        template: Mapping[str, Any],
        scope: TemplateScope,
        holder: Mapping[str, Any],
        inputs: list[dict[str, Any]],
        local: Mapping[str, str],
        ctx: Ctx,
        kind: str,
    ) -> NodeStatus:
        def lookup(tag: str) -> str | None:
            return local.get(tag) if tag in local else self.global_lookup(tag)

        def defer(tag: str) -> bool:
            return tag.startswith(("tasks.", "steps.")) or tag == "item" or tag.startswith("item.")

        try:
            body = render_all(dict(template), lookup, defer)
        except Unresolved as exc:
            return self.error_node(name, ctx, str(exc), holder)
        node_type = _NODE_TYPES[kind]
        node = self.new_node(name, ctx, node_type, Phase.Pending, template, holder)
        if kind in ("dag", "steps"):
            # The boundary of the steps it runs, as written (Argo marshals the stored template to JSON).
            text = json.dumps(template, ensure_ascii=False)
            with self.lock:
                self.boundary_templates[node.id] = ("tasks" if kind == "dag" else "steps", text)
        node.inputs = {"parameters": inputs} if inputs else {}
        if kind in ("script", "container", "resource"):
            node.pod_name = local.get("pod.name")
        try:
            with self.slot(ctx, pod=kind in ("script", "container", "resource")):
                self.running(node)
                if kind in ("script", "container"):
                    self.run_pod(node, body, kind, ctx)
                elif kind == "resource":
                    self.run_resource(node, body, ctx)
                elif kind == "suspend":
                    self.run_suspend(node, body, ctx)
                elif kind == "dag":
                    self.run_dag(node, body, scope, ctx)
                else:
                    self.run_steps(node, body, scope, ctx)
        except _Stopped:
            self.finish(node, Phase.Failed, STOPPED_MESSAGE)
        except NodeError as exc:
            self.finish(node, Phase.Error, str(exc))
        except Exception as exc:  # a runner bug must not leave the node running for ever
            self.finish(node, Phase.Error, f"local runner error: {type(exc).__name__}: {exc}")
        return node

    # -- leaves -------------------------------------------------------------------------------------

    def _local(self, text: str, artifacts: Path) -> str:
        for prefix in LOCAL_PREFIXES:
            text = text.replace(prefix, str(artifacts))
        return text

    def _deadline(self, body: Mapping[str, Any], ctx: Ctx) -> tuple[float | None, float | None]:
        limits = [
            parse_duration(body[f]) for f in ("timeout", "activeDeadlineSeconds") if body.get(f) is not None
        ]
        limit = min(limits) if limits else None
        deadline = time.monotonic() + limit if limit is not None else None
        if ctx.deadline is not None:
            deadline = ctx.deadline if deadline is None else min(deadline, ctx.deadline)
        return deadline, limit

    def step_env(self, body: Mapping[str, Any], artifacts: Path) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.options.env)
        for item in body.get("env") or []:
            env[str(item.get("name"))] = self._local(str(item.get("value", "")), artifacts)
        env["DSX_OUTPUT_DIR"] = str(artifacts)
        env["hera__outputs_directory"] = str(artifacts)
        if self.cluster_spec is not None:
            env["DSX_CLUSTER"] = self.cluster_spec
        if self.options.kubeconfig:
            env["KUBECONFIG"] = self.options.kubeconfig
        if self.options.context:
            env["DSX_KUBE_CONTEXT"] = self.options.context
        env["PYTHONPATH"] = os.pathsep.join([*self.sys_path, *filter(None, [env.get("PYTHONPATH")])])
        return env

    def run_pod(self, node: NodeStatus, body: Mapping[str, Any], kind: str, ctx: Ctx) -> None:
        folder = self.folder(node)
        artifacts = folder / "artifacts"
        spec_body = body[kind]
        command = [str(c) for c in spec_body.get("command") or []]
        args = [str(a) for a in spec_body.get("args") or []]
        entry = hera_entrypoint(command, args) if kind == "script" else None
        script: Path | None = None
        if kind == "script":
            script = folder / "script"
            source = str(spec_body.get("source", ""))
            script.write_text(source if entry else self._local(source, artifacts))
        argv = [self._local(c, artifacts) for c in command] + [self._local(a, artifacts) for a in args]
        if argv and argv[0] in ("python", "python3"):
            argv[0] = self.options.python
        if script is not None:
            argv.append(str(script))
        process_spec = ProcessSpec(
            argv=argv,
            env=self.step_env(spec_body, artifacts),
            cwd=os.getcwd(),
            stdout=folder / "stdout.log",
            stderr=folder / "stderr.log",
            hera_entry=entry,
            script=script,
            sys_path=self.sys_path,
        )
        for log in (process_spec.stdout, process_spec.stderr):
            log.touch()
        try:
            process = self.launcher.start(process_spec)
        except OSError as exc:
            self.finish(node, Phase.Error, f"failed to start {argv[0]!r}: {exc}")
            return
        deadline, _ = self._deadline(body, ctx)
        with self.lock:
            self.processes.add(process)
        try:
            code, why = wait_for(process, deadline, self.stop)
        finally:
            with self.lock:
                self.processes.discard(process)
            process.close()
        outputs: dict[str, Any] = {}
        if self.include_script_output(node.name, ctx.boundary_id):
            outputs["result"] = script_result((folder / "stdout.log").read_bytes())
        if code is not None:
            outputs["exitCode"] = str(code)
        node.outputs = outputs
        if why == "stop":
            self.finish(node, Phase.Failed, STOPPED_MESSAGE)
            return
        if why == "deadline":
            self.finish(node, Phase.Failed, DEADLINE_MESSAGE)
            return
        try:
            wait_error = self.save_outputs(node, body, artifacts)
        except NodeError:
            if code == 0:
                raise  # an output path that leaves the step's folder: the node ends Error, naming it
            wait_error = None
        if code != 0:
            # The main container's failure outranks the wait container's (Argo's inferFailedReason).
            message = f"main: Error (exit code {code})"
            container = body.get("script") or body.get("container") or {}
            if container.get("terminationMessagePolicy") == "FallbackToLogsOnError":
                # Kubernetes then takes the container's termination message from the end of its log, and
                # Argo appends it to the node's message; the last line carries the step's error.
                tail = _last_line(folder / "stderr.log") or _last_line(folder / "stdout.log")
                if tail:
                    message = f"{message}: {tail}"
            self.finish(node, Phase.Failed, message)
        elif wait_error is not None:
            self.finish(node, Phase.Error, f"wait: Error (exit code {WAIT_EXIT_CODE}): {wait_error}")
        else:
            self.finish(node, Phase.Succeeded, "")

    def save_outputs(self, node: NodeStatus, body: Mapping[str, Any], artifacts: Path) -> str | None:
        """What Argo's wait container does once main has exited: save output parameters, then artifacts.

        Returns the first error, which becomes the wait container's termination message (its node then
        ends Error, unless main failed first). Files missing from the step's folder read as Argo's
        emissary reports them, under ``/var/run/argo/outputs``; artifacts need a repository.

        Raises:
            NodeError: an output path that leads out of the step's folder (``..``, or a link that
                points elsewhere): in a pod it would read the container's own file, here the host's.
        """
        outputs = body.get("outputs") or {}
        errors: list[str] = []
        params = []
        for param in outputs.get("parameters") or []:
            value_from = param.get("valueFrom") or {}
            if "path" not in value_from:
                if "default" in value_from:
                    params.append({"name": param["name"], "value": str(value_from["default"])})
                continue
            pod_path = str(value_from["path"])
            path = self.inside(node, artifacts, pod_path, f"parameter '{param.get('name')}'")
            if path.is_file():
                value = path.read_bytes().decode("utf-8", errors="replace")
            elif "default" in value_from:
                value = str(value_from["default"])
            else:
                errors.append(f"open {VAR_RUN_ARGO}/outputs/parameters{pod_path}: no such file or directory")
                break  # SaveParameters returns at its first error
            params.append({"name": param["name"], "value": _trim_newline(value)})
        kept = []
        failures = []
        for artifact in outputs.get("artifacts") or []:
            pod_path = str(artifact.get("path", ""))
            path = self.inside(node, artifacts, pod_path, f"artifact '{artifact.get('name')}'")
            if not path.exists():
                if not artifact.get("optional"):
                    staged = f"{VAR_RUN_ARGO}/outputs/artifacts{pod_path.rstrip('/')}.tgz"
                    failures.append(f"open {staged}: no such file or directory")
            elif self.options.artifact_repository == "none":
                failures.append(ARTIFACT_REPOSITORY_MESSAGE)
            else:
                kept.append({"name": artifact["name"], "path": str(path.relative_to(self.run_dir))})
        if failures:
            errors.append("".join(f"{failure}; " for failure in failures))
        if params:
            node.outputs["parameters"] = params
        if kept:
            node.outputs["artifacts"] = kept
        return errors[0] if errors else None

    def inside(self, node: NodeStatus, artifacts: Path, pod_path: str, what: str) -> Path:
        """Where an output path of the pod lies in the step's folder; NodeError when it leads out."""
        where = f"template '{node.template_name}', output {what}"
        relative = local_path(pod_path)
        if relative is None:
            kind = "artifacts" if what.startswith("artifact") else "files"
            raise NodeError(f"{where}: {outside_message(pod_path, kind)}; refused")
        path = artifacts / relative
        base = artifacts.resolve()
        target = path.resolve()  # follows links, as reading the file would
        if target != base and not target.is_relative_to(base):
            raise NodeError(
                f"{where}: output path {pod_path!r} is a link that leads out of the step's folder; refused"
            )
        return path

    def include_script_output(self, node_name: str, boundary_id: str | None) -> bool:
        """Argo's includeScriptOutput: keep stdout as ``outputs.result`` only if the step's DAG or steps
        template (its boundary) mentions ``tasks.<name>.outputs.result`` / ``steps.<name>...``.

        A step outside any DAG or steps template (the entrypoint itself, the workflow's exit handler)
        never keeps its result; nor does a step whose result only another template would read.
        """
        if boundary_id is None:
            return False
        boundary = self.boundary_templates.get(boundary_id)
        if boundary is None:
            return False
        prefix, text = boundary
        name = step_or_task_name(node_name)
        try:
            return bool(
                re.search(rf"{prefix}\.{name}\.outputs\.result", text)
                or re.search(rf"{prefix}\[['\"]{name}['\"]\]\.outputs.result", text)
            )
        except re.error:
            return False

    def cluster_port(self) -> Any:
        with self._port_lock:
            if self._port is None:
                try:
                    from steps.cluster import connect
                except ImportError as exc:
                    raise NodeError(f"needs a cluster: the cluster adapter is not available ({exc})") from exc
                spec = self.cluster_spec
                kube = spec in (None, "", "kube")
                try:
                    self._port = connect(
                        spec,
                        self.options.kubeconfig if kube else None,
                        self.options.context if kube else None,
                    )
                except Exception as exc:
                    raise NodeError(f"needs a cluster: {exc} (pass --cluster, e.g. --cluster sim:)") from exc
            return self._port

    def run_resource(self, node: NodeStatus, body: Mapping[str, Any], ctx: Ctx) -> None:
        import yaml

        folder = self.folder(node)
        resource = body["resource"]
        deadline, _ = self._deadline(body, ctx)
        log = (folder / "stdout.log").open("w")
        (folder / "stderr.log").write_text("")
        try:
            manifest = yaml.safe_load(str(resource.get("manifest", "")))
            (folder / "manifest.yaml").write_text(str(resource.get("manifest", "")))
            if not isinstance(manifest, dict) or not manifest.get("kind") or not manifest.get("apiVersion"):
                raise NodeError("the resource manifest needs apiVersion, kind and metadata.name")
            metadata = manifest.get("metadata") or {}
            api_version, kind = str(manifest["apiVersion"]), str(manifest["kind"])
            name, namespace = metadata.get("name"), metadata.get("namespace")
            action = resource["action"]
            port = self.cluster_port()
            target = f"{kind}/{name}"
            try:
                if action == "get":
                    obj = port.get_object(api_version, kind, str(name), namespace)
                    if obj is None:
                        raise NodeError(f"{target} not found")
                elif action == "create":
                    obj = port.create_object(manifest)
                elif action == "apply":
                    existing = port.get_object(api_version, kind, str(name), namespace)
                    obj = (
                        port.create_object(manifest)
                        if existing is None
                        else port.patch_object(api_version, kind, str(name), manifest, namespace)
                    )
                elif action == "patch":
                    patch = {k: v for k, v in manifest.items() if k not in ("apiVersion", "kind")}
                    obj = port.patch_object(api_version, kind, str(name), patch, namespace)
                else:
                    gone = port.delete_object(api_version, kind, str(name), namespace)
                    obj = None
                    log.write(f"{target} {'deleted' if gone else 'was already gone'}\n")
            except NodeError:
                raise
            except Exception as exc:
                log.write(f"{action} {target}: {exc}\n")
                self.finish(node, Phase.Failed, f"{action} {target}: {exc}")
                return
            if obj is not None:
                done = {"get": "read", "create": "created", "apply": "applied", "patch": "patched"}[action]
                log.write(f"{target} {done}\n")
                resolved = obj.get("metadata", {}).get("name", name)
                name = resolved
            success = (
                parse_condition(str(resource["successCondition"])) if resource.get("successCondition") else []
            )
            failure = (
                parse_condition(str(resource["failureCondition"])) if resource.get("failureCondition") else []
            )
            while obj is not None and (success or failure):
                for requirement in failure:
                    if requirement.holds(obj):
                        message = f"failure condition '{requirement.text}' evaluated true"
                        log.write(message + "\n")
                        self.finish(node, Phase.Failed, message)
                        return
                if not success or matches(obj, success):
                    log.write(f"{len(success)}/{len(success)} success conditions matched\n")
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    self.finish(node, Phase.Failed, DEADLINE_MESSAGE)
                    return
                if self.stop.wait(self.options.poll_interval):
                    raise _Stopped
                try:
                    obj = port.get_object(api_version, kind, str(name), namespace)
                except Exception as exc:
                    self.finish(node, Phase.Failed, f"get {target}: {exc}")
                    return
                if obj is None:
                    self.finish(node, Phase.Failed, f"{target} disappeared while waiting for its conditions")
                    return
            params = []
            for param in (body.get("outputs") or {}).get("parameters") or []:
                value_from = param.get("valueFrom") or {}
                try:
                    if "jsonPath" not in value_from or obj is None:
                        raise ConditionError("no object")
                    params.append(
                        {"name": param["name"], "value": json_path(obj, str(value_from["jsonPath"]))}
                    )
                except ConditionError as exc:
                    if "default" in value_from:
                        params.append({"name": param["name"], "value": str(value_from["default"])})
                    else:
                        raise NodeError(f"failed to save outputs: {exc}") from exc
            if params:
                node.outputs["parameters"] = params
            self.finish(node, Phase.Succeeded, "")
        finally:
            log.close()

    def run_suspend(self, node: NodeStatus, body: Mapping[str, Any], ctx: Ctx) -> None:
        names = [n for n in (ctx.step_name, body.get("name")) if n]
        approved = next((n for n in names if n in self.approve), None)
        params = []
        for param in (body.get("outputs") or {}).get("parameters") or []:
            value_from = param.get("valueFrom") or {}
            if "default" in value_from:
                params.append({"name": param["name"], "value": str(value_from["default"])})
        if params:
            node.outputs["parameters"] = params
        if approved is not None:
            self.finish(node, Phase.Succeeded, f"resumed by --approve {approved}")
            return
        duration = (body.get("suspend") or {}).get("duration")
        if duration is not None:
            seconds = parse_duration(duration)
            with self.lock:
                node.message = f"suspended for {duration}"
            self.notify(node)
            if self.stop.wait(seconds):
                raise _Stopped
            self.finish(node, Phase.Succeeded, "")
            return
        name = ctx.step_name or body.get("name")
        self.finish(
            node,
            Phase.Failed,
            f"suspended, waiting for approval: run again with --approve {name} to resume it",
        )

    # -- dag and steps ------------------------------------------------------------------------------

    def member_lookup(
        self,
        prefix: str,
        members: Mapping[str, Member],
        scope: TemplateScope,
        allowed: set[str] | None,
    ) -> Callable[[str], str | None]:
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
            return self.member_value(tag, member, field_name, scope)

        return lookup

    def member_value(self, tag: str, member: Member, field_name: str, scope: TemplateScope) -> str | None:
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
            return self.aggregate(member.items, field_name)
        assert node is not None
        if node.phase in (Phase.Skipped, Phase.Omitted):
            if field_name.startswith("outputs.parameters."):
                default = self.output_default(member.holder, scope, field_name[len("outputs.parameters.") :])
                if default is not None:
                    return default
            raise _Dropped(tag)
        if field_name == "outputs.result":
            return node.outputs.get("result")
        if field_name.startswith("outputs.parameters."):
            wanted = field_name[len("outputs.parameters.") :]
            for param in node.outputs.get("parameters") or []:
                if param.get("name") == wanted:
                    return str(param.get("value"))
        return None

    def aggregate(self, items: list[NodeStatus], field_name: str) -> str | None:
        """A fan-out's outputs as Argo's processAggregateNodeOutputs gathers them (succeeded items only).

        Raises:
            NodeError: an item kept a result that is not JSON; Argo then errors whatever needs the
                fan-out's outputs.
        """
        succeeded = [n for n in sorted(items, key=lambda n: n.sort_key) if n.phase is Phase.Succeeded]
        if field_name == "outputs.result":
            values = [_go_unmarshal(n.outputs["result"]) for n in succeeded if "result" in n.outputs]
            return go_json(values)
        if field_name == "outputs.parameters":
            listed = [
                {p["name"]: str(p["value"]) for p in n.outputs.get("parameters") or []}
                for n in succeeded
                if n.outputs.get("parameters")
            ]
            return go_json(_sorted_keys(listed))
        if field_name.startswith("outputs.parameters."):
            wanted = field_name[len("outputs.parameters.") :]
            found = [
                str(param["value"])
                for node in succeeded
                for param in node.outputs.get("parameters") or []
                if param.get("name") == wanted
            ]
            # Argo's aggregatedJSONValueList: parsed only if every value is a JSON list or object
            parsed: list[Any] = []
            for value in found:
                try:
                    item = json.loads(value, parse_constant=_no_constant)
                except ValueError:
                    break
                if not isinstance(item, list | dict):
                    break
                parsed.append(item)
            else:
                return go_json(_sorted_keys(parsed))
            return go_json(found)
        return None

    def aggregate_error(self, members: Mapping[str, Member], names: Iterable[str]) -> str | None:
        """Why Argo could not build the scope of a task whose ancestors include these fan-outs."""
        for name in sorted(names):
            member = members.get(name)
            if member is None or member.items is None:
                continue
            try:
                self.aggregate(member.items, "outputs.result")
            except NodeError as exc:
                return str(exc)
        return None

    def output_default(self, holder: Mapping[str, Any], scope: TemplateScope, name: str) -> str | None:
        try:
            template, _ = self.library.resolve(holder, scope)
        except KeyError:
            return None
        for param in (template.get("outputs") or {}).get("parameters") or []:
            value_from = param.get("valueFrom") or {}
            if param.get("name") == name and "default" in value_from:
                return str(value_from["default"])
        return None

    def render_member(
        self, holder: Mapping[str, Any], lookup: Callable[[str], str | None]
    ) -> tuple[dict[str, Any], dict[str, str]]:
        """The task or step with its references resolved, and its arguments (dropped ones left out)."""

        def defer(tag: str) -> bool:
            return tag == "item" or tag.startswith("item.")

        def skip(path: tuple[str | int, ...]) -> bool:
            return path == ("arguments",)

        rendered = render_all(dict(holder), lookup, defer, skip)
        args: dict[str, str] = {}
        kept = []
        for param in (holder.get("arguments") or {}).get("parameters") or []:
            try:
                value = render(_item_text(param.get("value", "")), lookup, defer)
            except _Dropped:
                continue
            args[str(param["name"])] = value
            kept.append({"name": param["name"], "value": value})
        rendered["arguments"] = {"parameters": kept}
        return rendered, args

    def expand(self, holder: Mapping[str, Any]) -> list[tuple[str, dict[str, str]]] | None:
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
            scope = {"item": _item_text(item)}
            if isinstance(item, dict):
                for key, value in item.items():
                    scope[f"item.{key}"] = _item_text(value)
            expanded.append((_item_label(item), scope))
        return expanded

    def run_member(
        self,
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
        """Run one task or step: resolve references, expand items, check ``when``, run, then ``onExit``."""
        member_ctx = Ctx(
            boundary_id=parent.id,
            parent_id=ctx.parent_id,
            depth=ctx.depth + 1,
            display=member.name,
            sort_key=(member.order,),
            step_name=member.name,
            local={f"{prefix}.name": member.name},
        )
        lookup = self.member_lookup(prefix, members, scope, allowed)
        if prefix == "tasks":  # Argo gathers the outputs of every fan-out among a task's ancestors
            failure = self.aggregate_error(members, allowed or ())
            if failure is not None:
                member.node = self.error_node(name, member_ctx, failure, member.holder)
                return
        try:
            holder, args = self.render_member(member.holder, lookup)
            items = self.expand(holder)
        except (Unresolved, _Dropped, NodeError) as exc:
            member.node = self.error_node(name, member_ctx, str(exc), member.holder)
            return
        if items is None:
            node = self.when_skip(name, holder, member_ctx)
            if node is None:
                node = self.execute(name, holder, scope, args, member_ctx)
            member.node = node
        elif not items:
            member.node = self.new_node(
                name, member_ctx, "Skipped", Phase.Skipped, holder=holder, message="Skipped, empty params"
            )
        else:
            group = item_parent()
            member.items = []
            threads = []
            results: list[NodeStatus | None] = [None] * len(items)

            def run_item(index: int, label: str, item_scope: dict[str, str]) -> None:
                item_name = f"{name}({index}:{label})"
                item_ctx = replace(
                    member_ctx,
                    display=f"{member.name}({index}:{label})",
                    parent_id=group.id if group is not None else member_ctx.parent_id,
                    sort_key=(member.order, index) if group is None else (index,),
                )
                try:
                    item_holder = render_all(
                        {k: v for k, v in holder.items() if k not in ("withItems", "withParam")}, item_scope
                    )
                    item_args = {
                        str(p["name"]): str(p["value"])
                        for p in (item_holder.get("arguments") or {}).get("parameters") or []
                    }
                except Unresolved as exc:
                    results[index] = self.error_node(item_name, item_ctx, str(exc), holder)
                    return
                node = self.when_skip(item_name, item_holder, item_ctx)
                results[index] = (
                    node
                    if node is not None
                    else self.execute(item_name, item_holder, scope, item_args, item_ctx)
                )

            for index, (label, item_scope) in enumerate(items):
                thread = threading.Thread(target=run_item, args=(index, label, item_scope), daemon=True)
                thread.start()
                threads.append(thread)
            for thread in threads:
                thread.join()
            member.items = [n for n in results if n is not None]
            if group is not None:
                failed = [n.phase for n in member.items if n.phase.failed_or_error]
                self.finish(group, failed[-1] if failed else Phase.Succeeded)
                member.node = group
        top = member.node
        exit_template = member.holder.get("onExit")
        if exit_template and top is not None and top.phase in (Phase.Succeeded, Phase.Failed, Phase.Error):
            exit_ctx = replace(
                member_ctx,
                parent_id=top.id,
                display=f"{member.name}.onExit",
                sort_key=(10**9,),
                step_name=None,
            )
            self.execute(f"{name}.onExit", {"template": exit_template}, scope, self.parameters, exit_ctx)

    def when_skip(self, name: str, holder: Mapping[str, Any], ctx: Ctx) -> NodeStatus | None:
        when = holder.get("when")
        if when is None or str(when).strip() == "":
            return None
        try:
            proceed = evaluate_when(str(when))
        except WhenError as exc:
            return self.error_node(name, ctx, str(exc), holder)
        if proceed:
            return None
        return self.new_node(
            name, ctx, "Skipped", Phase.Skipped, holder=holder, message=f"when '{when}' evaluated false"
        )

    def run_dag(self, node: NodeStatus, body: Mapping[str, Any], scope: TemplateScope, ctx: Ctx) -> None:
        dag = body["dag"]
        tasks = [t for t in dag.get("tasks") or []]
        if body.get("parallelism"):
            self.boundary_slots[node.id] = threading.BoundedSemaphore(int(body["parallelism"]))
        continue_on = {str(t["name"]): t.get("continueOn") or {} for t in tasks}
        logic = {str(t["name"]): depends_logic(t, continue_on) for t in tasks}
        deps = {name: task_names(text) for name, text in logic.items()}
        ancestors: dict[str, set[str]] = {}
        for name in logic:
            seen: set[str] = set()
            stack = list(deps[name])
            while stack:
                current = stack.pop()
                if current not in seen:
                    seen.add(current)
                    stack.extend(deps.get(current, []))
            ancestors[name] = seen
        if dag.get("target"):
            targets = sorted(str(dag["target"]).split())
        else:
            depended = {d for name in deps for d in deps[name]}
            targets = sorted(name for name in deps if name not in depended)
        needed = set(targets).union(*(ancestors[t] for t in targets)) if targets else set()
        members = {str(t["name"]): Member(str(t["name"]), dict(t), order) for order, t in enumerate(tasks)}
        condition = threading.Condition()
        threads: list[threading.Thread] = []
        child_ctx = replace(ctx, boundary_id=node.id, parent_id=node.id)

        def task_thread(member: Member) -> None:
            name = f"{node.name}.{member.name}"

            def group() -> NodeStatus:
                return self.new_node(
                    name,
                    replace(child_ctx, display=member.name, sort_key=(member.order,), step_name=member.name),
                    "TaskGroup",
                    Phase.Running,
                    holder=member.holder,
                )

            try:
                self.run_member(
                    "tasks", node, member, members, ancestors[member.name], scope, child_ctx, name, group
                )
            finally:
                with condition:
                    member.done = True
                    condition.notify_all()

        with condition:
            while True:
                started_any = False
                for member in members.values():
                    if member.name not in needed or member.started or self.stop.is_set():
                        continue
                    if not all(members[d].done for d in deps[member.name]):
                        continue
                    member.started = True
                    started_any = True
                    member_ctx = replace(
                        child_ctx,
                        display=member.name,
                        sort_key=(member.order,),
                        step_name=member.name,
                        depth=ctx.depth + 1,
                    )
                    name = f"{node.name}.{member.name}"
                    results = {d: self.task_results(members[d]) for d in deps[member.name]}
                    try:
                        execute = evaluate_depends(logic[member.name], results)
                    except ValueError as exc:
                        member.node = self.error_node(name, member_ctx, str(exc), member.holder)
                        member.done = True
                        continue
                    if not execute:
                        member.node = self.new_node(
                            name,
                            member_ctx,
                            "Skipped",
                            Phase.Omitted,
                            holder=member.holder,
                            message="omitted: depends condition not met",
                        )
                        member.done = True
                        continue
                    thread = threading.Thread(target=task_thread, args=(member,), daemon=True)
                    thread.start()
                    threads.append(thread)
                if started_any:
                    continue
                busy = [m for m in members.values() if m.started and not m.done]
                if not busy:
                    break
                condition.wait()
        for thread in threads:
            thread.join()
        phase, culprit = self.assess_dag(targets, members, deps, continue_on)
        if phase is Phase.Succeeded:
            failure = self.aggregate_error(members, members)  # Argo gathers every fan-out's outputs
            if failure is not None:
                self.finish(node, Phase.Error, failure)
                return
            lookup = self.member_lookup("tasks", members, scope, None)
            node.outputs = self.template_outputs(body, lookup)
            self.finish(node, Phase.Succeeded, "")
        else:
            self.finish(node, phase, f"child '{culprit}' failed" if culprit else STOPPED_MESSAGE)

    def task_results(self, member: Member) -> TaskResults:
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
        self,
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
                    culprit = next(
                        (n.id for n in members[name].items or [] if n.phase.failed_or_error), node.id
                    )
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
            if not phase.failed_or_error:
                continue
            flags = continue_on.get(target) or {}
            if (phase is Phase.Failed and flags.get("failed")) or (
                phase is Phase.Error and flags.get("error")
            ):
                continue
            return phase, culprit
        return Phase.Succeeded, None

    def template_outputs(
        self, body: Mapping[str, Any], lookup: Callable[[str], str | None]
    ) -> dict[str, Any]:
        params = []
        for param in (body.get("outputs") or {}).get("parameters") or []:
            value_from = param.get("valueFrom") or {}
            if "parameter" in value_from:
                try:
                    value = render(str(value_from["parameter"]), lookup)
                except (Unresolved, _Dropped) as exc:
                    if "default" not in value_from:
                        raise NodeError(f"Unable to resolve outputs from scope: {exc}") from exc
                    value = str(value_from["default"])
            elif "default" in value_from:
                value = str(value_from["default"])
            else:
                continue
            params.append({"name": param["name"], "value": value})
        return {"parameters": params} if params else {}

    def run_steps(self, node: NodeStatus, body: Mapping[str, Any], scope: TemplateScope, ctx: Ctx) -> None:
        if body.get("parallelism"):
            self.boundary_slots[node.id] = threading.BoundedSemaphore(int(body["parallelism"]))
        members: dict[str, Member] = {}
        for group_index, group in enumerate(body.get("steps") or []):
            if self.stop.is_set():
                raise _Stopped
            group_name = f"{node.name}[{group_index}]"
            group_ctx = replace(
                ctx,
                boundary_id=node.id,
                parent_id=node.id,
                display=f"[{group_index}]",
                sort_key=(group_index,),
                step_name=None,
            )
            group_node = self.new_node(group_name, group_ctx, "StepGroup", Phase.Running)
            allowed = set(members)
            step_ctx = replace(ctx, boundary_id=node.id, parent_id=group_node.id)
            threads = []
            current = []
            for index, step in enumerate(group or []):
                member = Member(str(step["name"]), dict(step), index)
                members[member.name] = member
                current.append(member)
                thread = threading.Thread(
                    target=self.run_member,
                    args=(
                        "steps",
                        node,
                        member,
                        members,
                        allowed,
                        scope,
                        step_ctx,
                        f"{group_name}.{member.name}",
                        lambda: None,
                    ),
                    daemon=True,
                )
                thread.start()
                threads.append(thread)
            for thread in threads:
                thread.join()
            message = None
            for member in current:
                flags = member.holder.get("continueOn") or {}
                candidates = member.items if member.items is not None else [member.node]
                for child in candidates:
                    if child is None or not child.phase.failed_or_error:
                        continue
                    if (child.phase is Phase.Failed and flags.get("failed")) or (
                        child.phase is Phase.Error and flags.get("error")
                    ):
                        continue
                    message = message or f"child '{child.id}' failed"
            if message is not None:
                self.finish(group_node, Phase.Failed, message)
                self.finish(node, Phase.Failed, message)
                return
            self.finish(group_node, Phase.Succeeded)
            failure = self.aggregate_error(members, [m.name for m in current])
            if failure is not None:
                self.finish(node, Phase.Error, failure)
                return
        lookup = self.member_lookup("steps", members, scope, None)
        node.outputs = self.template_outputs(body, lookup)
        self.finish(node, Phase.Succeeded, "")

    # -- the workflow -------------------------------------------------------------------------------

    def kill_all(self) -> None:
        """Kill every step process still running (the run is over or being abandoned)."""
        with self.lock:
            running = list(self.processes)
        for process in running:
            process.kill()

    def artifact_repository_error(self) -> str | None:
        """Why the workflow cannot start for want of an artifact repository (None when it can).

        Argo resolves ``spec.artifactRepositoryRef`` before anything runs; on a cluster without the
        ConfigMap it names (``--artifact-repository none``), the workflow ends Error with no nodes.
        """
        ref = self.spec.get("artifactRepositoryRef")
        if ref is None or self.options.artifact_repository != "none":
            return None
        named = f"{(ref or {}).get('configMap', '')}#{(ref or {}).get('key', '')}"
        return (
            "failed to resolve artifact repository: failed to find any artifact repository for "
            f'artifact repository ref "{named}"'
        )

    def run(self, entrypoint: str) -> tuple[NodeStatus, NodeStatus | None]:
        """Run the entrypoint, then the workflow's ``onExit``; returns the root and exit handler nodes."""
        root_ctx = Ctx(boundary_id=None, parent_id=None, depth=1, display=self.workflow)
        root = self.execute(
            self.workflow, {"template": entrypoint}, self.library.entry_scope, self.parameters, root_ctx
        )
        on_exit = self.spec.get("onExit")
        exit_node = None
        if on_exit and not self.stop.is_set():
            status = {Phase.Failed: "Failed", Phase.Error: "Error"}.get(root.phase, "Succeeded")
            failures = []
            with self.lock:
                nodes = list(self.nodes.values())
            for failed in sorted(nodes, key=lambda n: (n.finished_at or 0, n.name)):
                if failed.phase.failed_or_error:
                    failures.append(
                        {
                            "displayName": failed.display_name,
                            "message": failed.message,
                            "templateName": failed.template_name or "",
                            "phase": str(failed.phase),
                            "podName": pod_name(self.workflow, failed.name, failed.template_name),
                            "finishedAt": timestamp(failed.finished_at),
                        }
                    )
            self.globals["workflow.status"] = status
            # Argo marshals the list (null when empty) and then Go-quotes it, so the value a step gets
            # is a JSON string holding the JSON list: `"[{\"displayName\":...}]"`.
            self.globals["workflow.failures"] = go_quote(go_json(failures or None))
            exit_ctx = Ctx(
                boundary_id=None, parent_id=None, depth=1, display=f"{self.workflow}.onExit", sort_key=(1,)
            )
            exit_node = self.execute(
                f"{self.workflow}.onExit",
                {"template": on_exit},
                self.library.entry_scope,
                self.parameters,
                exit_ctx,
            )
        return root, exit_node
