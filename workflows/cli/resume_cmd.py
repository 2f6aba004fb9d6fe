"""``dsx resume``: resume a suspended step of a local run, as ``argo resume`` resumes a Workflow's."""

from __future__ import annotations

from pathlib import Path

import typer

from steps.errors import InputError
from workflows.runner.resume import request_resume


def resume_cmd(
    run_dir: Path = typer.Argument(..., help="The run folder of the local run (dsx run --local --out)."),
    node: str = typer.Option(
        "", "--node", help="The suspend step or template to resume; default: every suspended one."
    ),
) -> None:
    """Resume a suspended step of a local run (one running under its suspend duration).

    As `argo resume` marks a Workflow's suspended nodes Succeeded, this marks the run's: the step goes
    on at once instead of waiting out its duration.
    """

    if "/" in node or "\\" in node or node in (".", ".."):
        # the name becomes a file of <run folder>/resume/: a path would write elsewhere, or nowhere
        raise InputError(f"--node {node!r}: a step or template name, not a path")
    if not run_dir.is_dir():
        typer.secho(f"error: {run_dir}: no such run folder", fg=typer.colors.RED, err=True)
        raise typer.Exit(2)
    request_resume(run_dir, node or None)
    typer.echo(f"resume asked of {node or 'every suspended step'} in {run_dir}")


def register(app: typer.Typer) -> None:
    """Add the ``resume`` command."""
    app.command("resume")(resume_cmd)
