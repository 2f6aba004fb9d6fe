"""The runtime workflows: ``dsx-recipe``, ``dsx-bundle`` and the daily ``dsx-drift`` CronWorkflow.

``dsx-recipe``: resolve the recipe for the criteria; the recipe and its dependency graph (dot, mermaid,
JSON) are the ``recipe`` artifact. ``dsx-bundle``: resolve and render a Helm, Argo CD or Flux bundle,
the ``bundle`` artifact. ``dsx-drift``: every day, snapshot the cluster, compare it with the recipe,
keep ``snapshot.json`` and ``drift.json`` as the ``drift`` artifact, label drifted nodes, and end Failed
when the cluster drifted.

Artifacts are extra: a default Argo install has no artifact repository, and the chart then removes every
output artifact. What each workflow's user needs stays in the Workflow itself: the result of
``resolve-recipe`` and ``bundle-recipe`` is the entry template's output parameter (Argo keeps a step's
``outputs.result`` only when something references it), and drift ends in its labels and its gate.

Every template and task is named after its step function in ``steps.runtime.tasks``.
"""

from collections.abc import Sequence
from typing import Any

from hera.workflows import DAG, Artifact, CronWorkflow, Parameter, Task, Workflow
from hera.workflows.models import ValueFrom

from steps.cluster import vocabulary as vocab
from steps.runtime import tasks as runtime
from steps.runtime.bundle import BundleFormat
from steps.runtime.criteria import ALLOWED, ANY, FIELDS
from steps.runtime.drift import SCOPES
from workflows.templates._base import (
    DESCRIPTION_ANNOTATION,
    OUTPUT_DIR,
    PART_OF,
    param,
    step,
    workflow_spec,
    workflow_template,
)

__all__ = ["DRIFT_LABEL", "templates"]

DRIFT_LABEL = vocab.LABEL_DRIFT
"""Label put on nodes that drifted from the recipe (``true``), removed when they conform again."""

_DESCRIPTIONS = {
    "service": "Where the cluster runs.",
    "accelerator": "GPU of the nodes (cpu: none).",
    "os": "Operating system of the nodes.",
    "intent": "What the cluster is for.",
    "platform": "Platform on top (kubeflow adds Kubeflow Trainer).",
    "nodes": "Number of nodes (selects multi-node overlays), or any.",
}
"""What the Argo UI says of each recipe criterion (:data:`steps.runtime.criteria.FIELDS`)."""


def _criteria_params() -> list[Parameter]:
    """A parameter per recipe criterion, ``any`` by default, with its allowed values as the enum."""
    return [
        param(name, _DESCRIPTIONS[name], ANY, enum=[ANY, *ALLOWED[name]] if name in ALLOWED else None)
        for name in FIELDS
    ]


def _criteria_arguments(wt: Workflow) -> dict[str, Parameter]:
    """The step's recipe criteria, each from the workflow parameter of the same name."""
    return {name: wt.get_parameter(name) for name in FIELDS}


def _result_of(task: Task, name: str, description: str) -> Parameter:
    """An output parameter of the entry DAG holding ``task``'s result, so that Argo keeps the result and
    shows it on the Workflow (the only copy when there is no artifact repository)."""
    return Parameter(name=name, description=description, value_from=ValueFrom(parameter=task.result))


def _resolving_template(
    fn: Any, name: str, description: str, output: str, result: str, params: Sequence[Parameter] = ()
) -> Any:
    """A workflow template of one step that resolves the recipe from the criteria and ``params``; the
    step's folder ``output`` is its artifact, and its result the DAG's output ``output``."""
    resolving = step(
        fn, timeout="5m", retries=2, outputs=[Artifact(name=output, path=f"{OUTPUT_DIR}/{output}")]
    )
    with (
        workflow_template(name, description, "main", [*params, *_criteria_params()]) as wt,
        DAG(name="main") as main,
    ):
        task = resolving(
            arguments={
                **{str(p.name).replace("-", "_"): wt.get_parameter(str(p.name)) for p in params},
                **_criteria_arguments(wt),
            },
        )
        main.outputs = [_result_of(task, output, result)]
    return wt


def _recipe_template() -> Any:
    return _resolving_template(
        runtime.resolve_recipe,
        vocab.WORKFLOW_RECIPE,
        "Resolve the runtime recipe for a cluster: which components, at which pinned versions, in which "
        "order. The result lists the digest, order and versions; the 'recipe' artifact holds the "
        "resolved recipe (recipe.yaml) and its dependency graph (graph.dot, graph.mmd, graph.json).",
        "recipe",
        "Digest, order, tiers and pinned versions (JSON).",
    )


def _bundle_template() -> Any:
    return _resolving_template(
        runtime.bundle_recipe,
        vocab.WORKFLOW_BUNDLE,
        "Resolve the runtime recipe and render it as a bundle for a GitOps repository: Helm (install "
        "script), Argo CD (app of apps, sync waves by tier) or Flux (HelmReleases with dependsOn). "
        "The 'bundle' artifact verifies with sha256sum -c checksums.txt.",
        "bundle",
        "Digest, format, file count, checksums.txt's sha256.",
        [
            param("format", "Bundle format.", BundleFormat.helm, enum=[f.value for f in BundleFormat]),
            param("repo-url", "Git repository the bundle is committed to (required for argocd).", ""),
            param("revision", "Git revision Argo CD tracks.", "main"),
            param("repo-path", "Folder of the bundle inside that repository.", "."),
        ],
    )


def _drift_cron() -> Any:
    detect_drift = step(
        runtime.detect_drift,
        timeout="30m",
        retries=2,
        outputs=[Artifact(name="drift", path=f"{OUTPUT_DIR}/drift")],
        # Namespaces whose Helm release Secrets the snapshot reads; the chart sets them
        # (drift.helmNamespaces). Empty: every namespace.
        env={vocab.ENV_HELM_NAMESPACES: ""},
    )
    gate = step(runtime.gate, timeout="1m")
    with (
        CronWorkflow(
            name=vocab.WORKFLOW_DRIFT,
            schedules=["0 6 * * *"],
            concurrency_policy="Forbid",
            starting_deadline_seconds=3600,
            successful_jobs_history_limit=7,
            failed_jobs_history_limit=7,
            entrypoint="main",
            annotations={
                DESCRIPTION_ANNOTATION: "Every day at 06:00: snapshot the cluster (node software, GPU "
                "Feature Discovery labels, Helm releases, images) and compare it with the runtime recipe. "
                f"The 'drift' artifact holds snapshot.json and drift.json; drifted nodes get {DRIFT_LABEL}="
                "true; the workflow ends Failed when anything drifted."
            },
            labels=dict(PART_OF),
            arguments=[
                param("scope", "What to compare.", "all", enum=list(SCOPES)),
                param("label", "Node label marking drifted nodes; empty: label nothing.", DRIFT_LABEL),
                *_criteria_params(),
            ],
            **workflow_spec(vocab.WORKFLOW_DRIFT),
        ) as cron,
        DAG(name="main"),
    ):
        checked = detect_drift(
            arguments={
                "scope": cron.get_parameter("scope"),
                "label": cron.get_parameter("label"),
                **_criteria_arguments(cron),
            },
        )
        checked >> gate(arguments={"summary": checked.result})
    return cron


def templates() -> list[Any]:
    """The runtime part's WorkflowTemplates and CronWorkflow."""
    return [_recipe_template(), _bundle_template(), _drift_cron()]
