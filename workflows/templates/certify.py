"""``dsx-certify``: is this node group fit for production?

plan (nodes, groups, launcher, recipe criteria; every node marked pending and held for this run) ->
resolve the recipe -> keep its thresholds for the run -> each node's own sweep (in parallel: each on its
own node) -> the groups of the group label (racks, disjoint: in parallel) -> the whole set -> training
smoke run on the nodes left standing -> report, kept in a ConfigMap, and node labels -> gate (Failed,
naming the nodes, when certification failed). Stages never compete for a node's GPUs. Each stage runs
once the one before has ended, whatever its result, so a failed check never leaves nodes unlabelled.
The steps pass each other only the run's reference: the plan and outcomes live in ConfigMaps of the run.
"""

from typing import Any

from hera.workflows import DAG, Artifact, Parameter
from hera.workflows.models import ValueFrom

from steps.cluster import vocabulary as vocab
from steps.readiness.certify import (
    certification_gate,
    certify_group,
    certify_node,
    certify_smoke,
    finish_certification,
    plan_certification,
    release_certification,
    store_recipe,
)
from steps.runtime.tasks import resolve_recipe
from workflows.templates._base import GPU_IMAGE, OUTPUT_DIR, param, rank_env, step, workflow_template

__all__ = ["templates"]

_PLAN_OUTPUTS = ("nodes", "groups", "whole", "run", "launcher", "service", "accelerator", "os")
_GROUP_TIMEOUT = "6h"  # the outer bound; each group test has its own from the recipe (timeoutFactor)
_JOB_ENV = {"DSX_NAMESPACE": "{{workflow.namespace}}", **rank_env()}


def _ended(task: str) -> str:
    """``depends`` on ``task`` having ended, whatever its result (not when it was omitted)."""
    return f"({task}.Succeeded || {task}.Failed || {task}.Errored || {task}.Skipped)"


def _verdict_output() -> list[Parameter]:
    """A check's one-line verdict as an output parameter: Argo shows those in the UI, and keeps a step's
    ``outputs.result`` only when another step refers to it."""
    return [Parameter(name="verdict", value_from=ValueFrom(path=f"{OUTPUT_DIR}/params/verdict", default=""))]


def _plan_step() -> Any:
    return step(
        plan_certification,
        name="plan",
        timeout="10m",
        retries=2,
        outputs=[
            Parameter(name=name, value_from=ValueFrom(path=f"{OUTPUT_DIR}/params/{name}"))
            for name in _PLAN_OUTPUTS
        ],
        env={"DSX_NAMESPACE": "{{workflow.namespace}}", "DSX_GPU_IMAGE": GPU_IMAGE},
    )


