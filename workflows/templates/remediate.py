"""``dsx-remediate``: take a faulty node out of service, repair it, and let it back only once it passed again.

guard -> quarantine (cordon, taint, ``dsx.dev/state=quarantined``) -> drain (Eviction API only) ->
request-repair (the request; an action ``repair-template`` takes handed to a Workflow of it) ->
repair-wait (reads the node until it is repaired as ``repaired`` judges it: a new boot id, or the GPUs
reset by the sentinel's agent for a ``reset-gpu`` request, Ready, the check's condition cleared by a
reading after it; an actuator's failure ends it) or, with ``repair-wait=suspend``,
repair-suspend (a Suspend an operator resumes: ``argo resume``; locally ``dsx resume RUN_DIR``), either
bounded by ``repair-timeout`` -> repaired (the same judgement; else escalated) -> recertify
(``dsx-certify`` through ``templateRef``, on the node alone; then a pair test beside a known-good node
through ``dsx-bisect``'s ``prepare``, ``search-group`` and ``finish``) -> conclude (a pass of both:
uncordon and clear the state; a pair test that gave no verdict: the node stays recertifying and cordoned,
the workflow Failed saying so; else ``state=escalated``, ``dsx.dev/replace=requested``, a Warning
Event). The exit handler: record-outcome writes how the workflow ended to the ledger, and release gives
back the certification Leases recertification took (certify's own exit handler does not run under
``templateRef``).

The workflow holds the mutex ``dsx-remediate-<node>``: two events for one node never run two
remediations; the second waits and then finds the node where the first left it.

``repair-wait`` is a step of its own rather than a resource template: Argo's ``successCondition`` is a
label-selector over plain paths, and a new boot id is one, but Ready and the fault's condition sit in a
list, and a real node shows them tens of seconds apart (the boot id first, Ready, then the sentinel's first
reading of the new boot): a wait on the boot id alone ends before the node is back.

Recertification runs ``dsx-certify``'s ``certify`` DAG on this workflow's parameters, so this template
declares certify's parameters too; its ``nodes`` is fixed to ``dsx.dev/recertify=true``, the label the
``recertify`` DAG puts on this node alone while it holds the fleet-wide mutex ``dsx-recertify``.
"""

from typing import Any

from hera.workflows import DAG, CronWorkflow, Parameter, Suspend, Task, TaskResult, WorkflowTemplate
from hera.workflows.models import Mutex, Synchronization, TemplateRef

from steps.cluster import vocabulary as vocab
from steps.readiness import certify as readiness
from steps.readiness.bisect.evidence import P_MIN
from steps.readiness.certify import AUTO
from steps.sentinel import ledger, repair, webhook
from steps.sentinel import recertify as recert
from steps.sentinel import reconcile as reconciler
from steps.sentinel import remediate as steps
from workflows.templates._base import (
    DESCRIPTION_ANNOTATION,
    PART_OF,
    WORKFLOW_NAME,
    WORKFLOW_NAMESPACE,
    WORKFLOW_UID,
    param,
    param_outputs,
    step,
    workflow_spec,
    workflow_template,
)

__all__ = ["LEDGER_ENV", "RECERTIFY_SELECTOR", "REPAIR_ACCOUNT", "REPAIR_WAITS", "templates"]

REPAIR_WAITS = ("node", "suspend")
"""The ``repair-wait`` parameter's values: a resource template watching the node, or a Suspend step."""

RECERTIFY_SELECTOR = f"{vocab.LABEL_RECERTIFY}=true"
REPAIR_ACCOUNT = "dsx-repair"
"""The account of dsx-repair-webhook (the chart's serviceAccounts.names.repair)."""
#: The environment of every step that writes the ledger: how long it keeps (the chart's
#: remediate.ledger.retentionDays replaces the compiled default).
LEDGER_ENV = {vocab.ENV_LEDGER_RETENTION_DAYS: str(ledger.RETENTION_DAYS)}
_ENDED = TaskResult.succeeded | TaskResult.failed | TaskResult.errored
_ANY_END = _ENDED | TaskResult.skipped | TaskResult.omitted
_BISECT = vocab.WORKFLOW_BISECT
# The repair wait's own deadline: it waits repair-timeout (at most this) itself.
_REPAIR_WAIT_BOUND = f"{steps.REPAIR_WAIT_LIMIT_S // 3600}h"


def _waited(task: str) -> str:
    """A wait ended as a wait ends (its deadline included), or was skipped by its ``when``."""
    return f"{task}.Succeeded || {task}.Skipped"


