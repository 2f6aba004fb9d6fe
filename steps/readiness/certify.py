"""The certification pipeline's steps: plan, node and group checks, smoke run, report and labels.

The steps of the ``dsx-certify`` workflow, each named as its task is (``node_check`` runs as
``node-check``): plan, keep_recipe, node_check, group_check (also the whole set's ``whole-check``),
smoke_check, report, gate, and release, the exit handler. Hera's runner calls them with pydantic inputs
and outputs (this module must not use ``from __future__ import annotations``).

Stages never compete for a node's GPUs: every node's own test first (each on its own node), then the
groups of the group label (racks: disjoint, so all at once), then the whole set, then the training smoke
run. A later stage tests only the nodes an earlier one did not fail or leave in doubt. The plan and the
recipe's thresholds are stored once, in ConfigMaps of the run (:mod:`steps.readiness.outcomes`); every
later step receives only the run's reference and its subject's name, so the Workflow object stays small
however large the fleet.

Labels never lie: the plan marks every node it will test ``pending`` (taking its certification Lease)
before any test runs, and the report writes each node's verdict label with its annotations in one patch,
failed nodes first. A node the report could not update stays ``pending``, never with an older verdict.

Where the group tests run:

* ``local``: on this machine, one rank process per node, over gloo. The simulated fleet's faults are
  turned into injected faults of the rank that stands for the node (a slow NIC delays that rank's
  collectives in proportion to the bandwidth it lost), and every output labels them as injected. The
  measurements are real: the straggler is found by timing, not by reading the fault.
* ``job``: on the cluster, as an Indexed Job with a headless Service for rendezvous, pinned to exactly
  the group's nodes (see :mod:`steps.readiness.launchers.job`).

``auto`` picks ``local`` for a simulated fleet (its nodes cannot run pods) and ``job`` otherwise.
"""

from typing import Any, Literal

from pydantic import Field, ValidationError

from steps import figures
from steps.cluster import ClusterPort, connect
from steps.cluster import vocabulary as vocab
from steps.errors import DsxError, InputError
from steps.files import write_text
from steps.models import input_error
from steps.outputs import output_dir, write_params
from steps.readiness.bisect.evidence import DELTA, P_MIN, caught, screening_runs
from steps.readiness.bisect.records import Records, with_bisection
from steps.readiness.check import CheckOutcome
from steps.readiness.checks import (
    ALLREDUCE_SWEEP,
    RANK_PRELOAD,
    SMOKE_TEST,
    SWEEP_TEST,
    TRAINING_SMOKE,
    DiagRequest,
    GroupRun,
    RelativeRequest,
    SmokeRequest,
    SweepRequest,
    judge_groups_relative,
    run_allreduce_sweep,
    run_diag,
    run_smoke,
    run_sweep,
    run_training_smoke,
)
from steps.readiness.judge import verdict
from steps.readiness.launchers.local import LocalLauncher, local_injections
from steps.readiness.models import STATUS_ORDER, CollectiveRun, Model, Subject, Verdict, dump_json
from steps.readiness.node_marks import label_verdicts, release_held, release_nodes, take_nodes
from steps.readiness.outcomes import CheckResult, OutcomeStore, RunRef, check_result, keep_report
from steps.readiness.planning import (
    ACCELERATORS,
    AUTO,
    LAUNCHERS,
    PLAN_OUTPUTS,
    RECIPE_INTENT,
    WHOLE,
    CertifyOptions,
    CertifyPlan,
    Exclusion,
    KeptRecipe,
    check_options,
    drill_injections,
    make_plan,
    now,
    plan_outputs,
)
from steps.readiness.ranks.diag import DiagResult
from steps.readiness.ranks.smoke import SmokeResult
from steps.readiness.ranks.sweep import DEFAULTS as SWEEP
from steps.readiness.report import (
    INCOMPLETE_TEST,
    ReportRequest,
    Screening,
    build_report,
    node_results,
    render_markdown,
)
from steps.readiness.sizes import size_series
from steps.readiness.thresholds import Thresholds, group_timeout

