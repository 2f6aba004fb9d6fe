"""``dsx-bisect``: the nodes that slow or break a group while each passes alone, found by the search of
``dsx bisect``.

``search-group`` runs the search: every test's result is evidence, the next test is
chosen from the posterior, a node whose probability of being faulty reaches 0.99 is labelled
``dsx.dev/certification=failed`` with the reason and the probability the moment it is accused, and the nodes
left in service are screened until a fault failing a fifth of its tests would have shown with 99%. Its
output ``suspects`` is what it labelled.

Entry ``bisect`` (a run of its own): ``prepare`` (the nodes of the ``nodes`` selector, dsx's default
thresholds) -> ``search-group`` -> ``finish`` (Failed when it named a node, or when the search could not
clear the group). ``bisect-groups`` is what ``dsx-certify`` calls (templateRef) with the groups that
failed while their members passed alone, at most :data:`PARALLELISM` of them at once.
"""

from typing import Any

from hera.workflows import DAG, Parameter, Task, TaskResult
from hera.workflows.models import TemplateRef

from steps.cluster import vocabulary as vocab
from steps.readiness.bisect import flow
from steps.readiness.bisect.evidence import P_MIN
from workflows.templates._base import (
    WORKFLOW_NAME,
    WORKFLOW_NAMESPACE,
    WORKFLOW_UID,
    StepScript,
    item_field,
    param,
    param_outputs,
    rank_env,
    step,
    workflow_template,
)

__all__ = ["NAME", "PARALLELISM", "STAGE_ENDED", "bisect_stage", "bisect_targets_step", "templates"]

NAME = vocab.WORKFLOW_BISECT
PARALLELISM = 8
"""Group tests (pods) of one bisection at once, and failed groups of a certification bisected at once."""

_TEST_TIMEOUT = "6h"  # the outer bound; each group test has its own from the recipe (timeoutFactor)
_JOB_ENV = {vocab.ENV_NAMESPACE: WORKFLOW_NAMESPACE, **rank_env()}
_ENDED = TaskResult.succeeded | TaskResult.failed | TaskResult.errored | TaskResult.skipped
STAGE_ENDED = _ENDED | TaskResult.omitted
"""What the stage after a certification's bisection stage waits for: the bisection ended, or was left out
because its targets could not be worked out (the certification goes on; those groups stay unresolved)."""


def templates() -> list[Any]:
    """The bisection WorkflowTemplate."""
    prepare = step(flow.prepare, timeout="10m", retries=2, outputs=param_outputs("run", "members"))
    search = step(
        flow.search_group,
        timeout=_TEST_TIMEOUT,
        env=dict(_JOB_ENV),
        outputs=param_outputs("suspects", default="[]"),
    )
    finish = step(flow.finish, timeout="5m", env={vocab.ENV_NAMESPACE: WORKFLOW_NAMESPACE})
    with workflow_template(
        NAME,
        "Find the nodes that slow or break a group while each passes its own test, every result taken as "
        "evidence: the next test is chosen from each node's probability of being faulty, a node is "
        "labelled dsx.dev/certification=failed with the reason and its probability once that reaches 0.99, "
        "and the nodes left are screened until a fault failing a fifth of its tests would have shown with "
        "99%. The workflow fails when it named a node, and when it could not clear the group.",
        "bisect",
        [
            param("nodes", "Label selector of the nodes to bisect; empty: every managed node with GPUs.", ""),
            param(
                "p-min",
                "The least share of tests a faulty node fails (its intermittence) that the screening of the "
                "nodes left in service catches with 99% (21 passes at 0.2, 7 at 0.5, 2 at 0.9).",
                str(P_MIN),
            ),
        ],
        parallelism=PARALLELISM,
    ) as wt:
        with DAG(
            name="bisect-groups",
            parallelism=PARALLELISM,
            inputs=[Parameter(name="run"), Parameter(name="targets")],  # the run; its BisectTargets (JSON)
        ) as groups:
            Task(
                name="search-group",
                template=search,
                with_param=groups.get_parameter("targets"),
                arguments={
                    "run": groups.get_parameter("run"),
                    "members": item_field("members"),
                    "partners": item_field("partners"),
                    "group": item_field("group"),
                    "tested": "fail",
                },
            )
        with DAG(name="bisect"):
            prepared = prepare(
                arguments={
                    "selector": wt.get_parameter("nodes"),
                    "p_min": wt.get_parameter("p-min"),
                    "workflow_name": WORKFLOW_NAME,
                    "workflow_uid": WORKFLOW_UID,
                }
            )
            run = prepared.get_parameter("run")
            bisected = Task(
                name="search-group",
                template=search,
                arguments={"run": run, "members": prepared.get_parameter("members"), "partners": "[]"},
            )
            ended = finish(arguments={"run": run})
            prepared >> bisected
            bisected.next(ended, on=_ENDED)
    return [wt]


def bisect_targets_step() -> StepScript:
    """The step that lists a certification stage's groups to bisect (``targets``, ``count``)."""
    return step(
        flow.bisect_targets,
        timeout="10m",
        retries=2,
        outputs=param_outputs("targets", "count"),
        env={vocab.ENV_NAMESPACE: WORKFLOW_NAMESPACE},
    )


def bisect_stage(run: Parameter, stage: str, bisect_targets: StepScript) -> tuple[Task, Task]:
    """A certification's bisection stage: its groups that failed while their members passed alone,
    bisected through ``dsx-bisect``'s ``bisect-groups`` (templateRef); skipped when there are none.
    Returns the first and the last task."""
    # The first stage's task is named after its step, as every first call is; the second for its stage.
    name = "bisect-targets" if stage == "groups" else f"bisect-{stage}-targets"
    targets = bisect_targets(name=name, arguments={"run": run, "stage": stage})
    bisected = Task(
        name=f"bisect-{stage}",
        template_ref=TemplateRef(name=NAME, template="bisect-groups"),
        arguments={"run": run, "targets": targets.get_parameter("targets")},
        when=f"{targets.get_parameter('count').value} > 0",
    )
    targets >> bisected
    return targets, bisected