def _parameters() -> list[Parameter]:
    return [
        param("node", "The node to remediate."),
        param(
            "check",
            "The sentinel check that found the fault (its condition must clear).",
            "xid",
            enum=sorted(vocab.CONDITION_SENTINEL),
        ),
        param(
            "event",
            "What started it, as JSON: the check's node condition (the Sensor and dsx-reconcile pass it) "
            "or a HealthEvent; a run whose fault no longer stands is superseded. Empty: a person asked.",
            "",
        ),
        param("dry-run", "true: decide and record, change nothing.", "false", enum=["false", "true"]),
        param("max-attempts", "Attempts since the node was last in service before it is escalated.", "3"),
        param("breaker-share", "Largest share of GPU nodes quarantined within the breaker's window.", "0.1"),
        param("breaker-window-s", "The circuit breaker's sliding window, in seconds.", "3600"),
        param(
            "drain-policy",
            "The drain's modes, deadline, force switch and unreachable_wait_s, as JSON (DrainPolicy).",
            "{}",
        ),
        param(
            "repair-wait",
            "How the repair is awaited: node (the node back on a new boot id) or suspend (an operator "
            "resumes the repair-suspend step: argo resume); the chart's remediate.repairWait.",
            "node",
            enum=list(REPAIR_WAITS),
        ),
        param("repair-timeout", "How long to wait for the repair before the repair check decides.", "4h"),
        param(
            "repair-template",
            "A WorkflowTemplate of the operator's that carries out the repair of the actions "
            "repair-template-actions names: a Workflow of it is created with the request as parameters "
            "(node, action, gpus, request, requested-at, boot-id, workflow) and the repair wait follows "
            "it; the chart's remediate.repairTemplate.name. Empty: none.",
            "",
        ),
        param(
            "repair-template-actions",
            "The actions handed to repair-template, comma-separated (reset-gpu, reboot, replace, "
            "contact-support); the chart's remediate.repairTemplate.actions.",
            "replace",
        ),
        # Certification's own parameters (read by dsx-certify's DAG as workflow parameters).
        param(
            "nodes",
            "Fixed: the node under recertification carries this label.",
            RECERTIFY_SELECTOR,
            enum=[RECERTIFY_SELECTOR],
        ),
        param("group-label", "Certification: node label of the multi-node groups.", vocab.LABEL_RACK),
        param("launcher", "Certification: where group tests run.", AUTO),
        param("accelerator", "Certification: recipe accelerator.", AUTO),
        param("service", "Certification: recipe service.", AUTO),
        param("os", "Certification: recipe OS.", AUTO),
        param("min-bytes", "Certification: smallest all-reduce message.", AUTO),
        param("max-bytes", "Certification: largest all-reduce message.", AUTO),
        param("iters", "Certification: timed iterations per message size.", "20"),
        param("inject", "Certification: a fault drill (NODE:KIND[=VALUE]); empty: none.", ""),
        param(
            "diag",
            "Certification: DCGM's diagnostics; auto: as the fault's check calls for "
            "(recipes/faults/diagnostics.yaml), off, or what dcgmi diag -r takes.",
            "auto",
        ),
        param("dcgm-host", "Certification: the DCGM host engine dcgmi asks; empty: localhost.", ""),
        param(
            "p-min",
            "Certification and the pair test: the least share of tests a faulty node fails that their "
            "screening catches with 99% (21 passes at 0.2, 7 at 0.5, 2 at 0.9).",
            str(P_MIN),
        ),
    ]


def _pair_test(partner: str, node: str) -> tuple[Task, Task]:
    """``dsx-bisect``'s own steps on the node and its partner: a run over the pair (``prepare``), the node
    searched beside the partner (``search-group``: screened until a fault failing a fifth of its tests
    would have shown with 99%, labelled failed with the reason and its probability if accused), and
    ``finish`` (Failed when it named the node, or could not clear it). Skipped when there is no partner.
    Returns the first and the last task."""
    has_partner = f"'{partner}' != ''"
    prepared = Task(
        name="pair-prepare",
        template_ref=TemplateRef(name=_BISECT, template="prepare"),
        when=has_partner,
        arguments={
            "selector": recert.PAIR_SELECTOR,
            "workflow_name": WORKFLOW_NAME,
            # A run of its own, apart from certification's (its outcomes are keyed by the uid).
            "workflow_uid": f"{WORKFLOW_UID}-pair",
            # Sized and run as recertification was (gloo on a cluster without GPUs).
            **{
                name.replace("-", "_"): f"{{{{workflow.parameters.{name}}}}}"
                for name in ("accelerator", "min-bytes", "max-bytes", "iters", "p-min")
            },
        },
    )
    run = "{{tasks.pair-prepare.outputs.parameters.run}}"
    confirmed = Task(
        name="pair-test",
        template_ref=TemplateRef(name=_BISECT, template="search-group"),
        when=has_partner,
        arguments={"run": run, "members": f'["{node}"]', "partners": f'["{partner}"]', "group": "pair"},
    )
    finished = Task(
        name="pair-finish",
        template_ref=TemplateRef(name=_BISECT, template="finish"),
        when=has_partner,
        arguments={"run": run},
    )
    prepared.next(confirmed).next(finished)
    return prepared, finished


