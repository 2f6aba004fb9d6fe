"""The runner's entry points: validate a workflow, plan a run, run it."""

from __future__ import annotations

import base64
import contextlib
import gzip
import json
import secrets
import shutil
import signal
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from steps.errors import InputError
from steps.files import make_folder, write_text
from workflows.runner.engine import Engine, go_json
from workflows.runner.errors import HostCommandsRefused
from workflows.runner.executor import hera_entrypoint
from workflows.runner.host import host_templates, host_warning, refusal
from workflows.runner.library import Library, spec_of
from workflows.runner.model import (
    NOTHING_TRUSTED,
    NodeStatus,
    Phase,
    Plan,
    RunOptions,
    RunResult,
    TrustedSteps,
    timestamp,
)
from workflows.runner.resume import write_run_record
from workflows.runner.state import RunState, Shutdown, Stopped, stronger
from workflows.runner.validate import validate

__all__ = [
    "ARTIFACT_REPOSITORIES",
    "MAX_WORKFLOW_SIZE",
    "RunControl",
    "plan",
    "resolve_parameters",
    "run",
    "suspend_names",
    "warnings",
    "workflow_size_warning",
]

_SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


class RunControl:
    """Stops a run of :func:`run` from another thread, as ``argo stop`` or ``argo terminate`` would.

    A stop asked before the run has started is applied as soon as it does (its steps never start).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._engine: Engine | None = None
        self._asked: Shutdown | None = None

    def stop(self, strategy: Shutdown = "Stop") -> None:
        """Stop the run: ``Stop`` runs its exit handler, ``Terminate`` does not."""
        with self._lock:
            self._asked = stronger(self._asked, strategy)
            engine = self._engine
        if engine is not None:
            engine.stop(strategy)

    def attach(self, engine: Engine) -> None:
        """Bind the run's engine (called by :func:`run`); a stop asked already is applied now."""
        with self._lock:
            self._engine, asked = engine, self._asked
        if asked is not None:
            engine.stop(asked)


ARTIFACT_REPOSITORIES = ("local", "none")
"""``--artifact-repository``: ``local`` keeps artifacts in the run folder, standing for a configured
repository; ``none`` plays a cluster without one (a default Argo install), where saving one fails."""


def resolve_parameters(entry: Mapping[str, Any], overrides: Mapping[str, str]) -> dict[str, str]:
    """The workflow's parameter values: declared values, overridden by ``-p``; enums enforced.

    Raises:
        InputError: an override names no parameter, a parameter has no value, or a value is not in its enum.
    """
    declared = [
        p for p in (spec_of(entry).get("arguments") or {}).get("parameters") or [] if isinstance(p, dict)
    ]
    names = [str(p.get("name")) for p in declared]
    for key in overrides:
        if key not in names:
            known = ", ".join(names) or "none"
            raise InputError(f"-p {key}: the workflow has no parameter {key!r} (its parameters: {known})")
    values: dict[str, str] = {}
    for param in declared:
        name = str(param.get("name"))
        value: Any = overrides.get(name, param.get("value", param.get("default")))
        if value is None:
            raise InputError(f"parameter {name!r} has no value: pass -p {name}=VALUE")
        text = value if isinstance(value, str) else json.dumps(value)
        enum = [str(v) for v in param.get("enum") or []]
        if enum and text not in enum:
            raise InputError(f"-p {name}={text}: not one of {', '.join(enum)}")
        values[name] = text
    return values


def suspend_names(library: Library, entrypoint: str) -> list[str]:
    """Names ``--approve`` accepts: suspend templates, and the tasks and steps that run them."""
    names: set[str] = set()
    for scope, name in library.reachable(entrypoint):
        template = scope.templates[name]
        if "suspend" in template:
            names.add(name)
        for _, holder in library.references(template):
            with contextlib.suppress(KeyError):
                target, _ = library.resolve(holder, scope)
                if "suspend" in target and holder.get("name"):
                    names.add(str(holder["name"]))
    return sorted(names)


