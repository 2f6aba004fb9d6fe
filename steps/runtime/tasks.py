"""Workflow steps of the runtime part: plain functions with simple inputs and pydantic outputs.

Each runs the same under pytest, the local runner and Hera's runner in a pod; evidence files go under
``$DSX_OUTPUT_DIR`` (default ``./dsx-out``), where the workflow collects them as artifacts. This
module must not use ``from __future__ import annotations``: Hera reads the annotations.
"""

from pathlib import Path
from typing import Any

from pydantic import BaseModel

from steps.files import write_text
from steps.outputs import output_dir as _evidence
from steps.runtime import graph
from steps.runtime.bundle import CHECKSUMS, render_bundle, write_bundle
from steps.runtime.catalogue import load_catalogue
from steps.runtime.criteria import parse_criteria
from steps.runtime.names import ANY, FIELDS
from steps.runtime.resolve import RecipeResult, resolve
from steps.runtime.yamlio import dump_yaml

__all__ = [
    "BundleSummary",
    "DriftSummary",
    "RecipeSummary",
    "bundle_recipe",
    "detect_drift",
    "gate",
    "output_dir",
    "resolve_recipe",
]


class RecipeSummary(BaseModel):
    """What ``resolve_recipe`` returns: the digest, the order, the pinned versions, and the recipe's
    criteria, constraints, thresholds (what readiness judges against) and fabric (what its rank pods ask
    for to reach the fabric)."""

    digest: str
    criteria: dict[str, Any]
    constraints: dict[str, Any]
    thresholds: dict[str, Any]
    fabric: dict[str, Any]
    appliedOverlays: list[str]
    deploymentOrder: list[str]
    tiers: list[list[str]]
    versions: dict[str, str]
    files: list[str]


class BundleSummary(BaseModel):
    """What ``bundle_recipe`` returns: where the bundle is and the digest of its checksums."""

    digest: str
    format: str
    folder: str
    files: int
    checksumsSha256: str


def output_dir(*parts: str) -> Path:
    """``$DSX_OUTPUT_DIR`` (default ``dsx-out``) joined with ``parts``, created."""
    folder = _evidence("dsx-out").joinpath(*parts)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _resolve(
    service: str, accelerator: str, os_: str, intent: str, platform: str, nodes: str, recipes: str
) -> RecipeResult:
    query = parse_criteria(
        dict(zip(FIELDS, (service, accelerator, os_, intent, platform, nodes), strict=True))
    )
    return resolve(load_catalogue(Path(recipes) if recipes else None), query)


def resolve_recipe(
    service: str = ANY,
    accelerator: str = ANY,
    os: str = ANY,  # the criterion, named as on the command line
    intent: str = ANY,
    platform: str = ANY,
    nodes: str = ANY,
    recipes: str = "",
) -> RecipeSummary:
    """Resolve the recipe and write it with its dependency graph under ``$DSX_OUTPUT_DIR/recipe``.

    Files: ``recipe.yaml`` (the RecipeResult), ``graph.dot``, ``graph.mmd`` (mermaid), ``graph.json``.
    """
    result = _resolve(service, accelerator, os, intent, platform, nodes, recipes)
    folder = output_dir("recipe")
    dependency_graph = graph.DependencyGraph(
        {c.name: c.dependsOn for c in result.components}, {c.name: c.version for c in result.components}
    )
    texts = {
        "recipe.yaml": dump_yaml(result.model_dump(mode="json")),
        "graph.dot": graph.to_dot(dependency_graph, result.tiers),
        "graph.mmd": graph.to_mermaid(dependency_graph, result.tiers),
        "graph.json": graph.to_json(dependency_graph, result.deploymentOrder, result.tiers),
    }
    for name, text in texts.items():
        write_text(folder / name, text)
    return RecipeSummary(
        digest=result.digest,
        criteria=result.criteria,
        constraints=result.constraints,
        thresholds=result.thresholds,
        fabric=result.fabric,
        appliedOverlays=[o.name for o in result.appliedOverlays],
        deploymentOrder=result.deploymentOrder,
        tiers=result.tiers,
        versions={c.name: c.version for c in result.components},
        files=sorted(texts),
    )


