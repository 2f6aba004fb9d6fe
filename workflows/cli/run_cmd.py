"""``dsx run NAME --local``: run one of dsx's workflows on this machine with Argo's semantics."""

from __future__ import annotations

import dataclasses
import enum
import importlib
import os
import shlex
import sys
from pathlib import Path
from typing import Any

import typer
from pydantic import BaseModel, ValidationError

from steps.cluster import shareable
from steps.cluster import vocabulary as vocab
from steps.cluster.retry import RetryPolicy
from steps.errors import DsxError, InputError
from steps.yamlio import line_of, load_yaml, parse_yaml, plain
from workflows import runner
from workflows.cli.output import OUTPUT_OPTION, OutputFormat, check_out_dir, emit
from workflows.compiler import compiled_documents, trusted_steps
from workflows.runner.report import LineReporter, LiveReporter, plan_text, result_text

DEFAULT_LOCAL_FLEET = "sim:nodes=4,gpu=h100,racks=2"
"""The cluster of a local run given none: a small simulated fleet of two racks."""

DEFAULT_NAMESPACE = "gpu-ops"
"""Where the README installs the chart: the namespace ``argo submit`` is told when none is given."""

_WORKFLOW_KINDS = ("Workflow", "WorkflowTemplate", "ClusterWorkflowTemplate")


class ArtifactRepository(enum.StrEnum):
    """What stands for Argo's artifact repository in a local run."""

    local = "local"
    none = "none"


def _parameters(pairs: list[str]) -> dict[str, str]:
    values: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InputError(f"-p {pair!r}: expected KEY=VALUE")
        values[key] = value
    return values


def _check_types(path: Path, raw: Any, doc: dict[str, Any], index: int) -> None:
    """Refuse a document whose fields have the wrong types for Argo's schema, naming the field and line.

    The runner reads the documents as plain data and trusts their shapes; a mapping where Argo has a
    list (``inputs: x``, ``tasks: 7``) would otherwise fail deep inside it. Hera's models are Argo's
    schema, generated from its OpenAPI document; they are imported here, for a ``--file`` only (about a
    second of CPU that a run of dsx's own workflows, read compiled, does without).
    """
    from hera.workflows import models

    schemas: dict[str, type[BaseModel]] = {
        "Workflow": models.Workflow,
        "WorkflowTemplate": models.WorkflowTemplate,
        "ClusterWorkflowTemplate": models.ClusterWorkflowTemplate,
        "CronWorkflow": models.CronWorkflow,
    }
    schema = schemas.get(str(doc.get("kind")))
    if schema is None:
        return
    problem: tuple[tuple[Any, ...], str] | None = None
    try:
        schema.model_validate(doc)
    except ValidationError as exc:
        first = exc.errors()[0]
        problem = (tuple(first["loc"]), first["msg"])
    if problem is None:
        problem = _manifest_problem(doc)
    if problem is not None:
        loc, message = problem
        line = line_of(raw, loc)
        where = f"--file {path}:{line}" if line else f"--file {path}"
        field = ".".join(str(part) for part in loc) or "(document)"
        raise InputError(f"{where}: {doc.get('kind')} (document {index + 1}): {field}: {message}")


def _manifest_problem(doc: dict[str, Any]) -> tuple[tuple[Any, ...], str] | None:
    """A resource template whose manifest is YAML but not an object (``manifest: x``).

    A manifest that is not YAML yet may become YAML once Argo substitutes its ``{{...}}`` variables, so
    only one that parses, and holds no variable, is judged here.
    """

    spec = doc.get("spec") or {}
    prefix: tuple[str, ...]
    if doc.get("kind") == "CronWorkflow":
        spec, prefix = spec.get("workflowSpec") or {}, ("spec", "workflowSpec")
    else:
        prefix = ("spec",)
    for number, template in enumerate(spec.get("templates") or []):
        manifest = (template.get("resource") or {}).get("manifest")
        if not isinstance(manifest, str) or "{{" in manifest:
            continue
        try:
            parsed = parse_yaml(manifest, "manifest")
        except InputError:
            continue
        if not isinstance(parsed, dict):
            loc = (*prefix, "templates", number, "resource", "manifest")
            return loc, "the manifest is not a Kubernetes object (a YAML mapping)"
    return None