__all__ = [
    "ACCELERATORS",
    "AUTO",
    "LAUNCHERS",
    "PLAN_OUTPUTS",
    "RECIPE_INTENT",
    "WHOLE",
    "CertifyOptions",
    "CertifyPlan",
    "CertifySummary",
    "Exclusion",
    "KeptRecipe",
    "check_options",
    "gate",
    "group_check",
    "group_members",
    "keep_recipe",
    "load_plan",
    "node_check",
    "plan",
    "release",
    "report",
    "smoke_check",
    "sweep_group",
]

#: The steps here launch ranks, and the report draws its plots: a local runner's fork server imports what
#: they import once for every step (:mod:`steps.forkserver`).
FORK_SERVER_PRELOAD = (*RANK_PRELOAD, *figures.IMPORTS)
#: Launch and rendezvous time counted into every healthy-run estimate, seconds.
LAUNCH_OVERHEAD_S = 20.0
#: Bus bandwidth assumed for a healthy run when the recipe has no absolute figure (gloo on CPU), GB/s.
FALLBACK_BUSBW_GBPS = 0.2
#: How many node verdicts the gate's summary names one by one; the report has them all.
SUMMARY_NODES = 50


class CertifySummary(Model):
    """What the workflow reports at the end, and what the gate decides on (kept small: Argo keeps a
    step's result only up to 256 kB; the report has every node)."""

    status: Literal["passed", "failed"]
    summary: str
    passed: int = Field(description="how many nodes passed")
    failed: dict[str, str] = Field(description="failed node -> first reason (the first SUMMARY_NODES)")
    pending: dict[str, str] = Field(
        default_factory=dict,
        description="nodes left pending (not certified) -> why (the first SUMMARY_NODES)",
    )
    failed_count: int = 0
    pending_count: int = 0
    not_labelled: list[str] = Field(
        default_factory=list, description="nodes whose verdict could not be written"
    )
    recipe_digest: str | None
    report: str = Field(default="", description="the ConfigMap that keeps the report")
    report_files: list[str]


def plan(
    selector: str = "",
    group_label: str = vocab.LABEL_RACK,
    launcher: str = AUTO,
    accelerator: str = AUTO,
    service: str = AUTO,
    os: str = AUTO,
    min_bytes: str = AUTO,
    max_bytes: str = AUTO,
    iters: int = SWEEP.iters,
    namespace: str = "",
    image: str = "",
    inject: str = "",
    diag: str = "auto",
    dcgm_host: str = "",
    p_min: float = P_MIN,
    workflow_name: str = "",
    workflow_uid: str = "",
) -> CertifyPlan:
    """Discover the nodes to certify and the groups to test; choose the launcher and recipe criteria.

    Nodes opted out with ``dsx.dev/managed=false`` are left alone, and so are nodes without GPUs (a
    cluster's CPU system nodes). Nodes that are not Ready cannot be tested and are certified as failed.
    Every node to test is marked ``dsx.dev/certification=pending`` and held by a Lease for this run
    before any test starts. The plan is stored for the later steps; the output parameters for the
    workflow are written under ``$DSX_OUTPUT_DIR/params``: ``nodes`` and ``groups`` (JSON lists of
    names; ``groups`` without the whole set), ``whole`` (``all``, or empty when fewer than two nodes),
    ``run`` (the run's reference, JSON), ``launcher``, ``service``, ``accelerator`` and ``os``.
    ``workflow_name`` and ``workflow_uid`` name the Workflow; without them the run is a local one.

    Raises:
        InputError: an option is malformed, no node matches, a node is being certified by another run,
            or the accelerator cannot be told from the nodes' labels.
    """
    given = dict(locals())  # the parameters, by name: the options are those CertifyOptions names
    options = check_options(**{name: given[name] for name in CertifyOptions.model_fields})
    port = connect()
    try:
        run = (
            RunRef(name=workflow_name, uid=workflow_uid, namespace=port.namespace)
            if workflow_name or workflow_uid
            else RunRef.local(port.namespace)
        )
    except ValidationError as exc:
        raise input_error(exc, "certify workflow") from None
    planned = make_plan(port, options, run)
    certified = planned.nodes + [e.node for e in planned.excluded]
    take_nodes(port, run, certified)
    OutcomeStore(port, run).put_document("plan", planned.model_dump_json())
    for name in certified:
        port.set_labels(name, {vocab.LABEL_CERTIFICATION: vocab.Certification.pending.value})
    write_params(**plan_outputs(planned))
    return planned


