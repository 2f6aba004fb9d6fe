"""Script and container templates: the pod, played by a process of this machine in the node's folder.

Mirrors ``workflow/controller/workflowpod.go`` (what the pod gets: command, args, the script as a file,
env, the deadline) with the two containers' parts that decide the node's outcome: the main container's
exit code and termination message (``inferFailedReason`` in ``operator.go``), and the wait container's
saving of output parameters and artifacts (``SaveParameters``, ``SaveArtifacts`` in
``workflow/executor/executor.go``), whose first error ends the node Error. ``/tmp/dsx-out`` in the pod
is the node's ``artifacts/`` folder here, and no output path may lead out of it.
"""

from __future__ import annotations

import os
import re
import socket
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from steps.cluster import vocabulary as vocab
from steps.durations import parse_duration
from workflows.runner.errors import NodeError
from workflows.runner.executor import ProcessSpec, RunningProcess, hera_entrypoint, wait_for
from workflows.runner.model import NodeStatus, Phase
from workflows.runner.names import step_or_task_name
from workflows.runner.nodes import finish, folder
from workflows.runner.paths import LOCAL_PREFIXES, local_path, outside_message
from workflows.runner.state import Ctx, RunState
from workflows.runner.values import script_result, trim_newline

__all__ = [
    "ARTIFACT_REPOSITORY_MESSAGE",
    "DEADLINE_MESSAGE",
    "deadline",
    "include_script_output",
    "run_pod",
    "save_outputs",
    "step_env",
]

DEADLINE_MESSAGE = "Pod was active on the node longer than the specified deadline"
ARTIFACT_REPOSITORY_MESSAGE = (
    "artifact storage is not configured; see the docs for setup instructions: "
    "https://argo-workflows.readthedocs.io/en/latest/configure-artifact-repository/"
)
"""The executor's error for an output artifact when the cluster has no artifact repository."""
WAIT_EXIT_CODE = 64
"""argoexec's exit code when the wait container ends with an error (its message is the first error)."""
VAR_RUN_ARGO = "/var/run/argo"
"""Where the emissary stages a step's output parameters and artifacts for the wait container."""


def _local(text: str, artifacts: Path) -> str:
    """``text`` with the pod's output folders replaced by the node's artifacts folder."""
    for prefix in LOCAL_PREFIXES:
        text = text.replace(prefix, str(artifacts))
    return text