def templates() -> list[Any]:
    """The certification WorkflowTemplate."""
    plan = _plan_step()
    resolve = step(resolve_recipe, name="resolve", timeout="5m", retries=2)
    keep = step(store_recipe, name="keep-recipe", timeout="5m", retries=2, env=dict(_JOB_ENV))
    node = step(
        certify_node, name="node-check", timeout=_GROUP_TIMEOUT, env=dict(_JOB_ENV), outputs=_verdict_output()
    )
    group = step(
        certify_group,
        name="group-check",
        timeout=_GROUP_TIMEOUT,
        env=dict(_JOB_ENV),
        outputs=_verdict_output(),
    )
    smoke = step(
        certify_smoke, name="smoke", timeout=_GROUP_TIMEOUT, env=dict(_JOB_ENV), outputs=_verdict_output()
    )
    finish = step(
        finish_certification,
        name="report",
        timeout="15m",
        retries=2,
        outputs=[Artifact(name="report", path=OUTPUT_DIR)],
        env={"DSX_NAMESPACE": "{{workflow.namespace}}"},
    )
    gate = step(certification_gate, name="gate", timeout="1m")
    release = step(
        release_certification,
        name="release",
        timeout="5m",
        retries=2,
        env={"DSX_NAMESPACE": "{{workflow.namespace}}"},
    )
    run = "{{tasks.plan.outputs.parameters.run}}"
    with (
        workflow_template(
            "dsx-certify",
            "Certify GPU nodes for production: NCCL all-reduce sweeps on each node, then on each rack, then "
            "over the whole set, then a short DDP training run, judged against the recipe's thresholds. "
            "Every node ends labelled dsx.dev/certification=passed|failed|pending (pending: not certified, "
            "e.g. its group failed without naming a member); the report (JSON, Markdown) is kept in the "
            "ConfigMap dsx-report-<workflow name>. The workflow fails when any node is not certified.",
            "certify",
            [
                param(
                    "nodes",
                    "Label selector of the nodes to certify; empty: every managed node with GPUs.",
                    "",
                ),
                param(
                    "group-label",
                    "Node label whose values form the multi-node groups (racks, blocks).",
                    vocab.LABEL_RACK,
                ),
                param(
                    "launcher",
                    "Where group tests run: job (Indexed Jobs on the nodes), local (processes in the step's "
                    "pod, for simulated fleets), auto (local on a simulated fleet, else job).",
                    "auto",
                    enum=["auto", "job", "local"],
                ),
                param(
                    "accelerator",
                    "Recipe accelerator; auto reads nvidia.com/gpu.product from the nodes.",
                    "auto",
                    enum=["auto", "h100", "h200", "b200", "gb200", "a100", "cpu"],
                ),
                param(
                    "service",
                    "Recipe service (where the cluster runs); auto: local for local runs, else any.",
                    "auto",
                    enum=["auto", "any", "eks", "gke", "aks", "oke", "bare-metal", "local"],
                ),
                param(
                    "os",
                    "Recipe OS; auto reads the nodes' OS image.",
                    "auto",
                    enum=["auto", "any", "ubuntu", "rhel"],
                ),
                param(
                    "min-bytes",
                    "Smallest all-reduce message (e.g. 1MiB); auto: 64KiB local, 1MiB job.",
                    "auto",
                ),
                param(
                    "max-bytes", "Largest all-reduce message (e.g. 8GiB); auto: 4MiB local, 8GiB job.", "auto"
                ),
                param("iters", "Timed iterations per message size.", "20"),
            ],
            on_exit="exit",
        ) as wt,
        DAG(name="certify"),
    ):
        plan(
            name="plan",
            arguments={
                "selector": "{{workflow.parameters.nodes}}",
                "group_label": "{{workflow.parameters.group-label}}",
                "launcher": "{{workflow.parameters.launcher}}",
                "accelerator": "{{workflow.parameters.accelerator}}",
                "service": "{{workflow.parameters.service}}",
                "os": "{{workflow.parameters.os}}",
                "min_bytes": "{{workflow.parameters.min-bytes}}",
                "max_bytes": "{{workflow.parameters.max-bytes}}",
                "iters": "{{workflow.parameters.iters}}",
                "workflow_name": "{{workflow.name}}",
                "workflow_uid": "{{workflow.uid}}",
            },
        )
        resolve(
            name="resolve",
            depends="plan",
            arguments={
                "service": "{{tasks.plan.outputs.parameters.service}}",
                "accelerator": "{{tasks.plan.outputs.parameters.accelerator}}",
                "os": "{{tasks.plan.outputs.parameters.os}}",
                "intent": "training",
            },
        )
        keep(
            name="keep-recipe",
            depends="resolve",
            arguments={"run": run, "recipe": "{{tasks.resolve.outputs.result}}"},
        )
        node(
            name="node-check",
            depends="keep-recipe",
            with_param="{{tasks.plan.outputs.parameters.nodes}}",
            arguments={"node": "{{item}}", "run": run},
        )
        group(
            name="group-check",
            depends=_ended("node-check"),
            with_param="{{tasks.plan.outputs.parameters.groups}}",
            arguments={"group": "{{item}}", "run": run},
        )
        group(
            name="whole-check",
            depends=_ended("group-check"),
            when="'{{tasks.plan.outputs.parameters.whole}}' != ''",
            arguments={"group": "{{tasks.plan.outputs.parameters.whole}}", "run": run},
        )
        smoke(name="smoke", depends=_ended("whole-check"), arguments={"run": run})
        finish(name="report", depends=_ended("smoke"), arguments={"run": run})
        gate(name="gate", depends="report", arguments={"summary": "{{tasks.report.outputs.result}}"})
    with wt, DAG(name="exit"):
        release(
            name="release",
            arguments={"workflow_name": "{{workflow.name}}", "workflow_uid": "{{workflow.uid}}"},
        )
    return [wt]