def load_plan(run: RunRef, port: ClusterPort | None = None) -> tuple[CertifyPlan, KeptRecipe]:
    """The run's stored plan and recipe (digest, thresholds, fabric).

    Raises:
        DsxError: the run stored no plan or recipe.
    """
    store = OutcomeStore(port or connect(), run)
    plan = CertifyPlan.model_validate_json(store.document("plan"))
    return plan, KeptRecipe.model_validate_json(store.document("recipe"))


def keep_recipe(run: RunRef, recipe: dict[str, Any]) -> str:
    """Keep the resolved recipe's digest and thresholds for the run's checks, smoke run and report.

    Raises:
        InputError: ``recipe`` is not a resolved recipe (no thresholds).
    """
    if not isinstance(recipe.get("thresholds"), dict):
        raise InputError(
            "recipe: not a resolved recipe (no 'thresholds' mapping); pass the resolve step's result"
        )
    digest, fabric = recipe.get("digest"), recipe.get("fabric")
    if fabric is not None and not isinstance(fabric, dict):
        raise InputError(f"recipe fabric: a mapping with rankPod and sources, not {type(fabric).__name__}")
    kept = KeptRecipe(
        digest=digest if isinstance(digest, str) else None, thresholds=recipe["thresholds"], fabric=fabric
    )
    kept.limits()  # refuse malformed thresholds before any test runs
    OutcomeStore(connect(), run).put_document("recipe", kept.model_dump_json())
    return f"recipe {kept.digest or '(no digest)'} kept for {run.name}"


def _backend(plan: CertifyPlan) -> Literal["gloo", "nccl"]:
    """gloo between local processes, and between the CPU ranks of a cluster without GPUs (``accelerator:
    cpu``, e.g. kind or a CI cluster); NCCL everywhere else."""
    if plan.launcher == "local" or plan.criteria.get("accelerator") == "cpu":
        return "gloo"
    return "nccl"


def _healthy_s(plan: CertifyPlan, thresholds: Thresholds, scope: Literal["node", "multi-node"]) -> float:
    """How long a healthy sweep of the plan's sizes takes, from the recipe's expected bandwidth."""
    expected = [t.bus_bw_gbps for t in thresholds.all_reduce(scope)]
    busbw = min(expected) if expected else FALLBACK_BUSBW_GBPS
    sizes = size_series(plan.min_bytes, plan.max_bytes, SWEEP.factor)
    iterations = plan.options.iters + SWEEP.warmup + 1  # timed, warm-up, data check
    seconds = sum(iterations * size * 2 / (busbw * 1e9) for size in sizes)
    return LAUNCH_OVERHEAD_S + seconds


def _job_launcher(plan: CertifyPlan, recipe: KeptRecipe) -> Any:
    """The plan's Job launcher, its pods fitted to the recipe's fabric and the operator's profile."""
    from steps.readiness.launchers.job import JobLauncher
    from steps.readiness.launchers.profiles import rank_pod_patch

    return JobLauncher.for_plan(plan, connect(), pod_patch=rank_pod_patch(recipe.model_dump()))


