"""``dsx run NAME --local``: run one of dsx's workflows on this machine with Argo's semantics."""

from __future__ import annotations

import enum
import os
import shlex
import sys
from pathlib import Path
from typing import Any

import typer

from steps.errors import DsxError, InputError
from workflows.cli.output import OUTPUT_OPTION, OutputFormat, emit

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


def _load_file(path: Path) -> list[dict[str, Any]]:
    import yaml

    try:
        text = path.read_text()
    except OSError as exc:
        raise InputError(f"--file {path}: {exc.strerror or exc}") from exc
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        problem = getattr(exc, "problem", None) or str(exc)
        raise InputError(f"{where}: not valid YAML: {problem}") from exc
    for index, doc in enumerate(docs):
        if not isinstance(doc, dict):
            raise InputError(f"{path}: document {index + 1} is not a mapping")
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
    chosen = namespace or os.environ.get("DSX_NAMESPACE") or DEFAULT_NAMESPACE
    words = ["argo", "submit", "-n", chosen]
    if kind == "Workflow":
        words.append(str(file or name + ".yaml"))
    else:
        words += ["--from", f"{str(kind).lower()}/{name}"]
    for key, value in params.items():
        words += ["-p", f"{key}={value}"]
    return shlex.join(words)


def register(app: typer.Typer) -> None:
    """Add the ``run`` command."""

    @app.command("run")
    def run_cmd(
        name: str = typer.Argument(
            ..., metavar="NAME", help="The workflow's name (metadata.name, with or without 'dsx-')."
        ),
        local: bool = typer.Option(
            False, "--local", help="Run on this machine instead of submitting to Argo."
        ),
        parameter: list[str] = typer.Option(
            [], "--parameter", "-p", metavar="KEY=VALUE", help="A workflow parameter (repeatable)."
        ),
        file: Path | None = typer.Option(
            None,
            "--file",
            "-f",
            metavar="PATH",
            help="Run a workflow from this YAML file; its WorkflowTemplates join the library.",
        ),
        entry: str | None = typer.Option(
            None, "--entry", metavar="TEMPLATE", help="Run this template instead of the entrypoint."
        ),
        out: Path | None = typer.Option(
            None, "--out", metavar="DIR", help="Run folder (default ./dsx-runs/<workflow>-<time>-<id>)."
        ),
        approve: list[str] = typer.Option(
            [],
            "--approve",
            metavar="NAME",
            help="Resume this suspend step (task, step or template name) at once (repeatable).",
        ),
        dry_run: bool = typer.Option(
            False, "--dry-run", help="Show the plan (parameters, templates) and exit."
        ),
        cluster: str | None = typer.Option(
            None,
            "--cluster",
            metavar="SPEC",
            help="Cluster for the steps: sim:..., a fleet file, state:PATH, kube "
            f"(default with --local: the simulated fleet {DEFAULT_LOCAL_FLEET}).",
        ),
        kubeconfig: str | None = typer.Option(
            None, "--kubeconfig", metavar="PATH", help="Kubeconfig of a real cluster."
        ),
        context: str | None = typer.Option(
            None, "--context", metavar="CONTEXT", help="Kubeconfig context of a real cluster."
        ),
        namespace: str | None = typer.Option(
            None,
            "--namespace",
            "-n",
            metavar="NAMESPACE",
            help="Without --local: the namespace dsx is installed in, for the printed argo submit "
            f"(default: DSX_NAMESPACE, else {DEFAULT_NAMESPACE}).",
        ),
        artifact_repository: ArtifactRepository = typer.Option(
            ArtifactRepository.local,
            "--artifact-repository",
            case_sensitive=False,
            help="local: output artifacts are kept in the run folder, standing for a configured repository "
            "(a warning names the steps a cluster without one would fail); none: play a cluster without "
            "one, as a default Argo install is, where those steps end Error.",
        ),
        allow_host_commands: bool = typer.Option(
            False,
            "--allow-host-commands",
            help="With --local: run container and script templates that are not dsx's own steps (those of "
            "a --file workflow) as processes of this machine, as you, their images ignored; without it such "
            "a run is refused before it starts.",
        ),
        output: OutputFormat = OUTPUT_OPTION,
    ) -> None:
        """Run a dsx workflow; with --local, on this machine, exiting 0 only if it Succeeded.

        A local run stopped by Ctrl-C or SIGTERM ends Failed ("Stopped with strategy 'Terminate'", as
        argo terminate), keeps its run folder and workflow.json, and exits 130 (SIGINT) or 143 (SIGTERM).
        """
        try:
            code = _run(
                name,
                local,
                parameter,
                file,
                entry,
                out,
                approve,
                dry_run,
                cluster,
                kubeconfig,
                context,
                output,
                namespace,
                artifact_repository=artifact_repository.value,
                allow_host_commands=allow_host_commands,
            )
        except DsxError as exc:
            typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
            raise typer.Exit(2) from None
        raise typer.Exit(code)