def _without_nulls(data: Any) -> Any:
    """The data without the mapping keys whose value is null: Argo reads ``dag: null`` (a nil pointer
    in Go) as no ``dag`` at all, and so must the runner."""
    if isinstance(data, dict):
        return {k: _without_nulls(v) for k, v in data.items() if v is not None}
    if isinstance(data, list):
        return [_without_nulls(v) for v in data]
    return data


def _load_file(path: Path) -> list[dict[str, Any]]:
    raws = [d for d in load_yaml(path, f"--file {path}", documents=True) if d is not None]
    docs: list[dict[str, Any]] = []
    for index, raw in enumerate(raws):
        if not isinstance(raw, dict):
            raise InputError(f"--file {path}: document {index + 1} is not a mapping")
        doc = _without_nulls(plain(raw))
        _check_types(path, raw, doc, index)
        docs.append(doc)
    return docs


def _names(doc: dict[str, Any]) -> set[str]:
    metadata = doc.get("metadata") or {}
    names = {str(metadata.get("name") or ""), str(metadata.get("generateName") or "").rstrip("-")}
    return {n for n in names if n}


def _pick(name: str, docs: list[dict[str, Any]], where: str) -> dict[str, Any]:
    workflows = [d for d in docs if d.get("kind") in (*_WORKFLOW_KINDS, "CronWorkflow")]
    wanted = {name, f"dsx-{name}"}
    found = [d for d in workflows if _names(d) & wanted]
    if not found:
        known = sorted(n for d in workflows for n in _names(d))
        raise InputError(f"no workflow named {name!r} in {where} (known: {', '.join(known) or 'none'})")
    exact = [d for d in found if name in _names(d)]
    return (exact or found)[0]


def _scheduled_run(cron: dict[str, Any]) -> dict[str, Any]:
    """The Workflow a CronWorkflow starts on its schedule, to run once now."""
    metadata = cron.get("metadata") or {}
    return {
        "apiVersion": cron.get("apiVersion", "argoproj.io/v1alpha1"),
        "kind": "Workflow",
        "metadata": {
            "name": metadata.get("name", "cron"),
            "annotations": dict(metadata.get("annotations") or {}),
            "labels": dict(metadata.get("labels") or {}),
        },
        "spec": dict((cron.get("spec") or {}).get("workflowSpec") or {}),
    }


def _referenced(docs: list[dict[str, Any]]) -> set[str]:
    """Names of the WorkflowTemplates the documents' ``templateRef`` fields name."""
    names: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            ref = node.get("templateRef")
            if isinstance(ref, dict) and ref.get("name") and not ref.get("clusterScope"):
                names.add(str(ref["name"]))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(docs)
    return names


def _submit_hint(
    entry: dict[str, Any], params: dict[str, str], file: Path | None, namespace: str | None
) -> str:
    """The ``argo submit`` command that runs ``entry`` on a cluster, every value quoted for a POSIX shell."""
    name = sorted(_names(entry))[0]
    kind = entry.get("kind")

    chosen = namespace or os.environ.get(vocab.ENV_NAMESPACE) or DEFAULT_NAMESPACE
    words = ["argo", "submit", "-n", chosen]
    if kind == "Workflow":
        words.append(str(file or name + ".yaml"))
    else:
        words += ["--from", f"{str(kind).lower()}/{name}"]
    for key, value in params.items():
        words += ["-p", f"{key}={value}"]
    return shlex.join(words)


def _check_step_environment(cluster: str | None) -> None:
    """Refuse, before a step runs, what every step would refuse on its own (and fail the run with 1):
    ``DSX_RETRY_*`` values, and a ``state:`` cluster path that is empty, a folder or missing."""

    RetryPolicy.from_env()
    spec = cluster if cluster is not None else os.environ.get(vocab.ENV_CLUSTER, "")
    if spec.strip().startswith("state:"):
        shareable(spec, Path("."))