def _sweep(
    plan: CertifyPlan,
    recipe: KeptRecipe,
    subject: Subject,
    ranks: int,
    hosts: list[str],
    inject: list[str],
    scope: Literal["node", "multi-node"],
) -> CheckOutcome[CollectiveRun]:
    thresholds = recipe.limits()
    request = SweepRequest(
        subject=subject,
        ranks=ranks,
        backend=_backend(plan),
        min_bytes=plan.min_bytes,
        max_bytes=plan.max_bytes,
        factor=SWEEP.factor,
        iters=plan.options.iters,
        inject=inject + drill_injections(plan, hosts),
        timeout_s=group_timeout(_healthy_s(plan, thresholds, scope), thresholds),
        thresholds=thresholds,
        scope=scope,
        rank_hosts=hosts,
    )
    if plan.launcher == "local":
        return run_allreduce_sweep(request)
    return run_sweep(request, _job_launcher(plan, recipe))


def _summary_file(result: CheckResult) -> CheckResult:
    """Write the check's one line as the ``verdict`` output parameter too: Argo keeps a step's result only
    when a later step refers to it, but always shows output parameters."""
    write_params(verdict=result.model_dump_json())
    return result


def node_check(node: str, run: RunRef) -> CheckResult:
    """Single-node all-reduce sweep: the node's own GPUs (locally, two ranks standing for them).

    The full outcome is stored for the report (:mod:`steps.readiness.outcomes`); the result is one line.
    """
    port = connect()
    plan, recipe = load_plan(run, port)
    if node not in plan.nodes:
        raise InputError(f"node {node!r} is not in the plan ({', '.join(plan.nodes)})")
    subject = Subject(kind="node", name=node, members=[node])
    inject = local_injections(port, node, 0, "node") if plan.launcher == "local" else []
    ranks = plan.gpus_per_node
    outcome = _sweep(plan, recipe, subject, ranks, [node] * ranks, inject, "node")
    store = OutcomeStore(port, plan.run)
    store.put(outcome)
    result = check_result(outcome)
    diagnostics = plan.diagnostics.get(node)
    if diagnostics is not None:
        diagnosed = _diagnose(plan, recipe, subject, diagnostics)
        store.put(diagnosed)
        if STATUS_ORDER[diagnosed.status] > STATUS_ORDER[outcome.status]:
            result = check_result(diagnosed)
    return _summary_file(result)


def _diagnose(plan: CertifyPlan, recipe: KeptRecipe, subject: Subject, run: str) -> CheckOutcome[DiagResult]:
    """DCGM's diagnostics on the node of ``subject``: one local rank (its evidence in ``diag/`` of the
    step's folder, beside the sweep's), or the node's rank pods, whose rank 0 runs them."""
    request = DiagRequest(subject=subject, run=run, host=plan.options.dcgm_host)
    if plan.launcher == "local":
        folder = output_dir(None) / "diag"
        return run_diag(request, LocalLauncher(folder, 1, subject.members))
    return run_diag(request, _job_launcher(plan, recipe))


def group_members(plan: CertifyPlan, store: OutcomeStore, group: Subject) -> list[str]:
    """The members of ``group`` that earlier stages left standing: a group of racks tests the nodes that
    passed their own sweep and every other test of their own (DCGM's diagnostics, any check of a node);
    the whole set, those that also passed (or were in no) group of the group label.

    Testing a node already failed, or in doubt, would only fail (or cloud) the group with what is known.
    """
    own = [o for o in store.every_outcome() if o.subject.kind == "node"]
    swept = {o.subject.name for o in own if o.test == SWEEP_TEST}
    failed = {o.subject.name for o in own if o.status != "pass"}
    standing = [m for m in group.members if m in swept and m not in failed]
    if group.name != WHOLE:
        return standing
    racks = {
        o.subject.name: o
        for o in with_bisection(store.outcomes(ALLREDUCE_SWEEP, "group"), store)
        if o.subject.name != WHOLE
    }
    results = node_results(plan.nodes, [v for o in racks.values() for v in o.verdicts])
    doubtful = {r.name for r in results if r.status != "passed"}
    return [m for m in standing if m not in doubtful]