def _repair_suspend() -> Suspend:
    """Wait for an operator to say the repair is done (``argo resume``, or Resume in the Argo UI), up to the
    repair timeout. Argo resumes a suspend whose ``duration`` ran out by itself (executeSuspend marks it
    Succeeded), so the deadline leads to the repair check, which escalates a node that was not repaired."""
    return Suspend(name="repair-suspend", duration="{{workflow.parameters.repair-timeout}}")


def _recertify() -> DAG:
    """Mark the node, run dsx-certify's DAG on it alone, unmark it whatever the verdict; then the pair
    test beside a known-good node, whose verdict lands on the node's certification label."""
    mark = step(recert.mark, timeout="5m", retries=2)
    unmark = step(recert.unmark, timeout="5m", retries=2)
    pair_partner = step(
        recert.pair_partner, timeout="5m", retries=2, outputs=param_outputs("partner", default="")
    )
    pair_verdict = step(recert.pair_verdict, timeout="5m", retries=2)
    with DAG(
        name="recertify",
        inputs=[Parameter(name="node")],
        synchronization=Synchronization(mutexes=[Mutex(name="dsx-recertify")]),
    ) as recertify:
        node = "{{inputs.parameters.node}}"
        marked = mark(arguments={"node": node})
        certified = Task(
            name="certify",
            template_ref=TemplateRef(name=vocab.WORKFLOW_CERTIFY, template="certify"),
        )
        unmarked = unmark(arguments={"node": node})
        run = {"workflow_name": WORKFLOW_NAME, "workflow_uid": WORKFLOW_UID}
        partnered = pair_partner(arguments={"node": node, **run})
        partner = f"{partnered.get_parameter('partner').value}"
        first, last = _pair_test(partner, node)
        judged = pair_verdict(
            arguments={"node": node, "partner": partner, "status": "{{tasks.pair-finish.status}}", **run}
        )
        marked >> certified
        certified.next(unmarked, on=_ENDED)
        unmarked.next(partnered).next(first)
        last.next(judged, on=_ANY_END)
    return recertify


def _exit_handler(wt: WorkflowTemplate) -> None:
    """record-outcome, release-pair and release, whatever the workflow's end: recertification took the
    node's certification Lease under this workflow's name, and dsx-certify's own exit handler, which gives
    it back when a step fails, does not run for its DAG reached through ``templateRef``; the pair test
    held its partner (a cordon and a Lease) under the same name."""
    record_outcome = step(steps.record_outcome, timeout="5m", retries=2, env=LEDGER_ENV)
    namespace = {vocab.ENV_NAMESPACE: WORKFLOW_NAMESPACE}
    release_pair = step(recert.release_pair, timeout="5m", retries=2, env=namespace)
    release = step(readiness.release, timeout="5m", retries=2, env=namespace)
    with wt, DAG(name="exit") as exit_handler:
        record_outcome(
            arguments={
                "node": wt.get_parameter("node"),
                "check": wt.get_parameter("check"),
                "workflow_name": WORKFLOW_NAME,
                "status": "{{workflow.status}}",
            }
        )
        run = {"workflow_name": WORKFLOW_NAME, "workflow_uid": WORKFLOW_UID}
        # The pair hold first: it finds the partner by the Lease that release gives back.
        release_pair(arguments=run) >> release(arguments=run)
    wt.on_exit = exit_handler


