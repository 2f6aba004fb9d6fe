"""``dsx certify report``: show a certification report as a table, JSON, YAML or Markdown."""

from __future__ import annotations

import enum
import sys
from pathlib import Path
from typing import Any

import typer

from steps.readiness.report import load_report, recheck_report, render_markdown
from workflows.cli.nccl import print_verdicts
from workflows.cli.output import OutputFormat, emit, print_table, to_plain

__all__ = ["register"]

certify_app = typer.Typer(name="certify", help="Readiness certification.", no_args_is_help=True)


class ReportFormat(enum.StrEnum):
    """Output formats of ``dsx certify report``: the usual three and Markdown (as the Argo UI shows)."""

    table = "table"
    json = "json"
    yaml = "yaml"
    markdown = "markdown"


@certify_app.command("report")
def report_cmd(
    file: Path = typer.Argument(..., help="report.json written by a certification run."),
    output: ReportFormat = typer.Option(ReportFormat.table, "--output", "-o", help="Output format."),
) -> None:
    """Show a certification report: nodes, verdicts, evidence.

    The status shown, and the exit code, come from the report's verdicts and node results: 0 when
    every verdict passed (and the report agrees), 1 when it failed or disagrees with its own verdicts
    (each disagreement named on stderr), 2 when the file is not a report.
    """

    report, disagreements = recheck_report(load_report(file))
    for problem in disagreements:
        typer.secho(f"warning: {file}: {problem}; shown as {report.status}", fg=typer.colors.YELLOW, err=True)
    if output is ReportFormat.markdown:
        sys.stdout.write(render_markdown(report))
    else:

        def table(_: Any) -> None:
            typer.echo(f"certification {report.status.upper()}: {report.summary}")
            for label in report.injected:
                typer.echo(f"injected: {label}")
            print_table(
                "nodes",
                ["node", "status", "reasons"],
                [[n.name, n.status, "; ".join(n.reasons)] for n in report.nodes],
            )

            print_verdicts(report.verdicts)

        data = to_plain(report)
        if disagreements:
            data["disagreements"] = disagreements
        emit(data, OutputFormat(output.value), table)
    raise typer.Exit(0 if report.status == "passed" else 1)


def register(app: typer.Typer) -> None:
    """Add the ``certify`` command group."""
    app.add_typer(certify_app, name="certify")