def group_check(group: str, run: RunRef) -> CheckResult:
    """Multi-node all-reduce sweep over the plan's group named ``group`` (locally, one rank per node).

    Only the members earlier stages left standing take part (:func:`group_members`); with fewer than two
    there is nothing to test together, and the check says so and stores nothing. The full outcome is
    stored for the report (:mod:`steps.readiness.outcomes`); the result is one line.
    """
    port = connect()
    plan, recipe = load_plan(run, port)
    planned = plan.group(group)
    store = OutcomeStore(port, plan.run)
    members = group_members(plan, store, planned)
    if len(members) < 2:
        left = ", ".join(members) or "none"
        return _summary_file(
            CheckResult(
                test=SWEEP_TEST,
                subject=group,
                status="pass",
                message=f"group {group}: not tested: fewer than two members passed earlier stages ({left})",
            )
        )
    subject = Subject(kind="group", name=group, members=members)
    outcome = _certify_group(subject, plan, recipe)
    store.put(outcome)
    return _summary_file(check_result(outcome))


def _certify_group(group: Subject, plan: CertifyPlan, recipe: KeptRecipe) -> CheckOutcome[CollectiveRun]:
    inject: list[str] = []
    if plan.launcher == "local":
        port = connect()
        for rank, node in enumerate(group.members):
            inject += local_injections(port, node, rank, "group")
        return _sweep(plan, recipe, group, len(group.members), list(group.members), inject, "multi-node")
    ranks = len(group.members) * plan.gpus_per_node
    hosts = [node for node in group.members for _ in range(plan.gpus_per_node)]
    return _sweep(plan, recipe, group, ranks, hosts, inject, "multi-node")


def sweep_group(group: Subject, plan: CertifyPlan, recipe: KeptRecipe) -> CheckOutcome[CollectiveRun]:
    """A multi-node sweep of ``group`` as the plan runs group tests (bisection tests its parts with it)."""
    return _certify_group(group, plan, recipe)


def screening(
    groups: list[CheckOutcome[CollectiveRun]], store: OutcomeStore, p_min: float = P_MIN
) -> list[Screening]:
    """How long each group was screened: one pass of its group check, or its bisection's screening.

    A certification tests each group once; a fault failing one test in five goes unseen four times in five.
    The report says so for each group: the passes, the passes that would catch a fault failing ``p_min``
    of its tests with 99%, and the least intermittence they would have caught.
    """
    needed = screening_runs(p_min, DELTA)
    searched = {r.group: r for r in Records(store).summaries()}
    found: list[Screening] = []
    for outcome in sorted(groups, key=lambda o: o.subject.name):
        summary = searched.get(outcome.subject.name)
        passes = (summary.screening or 0) if summary is not None else int(outcome.status == "pass")
        found.append(
            Screening(
                group=outcome.subject.name,
                passes=passes,
                needed=needed,
                caught=round(caught(passes, DELTA), 4),
                bisected=summary is not None,
            )
        )
    return found


Sweeps = list[CheckOutcome[CollectiveRun]]


def _stored_sweeps(store: OutcomeStore, plan: CertifyPlan) -> tuple[Sweeps, Sweeps]:
    """The node and group outcomes the checks stored; a planned check that stored none is an error.

    A group expects an outcome only when at least two of its members were left standing to test it.
    """
    nodes_found = {o.subject.name: o for o in store.outcomes(ALLREDUCE_SWEEP, "node")}
    nodes = [
        nodes_found.get(n) or _missing("node", Subject(kind="node", name=n, members=[n]), plan)
        for n in plan.nodes
    ]
    groups_found = {
        o.subject.name: o for o in with_bisection(store.outcomes(ALLREDUCE_SWEEP, "group"), store)
    }
    groups: Sweeps = []
    for group in plan.groups:
        if group.name in groups_found:
            groups.append(groups_found[group.name])
        elif len(group_members(plan, store, group)) >= 2:
            groups.append(_missing("group", group, plan))
    return nodes, groups