def bundle_recipe(
    format: str = "helm",  # named as on the command line
    repo_url: str = "",
    revision: str = "main",
    repo_path: str = ".",
    service: str = ANY,
    accelerator: str = ANY,
    os: str = ANY,  # the criterion, named as on the command line
    intent: str = ANY,
    platform: str = ANY,
    nodes: str = ANY,
    recipes: str = "",
) -> BundleSummary:
    """Resolve the recipe and write its bundle to ``$DSX_OUTPUT_DIR/bundle`` (atomically, with checksums)."""
    import hashlib

    result = _resolve(service, accelerator, os, intent, platform, nodes, recipes)
    files = render_bundle(result, format, repo_url=repo_url or None, revision=revision, repo_path=repo_path)
    folder = output_dir() / "bundle"
    write_bundle(files, folder)
    return BundleSummary(
        digest=result.digest,
        format=format,
        folder=str(folder),
        files=len(files),
        checksumsSha256=hashlib.sha256(files[CHECKSUMS]).hexdigest(),
    )


class DriftSummary(BaseModel):
    """What ``detect_drift`` returns: whether the cluster drifted, where, and which nodes it labelled."""

    digest: str
    drifted: bool
    critical: int
    warning: int
    driftedNodes: list[str]
    driftedComponents: list[str]
    labelled: list[str]
    files: list[str]


def detect_drift(
    cluster: str = "",
    scope: str = "all",
    label: str = "",
    service: str = ANY,
    accelerator: str = ANY,
    os: str = ANY,  # the criterion, named as on the command line
    intent: str = ANY,
    platform: str = ANY,
    nodes: str = ANY,
    recipes: str = "",
) -> DriftSummary:
    """Snapshot the cluster, compare it with the recipe, write ``snapshot.json`` and ``drift.json``
    under ``$DSX_OUTPUT_DIR/drift``; with ``label``, set ``label=true`` on drifted nodes and remove it
    from nodes that conform again.

    Args:
        cluster: cluster spec (empty: ``DSX_CLUSTER`` or the in-cluster account).
        scope: ``all``, ``nodes`` or ``components`` (:data:`steps.runtime.drift.SCOPES`).
        label: node label key marking drifted nodes (empty: label nothing).
    """
    from steps.cluster import connect
    from steps.errors import InputError
    from steps.runtime.drift import SCOPES, compare
    from steps.runtime.snapshot import take_snapshot

    if scope not in SCOPES:
        raise InputError(f"scope: unknown value {scope!r}; allowed: {', '.join(SCOPES)}")
    result = _resolve(service, accelerator, os, intent, platform, nodes, recipes)
    port = connect(cluster or None)
    snapshot = take_snapshot(port, cluster=cluster)
    report = compare(snapshot, result, SCOPES[scope])
    folder = output_dir("drift")
    write_text(folder / "snapshot.json", snapshot.model_dump_json(indent=2) + "\n")
    write_text(folder / "drift.json", report.model_dump_json(indent=2) + "\n")
    labelled: list[str] = []
    if label and "nodes" in SCOPES[scope]:
        drifted = set(report.driftedNodes)
        for node in port.list_nodes(None):
            if node.name in drifted and node.labels.get(label) != "true":
                port.set_labels(node.name, {label: "true"})
                labelled.append(node.name)
            elif node.name not in drifted and label in node.labels:
                port.set_labels(node.name, {label: None})
    return DriftSummary(
        digest=result.digest,
        drifted=report.drifted,
        critical=report.summary["critical"],
        warning=report.summary["warning"],
        driftedNodes=report.driftedNodes,
        driftedComponents=report.driftedComponents,
        labelled=labelled,
        files=["drift.json", "snapshot.json"],
    )


def gate(summary: DriftSummary) -> str:
    """End the workflow Failed when the cluster drifted, naming the nodes and components."""
    from steps.errors import DsxError

    if not summary.drifted:
        return f"no drift from recipe {summary.digest}"
    parts = []
    if summary.driftedNodes:
        shown = ", ".join(summary.driftedNodes[:20])
        more = f" and {len(summary.driftedNodes) - 20} more" if len(summary.driftedNodes) > 20 else ""
        parts.append(f"nodes {shown}{more}")
    if summary.driftedComponents:
        parts.append(f"components {', '.join(summary.driftedComponents)}")
    raise DsxError(
        f"drift from recipe {summary.digest}: {summary.critical} critical, {summary.warning} warning; "
        + "; ".join(parts)
    )