def _check_approvals(
    chosen: dict[str, Any],
    library: list[dict[str, Any]],
    params: dict[str, str],
    entry: str | None,
    approve: list[str],
) -> None:
    """Refuse ``--approve NAME`` naming no suspend step of the workflow, in every mode (a dry run and the
    printed ``argo submit`` command too), before anything runs."""
    if not approve:
        return

    workflow = _scheduled_run(chosen) if chosen.get("kind") == "CronWorkflow" else chosen
    known = runner.plan(workflow, library, params, entry).approvals
    for name in approve:
        if name not in known:
            raise InputError(
                f"--approve {name}: the workflow has no suspend step or template of that name "
                f"(suspend steps: {', '.join(known) or 'none'})"
            )


_NAME = typer.Argument(
    ..., metavar="NAME", help="The workflow's name (metadata.name, with or without 'dsx-')."
)
_LOCAL = typer.Option(False, "--local", help="Run on this machine instead of submitting to Argo.")
_PARAMETER = typer.Option(
    [], "--parameter", "-p", metavar="KEY=VALUE", help="A workflow parameter (repeatable)."
)
_FILE = typer.Option(
    None,
    "--file",
    "-f",
    metavar="PATH",
    help="Run a workflow from this YAML file; its WorkflowTemplates join the library.",
)
_ENTRY = typer.Option(
    None, "--entry", metavar="TEMPLATE", help="Run this template instead of the entrypoint."
)
_OUT = typer.Option(
    None, "--out", metavar="DIR", help="Run folder (default ./dsx-runs/<workflow>-<time>-<id>)."
)
_APPROVE = typer.Option(
    [],
    "--approve",
    metavar="NAME",
    help="Resume this suspend step (task, step or template name) at once (repeatable).",
)
_DRY_RUN = typer.Option(False, "--dry-run", help="Show the plan (parameters, templates) and exit.")
_CLUSTER = typer.Option(
    None,
    "--cluster",
    metavar="SPEC",
    help="Cluster for the steps: sim:..., a fleet file, state:PATH, kube "
    f"(default with --local: the simulated fleet {DEFAULT_LOCAL_FLEET}).",
)
_KUBECONFIG = typer.Option(None, "--kubeconfig", metavar="PATH", help="Kubeconfig of a real cluster.")
_CONTEXT = typer.Option(None, "--context", metavar="CONTEXT", help="Kubeconfig context of a real cluster.")
_NAMESPACE = typer.Option(
    None,
    "--namespace",
    "-n",
    metavar="NAMESPACE",
    help="Without --local: the namespace dsx is installed in, for the printed argo submit "
    f"(default: DSX_NAMESPACE, else {DEFAULT_NAMESPACE}). With --local: the run's namespace "
    "({{workflow.namespace}}, where its mutexes are held; default: default).",
)
_ARTIFACT_REPOSITORY = typer.Option(
    ArtifactRepository.local,
    "--artifact-repository",
    case_sensitive=False,
    help="local: output artifacts are kept in the run folder, standing for a configured repository "
    "(a warning names the steps a cluster without one would fail); none: play a cluster without "
    "one, as a default Argo install is, where those steps end Error.",
)
_ALLOW_HOST_COMMANDS = typer.Option(
    False,
    "--allow-host-commands",
    help="With --local: run container and script templates that are not dsx's own steps (those of "
    "a --file workflow) as processes of this machine, as you, their images ignored; without it such "
    "a run is refused before it starts.",
)