def _repair_webhook() -> WorkflowTemplate:
    """``dsx-repair-webhook``: the repair request POSTed as JSON to a URL (:mod:`steps.sentinel.webhook`),
    the example of a repair template (``remediate.repairTemplate.name``); it runs as an account of its
    own, :data:`REPAIR_ACCOUNT`, which reads the request's ConfigMap."""
    notify = step(webhook.notify, timeout="2m", retries=3)
    with (
        workflow_template(
            vocab.WORKFLOW_REPAIR_WEBHOOK,
            "Hand a repair request to a web service: POST the request dsx-remediate wrote (ConfigMap "
            "dsx-repair-<node>, kind RepairRequest: action, GPUs, evidence) as JSON to the url parameter "
            "(the chart's remediate.webhook.url). A 2xx answer succeeds; anything else fails the "
            "Workflow, and dsx-remediate escalates the node. Created by dsx-remediate when "
            "remediate.repairTemplate.name names it.",
            "repair-webhook",
            [
                *(param(name, description) for name, description in repair.TEMPLATE_PARAMETERS.items()),
                param("url", "Where to POST the request (the chart's remediate.webhook.url).", ""),
            ],
            service_account_name=REPAIR_ACCOUNT,
        ) as wt,
        DAG(name="repair-webhook"),
    ):
        notify(
            arguments={
                "url": wt.get_parameter("url"),
                "request": wt.get_parameter("request"),
                "node": wt.get_parameter("node"),
                "workflow": wt.get_parameter("workflow"),
            }
        )
    return wt


def _reconciler() -> CronWorkflow:
    """``dsx-reconcile``: every 5 minutes, the not-ready check on every GPU node, then ``dsx-remediate`` for
    each node whose fault the Sensor's edges missed (:mod:`steps.sentinel.reconcile`), as its own account
    (it reads nodes, the breaker and the ledger, writes what the not-ready check finds, and creates
    Workflows; the runs act as dsx-remediate). Where the Sensor is not installed the chart sets
    ``remediate`` to ``false``: it marks, and starts nothing."""
    reconcile = step(
        reconciler.reconcile,
        timeout="5m",
        retries=2,
        env={vocab.ENV_NAMESPACE: WORKFLOW_NAMESPACE, vocab.ENV_FAULT_OVERRIDES: ""},
    )
    with (
        CronWorkflow(
            name=vocab.WORKFLOW_RECONCILE,
            schedules=["*/5 * * * *"],
            concurrency_policy="Forbid",
            starting_deadline_seconds=240,
            successful_jobs_history_limit=3,
            failed_jobs_history_limit=3,
            entrypoint="main",
            annotations={
                DESCRIPTION_ANNOTATION: "Every 5 minutes: DsxNodeNotReady and the sentinel's taint on every "
                "managed GPU node whose Ready condition has not been True for the not-ready threshold "
                "(its agent may be down with it); then dsx-remediate for every managed node that carries "
                "the sentinel's taint with a sentinel condition the policy remediates, no dsx.dev/state and "
                "no remediation under way (an edge the Sensor missed, a submission that failed, a node the "
                "circuit breaker refused before it was reset). Nothing while the breaker is open."
            },
            labels=dict(PART_OF),
            arguments=[
                param(
                    "dry-run",
                    "true: print what it would start, start nothing.",
                    "false",
                    enum=["false", "true"],
                ),
                param(
                    "remediate-parameters",
                    'Other parameters of the runs it starts, as a JSON object ({"repair-wait": "suspend"}).',
                    "{}",
                ),
                param(
                    "remediate",
                    "false: mark the nodes that are down (DsxNodeNotReady, the taint) and list what it "
                    "would start, starting nothing (the chart's value where the Sensor is not installed: "
                    "remediation is then a person's to start).",
                    "true",
                    enum=["true", "false"],
                ),
            ],
            **workflow_spec(vocab.WORKFLOW_RECONCILE),
        ) as cron,
        DAG(name="main"),
    ):
        reconcile(
            arguments={
                "dry_run": cron.get_parameter("dry-run"),
                "remediate_parameters": cron.get_parameter("remediate-parameters"),
                "workflow_name": WORKFLOW_NAME,
                "remediate": cron.get_parameter("remediate"),
            }
        )
    return cron


