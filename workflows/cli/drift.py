"""``dsx snapshot`` and ``dsx drift``: what the live cluster runs, and where it departs from the recipe."""

from __future__ import annotations

import enum
from collections import Counter
from pathlib import Path
from typing import Any

import typer

from steps.cluster import connect
from steps.errors import InputError
from steps.runtime.drift import DriftReport, compare
from steps.runtime.names import SCOPES
from steps.runtime.snapshot import Snapshot, read_snapshot, take_snapshot
from workflows.cli.output import OUTPUT_OPTION, OutputFormat, emit, print_table
from workflows.cli.output import console as output_console
from workflows.cli.recipe import (
    ACCELERATOR,
    INTENT,
    NODES,
    OS,
    PLATFORM,
    RECIPES,
    SERVICE,
    criteria_flags,
    recipe_from_file_or_flags,
)

__all__ = ["FailOn", "Scope", "register"]

_TABLE_ROWS = 50


# built from SCOPES, the one list of them, so mypy cannot name its members
Scope = enum.StrEnum("Scope", [(scope, scope) for scope in SCOPES])  # type: ignore[misc]
"""What ``dsx drift`` compares: the drift scopes of :data:`steps.runtime.names.SCOPES`, the default first."""


class FailOn(enum.StrEnum):
    """The least severe finding that makes ``dsx drift`` exit 1."""

    warning = "warning"
    critical = "critical"


def _snapshot_table(snapshot: Snapshot) -> None:
    print_table(
        f"nodes of {snapshot.cluster or 'the cluster'} ({len(snapshot.nodes)})",
        ["count", "os", "kernel", "kubelet", "runtime", "gpu", "gpus", "driver", "cuda"],
        [
            [count, *key]
            for key, count in sorted(
                Counter(
                    (
                        n.osImage,
                        n.kernelVersion,
                        n.kubeletVersion,
                        n.containerRuntimeVersion,
                        n.gpuProduct or "-",
                        n.gpuCount,
                        n.driverVersion or "-",
                        n.cudaVersion or "-",
                    )
                    for n in snapshot.nodes
                ).items(),
                key=lambda item: (-item[1], str(item[0])),
            )
        ],
    )
    print_table(
        f"Helm releases ({len(snapshot.releases)})",
        ["namespace", "release", "chart", "version", "status"],
        [[r.namespace, r.name, r.chart, r.version, r.status] for r in snapshot.releases],
    )


def _report_table(report: DriftReport) -> None:
    console = output_console()
    checked = report.checked
    console.print(
        f"recipe {report.recipeDigest}: {checked['nodes']} nodes ({checked['gpuNodes']} with GPUs) and "
        f"{checked['components']} components checked"
    )
    if not report.drifted:
        console.print("[green]no drift[/green]")
        return
    console.print(
        f"[red]drift[/red]: {report.summary['critical']} critical, {report.summary['warning']} warning; "
        f"{len(report.driftedNodes)} nodes, {len(report.driftedComponents)} components"
    )
    shown = report.findings[:_TABLE_ROWS]
    print_table(
        "findings",
        ["severity", "scope", "subject", "field", "expected", "actual"],
        [[f.severity, f.scope, f.subject, f.field, f.expected, f.actual] for f in shown],
    )
    if len(report.findings) > len(shown):
        console.print(f"... {len(report.findings) - len(shown)} more findings (-o json for all)")


def register(app: typer.Typer) -> None:
    """Add the ``snapshot`` and ``drift`` commands."""

    @app.command("snapshot")
    def snapshot_cmd(
        cluster: str = typer.Option(
            ..., "--cluster", help="Cluster to read: a kubeconfig context or sim:..."
        ),
        selector: str | None = typer.Option(
            None, "--selector", "-l", help="Only nodes matching this selector."
        ),
        output: OutputFormat = OUTPUT_OPTION,
    ) -> None:
        """Read node software, GPU Feature Discovery labels, Helm releases and images from a cluster."""

        snapshot = take_snapshot(connect(cluster), cluster=cluster, selector=selector)
        emit(snapshot, output, _snapshot_table)

    @app.command("drift")
    def drift_cmd(
        snapshot_file: Path | None = typer.Option(
            None, "--snapshot", help="A snapshot written by dsx snapshot (JSON or YAML)."
        ),
        cluster: str | None = typer.Option(None, "--cluster", help="Read the cluster now instead."),
        selector: str | None = typer.Option(
            None, "--selector", "-l", help="Only nodes matching this selector."
        ),
        recipes: Path | None = RECIPES,
        service: str = SERVICE,
        accelerator: str = ACCELERATOR,
        os_: str = OS,
        intent: str = INTENT,
        platform: str = PLATFORM,
        nodes: str = NODES,
        recipe_file: Path | None = typer.Option(
            None, "--recipe", help="Compare with this resolved recipe (RecipeResult) instead of resolving."
        ),
        scope: Scope = typer.Option(next(iter(Scope)), "--scope", help="Compare nodes, components or both."),
        fail_on: FailOn = typer.Option(FailOn.warning, "--fail-on", help="Least severity that exits 1."),
        output: OutputFormat = OUTPUT_OPTION,
    ) -> None:
        """Compare the cluster with the recipe per node and per component; exit 1 when it drifted."""

        if (snapshot_file is None) == (cluster is None):
            raise InputError("dsx drift: give exactly one of --snapshot FILE and --cluster SPEC")
        recipe = recipe_from_file_or_flags(
            recipe_file, recipes, **criteria_flags(service, accelerator, os_, intent, platform, nodes)
        )
        if snapshot_file is not None:
            snapshot = read_snapshot(snapshot_file)
        else:
            assert cluster is not None
            snapshot = take_snapshot(connect(cluster), cluster=cluster, selector=selector)
        scopes: Any = SCOPES[scope.value]
        report = compare(snapshot, recipe, scopes)
        emit(report, output, _report_table)
        if report.fails("critical" if fail_on is FailOn.critical else "warning"):
            raise typer.Exit(1)