def run_cmd(
    name: str = _NAME,
    local: bool = _LOCAL,
    parameter: list[str] = _PARAMETER,
    file: Path | None = _FILE,
    entry: str | None = _ENTRY,
    out: Path | None = _OUT,
    approve: list[str] = _APPROVE,
    dry_run: bool = _DRY_RUN,
    cluster: str | None = _CLUSTER,
    kubeconfig: str | None = _KUBECONFIG,
    context: str | None = _CONTEXT,
    namespace: str | None = _NAMESPACE,
    artifact_repository: ArtifactRepository = _ARTIFACT_REPOSITORY,
    allow_host_commands: bool = _ALLOW_HOST_COMMANDS,
    output: OutputFormat = OUTPUT_OPTION,
) -> None:
    """Run a dsx workflow; with --local, on this machine, exiting 0 only if it Succeeded.

    A local run stopped by Ctrl-C or SIGTERM ends Failed ("Stopped with strategy 'Terminate'", as
    argo terminate), keeps its run folder and workflow.json, and exits 130 (SIGINT) or 143 (SIGTERM).
    """
    try:
        request = _Request(
            name=name,
            local=local,
            params=_parameters(parameter),
            file=file,
            entry=entry,
            out=out,
            approve=approve,
            dry_run=dry_run,
            cluster=cluster,
            kubeconfig=kubeconfig,
            context=context,
            namespace=namespace,
            artifact_repository=artifact_repository.value,
            allow_host_commands=allow_host_commands,
            output=output,
        )
        code = _run(request)
    except DsxError as exc:
        typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None
    raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    """Add the ``run`` command."""
    app.command("run")(run_cmd)


#: dsx workflows whose parameters their first step would refuse: checked before anything runs, so a
#: typo exits 2 at once instead of failing the workflow's first step (exit 1, "did not succeed").
_PARAMETER_CHECKS: dict[str, tuple[str, str, dict[str, str]]] = {
    vocab.WORKFLOW_CERTIFY: (
        "steps.readiness.certify",
        "check_options",
        {
            "nodes": "selector",
            "group-label": "group_label",
            "launcher": "launcher",
            "accelerator": "accelerator",
            "service": "service",
            "os": "os",
            "min-bytes": "min_bytes",
            "max-bytes": "max_bytes",
            "iters": "iters",
            "diag": "diag",
            "dcgm-host": "dcgm_host",
            "p-min": "p_min",
        },
    ),
    vocab.WORKFLOW_REMEDIATE: (
        "steps.sentinel.remediate",
        "check_parameters",
        {
            "node": "node",
            "check": "check",
            "event": "event",
            "max-attempts": "max_attempts",
            "breaker-share": "breaker_share",
            "breaker-window-s": "breaker_window_s",
            "drain-policy": "drain_policy",
            "repair-timeout": "repair_timeout",
            "repair-template": "repair_template",
            "repair-template-actions": "repair_template_actions",
        },
    ),
}


def _check_parameters(chosen: dict[str, Any], params: dict[str, str]) -> None:
    """Check a dsx workflow's parameters with the function its first step checks them with.

    Raises:
        InputError: a parameter is malformed (named by the step's option name).
    """
    name = str((chosen.get("metadata") or {}).get("name", ""))
    if name not in _PARAMETER_CHECKS:
        return

    module, function, names = _PARAMETER_CHECKS[name]
    declared = {
        str(p["name"]): str(p.get("value", ""))
        for p in ((chosen.get("spec") or {}).get("arguments") or {}).get("parameters") or []
    }
    values = {**declared, **params}
    getattr(importlib.import_module(module), function)(
        **{names[k]: v for k, v in values.items() if k in names}
    )


@dataclasses.dataclass(frozen=True)
class _Request:
    """What ``dsx run`` was asked to do: the options of the command, the parameters parsed."""

    name: str
    local: bool
    params: dict[str, str]
    file: Path | None
    entry: str | None
    out: Path | None
    approve: list[str]
    dry_run: bool
    cluster: str | None
    kubeconfig: str | None
    context: str | None
    namespace: str | None
    artifact_repository: str
    allow_host_commands: bool
    output: OutputFormat


def _documents(file: Path | None) -> tuple[list[dict[str, Any]], str]:
    """The documents to pick the workflow from (the file's, else dsx's compiled ones) and where they are."""
    if file is not None:
        return _load_file(file), str(file)

    return list(compiled_documents().values()), "dsx's workflows"