def _missing(kind: str, subject: Subject, plan: CertifyPlan) -> CheckOutcome[CollectiveRun]:
    message = (
        f"{kind} {subject.name}: its {kind}-check stored no outcome for workflow {plan.run.name} "
        "(the step did not finish)"
    )
    return ALLREDUCE_SWEEP.unrun(verdict(subject, INCOMPLETE_TEST, "error", message))


def smoke_nodes(plan: CertifyPlan, store: OutcomeStore) -> list[str]:
    """The nodes the smoke run takes: the planned nodes that no sweep, and no other test of a node of its
    own (DCGM's diagnostics, any check of a node), failed or left in doubt."""
    nodes, groups = _stored_sweeps(store, plan)
    own = [o for o in store.every_outcome(but=SWEEP_TEST) if o.subject.kind == "node"]
    verdicts = [v for o in [*nodes, *groups, *own] for v in o.verdicts]
    results = {r.name: r.status for r in node_results(plan.nodes, verdicts)}
    return [n for n in plan.nodes if results.get(n) == "passed"]


def smoke_check(run: RunRef) -> CheckResult:
    """Training smoke run (DDP, a few transformer layers) on the nodes that passed the checks before it
    (:func:`smoke_nodes`).

    Reads the earlier checks' outcomes from the run's store and stores its own there; the result is one
    line.
    """
    port = connect()
    plan, recipe = load_plan(run, port)
    store = OutcomeStore(port, plan.run)
    outcome = _smoke(plan, recipe, smoke_nodes(plan, store))
    store.put(outcome)
    return _summary_file(check_result(outcome))


def _smoke(plan: CertifyPlan, recipe: KeptRecipe, passing: list[str]) -> CheckOutcome[SmokeResult]:
    subject = Subject(kind="group", name="smoke", members=passing)
    if not passing:
        message = "no node passed the checks before it: nothing to run the smoke run on"
        return TRAINING_SMOKE.unrun(verdict(subject, SMOKE_TEST, "error", message), str(output_dir(None)))
    thresholds = recipe.limits()
    local = plan.launcher == "local"
    ranks = max(len(passing), 2) if local else len(passing) * plan.gpus_per_node
    hosts = (passing * 2)[:ranks] if local else [n for n in passing for _ in range(plan.gpus_per_node)]
    inject: list[str] = []
    if local:
        port = connect()
        for rank, node in enumerate(hosts):
            inject += local_injections(port, node, rank, "train")
    inject += drill_injections(plan, hosts, ("delay", "fail", "hang"))
    request = SmokeRequest(
        subject=subject,
        ranks=ranks,
        backend=_backend(plan),
        inject=inject,
        timeout_s=group_timeout(LAUNCH_OVERHEAD_S * 3, thresholds),
        thresholds=thresholds,
        rank_hosts=hosts,
    )
    if local:
        return run_training_smoke(request)
    return run_smoke(request, _job_launcher(plan, recipe))


def _relative(groups: Sweeps, recipe: KeptRecipe) -> list[Verdict]:
    """Groups of equal size compared with each other (median and MAD), where enough of them ran."""
    thresholds = recipe.limits()
    by_size: dict[int, list[GroupRun]] = {}
    for outcome in groups:
        if outcome.result is not None and outcome.subject.name != WHOLE:
            by_size.setdefault(len(outcome.subject.members), []).append(
                GroupRun(subject=outcome.subject, run=outcome.result)
            )
    verdicts: list[Verdict] = []
    for runs in by_size.values():
        if len(runs) >= thresholds.nccl.relative.min_groups:
            verdicts += judge_groups_relative(RelativeRequest(groups=runs, thresholds=thresholds))
    return verdicts


