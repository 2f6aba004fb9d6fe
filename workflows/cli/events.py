"""``dsx events play``: Argo Events on this machine, the EventSources and Sensors dsx compiles."""

from __future__ import annotations

import os
import time
from pathlib import Path

import typer

from steps.cluster import vocabulary as vocab
from steps.durations import parse_duration
from steps.errors import InputError
from workflows.cli._signals import sigterm_as_interrupt
from workflows.compiler import compiled_documents
from workflows.eventplay import parse_injection, play

DEFAULT_FLEET = "sim:nodes=4,gpu=h100,racks=2,repair-delay=3"
"""The fleet played on when none is given: small, with a quick simulated repair."""


def _overrides(pairs: list[str]) -> dict[str, str]:
    """``-p KEY=VALUE`` pairs as a mapping."""

    overrides = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InputError(f"-p {pair!r}: expected KEY=VALUE")
        overrides[key] = value
    return overrides


def _folder(out: Path | None) -> Path:
    """The run folder: ``--out``, which must be new or empty, or a fresh one under ``dsx-runs``."""

    folder = out or Path("dsx-runs") / f"events-{time.strftime('%Y%m%d-%H%M%S')}"
    if folder.exists() and not folder.is_dir():
        raise InputError(f"--out {folder}: exists and is not a folder")
    if folder.exists() and any(folder.iterdir()):
        raise InputError(f"--out {folder}: the folder exists and is not empty")
    return folder


def play_cmd(
    cluster: str | None = typer.Option(
        None,
        "--cluster",
        metavar="SPEC",
        help=f"The cluster watched (default $DSX_CLUSTER, else the simulated fleet {DEFAULT_FLEET}).",
    ),
    agent: bool = typer.Option(
        False, "--agent", help="Run the sentinel agent of every node too (a simulated fleet's)."
    ),
    inject: list[str] = typer.Option(
        [],
        "--inject",
        metavar="NODE:FAULT[@SECONDS]",
        help="Put a fault into a simulated node that many seconds in (repeatable): node-02:xid=79@5.",
    ),
    duration: str = typer.Option(
        "10m", "--for", metavar="DURATION", help="The longest it plays (a Go duration: 90s, 10m)."
    ),
    until_done: bool = typer.Option(
        False,
        "--until-done",
        help="End once every injection happened, a Sensor started a workflow and none is running.",
    ),
    interval: float = typer.Option(
        1.0, "--interval", min=0.1, help="Seconds between two polls of the cluster and two agent passes."
    ),
    parameter: list[str] = typer.Option(
        [],
        "--parameter",
        "-p",
        metavar="KEY=VALUE",
        help="A parameter of every workflow the Sensors submit (where it declares it), e.g. iters=2.",
    ),
    out: Path | None = typer.Option(
        None,
        "--out",
        metavar="DIR",
        help="Folder for the fleet and every run (default ./dsx-runs/events-<time>).",
    ),
) -> None:
    """Watch a cluster with dsx's compiled EventSources, apply their Sensors' filters, and run each
    workflow a trigger submits with the local runner, rate limits included. Exit 0 when every workflow
    started Succeeded (and one was started), 1 otherwise, 2 on bad input.

    However the play ends (--for, --until-done, Ctrl-C, SIGTERM), a workflow still running is stopped as
    argo stop does (its exit handler runs, its workflow.json is kept) and reported; a second Ctrl-C or
    SIGTERM terminates it. Ctrl-C exits 130, SIGTERM 143."""

    try:
        seconds = parse_duration(duration)
    except ValueError:
        raise InputError(f"--for {duration!r}: not a duration (90s, 10m)") from None
    if seconds <= 0:
        raise InputError(f"--for {duration!r}: must be longer than nothing (90s, 10m)")
    with sigterm_as_interrupt():
        result = play(
            list(compiled_documents().values()),
            cluster or os.environ.get(vocab.ENV_CLUSTER) or DEFAULT_FLEET,
            _folder(out),
            agent=agent,
            injections=[parse_injection(text) for text in inject],
            duration=seconds,
            interval=interval,
            until_done=until_done,
            overrides=_overrides(parameter),
            report=lambda line: typer.echo(f"{time.strftime('%H:%M:%S')}  {line}"),
        )
    for run in result.runs:
        stopped = "  (stopped when the play ended)" if run.workflow_name in result.stopped else ""
        typer.echo(f"{run.workflow_name}  {run.phase}  {run.run_dir}{stopped}")
    if not result.runs:
        typer.echo("no workflow was started", err=True)
    raise typer.Exit(result.exit_code)


def register(app: typer.Typer) -> None:
    """Add the ``events`` command group."""
    group = typer.Typer(
        name="events",
        help="Argo Events on this machine: dsx's EventSources and Sensors against a cluster.",
        no_args_is_help=True,
    )
    group.command("play")(play_cmd)
    app.add_typer(group, name="events")