def _warnings(
    lib: Library,
    entrypoint: str,
    artifact_repository: str,
    allow_host_commands: bool = False,
    trusted: TrustedSteps = NOTHING_TRUSTED,
) -> list[str]:
    if artifact_repository not in ARTIFACT_REPOSITORIES:
        raise InputError(
            f"--artifact-repository {artifact_repository}: not one of {', '.join(ARTIFACT_REPOSITORIES)}"
        )
    found = []
    if allow_host_commands:
        hosted = host_warning(host_templates(lib, entrypoint, trusted))
        found += [hosted] if hosted else []
    return found + _artifact_warnings(lib, entrypoint, artifact_repository)


def _artifact_warnings(lib: Library, entrypoint: str, artifact_repository: str) -> list[str]:
    if artifact_repository != "local" or spec_of(lib.entry).get("artifactRepositoryRef") is not None:
        return []
    names = sorted(
        {
            name if scope.is_entry else f"{scope.name}/{name}"
            for scope, name in lib.reachable(entrypoint)
            if (scope.templates[name].get("outputs") or {}).get("artifacts")
        }
    )
    if not names:
        return []
    return [
        f"template{'s' if len(names) > 1 else ''} {', '.join(names)} declare{'' if len(names) > 1 else 's'} "
        "output artifacts and the workflow declares no artifactRepositoryRef: here they are kept in the "
        "run folder, but on a cluster they need an artifact repository (a default Argo install has none, "
        "and there these steps end Error); rehearse that with --artifact-repository none"
    ]


def warnings(
    entry: Mapping[str, Any],
    library: Sequence[Mapping[str, Any]] = (),
    entrypoint: str | None = None,
    artifact_repository: str = "local",
    allow_host_commands: bool = False,
    trusted: TrustedSteps = NOTHING_TRUSTED,
) -> list[str]:
    """What the user should know before the run, one line each.

    With ``allow_host_commands``: the templates that will run as processes of this machine (all but
    the ``trusted`` steps), and the values they substitute into shell or script text. Then what would
    work here but fail on a cluster as Argo is installed by default: output artifacts with no
    ``artifactRepositoryRef`` while the run folder stands for a repository
    (``artifact_repository="local"``).
    """
    lib = Library(entry, library)
    start = str(entrypoint or spec_of(entry).get("entrypoint"))
    return _warnings(lib, start, artifact_repository, allow_host_commands, trusted)


def _describe(template: Mapping[str, Any]) -> tuple[str, str]:
    for kind in ("dag", "steps", "script", "container", "resource", "suspend"):
        if kind in template:
            break
    else:
        return "?", ""
    body = template.get(kind) or {}
    if kind == "script":
        entry = hera_entrypoint(body.get("command") or [], body.get("args") or [])
        return kind, entry or " ".join(str(c) for c in body.get("command") or []) + " (inline script)"
    if kind == "container":
        return kind, " ".join(str(c) for c in [*(body.get("command") or []), *(body.get("args") or [])])
    if kind == "resource":
        import yaml

        try:
            manifest = yaml.safe_load(str(body.get("manifest") or "")) or {}
        except yaml.YAMLError:
            manifest = {}
        target = f"{manifest.get('kind', '?')}/{(manifest.get('metadata') or {}).get('name', '?')}"
        return kind, f"{body.get('action')} {target}"
    if kind == "dag":
        return kind, f"{len(body.get('tasks') or [])} tasks"
    if kind == "steps":
        return kind, f"{len(template.get('steps') or [])} groups"
    return kind, f"duration {body.get('duration')}" if body.get("duration") else "until approved"


