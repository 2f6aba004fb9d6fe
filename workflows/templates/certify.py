"""``dsx-certify``: is this node group fit for production?

plan (nodes, groups, launcher, recipe criteria; every node marked pending and held for this run) ->
resolve-recipe -> keep-recipe (its thresholds, for the run) -> node-check, each node's own sweep (in
parallel: each on its own node) -> group-check, the groups of the group label (racks, disjoint: in
parallel) -> whole-check, the whole set -> smoke-check, a training smoke run on the nodes left standing
-> report, kept in a ConfigMap, and node labels -> gate (Failed, naming the nodes, when certification
failed); release, the exit handler, lets go of the nodes however the run ended. Stages never compete
for a node's GPUs. Each stage runs once the one before has ended, whatever its result, so a failed check
never leaves nodes unlabelled. The steps pass each other only the run's reference: the plan and outcomes
live in ConfigMaps of the run.
"""

from typing import Any

from hera.workflows import DAG, Artifact, Parameter, TaskResult

from steps.cluster import vocabulary as vocab
from steps.readiness import certify as readiness
from steps.readiness.bisect.evidence import P_MIN
from steps.readiness.certify import AUTO, LAUNCHERS, PLAN_OUTPUTS, RECIPE_INTENT
from steps.runtime import tasks as runtime
from steps.runtime.criteria import ALLOWED, ANY
from workflows.templates._base import (
    GPU_IMAGE,
    ITEM,
    OUTPUT_DIR,
    WORKFLOW_NAME,
    WORKFLOW_NAMESPACE,
    WORKFLOW_UID,
    param,
    param_outputs,
    rank_env,
    step,
    workflow_template,
)
from workflows.templates.bisect import STAGE_ENDED, bisect_stage, bisect_targets_step

__all__ = ["templates"]

_GROUP_TIMEOUT = "6h"  # the outer bound; each group test has its own from the recipe (timeoutFactor)
_JOB_ENV = {vocab.ENV_NAMESPACE: WORKFLOW_NAMESPACE, **rank_env()}
_ENDED = TaskResult.succeeded | TaskResult.failed | TaskResult.errored | TaskResult.skipped
"""A stage runs once the one before has ended, whatever its result (not when it was omitted)."""


def _check_step(check: Any) -> Any:
    """A check's step: it runs its tests on the nodes (Jobs in the run's namespace), within the outer
    bound, and gives its one-line verdict as an output parameter (Argo shows those in the UI, and keeps a
    step's ``outputs.result`` only when another step refers to it)."""
    return step(
        check, timeout=_GROUP_TIMEOUT, env=dict(_JOB_ENV), outputs=param_outputs("verdict", default="")
    )


def _plan_step() -> Any:
    return step(
        readiness.plan,
        timeout="10m",
        retries=2,
        outputs=param_outputs(*PLAN_OUTPUTS),
        env={vocab.ENV_NAMESPACE: WORKFLOW_NAMESPACE, vocab.ENV_GPU_IMAGE: GPU_IMAGE},
    )


def _parameters() -> list[Parameter]:
    """The workflow's parameters: the plan's options, with the recipe criteria's values as enums."""
    return [
        param("nodes", "Label selector of the nodes to certify; empty: every managed node with GPUs.", ""),
        param(
            "group-label",
            "Node label whose values form the multi-node groups (racks, blocks).",
            vocab.LABEL_RACK,
        ),
        param(
            "launcher",
            "Where group tests run: job (Indexed Jobs on the nodes), local (processes in the step's "
            "pod, for simulated fleets), auto (local on a simulated fleet, else job).",
            AUTO,
            enum=[AUTO, *sorted(LAUNCHERS)],
        ),
        param(
            "accelerator",
            "Recipe accelerator; auto reads nvidia.com/gpu.product from the nodes.",
            AUTO,
            enum=[AUTO, *ALLOWED["accelerator"]],
        ),
        param(
            "service",
            "Recipe service (where the cluster runs); auto: local for local runs, else any.",
            AUTO,
            enum=[AUTO, ANY, *ALLOWED["service"]],
        ),
        param("os", "Recipe OS; auto reads the nodes' OS image.", AUTO, enum=[AUTO, ANY, *ALLOWED["os"]]),
        param("min-bytes", "Smallest all-reduce message (e.g. 1MiB); auto: 64KiB local, 1MiB job.", AUTO),
        param("max-bytes", "Largest all-reduce message (e.g. 8GiB); auto: 4MiB local, 8GiB job.", AUTO),
        param("iters", "Timed iterations per message size.", "20"),
        param(
            "inject",
            "A fault drill: NODE:KIND[=VALUE] (delay=20ms, fail, hang, corrupt) played by every rank on "
            "the node, comma-separated; every verdict and the report label them injected. Empty: none.",
            "",
        ),
        param(
            "diag",
            "DCGM's diagnostics on each node: auto runs them on a node under remediation (or escalated by "
            "it), as its fault's check calls for (recipes/faults/diagnostics.yaml: memory faults run the "
            "memory tests), and on no other node; off; or what dcgmi diag -r takes, for every node (a "
            "level 1-4, or test names comma-separated). DCGM absent from the GPU image is said in the "
            "report, not a failure.",
            "auto",
        ),
        param("dcgm-host", "The DCGM host engine dcgmi asks (its --host); empty: localhost.", ""),
        param(
            "p-min",
            "The least share of tests a faulty node fails (its intermittence) that bisection screens for "
            "with 99%: a failed group's nodes left in service are cleared after "
            "ceil(ln 0.01 / ln(1 - p-min)) passes (21 at 0.2, 7 at 0.5, 2 at 0.9).",
            str(P_MIN),
        ),
    ]


