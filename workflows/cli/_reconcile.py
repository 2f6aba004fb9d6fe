"""``dsx sentinel reconcile``: start the remediations the Sensor's edges missed (steps.sentinel.reconcile).

On a cluster it creates ``dsx-remediate`` Workflows in dsx's namespace, as the ``dsx-reconcile``
CronWorkflow does; on a simulated fleet (``sim:`` or ``state:``) it runs each with the local runner, one
after the other, in a run folder under ``--out``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import typer

from steps.cluster import connect, shareable
from steps.cluster import vocabulary as vocab
from steps.errors import InputError
from steps.sentinel.reconcile import REMEDIATE, mark_not_ready, plan, submit_workflow
from workflows.cli.events import _overrides
from workflows.compiler import compiled_documents
from workflows.eventplay import local_submitter
from workflows.runner.events import Submission
from workflows.runner.model import Phase, RunResult

__all__ = ["reconcile_cmd", "reconcile_now"]


def reconcile_now(
    cluster: str | None,
    *,
    dry_run: bool = False,
    parameters: dict[str, str] | None = None,
    out: Path | None = None,
    by: str = "dsx sentinel reconcile",
    err: bool = False,
) -> int:
    """One reconciler pass against ``cluster``, printing a line per tainted node (on stderr with ``err``);
    the exit code: 0 when every remediation it ran locally Succeeded (or it only created Workflows), 1
    otherwise."""

    spec = cluster or os.environ.get(vocab.ENV_CLUSTER) or "kube"
    port = connect(spec)
    simulated = hasattr(port, "inject")
    for line in mark_not_ready(port, dry_run=dry_run):
        typer.echo(line, err=err)
    found = plan(port)
    if dry_run or not found.starts:
        for line in found.lines(None if dry_run else {}):
            typer.echo(line, err=err)
        return 0
    started: dict[str, str] = {}
    runs: list[RunResult] = []
    if simulated:
        folder = out or Path("dsx-runs") / f"reconcile-{time.strftime('%Y%m%d-%H%M%S')}"
        folder.mkdir(parents=True, exist_ok=True)
        shared = shareable(spec, folder)
        if shared != spec:  # a fresh simulated fleet: plan again on the copy every run shares
            found = plan(connect(shared))
        submit = local_submitter(
            list(compiled_documents().values()),
            shared,
            folder,
            parameters or {},
            runs,
            lambda line: typer.echo(line, err=err),
        )
        for s in found.starts:
            submit(
                Submission(
                    vocab.WORKFLOW_RECONCILE,
                    "reconcile",
                    REMEDIATE,
                    {"node": s.node, "check": s.check, "event": s.event},
                    (),
                )
            )
            started[s.node] = runs[-1].workflow_name if runs else "?"
    else:
        for s in found.starts:
            started[s.node] = submit_workflow(port, s, parameters or {}, by=by)
    for line in found.lines(started):
        typer.echo(line, err=err)
    return 0 if all(r.phase is Phase.Succeeded for r in runs) else 1


def reconcile_cmd(
    cluster: str | None = typer.Option(
        None, "--cluster", metavar="SPEC", help="Cluster spec (default $DSX_CLUSTER, else kube)."
    ),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Print what it would start, and why; start nothing."
    ),
    parameter: list[str] = typer.Option(
        [],
        "--parameter",
        "-p",
        metavar="KEY=VALUE",
        help="A parameter of every dsx-remediate it starts (besides node, check and event).",
    ),
    out: Path | None = typer.Option(
        None,
        "--out",
        metavar="DIR",
        help="A simulated fleet's run folder (default ./dsx-runs/reconcile-<time>).",
    ),
) -> None:
    """Start dsx-remediate for every managed node that carries the sentinel's taint with a sentinel
    condition the policy remediates, no dsx.dev/state and no remediation under way; print each tainted
    node and why it is started or left alone. Exit 0, 1 when a run on a simulated fleet did not Succeed,
    2 on bad input."""

    overrides = _overrides(parameter)
    reserved = sorted({"node", "check", "event"} & set(overrides))
    if reserved:
        raise InputError(f"-p {', '.join(reserved)}: set by the reconciler for each node")
    raise typer.Exit(reconcile_now(cluster, dry_run=dry_run, parameters=overrides, out=out))