def plan(
    entry: Mapping[str, Any],
    library: Sequence[Mapping[str, Any]] = (),
    parameters: Mapping[str, str] | None = None,
    entrypoint: str | None = None,
) -> Plan:
    """What a run would do: the parameters it would use and every template it can reach (``--dry-run``)."""
    validate(entry, library, entrypoint)
    lib = Library(entry, library)
    values = resolve_parameters(entry, parameters or {})
    spec = spec_of(entry)
    start = str(entrypoint or spec.get("entrypoint"))
    declared = {str(p.get("name")): p for p in (spec.get("arguments") or {}).get("parameters") or []}
    params = []
    for name, value in values.items():
        param = declared[name]
        row: dict[str, Any] = {
            "name": name,
            "value": value,
            "source": "-p" if name in (parameters or {}) else "default",
        }
        if param.get("description"):
            row["description"] = param["description"]
        if param.get("enum"):
            row["enum"] = [str(v) for v in param["enum"]]
        params.append(row)
    templates = []
    for scope, name in lib.reachable(start):
        template = scope.templates[name]
        kind, runs = _describe(template)
        row = {
            "name": name,
            "type": kind,
            "runs": runs,
            "from": "this workflow" if scope.is_entry else scope.label,
        }
        if template.get("retryStrategy"):
            row["retries"] = str((template["retryStrategy"] or {}).get("limit", "unlimited"))
        for field in ("timeout", "activeDeadlineSeconds"):
            if template.get(field) is not None:
                row["timeout"] = str(template[field])
        templates.append(row)
    metadata = entry.get("metadata") or {}
    return Plan(
        workflow=str(metadata.get("name") or metadata.get("generateName") or "?"),
        kind=str(entry.get("kind")),
        entrypoint=start,
        on_exit=spec.get("onExit"),
        parameters=params,
        templates=templates,
        approvals=suspend_names(lib, start),
    )


def _shareable(spec: str | None, run_dir: Path) -> str | None:
    if spec is None:
        return None
    from steps.cluster import shareable

    return shareable(spec, run_dir)


def _write_json(path: Path, data: Any) -> None:
    write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def run(
    entry: Mapping[str, Any],
    library: Sequence[Mapping[str, Any]] = (),
    parameters: Mapping[str, str] | None = None,
    options: RunOptions | None = None,
    control: RunControl | None = None,
) -> RunResult:
    """Run a Workflow or WorkflowTemplate on this machine with Argo's semantics.

    Checks everything first (unsupported constructs, parameters, ``--approve`` names, commands that
    would run on this machine without ``options.allow_host_commands``) and raises
    :class:`~steps.errors.InputError` (:class:`~workflows.runner.errors.UnsupportedConstruct` for
    constructs, :class:`~workflows.runner.errors.HostCommandsRefused` for host commands) before anything
    runs. A workflow that fails is not an exception: the result's phase
    says Failed or Error. SIGINT (Ctrl-C) and SIGTERM stop the run as ``argo terminate`` does (Argo's
    ``Terminate`` strategy: running steps are killed, no exit handler runs): the run ends Failed with
    Argo's message "Stopped with strategy 'Terminate'", its ``workflow.json`` written, its folder kept,
    and the result names the signal (:attr:`RunResult.signal`). Another thread stops the run through
    ``control``: ``Stop`` as ``argo stop`` does (running steps killed, then the exit handler runs; the run
    ends Failed, "Stopped with strategy 'Stop'"), ``Terminate`` as above.
    """
    options = options or RunOptions()
    lib, values, entrypoint, cautions = _checked(entry, library, parameters or {}, options)
    workflow_name, run_dir, created = _run_folder(entry, options)
    try:
        cluster = _shareable(options.cluster, run_dir)
        engine = Engine(lib, options, run_dir, workflow_name, values, cluster)
    except BaseException:
        if created:  # nothing ran: leave no empty folder behind
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    # From here on the folder holds evidence: whatever happens, it is never deleted.
    write_run_record(run_dir, workflow_name, suspend_names(lib, entrypoint))
    if control is not None:
        control.attach(engine)
    refused = engine.artifact_repository_error()
    received: list[int] = []
    with _stop_on_signals(engine, received):
        root, exit_node = _carry_out(engine, entrypoint, refused is not None, received)
        if root is None and refused is None:  # stopped while it waited for its workflow's mutex
            phase, message = Phase.Failed, engine.state.stopped_message
        elif root is None:
            phase, message = Phase.Error, str(refused)
        else:
            phase, message = _final_phase(root, exit_node, engine.state)
        result = RunResult(
            phase=phase,
            message=message,
            workflow_name=workflow_name,
            run_dir=run_dir,
            nodes=dict(engine.state.nodes),
            parameters=values,
            started_at=engine.state.created,
            finished_at=time.time(),
            root_id=root.id if root is not None else workflow_name,
            warnings=cautions,
            signal=received[0] if received else None,
        )
        document = _workflow_document(entry, result, engine, entrypoint)
        too_large = workflow_size_warning(document, spec_of(entry))
        if too_large is not None:
            result.warnings.append(too_large)
        _write_json(run_dir / "workflow.json", document)
        return result


