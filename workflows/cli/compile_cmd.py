"""``dsx compile``: write every workflow as Argo YAML, or check the committed files are current."""

from __future__ import annotations

from pathlib import Path

import typer

from workflows import compiler
from workflows.cli.output import check_out_dir


def register(app: typer.Typer) -> None:
    """Add the ``compile`` command."""

    @app.command("compile")
    def compile_cmd(
        out: Path = typer.Option(Path("charts/dsx/files"), "--out", help="Folder for the compiled YAML."),
        check_only: bool = typer.Option(
            False, "--check", help="Write nothing; exit 1 naming every stale or missing file."
        ),
    ) -> None:
        """Compile every dsx WorkflowTemplate, CronWorkflow, EventSource and Sensor to YAML."""

        check_out_dir(out, "--out")
        files = compiler.compile_objects()
        if check_only:
            problems = compiler.check(files, out)
            for problem in problems:
                typer.echo(problem, err=True)
            if problems:
                raise typer.Exit(1)
            typer.echo(f"{len(files)} files in {out} are up to date")
            return
        changed = compiler.write(files, out)
        for path in changed:
            typer.echo(f"wrote {path}" if path.exists() else f"removed {path}")
        typer.echo(f"{len(files)} files in {out} ({len(changed)} changed)")
