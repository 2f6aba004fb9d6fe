"""``dsx recipe resolve|graph|list``: which components, at which versions, in which order.

Also the options every runtime command shares (``--recipes`` and the criteria flags).
"""

from __future__ import annotations

import enum
import json
import sys
from pathlib import Path
from typing import Any

import typer

from steps.errors import InputError
from steps.runtime import graph
from steps.runtime.catalogue import Catalogue, load_catalogue
from steps.runtime.criteria import Criteria, parse_criteria
from steps.runtime.names import ALLOWED, ANY, FIELDS
from steps.runtime.recipefile import read_recipe
from steps.runtime.resolve import RecipeResult, resolve
from workflows.cli.output import OUTPUT_OPTION, OutputFormat, emit, print_table
from workflows.cli.output import console as output_console

__all__ = [
    "ACCELERATOR",
    "INTENT",
    "NODES",
    "OS",
    "PLATFORM",
    "RECIPES",
    "SERVICE",
    "GraphFormat",
    "criteria_flags",
    "criteria_from_flags",
    "recipe_from_file_or_flags",
    "register",
    "resolve_from_flags",
]

_ANY = ANY
RECIPES = typer.Option(
    None,
    "--recipes",
    help="Catalogue folder (registry.yaml, overlays/, components/); default: the packaged one.",
)


def _criteria_option(field: str) -> Any:
    return typer.Option(_ANY, f"--{field}", help=f"{', '.join(ALLOWED[field])} or {_ANY}.")


SERVICE = _criteria_option("service")
ACCELERATOR = _criteria_option("accelerator")
OS = _criteria_option("os")
INTENT = _criteria_option("intent")
PLATFORM = _criteria_option("platform")
NODES = typer.Option(_ANY, "--nodes", help="Number of nodes, or any.")


def criteria_from_flags(**flags: Any) -> Criteria:
    """Criteria from the CLI flags; an unknown value is an error naming the flag and allowed values."""

    return parse_criteria(flags, "--")


def criteria_flags(
    service: str, accelerator: str, os_: str, intent: str, platform: str, nodes: str
) -> dict[str, str]:
    """The criteria flags of a command, named as the criteria are (``--os`` arrives as ``os_``)."""
    return dict(zip(FIELDS, (service, accelerator, os_, intent, platform, nodes), strict=True))


def resolve_from_flags(recipes: Path | None, **flags: Any) -> RecipeResult:
    """Load the catalogue and resolve the recipe the flags describe."""

    query = criteria_from_flags(**flags)
    return resolve(load_catalogue(recipes), query)


def recipe_from_file_or_flags(recipe_file: Path | None, recipes: Path | None, **flags: Any) -> RecipeResult:
    """The resolved recipe in ``recipe_file`` (``--recipe``), else the one the criteria flags describe.

    Raises:
        InputError: ``--recipe`` given together with ``--recipes`` or a criteria flag: the file's recipe
            was resolved already, so those flags would be ignored without a word.
    """
    if recipe_file is not None:
        given = [f"--{name} {value}" for name, value in flags.items() if value != _ANY]
        if recipes is not None:
            given.insert(0, f"--recipes {recipes}")
        if given:
            raise InputError(
                f"--recipe {recipe_file} and {', '.join(given)} cannot be used together: the file holds "
                "a recipe resolved already; drop one"
            )

        return read_recipe(recipe_file)
    return resolve_from_flags(recipes, **flags)


class GraphFormat(enum.StrEnum):
    """Output formats of ``dsx recipe graph``."""

    table = "table"
    json = "json"
    yaml = "yaml"
    dot = "dot"
    mermaid = "mermaid"


def _print_result(result: RecipeResult) -> None:
    console = output_console()
    criteria = ", ".join(f"{k}={v}" for k, v in result.criteria.items())
    console.print(f"recipe [bold]{result.digest}[/bold]")
    console.print(f"criteria: {criteria}")
    console.print(f"overlays: {' -> '.join(o.name for o in result.appliedOverlays)}")
    print_table(
        "components in deployment order",
        ["tier", "component", "chart", "version", "namespace", "depends on"],
        [
            [c.tier, c.name, c.chart_ref, c.version, c.namespace, ", ".join(c.dependsOn) or "-"]
            for c in result.components
        ],
    )