def _checked(
    entry: Mapping[str, Any],
    library: Sequence[Mapping[str, Any]],
    parameters: Mapping[str, str],
    options: RunOptions,
) -> tuple[Library, dict[str, str], str, list[str]]:
    """Everything :func:`run` checks before anything runs: the library, parameter values, entrypoint
    and the warnings about what would fail on a cluster.

    Raises:
        InputError: as :func:`run` says.
    """
    validate(entry, library, options.entrypoint)
    lib = Library(entry, library)
    values = resolve_parameters(entry, parameters)
    entrypoint = str(options.entrypoint or spec_of(entry).get("entrypoint"))
    known = suspend_names(lib, entrypoint)
    for name in options.approve:
        if name not in known:
            raise InputError(
                f"--approve {name}: the workflow has no suspend step or template of that name "
                f"(suspend steps: {', '.join(known) or 'none'})"
            )
    hosts = host_templates(lib, entrypoint, options.trusted)
    if hosts and not options.allow_host_commands:
        raise HostCommandsRefused(refusal(hosts), [h.label for h in hosts])
    cautions = _warnings(lib, entrypoint, options.artifact_repository)  # what would fail on a cluster
    return lib, values, entrypoint, cautions


def _run_folder(entry: Mapping[str, Any], options: RunOptions) -> tuple[str, Path, bool]:
    """The workflow's name (Argo's ``generateName`` plus five letters), its run folder (made here,
    absolute) and whether this call made it.

    Raises:
        InputError: ``--out`` names a folder that exists and is not empty.
    """
    metadata = entry.get("metadata") or {}
    base = str(metadata.get("name") or str(metadata.get("generateName") or "workflow").rstrip("-"))
    suffix = "".join(secrets.choice(_SUFFIX_ALPHABET) for _ in range(5))
    workflow_name = options.workflow_name or f"{base}-{suffix}"
    run_dir = options.out_dir or Path("dsx-runs") / f"{base}-{time.strftime('%Y%m%d-%H%M%S')}-{suffix}"
    if run_dir.exists() and any(run_dir.iterdir()):
        raise InputError(f"--out {run_dir}: the folder exists and is not empty")
    created = not run_dir.exists()
    make_folder(run_dir, "--out" if options.out_dir else "run folder")
    return workflow_name, run_dir.resolve(), created


def _carry_out(
    engine: Engine, entrypoint: str, refused: bool, received: list[int]
) -> tuple[NodeStatus | None, NodeStatus | None]:
    """Run the workflow in its own thread; the root and exit nodes (none when ``refused``, or when the run
    was stopped while it waited for its workflow's mutex).

    The calling thread only waits, so a signal handler or a KeyboardInterrupt can stop the run; every
    step process still running is killed before this returns. An exception in the run is raised here.
    """
    outcome: dict[str, Any] = {}
    finished = threading.Event()

    def work() -> None:
        try:
            outcome["nodes"] = (None, None) if refused else engine.run(entrypoint)
        except Stopped:  # stopped while it waited for the workflow's mutex: nothing ran, nothing to exit
            outcome["nodes"] = (None, None)
        except BaseException as exc:  # surfaced in the calling thread
            outcome["error"] = exc
        finally:
            finished.set()

    threading.Thread(target=work, name="dsx-run", daemon=True).start()
    try:
        try:
            while not finished.wait(0.2):
                pass
        except KeyboardInterrupt:  # SIGINT where the handler could not be installed
            received.append(int(signal.SIGINT))
            engine.stop("Terminate")
            while not finished.wait(0.2):
                pass
    finally:
        engine.kill_all()
    if "error" in outcome:
        raise outcome["error"]
    nodes: tuple[NodeStatus | None, NodeStatus | None] = outcome["nodes"]
    return nodes


