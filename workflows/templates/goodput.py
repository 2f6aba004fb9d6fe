"""``dsx-goodput``: every week, what the fleet lost and why, kept where a person and Prometheus find it.

One step reads the remediation ledger, the nodes and the Events about nodes, accounts for every node's
week (:mod:`steps.sentinel.goodput.ledger_report`) and replaces the ConfigMap ``dsx-goodput-report``
(the report's JSON gzip-compressed, its Prometheus metrics, a summary line); the ``goodput`` artifact
holds the full files where an artifact repository exists. The summary is also the step's result, shown
on the Workflow.
"""

from typing import Any

from hera.workflows import DAG, Artifact, CronWorkflow

from steps.cluster import vocabulary as vocab
from steps.sentinel.goodput import keep
from workflows.templates._base import DESCRIPTION_ANNOTATION, OUTPUT_DIR, PART_OF, param, step, workflow_spec

__all__ = ["templates"]


def templates() -> list[Any]:
    """The weekly goodput CronWorkflow."""
    report = step(
        keep.keep_goodput_report,
        timeout="30m",
        retries=2,
        outputs=[Artifact(name="goodput", path=f"{OUTPUT_DIR}/goodput")],
        memory="512Mi",
        memory_limit="2Gi",
    )
    with (
        CronWorkflow(
            name=vocab.WORKFLOW_GOODPUT,
            schedules=["0 7 * * 1"],
            concurrency_policy="Forbid",
            starting_deadline_seconds=3600,
            successful_jobs_history_limit=4,
            failed_jobs_history_limit=4,
            entrypoint="main",
            annotations={
                DESCRIPTION_ANNOTATION: "Every Monday at 07:00: the goodput report of the week before, from "
                "the remediation ledger, the node marks and Events: GPU-hours in service and lost by cause, "
                "per node and for the fleet, times to detect and repair, the recertification pass rate. "
                f"Kept in the ConfigMap {keep.REPORT_CONFIGMAP} (report.json.gz, metrics.prom, summary.txt); "
                "the 'goodput' artifact holds the full files."
            },
            labels=dict(PART_OF),
            arguments=[
                param("since", "The period: a duration back from now (7d, 36h) or an RFC 3339 time.", "7d")
            ],
            **workflow_spec(vocab.WORKFLOW_GOODPUT),
        ) as cron,
        DAG(name="main"),
    ):
        report(arguments={"since": cron.get_parameter("since")})
    return [cron]
