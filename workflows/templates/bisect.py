"""``dsx-bisect``: the nodes that slow or break a group while each passes alone, found by recursion.

``bisect-group`` tests its node list (``test-group``); when the test fails it splits the list in halves and
calls itself on both at once (``left``, ``right``: their ``when`` is the test's ``split``), until a failing
part has fewer than four members, which ``confirm-members`` tests one by one beside a known-good partner,
labelling each that fails ``dsx.dev/certification=failed`` with the reason the moment it is confirmed. Its
output ``suspects`` is what its own confirmation labelled: a skipped ``confirm-members`` has no outputs, so
its output declares a default, as Argo v4 requires of a skipped task's output that anything reads.

Entry ``bisect`` (a run of its own): ``prepare`` (the nodes of the ``nodes`` selector, dsx's default
thresholds) -> ``bisect-group`` -> ``finish`` (Failed when it named a node, or when a test failed and it
could name none). ``bisect-groups`` is what ``dsx-certify`` calls (templateRef) with the groups that
failed while their members passed alone, at most :data:`PARALLELISM` of them at once; the workflow's
``parallelism`` bounds the tests run at once.
"""

from typing import Any

from hera.workflows import DAG, Parameter, Script, Task, TaskResult
from hera.workflows.models import TemplateRef, ValueFrom

from steps.cluster import vocabulary as vocab
from steps.readiness.bisect import flow
from workflows.templates._base import (
    OUTPUT_DIR,
    WORKFLOW_NAME,
    WORKFLOW_NAMESPACE,
    WORKFLOW_UID,
    item_field,
    param,
    rank_env,
    step,
    workflow_template,
)

__all__ = ["NAME", "PARALLELISM", "STAGE_ENDED", "bisect_stage", "bisect_targets_step", "templates"]

NAME = "dsx-bisect"
PARALLELISM = 8
"""Group tests (pods) of one bisection at once, and failed groups of a certification bisected at once."""

_TEST_TIMEOUT = "6h"  # the outer bound; each group test has its own from the recipe (timeoutFactor)
_JOB_ENV = {vocab.ENV_NAMESPACE: WORKFLOW_NAMESPACE, **rank_env()}
_ENDED = TaskResult.succeeded | TaskResult.failed | TaskResult.errored | TaskResult.skipped
STAGE_ENDED = _ENDED | TaskResult.omitted
"""What the stage after a certification's bisection stage waits for: the bisection ended, or was left out
because its targets could not be worked out (the certification goes on; those groups stay unresolved)."""


def _param_outputs(*names: str, default: str | None = None) -> list[Parameter]:
    return [
        Parameter(name=name, value_from=ValueFrom(path=f"{OUTPUT_DIR}/params/{name}", default=default))
        for name in names
    ]


def _group_dag(test_group: Script, confirm: Script) -> DAG:
    """``bisect-group``: test, then split and recurse, or confirm the members of a small failing part."""
    # Inputs of inner templates carry no description: Hera copies a parameter passed on as an argument,
    # description and all, and an argument has none in Argo's schema.
    inputs = [
        Parameter(name="run"),  # the run whose plan and thresholds the tests use (JSON)
        Parameter(name="members"),  # the nodes to test together (JSON list)
        Parameter(name="partners", default="[]"),  # known-good nodes lent as partners (JSON list)
        Parameter(name="group", default="bisect"),  # the group being narrowed, for the records
        Parameter(name="tested", default=""),  # 'fail': the caller's own test of these nodes failed
    ]
    with DAG(name="bisect-group", inputs=inputs) as dag:
        run, members, partners, group = (
            dag.get_parameter(name) for name in ("run", "members", "partners", "group")
        )
        tested = test_group(
            arguments={"run": run, "members": members, "group": group, "tested": dag.get_parameter("tested")}
        )
        action = tested.get_parameter("action").value
        for half in ("left", "right"):
            Task(
                name=half,
                template=dag,
                when=f"{action} == {flow.SPLIT}",
                arguments={
                    "run": run,
                    "members": tested.get_parameter(half),
                    "partners": partners,
                    "group": group,
                },
                depends=tested.name,
            )
        confirmed = confirm(
            when=f"{action} == {flow.CONFIRM}",
            arguments={"run": run, "members": members, "partners": partners, "group": group},
        )
        tested >> confirmed
    dag.outputs = [
        Parameter(
            name="suspects",
            value_from=ValueFrom(parameter=confirmed.get_parameter("suspects").value, default="[]"),
        )
    ]
    return dag


def templates() -> list[Any]:
    """The bisection WorkflowTemplate."""
    prepare = step(flow.prepare, timeout="10m", retries=2, outputs=_param_outputs("run", "members"))
    test_group = step(
        flow.test_group,
        timeout=_TEST_TIMEOUT,
        env=dict(_JOB_ENV),
        outputs=_param_outputs("action", "left", "right"),
    )
    confirm = step(
        flow.confirm_members,
        timeout=_TEST_TIMEOUT,
        env=dict(_JOB_ENV),
        outputs=_param_outputs("suspects", default="[]"),
    )
    finish = step(flow.finish, timeout="5m", env={vocab.ENV_NAMESPACE: WORKFLOW_NAMESPACE})
    with workflow_template(
        NAME,
        "Find the nodes that slow or break a group while each passes its own test: test the group, split a "
        "failing one in halves and test both at once, recursively, and test each member of a small failing "
        "part beside a known-good node. A node that fails beside one is labelled "
        "dsx.dev/certification=failed with the reason at once. The workflow fails when it named a node, "
        "and when a test failed that no node could be named for.",
        "bisect",
        [param("nodes", "Label selector of the nodes to bisect; empty: every managed node with GPUs.", "")],
        parallelism=PARALLELISM,
    ) as wt:
        group_dag = _group_dag(test_group, confirm)
        with DAG(
            name="bisect-groups",
            parallelism=PARALLELISM,
            inputs=[Parameter(name="run"), Parameter(name="targets")],  # the run; its BisectTargets (JSON)
        ) as groups:
            Task(
                name="bisect-group",
                template=group_dag,
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
                    "workflow_name": WORKFLOW_NAME,
                    "workflow_uid": WORKFLOW_UID,
                }
            )
            run = prepared.get_parameter("run")
            bisected = Task(
                name="bisect-group",
                template=group_dag,
                arguments={"run": run, "members": prepared.get_parameter("members")},
            )
            ended = finish(arguments={"run": run})
            prepared >> bisected
            bisected.next(ended, on=_ENDED)
    return [wt]


def bisect_targets_step() -> Script:
    """The step that lists a certification stage's groups to bisect (``targets``, ``count``)."""
    return step(
        flow.bisect_targets,
        timeout="10m",
        retries=2,
        outputs=_param_outputs("targets", "count"),
        env={vocab.ENV_NAMESPACE: WORKFLOW_NAMESPACE},
    )


def bisect_stage(run: Parameter, stage: str, bisect_targets: Script) -> tuple[Task, Task]:
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