def _library(chosen: dict[str, Any], docs: list[dict[str, Any]], file: Path | None) -> list[dict[str, Any]]:
    """The WorkflowTemplates the chosen workflow may call: the other documents', and dsx's own when a
    file's ``templateRef`` names one the file does not hold."""
    library = [
        d
        for d in docs
        if d is not chosen and d.get("kind") in ("WorkflowTemplate", "ClusterWorkflowTemplate")
    ]
    if file is not None:
        present = {n for d in docs for n in _names(d)}
        if _referenced(docs) - present:  # a file may call dsx's own templates through templateRef
            library += [
                d
                for d in compiled_documents().values()
                if d.get("kind") == "WorkflowTemplate" and not _names(d) & present
            ]
    return library


def _local_cluster(request: _Request) -> str | None:
    """The cluster the steps of a local run act on: the one asked for, else the simulated fleet (a
    rehearsal on this machine never reaches a real cluster unless asked to)."""

    if request.cluster is not None or request.kubeconfig is not None or os.environ.get(vocab.ENV_CLUSTER):
        return request.cluster
    typer.echo(
        f"no --cluster given: steps act on a simulated fleet ({DEFAULT_LOCAL_FLEET}); "
        "use --cluster kube (or --kubeconfig) for a real one",
        err=True,
    )
    return DEFAULT_LOCAL_FLEET


def _run(request: _Request) -> int:
    check_out_dir(request.out, "--out")
    docs, where = _documents(request.file)
    chosen = _pick(request.name, docs, where)
    library = _library(chosen, docs, request.file)
    _check_approvals(chosen, library, request.params, request.entry, request.approve)
    if request.file is None:
        _check_parameters(chosen, request.params)
    if not request.local and not request.dry_run:
        typer.echo(
            "dsx run submits nothing by itself: on a cluster, Argo runs the workflow. Submit it with the "
            "command below, or add --local to run it on this machine.",
            err=True,
        )
        typer.echo(_submit_hint(chosen, request.params, request.file, request.namespace))
        return 2
    if chosen.get("kind") == "CronWorkflow":
        chosen = _scheduled_run(chosen)
    if request.dry_run:
        plan = runner.plan(chosen, library, request.params, request.entry)
        emit(plan.to_dict(), request.output, lambda _: print(plan_text(plan), end=""))
        return 0
    _check_step_environment(request.cluster)
    return _run_locally(request, chosen, library, _local_cluster(request))


def _warn(warning: str) -> None:
    typer.secho(f"warning: {warning}", fg=typer.colors.YELLOW, err=True)


def _run_locally(
    request: _Request, chosen: dict[str, Any], library: list[dict[str, Any]], cluster: str | None
) -> int:
    """Run the workflow on this machine, reporting progress; its exit code (0 only if it Succeeded)."""

    output = request.output
    reporter: Any
    if output is OutputFormat.table and sys.stdout.isatty():
        reporter = LiveReporter()
    else:
        reporter = LineReporter(sys.stdout if output is OutputFormat.table else sys.stderr)
    options = runner.RunOptions(
        out_dir=request.out,
        approve=request.approve,
        cluster=cluster,
        kubeconfig=request.kubeconfig,
        context=request.context,
        namespace=request.namespace,
        entrypoint=request.entry,
        on_update=reporter.update,
        artifact_repository=request.artifact_repository,
        allow_host_commands=request.allow_host_commands,
        trusted=trusted_steps(),
    )
    runner.validate(chosen, library, request.entry)
    printed = runner.warnings(
        chosen,
        library,
        request.entry,
        request.artifact_repository,
        request.allow_host_commands,
        options.trusted,
    )
    for warning in printed:
        _warn(warning)
    with reporter:
        result = runner.run(chosen, library, request.params, options)
    if isinstance(reporter, LineReporter) and output is OutputFormat.table:
        sys.stdout.write("\n")
    for warning in result.warnings:
        if warning not in printed:
            _warn(warning)
    emit(result.to_dict(), output, lambda _: print(result_text(result), end=""))
    return result.exit_code