def report(run: RunRef) -> CertifySummary:
    """Write the report (JSON, Markdown, plots), keep it in a ConfigMap, and label every node.

    The outcomes come from the run's store. Every certified node gets
    ``dsx.dev/certification=passed|failed|pending`` with annotations (time, recipe digest, the first
    reason) in one patch, failed nodes first; an Event records it on the node (best-effort). The run's
    Leases are released and its stored outcomes deleted last, once the report holds them.

    Raises:
        DsxError: some nodes' verdicts could not be written (named; they stay ``pending``).
    """
    port = connect()
    plan, recipe = load_plan(run, port)
    store = OutcomeStore(port, plan.run)
    nodes, groups = _stored_sweeps(store, plan)
    others = store.every_outcome(but=SWEEP_TEST)  # every other test's, whatever it is
    digest = recipe.digest
    excluded = [
        verdict(
            Subject(kind="node", name=e.node, members=[e.node]),
            "node-ready",
            "error",
            f"node {e.node}: {e.reason}",
            node=e.node,
        )
        for e in plan.excluded
    ]
    report = build_report(
        ReportRequest(
            nodes=plan.nodes + [e.node for e in plan.excluded],
            groups=plan.groups,
            outcomes=[*nodes, *groups, *others],
            verdicts=excluded + _relative(groups, recipe),
            screening=screening(groups, store, plan.options.p_min),
            recipe_digest=digest,
            started_at=plan.started_at,
            thresholds=recipe.thresholds,
        )
    )
    kept = keep_report(port, plan.run, dump_json(report), render_markdown(report))
    _, missed = label_verdicts(port, report.nodes, str(digest or ""), now())
    failed = {r.name: (r.reasons[0] if r.reasons else "") for r in report.nodes if r.status == "failed"}
    pending = {r.name: (r.reasons[0] if r.reasons else "") for r in report.nodes if r.status == "pending"}
    summary = CertifySummary(
        status=report.status,
        summary=report.summary,
        passed=sum(1 for n in report.nodes if n.status == "passed"),
        failed=dict(sorted(failed.items())[:SUMMARY_NODES]),
        pending=dict(sorted(pending.items())[:SUMMARY_NODES]),
        failed_count=len(failed),
        pending_count=len(pending),
        not_labelled=sorted(missed),
        recipe_digest=report.recipe_digest,
        report=kept,
        report_files=report.files,
    )
    write_text(output_dir(None) / "summary.json", summary.model_dump_json(indent=2) + "\n")
    if missed:
        raise DsxError(
            f"certification report {kept or 'written'}, but the verdicts of {len(missed)} node(s) could "
            f"not be written: {', '.join(sorted(missed))}; they stay {vocab.Certification.pending.value}"
        )
    release_nodes(port, plan.run, plan.nodes + [e.node for e in plan.excluded])
    store.delete()
    return summary


def gate(summary: CertifySummary) -> str:
    """End the workflow Failed, naming each failed or uncertified node and why, when certification failed."""
    if summary.status == "passed" and not summary.failed_count and not summary.pending_count:
        return f"certification passed: {summary.passed} node(s)"
    lines = [f"{node}: {reason}" for node, reason in summary.failed.items()]
    lines += [f"{node} (pending): {reason}" for node, reason in summary.pending.items()]
    more = summary.failed_count + summary.pending_count - len(lines)
    if more > 0:
        lines.append(f"and {more} more (report {summary.report or 'artifact'})")
    raise DsxError("certification failed: " + ("; ".join(lines) or summary.summary))


def release(workflow_name: str, workflow_uid: str) -> str:
    """The workflow's exit handler: give up the run's hold on its nodes, however the run ended.

    The report step releases the Leases when it finishes; when an earlier step failed, or the workflow
    was stopped, this does, so that the next certification need not wait for the Leases to expire. The
    nodes the report did not label keep ``pending``: nothing vouches for them.
    """
    port = connect()
    try:
        run = RunRef(name=workflow_name, uid=workflow_uid, namespace=port.namespace)
    except ValidationError as exc:
        raise input_error(exc, "certify workflow") from None
    released = release_held(port, run)
    return f"released {len(released)} node(s) held by {run.name}" + (
        f": {', '.join(released)}" if released else ""
    )
