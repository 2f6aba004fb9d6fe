"""``dsx-certify``: is this node group fit for production?

plan (nodes, groups, launcher, recipe criteria) -> resolve the recipe's thresholds -> single-node sweeps
in parallel -> multi-node sweeps over the whole set and each rack -> training smoke run on the nodes
that passed -> report and node labels -> gate (Failed, naming the nodes, when certification failed).
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
)
from steps.runtime.tasks import resolve_recipe
from workflows.templates._base import DEFAULT_IMAGE, OUTPUT_DIR, param, step, workflow_template

__all__ = ["templates"]

_PLAN_OUTPUTS = ("nodes", "groups", "launcher", "service", "accelerator", "os")
_GROUP_TIMEOUT = "6h"  # the outer bound; each group test has its own from the recipe (timeoutFactor)


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
        env={"DSX_NAMESPACE": "{{workflow.namespace}}", "DSX_IMAGE": DEFAULT_IMAGE},
    )


def templates() -> list[Any]:
    """The certification WorkflowTemplate."""
    job_env = {"DSX_NAMESPACE": "{{workflow.namespace}}", "DSX_IMAGE": DEFAULT_IMAGE}
    plan = _plan_step()
    resolve = step(resolve_recipe, name="resolve", timeout="5m", retries=2)
    node = step(certify_node, name="node-check", timeout=_GROUP_TIMEOUT, env=job_env)
    group = step(certify_group, name="group-check", timeout=_GROUP_TIMEOUT, env=job_env)
    smoke = step(certify_smoke, name="smoke", timeout=_GROUP_TIMEOUT, env=job_env)
    finish = step(
        finish_certification,
        name="report",
        timeout="15m",
        retries=2,
        outputs=[Artifact(name="report", path=OUTPUT_DIR)],
    )
    gate = step(certification_gate, name="gate", timeout="1m")
    plan_result = "{{tasks.plan.outputs.result}}"
    recipe_result = "{{tasks.resolve.outputs.result}}"
    with (
        workflow_template(
            "dsx-certify",
            "Certify GPU nodes for production: NCCL all-reduce sweeps per node, per rack and over the "
            "whole set, then a short DDP training run, judged against the recipe's thresholds. Every "
            "node ends labelled dsx.dev/certification=passed|failed; the report (JSON, Markdown, plots) "
            "is the 'report' artifact of the report step. The workflow fails when any node fails.",
            "certify",
            [
                param("nodes", "Label selector of the nodes to certify; empty: every managed node.", ""),
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
        ) as wt,
        DAG(name="certify"),
    ):
        planned = plan(
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
        resolved = resolve(
            name="resolve",
            arguments={
                "service": "{{tasks.plan.outputs.parameters.service}}",
                "accelerator": "{{tasks.plan.outputs.parameters.accelerator}}",
                "os": "{{tasks.plan.outputs.parameters.os}}",
                "intent": "training",
            },
        )
        nodes = node(
            name="node-check",
            with_param="{{tasks.plan.outputs.parameters.nodes}}",
            arguments={"node": "{{item}}", "plan": plan_result, "recipe": recipe_result},
        )
        groups = group(
            name="group-check",
            with_param="{{tasks.plan.outputs.parameters.groups}}",
            arguments={"group": "{{item}}", "plan": plan_result, "recipe": recipe_result},
        )
        # The checks' full outcomes travel in ConfigMaps (steps.readiness.outcomes), not as parameters:
        # aggregated over a fleet they would outgrow what a step's inputs can carry.
        smoked = smoke(name="smoke", arguments={"plan": plan_result, "recipe": recipe_result})
        reported = finish(name="report", arguments={"plan": plan_result, "recipe": recipe_result})
        gated = gate(name="gate", arguments={"summary": "{{tasks.report.outputs.result}}"})
        planned >> resolved >> [nodes, groups]
        [nodes, groups] >> smoked >> reported >> gated
    return [wt]