def resolve_cmd(
    recipes: Path | None = RECIPES,
    service: str = SERVICE,
    accelerator: str = ACCELERATOR,
    os_: str = OS,
    intent: str = INTENT,
    platform: str = PLATFORM,
    nodes: str = NODES,
    output: OutputFormat = OUTPUT_OPTION,
) -> None:
    """Resolve the recipe for the criteria: components, pinned versions, order, overlays, digest."""
    result = resolve_from_flags(recipes, **criteria_flags(service, accelerator, os_, intent, platform, nodes))
    emit(result, output, _print_result)


def _graph_table(data: dict[str, Any]) -> None:
    print_table(
        "dependency graph",
        ["tier", "component", "version", "depends on"],
        [[n["tier"], n["name"], n["version"], ", ".join(n["dependsOn"]) or "-"] for n in data["nodes"]],
    )


def graph_cmd(
    recipes: Path | None = RECIPES,
    service: str = SERVICE,
    accelerator: str = ACCELERATOR,
    os_: str = OS,
    intent: str = INTENT,
    platform: str = PLATFORM,
    nodes: str = NODES,
    output: GraphFormat = typer.Option(GraphFormat.table, "--output", "-o", help="Output format."),
) -> None:
    """Show the dependency graph of the resolved recipe (dot and mermaid for drawings)."""

    result = resolve_from_flags(recipes, **criteria_flags(service, accelerator, os_, intent, platform, nodes))
    dependency_graph = graph.DependencyGraph(
        {c.name: c.dependsOn for c in result.components}, {c.name: c.version for c in result.components}
    )
    if output is GraphFormat.dot:
        sys.stdout.write(graph.to_dot(dependency_graph, result.tiers))
    elif output is GraphFormat.mermaid:
        sys.stdout.write(graph.to_mermaid(dependency_graph, result.tiers))
    else:
        data = json.loads(graph.to_json(dependency_graph, result.deploymentOrder, result.tiers))
        emit(data, OutputFormat(output.value), _graph_table)


def _list_components(catalogue: Catalogue, output: OutputFormat) -> None:
    rows = [
        {
            "name": name,
            "chart": spec.chart,
            "repository": spec.repository,
            "defaultVersion": spec.defaultVersion,
            "namespace": spec.namespace,
            "dependsOn": list(spec.dependsOn),
        }
        for name, spec in sorted(catalogue.components.items())
    ]
    emit(
        rows,
        output,
        lambda d: print_table(
            "components",
            ["component", "chart", "repository", "default version", "namespace"],
            [[r["name"], r["chart"], r["repository"], r["defaultVersion"], r["namespace"]] for r in d],
        ),
    )


def _overlays_table(data: list[dict[str, Any]]) -> None:
    print_table(
        "overlays",
        ["overlay", "specificity", "criteria", "base", "file"],
        [
            [
                r["name"] + (" (abstract)" if r["abstract"] else ""),
                r["specificity"],
                ", ".join(f"{k}={v}" for k, v in r["criteria"].items()) or "(all)",
                r["base"] or "-",
                r["file"],
            ]
            for r in data
        ],
    )


def _list_overlays(catalogue: Catalogue, output: OutputFormat) -> None:
    overlays = sorted(catalogue.overlays.values(), key=lambda o: (o.specificity, o.name))
    data = [
        {
            "name": o.name,
            "specificity": o.specificity,
            "criteria": o.criteria.pinned(),
            "base": o.base,
            "abstract": o.abstract,
            "file": o.file,
            "components": [r.name for r in o.componentRefs],
            "description": o.description,
        }
        for o in overlays
    ]
    emit(data, output, _overlays_table)


def list_cmd(
    recipes: Path | None = RECIPES,
    components: bool = typer.Option(False, "--components", help="List the registry's components instead."),
    output: OutputFormat = OUTPUT_OPTION,
) -> None:
    """List the catalogue's overlays (criteria, specificity, base) or its components."""

    catalogue = load_catalogue(recipes)
    if components:
        _list_components(catalogue, output)
    else:
        _list_overlays(catalogue, output)


def register(app: typer.Typer) -> None:
    """Add the ``recipe`` command group."""
    recipe_app = typer.Typer(
        name="recipe",
        help="Resolve runtime recipes: pinned components, their dependency graph, the catalogue.",
        no_args_is_help=True,
    )
    recipe_app.command("resolve")(resolve_cmd)
    recipe_app.command("graph")(graph_cmd)
    recipe_app.command("list")(list_cmd)
    app.add_typer(recipe_app, name="recipe")