def _last_line(path: Path) -> str:
    """The last non-blank line of a log file, at most 500 characters ("" when there is none)."""
    try:
        lines = path.read_bytes().decode("utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    last = next((line.strip() for line in reversed(lines) if line.strip()), "")
    return last[:500]


def deadline(body: Mapping[str, Any], ctx: Ctx) -> float | None:
    """When the pod must be done (``time.monotonic``): its ``timeout`` or ``activeDeadlineSeconds``,
    or its caller's deadline (a retry's ``maxDuration``) if that comes first; None for no limit."""
    limits = [
        parse_duration(body[f]) for f in ("timeout", "activeDeadlineSeconds") if body.get(f) is not None
    ]
    limit = min(limits) if limits else None
    at = time.monotonic() + limit if limit is not None else None
    if ctx.deadline is not None:
        at = ctx.deadline if at is None else min(at, ctx.deadline)
    return at


def step_env(state: RunState, body: Mapping[str, Any], artifacts: Path) -> dict[str, str]:
    """The step's environment: this process's, ``--env``, the template's ``env``, then dsx's own."""
    env = dict(os.environ)
    env.update(state.options.env)
    for item in body.get("env") or []:
        env[str(item.get("name"))] = _local(str(item.get("value", "")), artifacts)
    env[vocab.ENV_OUTPUT_DIR] = str(artifacts)
    env["hera__outputs_directory"] = str(artifacts)
    env[vocab.ENV_LOCAL_RUN] = f"{socket.gethostname()}:{os.getpid()}"  # what the steps' holds name
    if state.cluster_spec is not None:
        env[vocab.ENV_CLUSTER] = state.cluster_spec
    if state.options.kubeconfig:
        env["KUBECONFIG"] = state.options.kubeconfig
    if state.options.context:
        env[vocab.ENV_KUBE_CONTEXT] = state.options.context
    env["PYTHONPATH"] = os.pathsep.join([*state.sys_path, *filter(None, [env.get("PYTHONPATH")])])
    return env


def _process_spec(state: RunState, node_folder: Path, spec_body: Mapping[str, Any], kind: str) -> ProcessSpec:
    """The process that plays the pod's main container: a script is written to ``script`` first.

    A dsx step (``python -m hera.workflows.runner -e module:fn``) keeps its source as written, since
    Hera reads it as the step's arguments; any other script and every command have the pod's output
    folders replaced by the node's. ``python`` is this run's interpreter.
    """
    artifacts = node_folder / "artifacts"
    command = [str(c) for c in spec_body.get("command") or []]
    args = [str(a) for a in spec_body.get("args") or []]
    entry = hera_entrypoint(command, args) if kind == "script" else None
    script: Path | None = None
    if kind == "script":
        script = node_folder / "script"
        source = str(spec_body.get("source", ""))
        script.write_text(source if entry else _local(source, artifacts))
    argv = [_local(c, artifacts) for c in command] + [_local(a, artifacts) for a in args]
    if argv and argv[0] in ("python", "python3"):
        argv[0] = state.options.python
    if script is not None:
        argv.append(str(script))
    spec = ProcessSpec(
        argv=argv,
        env=step_env(state, spec_body, artifacts),
        cwd=os.getcwd(),
        stdout=node_folder / "stdout.log",
        stderr=node_folder / "stderr.log",
        hera_entry=entry,
        script=script,
        sys_path=state.sys_path,
    )
    for log in (spec.stdout, spec.stderr):
        log.touch()
    return spec


def _wait(state: RunState, process: RunningProcess, until: float | None) -> tuple[int | None, str]:
    """Wait for the process as :func:`wait_for` does, listed among the run's processes meanwhile."""
    with state.lock:
        state.processes.add(process)
    try:
        return wait_for(process, until, state.stop)
    finally:
        with state.lock:
            state.processes.discard(process)
        process.close()


def run_pod(state: RunState, node: NodeStatus, body: Mapping[str, Any], kind: str, ctx: Ctx) -> None:
    """Run a script or container template as a process and end its node as Argo would end the pod."""
    node_folder = folder(state, node)
    spec = _process_spec(state, node_folder, body[kind], kind)
    try:
        process = state.launcher.start(spec)
    except OSError as exc:
        finish(state, node, Phase.Error, f"failed to start {spec.argv[0]!r}: {exc}")
        return
    code, why = _wait(state, process, deadline(body, ctx))
    outputs: dict[str, Any] = {}
    if include_script_output(state, node.name, ctx.boundary_id):
        outputs["result"] = script_result(spec.stdout.read_bytes())
    if code is not None:
        outputs["exitCode"] = str(code)
    node.outputs = outputs
    if why == "stop":
        finish(state, node, Phase.Failed, state.stopped_message)
    elif why == "deadline":
        finish(state, node, Phase.Failed, DEADLINE_MESSAGE)
    else:
        _conclude(state, node, body, node_folder, code)


def _conclude(
    state: RunState, node: NodeStatus, body: Mapping[str, Any], node_folder: Path, code: int | None
) -> None:
    """End the node once main has exited: main's failure first, then the wait container's error.

    Raises:
        NodeError: main succeeded but an output path leads out of the step's folder.
    """
    try:
        wait_error = save_outputs(state, node, body, node_folder / "artifacts")
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
            tail = _last_line(node_folder / "stderr.log") or _last_line(node_folder / "stdout.log")
            if tail:
                message = f"{message}: {tail}"
        finish(state, node, Phase.Failed, message)
    elif wait_error is not None:
        finish(state, node, Phase.Error, f"wait: Error (exit code {WAIT_EXIT_CODE}): {wait_error}")
    else:
        finish(state, node, Phase.Succeeded, "")


def save_outputs(state: RunState, node: NodeStatus, body: Mapping[str, Any], artifacts: Path) -> str | None:
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
    params, missing = _save_parameters(node, outputs.get("parameters") or [], artifacts)
    errors += [missing] if missing else []
    kept = []
    failures = []
    for artifact in outputs.get("artifacts") or []:
        pod_path = str(artifact.get("path", ""))
        path = _inside(node, artifacts, pod_path, f"artifact '{artifact.get('name')}'")
        if not path.exists():
            if not artifact.get("optional"):
                staged = f"{VAR_RUN_ARGO}/outputs/artifacts{pod_path.rstrip('/')}.tgz"
                failures.append(f"open {staged}: no such file or directory")
        elif state.options.artifact_repository == "none":
            failures.append(ARTIFACT_REPOSITORY_MESSAGE)
        else:
            kept.append({"name": artifact["name"], "path": str(path.relative_to(state.run_dir))})
    if failures:
        errors.append("".join(f"{failure}; " for failure in failures))
    if params:
        node.outputs["parameters"] = params
    if kept:
        node.outputs["artifacts"] = kept
    return errors[0] if errors else None


def _save_parameters(
    node: NodeStatus, declared: list[Mapping[str, Any]], artifacts: Path
) -> tuple[list[dict[str, Any]], str | None]:
    """The output parameters read from their files (less one trailing newline), and the first error.

    Like Argo's SaveParameters, it stops at the first file that is missing and has no default.
    """
    params = []
    for param in declared:
        value_from = param.get("valueFrom") or {}
        if "path" not in value_from:
            if "default" in value_from:
                params.append({"name": param["name"], "value": str(value_from["default"])})
            continue
        pod_path = str(value_from["path"])
        path = _inside(node, artifacts, pod_path, f"parameter '{param.get('name')}'")
        if path.is_file():
            value = path.read_bytes().decode("utf-8", errors="replace")
        elif "default" in value_from:
            value = str(value_from["default"])
        else:
            return params, f"open {VAR_RUN_ARGO}/outputs/parameters{pod_path}: no such file or directory"
        params.append({"name": param["name"], "value": trim_newline(value)})
    return params, None


def _inside(node: NodeStatus, artifacts: Path, pod_path: str, what: str) -> Path:
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


def include_script_output(state: RunState, node_name: str, boundary_id: str | None) -> bool:
    """Argo's includeScriptOutput: keep stdout as ``outputs.result`` only if the step's DAG or steps
    template (its boundary) mentions ``tasks.<name>.outputs.result`` / ``steps.<name>...``.

    A step outside any DAG or steps template (the entrypoint itself, the workflow's exit handler)
    never keeps its result; nor does a step whose result only another template would read.
    """
    if boundary_id is None:
        return False
    boundary = state.boundary_templates.get(boundary_id)
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