def _plan_arguments(wt: Any) -> dict[str, Any]:
    """The plan step's arguments: the workflow's parameters, under the plan's own names, and the
    Workflow's name and uid."""
    return {
        "selector": wt.get_parameter("nodes"),
        "group_label": wt.get_parameter("group-label"),
        "launcher": wt.get_parameter("launcher"),
        "accelerator": wt.get_parameter("accelerator"),
        "service": wt.get_parameter("service"),
        "os": wt.get_parameter("os"),
        "min_bytes": wt.get_parameter("min-bytes"),
        "max_bytes": wt.get_parameter("max-bytes"),
        "iters": wt.get_parameter("iters"),
        "inject": wt.get_parameter("inject"),
        "diag": wt.get_parameter("diag"),
        "dcgm_host": wt.get_parameter("dcgm-host"),
        "p_min": wt.get_parameter("p-min"),
        "workflow_name": WORKFLOW_NAME,
        "workflow_uid": WORKFLOW_UID,
    }


def templates() -> list[Any]:
    """The certification WorkflowTemplate.

    Each template and task is named after its step function (``readiness.node_check``: ``node-check``);
    the one task named by hand, ``whole-check``, calls the group check a second time, on the whole set.
    """
    plan = _plan_step()
    resolve_recipe = step(runtime.resolve_recipe, timeout="5m", retries=2)
    keep_recipe = step(readiness.keep_recipe, timeout="5m", retries=2, env=dict(_JOB_ENV))
    node_check, group_check, smoke_check = (
        _check_step(check) for check in (readiness.node_check, readiness.group_check, readiness.smoke_check)
    )
    report = step(
        readiness.report,
        timeout="15m",
        retries=2,
        outputs=[Artifact(name="report", path=OUTPUT_DIR)],
        env={vocab.ENV_NAMESPACE: WORKFLOW_NAMESPACE},
    )
    gate = step(readiness.gate, timeout="1m")
    bisect_targets = bisect_targets_step()
    release = step(readiness.release, timeout="5m", retries=2, env={vocab.ENV_NAMESPACE: WORKFLOW_NAMESPACE})
    with (
        workflow_template(
            vocab.WORKFLOW_CERTIFY,
            "Certify GPU nodes for production: NCCL all-reduce sweeps on each node, then on each rack, then "
            "over the whole set, then a short DDP training run, judged against the recipe's thresholds. "
            "Every node ends labelled dsx.dev/certification=passed|failed|pending (pending: not certified, "
            "e.g. its group failed without naming a member); the report (JSON, Markdown) is kept in the "
            "ConfigMap dsx-report-<workflow name>. The workflow fails when any node is not certified.",
            "certify",
            _parameters(),
        ) as wt,
        DAG(name="certify"),
    ):
        planned = plan(arguments=_plan_arguments(wt))
        run = planned.get_parameter("run")
        resolved = resolve_recipe(
            arguments={
                "service": planned.get_parameter("service"),
                "accelerator": planned.get_parameter("accelerator"),
                "os": planned.get_parameter("os"),
                "intent": RECIPE_INTENT,
            },
        )
        kept = keep_recipe(arguments={"run": run, "recipe": resolved.result})
        nodes = node_check(with_param=planned.get_parameter("nodes"), arguments={"node": ITEM, "run": run})
        groups = group_check(
            with_param=planned.get_parameter("groups"), arguments={"group": ITEM, "run": run}
        )
        whole_set = planned.get_parameter("whole")
        whole = group_check(
            name="whole-check",
            when=f"'{whole_set.value}' != ''",
            arguments={"group": whole_set, "run": run},
        )
        smoked = smoke_check(arguments={"run": run})
        reported = report(arguments={"run": run})
        gated = gate(arguments={"summary": reported.result})
        # Groups that failed while their members passed alone are bisected (dsx-bisect) before the next stage.
        group_targets, group_bisect = bisect_stage(run, "groups", bisect_targets)
        whole_targets, whole_bisect = bisect_stage(run, "whole", bisect_targets)
        planned >> resolved >> kept >> nodes
        for before, after in (
            (nodes, groups),
            (groups, group_targets),
            (whole, whole_targets),
            (smoked, reported),
        ):
            before.next(after, on=_ENDED)
        for before, after in ((group_bisect, whole), (whole_bisect, smoked)):
            before.next(after, on=STAGE_ENDED)
        reported >> gated
    with wt, DAG(name="exit") as exit_handler:
        release(arguments={"workflow_name": WORKFLOW_NAME, "workflow_uid": WORKFLOW_UID})
    wt.on_exit = exit_handler
    return [wt]