def _run(
    name: str,
    local: bool,
    parameter: list[str],
    file: Path | None,
    entry: str | None,
    out: Path | None,
    approve: list[str],
    dry_run: bool,
    cluster: str | None,
    kubeconfig: str | None,
    context: str | None,
    output: OutputFormat,
    namespace: str | None = None,
    artifact_repository: str = "local",
    allow_host_commands: bool = False,
) -> int:
    params = _parameters(parameter)
    if file is not None:
        docs = _load_file(file)
        where = str(file)
    else:
        from workflows.compiler import compiled_documents

        docs = list(compiled_documents().values())
        where = "dsx's workflows"
    chosen = _pick(name, docs, where)
    library = [
        d
        for d in docs
        if d is not chosen and d.get("kind") in ("WorkflowTemplate", "ClusterWorkflowTemplate")
    ]
    if file is not None:
        present = {n for d in docs for n in _names(d)}
        if _referenced(docs) - present:  # a file may call dsx's own templates through templateRef
            from workflows.compiler import compiled_documents

            library += [
                d
                for d in compiled_documents().values()
                if d.get("kind") == "WorkflowTemplate" and not _names(d) & present
            ]
    if not local and not dry_run:
        typer.echo(
            "dsx run submits nothing by itself: on a cluster, Argo runs the workflow. Submit it with the "
            "command below, or add --local to run it on this machine.",
            err=True,
        )
        typer.echo(_submit_hint(chosen, params, file, namespace))
        return 2

    from workflows import runner
    from workflows.runner.report import LineReporter, LiveReporter, plan_text, result_text

    if chosen.get("kind") == "CronWorkflow":
        chosen = _scheduled_run(chosen)

    if cluster is None and kubeconfig is None and not os.environ.get("DSX_CLUSTER") and not dry_run:
        # A rehearsal on this machine never reaches a real cluster unless asked to.
        cluster = DEFAULT_LOCAL_FLEET
        typer.echo(
            f"no --cluster given: steps act on a simulated fleet ({cluster}); "
            "use --cluster kube (or --kubeconfig) for a real one",
            err=True,
        )

    if dry_run:
        plan = runner.plan(chosen, library, params, entry)
        emit(plan.to_dict(), output, lambda _: print(plan_text(plan), end=""))
        return 0
    reporter: Any
    if output is OutputFormat.table and sys.stdout.isatty():
        reporter = LiveReporter()
    else:
        reporter = LineReporter(sys.stdout if output is OutputFormat.table else sys.stderr)
    options = runner.RunOptions(
        out_dir=out,
        approve=approve,
        cluster=cluster,
        kubeconfig=kubeconfig,
        context=context,
        entrypoint=entry,
        on_update=reporter.update,
        artifact_repository=artifact_repository,
        allow_host_commands=allow_host_commands,
    )
    runner.validate(chosen, library, entry)
    printed = runner.warnings(chosen, library, entry, artifact_repository, allow_host_commands)
    for warning in printed:
        typer.secho(f"warning: {warning}", fg=typer.colors.YELLOW, err=True)
    with reporter:
        result = runner.run(chosen, library, params, options)
    if isinstance(reporter, LineReporter) and output is OutputFormat.table:
        sys.stdout.write("\n")
    for warning in result.warnings:
        if warning not in printed:
            typer.secho(f"warning: {warning}", fg=typer.colors.YELLOW, err=True)
    emit(result.to_dict(), output, lambda _: print(result_text(result), end=""))
    return result.exit_code