def _guard_arguments(wt: Any) -> dict[str, Any]:
    """The guard step's arguments: the workflow's parameters, every one it reads before anything changes."""
    return {
        "node": wt.get_parameter("node"),
        "check": wt.get_parameter("check"),
        "event": wt.get_parameter("event"),
        "workflow_name": WORKFLOW_NAME,
        "dry_run": wt.get_parameter("dry-run"),
        "max_attempts": wt.get_parameter("max-attempts"),
        "breaker_share": wt.get_parameter("breaker-share"),
        "breaker_window_s": wt.get_parameter("breaker-window-s"),
        # Read here too, so that a malformed one fails the run before anything changes.
        "drain_policy": wt.get_parameter("drain-policy"),
        "repair_timeout": wt.get_parameter("repair-timeout"),
        "repair_template": wt.get_parameter("repair-template"),
        "repair_template_actions": wt.get_parameter("repair-template-actions"),
    }


def templates() -> list[Any]:
    """The remediation WorkflowTemplate and the reconciler's CronWorkflow."""
    guard = step(
        steps.guard,
        timeout="5m",
        retries=2,
        outputs=param_outputs("proceed", default=""),
        env={**LEDGER_ENV, vocab.ENV_FAULT_HISTORY: ""},
    )
    quarantine = step(steps.quarantine, timeout="5m", retries=2, env=LEDGER_ENV)
    drain = step(steps.drain, timeout="2h", retries=2, env=LEDGER_ENV)
    request_repair = step(steps.request_repair, timeout="5m", retries=2, env=LEDGER_ENV)
    repair_wait = step(steps.repair_wait, timeout=_REPAIR_WAIT_BOUND, retries=2, env=LEDGER_ENV)
    repaired = step(
        steps.repaired, timeout="5m", retries=2, outputs=param_outputs("gone", default=""), env=LEDGER_ENV
    )
    conclude = step(steps.conclude, timeout="5m", retries=2, env=LEDGER_ENV)
    with workflow_template(
        vocab.WORKFLOW_REMEDIATE,
        "Remediate a faulty node: guard (managed, breaker closed, attempts), cordon and taint it "
        "(dsx.dev/state=quarantined), drain it through the Eviction API, ask for a repair and wait for it "
        "(a new boot id, Ready, the fault's condition cleared), recertify it with dsx-certify, and "
        "uncordon it only on a pass; otherwise it stays cordoned with dsx.dev/state=escalated and "
        "dsx.dev/replace=requested. Every state change is kept in the ledger: a ConfigMap per node and "
        "month, dsx-ledger-<node>-<yyyy-mm>, labelled dsx.dev/ledger=true.",
        "remediate",
        _parameters(),
        synchronization=Synchronization(mutexes=[Mutex(name="dsx-remediate-{{workflow.parameters.node}}")]),
    ) as wt:
        node, check = wt.get_parameter("node"), wt.get_parameter("check")
        repair_suspend = _repair_suspend()
        recertify = _recertify()
        with DAG(name="remediate"):
            guarded = guard(arguments=_guard_arguments(wt))
            go = f"{guarded.get_parameter('proceed').value} == true"
            common = {"node": node, "check": check, "workflow_name": WORKFLOW_NAME}
            quarantined = quarantine(arguments=common, when=go)
            drained = drain(arguments={**common, "policy": wt.get_parameter("drain-policy")}, when=go)
            requested = request_repair(
                arguments={
                    **common,
                    "repair_template": wt.get_parameter("repair-template"),
                    "repair_template_actions": wt.get_parameter("repair-template-actions"),
                },
                when=go,
            )
            how = wt.get_parameter("repair-wait").value
            waited = repair_wait(
                arguments={**common, "timeout": wt.get_parameter("repair-timeout")},
                when=f"{go} && '{how}' == 'node'",
            )
            suspended = Task(
                name="repair-suspend", template=repair_suspend, when=f"{go} && '{how}' == 'suspend'"
            )
            checked = repaired(arguments=common, when=go)
            # A node deleted while awaiting its repair (a cloud's terminate-and-replace) left the cluster:
            # the repair check records it replaced, and there is nothing left to recertify.
            present = f"'{checked.get_parameter('gone').value}' != 'true'"
            recertified = Task(
                name="recertify", template=recertify, arguments={"node": node}, when=f"{go} && {present}"
            )
            concluded = conclude(arguments=common, when=go)
            guarded.next(quarantined).next(drained).next(requested) >> [waited, suspended]
            # The repair check runs after a wait that ended (or was skipped), never after one that failed
            # or errored: a wait that could not run must not escalate a node it never waited for.
            checked.depends = " && ".join(f"({_waited(t.name)})" for t in (waited, suspended))
            checked >> recertified
            recertified.next(concluded, on=_ENDED)
    _exit_handler(wt)
    return [wt, _reconciler(), _repair_webhook()]