def _final_phase(root: NodeStatus, exit_node: NodeStatus | None, state: RunState) -> tuple[Phase, str]:
    """The workflow's phase and message: the root's, then a failed exit handler's; a stop ends it Failed."""
    phase = {Phase.Failed: Phase.Failed, Phase.Error: Phase.Error}.get(root.phase, Phase.Succeeded)
    message = root.message if phase is not Phase.Succeeded else ""
    if phase is Phase.Succeeded and exit_node is not None and exit_node.phase.failed_or_error:
        phase, message = exit_node.phase, exit_node.message
    if state.shutdown is not None:
        phase, message = Phase.Failed, state.stopped_message
    return phase, message


@contextlib.contextmanager
def _stop_on_signals(engine: Engine, received: list[int]) -> Iterator[None]:
    """While the run goes on, SIGINT and SIGTERM stop it as ``argo terminate`` would.

    The first signal sets the engine's stop: running steps are killed with their process groups, no
    further step starts, and the run still ends with its ``workflow.json``. A later one only repeats the
    kill; nothing is ever deleted. Handlers can be installed only in the main thread; elsewhere the
    caller's own handling stays (a KeyboardInterrupt still stops the run).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, _frame: Any) -> None:
        received.append(signum)
        engine.stop("Terminate")

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


MAX_WORKFLOW_SIZE = 1024 * 1024
"""Argo's limit on a Workflow object (MAX_WORKFLOW_SIZE), checked with its node status compressed."""


def workflow_size_warning(document: Mapping[str, Any], spec: Mapping[str, Any]) -> str | None:
    """Whether Argo would refuse to store this run's Workflow object, and by how much.

    Argo's controller writes the whole status after every step; past 1 MiB it gzips the nodes, and if
    that is still too large (no node status offloading, which needs a database) the workflow ends
    Error: "workflow is longer than maximum allowed size". The run's document stands for the object,
    with the template's spec Argo stores beside it.
    """
    stored = {**document, "status": {**document["status"], "storedWorkflowTemplateSpec": spec}}
    plain = len(go_json(stored).encode())
    if plain <= MAX_WORKFLOW_SIZE:
        return None
    nodes = go_json(stored["status"]["nodes"]).encode()
    compressed = base64.b64encode(gzip.compress(nodes, mtime=0)).decode()
    status = {k: v for k, v in stored["status"].items() if k != "nodes"}
    packed = len(go_json({**stored, "status": {**status, "compressedNodes": compressed}}).encode())
    if packed <= MAX_WORKFLOW_SIZE:
        return None
    return (
        f"the Workflow object of this run would be {plain} bytes ({packed} with its nodes compressed): "
        f"Argo refuses more than {MAX_WORKFLOW_SIZE} (workflow is longer than maximum allowed size), so "
        "without node status offloading this workflow would end Error on a cluster; pass less to each step"
    )


def _workflow_document(
    entry: Mapping[str, Any], result: RunResult, engine: Engine, entrypoint: str
) -> dict[str, Any]:
    metadata = entry.get("metadata") or {}
    spec: dict[str, Any] = {
        "entrypoint": entrypoint,
        "arguments": {"parameters": [{"name": k, "value": v} for k, v in result.parameters.items()]},
    }
    if engine.state.shutdown is not None:
        spec["shutdown"] = engine.state.shutdown  # what `argo terminate` or `argo stop` sets on the Workflow
    if entry.get("kind") != "Workflow":
        spec["workflowTemplateRef"] = {
            "name": metadata.get("name"),
            "clusterScope": entry.get("kind") == "ClusterWorkflowTemplate",
        }
    return {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {
            "name": result.workflow_name,
            "namespace": engine.state.globals["workflow.namespace"],
            "uid": engine.state.uid,
            "creationTimestamp": timestamp(engine.state.created),
        },
        "spec": spec,
        "status": {
            "phase": str(result.phase),
            "message": result.message,
            "startedAt": timestamp(result.started_at),
            "finishedAt": timestamp(result.finished_at),
            "outputs": result.outputs,
            "nodes": {node_id: node.to_dict() for node_id, node in sorted(result.nodes.items())},
        },
    }
