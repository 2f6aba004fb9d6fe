"""The certification pipeline's steps: plan, node and group checks, smoke run, report and labels.

Each function here is one step of the ``dsx-certify`` workflow, called through Hera's runner with
pydantic inputs and outputs (this module must not use ``from __future__ import annotations``).

Where the group tests run:

* ``local``: on this machine, one rank process per node, over gloo. The simulated fleet's faults are
  turned into injected faults of the rank that stands for the node (a slow NIC delays that rank's
  collectives in proportion to the bandwidth it lost), and every output labels them as injected. The
  measurements are real: the straggler is found by timing, not by reading the fault.
* ``job``: on the cluster, as an Indexed Job with a headless Service for rendezvous, pinned to exactly
  the group's nodes (see :mod:`steps.readiness.jobs`).

``auto`` picks ``local`` for a simulated fleet (its nodes cannot run pods) and ``job`` otherwise.
"""

import json
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import Field, ValidationError

from steps.cluster import ClusterPort, Node, connect
from steps.cluster import vocabulary as vocab
from steps.errors import DsxError, InputError
from steps.readiness.checks import (
    GroupRun,
    RelativeRequest,
    SmokeOutcome,
    SmokeRequest,
    SweepOutcome,
    SweepRequest,
    judge_groups_relative,
    run_allreduce_sweep,
    run_training_smoke,
)
from steps.readiness.evidence import output_dir, write_text
from steps.readiness.models import Model, Subject, Verdict
from steps.readiness.outcomes import CheckResult, OutcomeStore, RunRef, check_result
from steps.readiness.report import ReportRequest, build_report
from steps.readiness.sizes import parse_size, size_series
from steps.readiness.thresholds import Thresholds, group_timeout, load_thresholds

__all__ = [
    "ACCELERATORS",
    "CertifyOptions",
    "CertifyPlan",
    "CertifySummary",
    "Exclusion",
    "certification_gate",
    "certify_group",
    "certify_node",
    "certify_smoke",
    "finish_certification",
    "local_injections",
    "plan_certification",
]

Launcher = Literal["local", "job"]

#: GPU Feature Discovery product names (``nvidia.com/gpu.product``) to the recipe's accelerator names.
#: Longest match first: ``GB200`` must not read as ``B200``.
ACCELERATORS: tuple[tuple[str, str], ...] = (
    ("GB200", "gb200"),
    ("B200", "b200"),
    ("H200", "h200"),
    ("H100", "h100"),
    ("A100", "a100"),
)

#: A local rank standing for a node whose links give a quarter of their nominal bandwidth is delayed
#: by this much per collective for each multiple of the bandwidth it lost (a quarter: 3 x 10 ms), up to
#: the cap, so that a badly degraded node still finishes within the group test's timeout.
LOCAL_DELAY_PER_LOST_MULTIPLE_S = 0.010
LOCAL_DELAY_CAP_S = 0.100
#: Ranks per node in a local single-node check (two stand for the node's GPUs over NVLink).
LOCAL_RANKS_PER_NODE = 2
#: Launch and rendezvous time counted into every healthy-run estimate, seconds.
LAUNCH_OVERHEAD_S = 20.0
#: Bus bandwidth assumed for a healthy run when the recipe has no absolute figure (gloo on CPU), GB/s.
FALLBACK_BUSBW_GBPS = 0.2


class CertifyOptions(Model):
    """What the operator chose when submitting the workflow."""

    selector: str = Field(default="", description="label selector of the nodes to certify (all when empty)")
    group_label: str = Field(default=vocab.LABEL_RACK, description="node label that forms the groups")
    launcher: Literal["auto", "local", "job"] = "auto"
    accelerator: str = Field(default="auto", description="recipe accelerator; auto: from GPU labels")
    service: str = Field(default="auto", description="recipe service; auto: local for local runs, else any")
    os: str = Field(default="auto", description="recipe os; auto: from the nodes' OS image")
    min_bytes: str = Field(default="auto", description="smallest message; auto: 64KiB local, 1MiB job")
    max_bytes: str = Field(default="auto", description="largest message; auto: 4MiB local, 8GiB job")
    iters: int = Field(default=20, ge=1)
    namespace: str = Field(default="", description="namespace of group jobs (default: DSX_NAMESPACE)")
    image: str = Field(default="", description="image of group jobs (default: DSX_IMAGE)")


class Exclusion(Model):
    """A selected node that cannot take part, and why."""

    node: str
    reason: str


class CertifyPlan(Model):
    """The nodes and groups to certify, how, and the recipe criteria they imply."""

    options: CertifyOptions
    launcher: Launcher
    nodes: list[str]
    excluded: list[Exclusion] = Field(default_factory=list, description="not ready: they fail certification")
    groups: list[Subject] = Field(description="the whole set, then one group per value of the group label")
    gpus_per_node: int
    min_bytes: int
    max_bytes: int
    criteria: dict[str, str] = Field(description="service, accelerator and os for the recipe")
    injected: dict[str, list[str]] = Field(
        default_factory=dict, description="local runs: faults the simulated fleet plays, per node"
    )
    started_at: str
    run: RunRef = Field(description="the Workflow whose steps share their outcomes (readiness.outcomes)")


class CertifySummary(Model):
    """What the workflow reports at the end, and what the gate decides on."""

    status: Literal["passed", "failed"]
    summary: str
    passed: list[str]
    failed: dict[str, str] = Field(description="failed node -> first reason")
    recipe_digest: str | None
    report_files: list[str]


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _accelerator(nodes: list[Node]) -> str:
    products = sorted({n.gpu_product for n in nodes})
    found: set[str] = set()
    for product in products:
        name = next((acc for key, acc in ACCELERATORS if key in product.upper()), None)
        if name is None:
            holder = next(n.name for n in nodes if n.gpu_product == product)
            raise InputError(
                f"node {holder}: GPU product {product or '(no nvidia.com/gpu.product label)'!r} is not one "
                f"dsx knows ({', '.join(acc for _, acc in ACCELERATORS)}); pass accelerator explicitly"
            )
        found.add(name)
    if len(found) != 1:
        raise InputError(
            f"the selected nodes mix accelerators {sorted(found)}: certify each kind with its own selector"
        )
    return found.pop()


def _os(nodes: list[Node]) -> str:
    images = {n.node_info.os_image.lower() for n in nodes}
    if images and all("ubuntu" in i for i in images):
        return "ubuntu"
    if images and all("red hat" in i or "rhel" in i for i in images):
        return "rhel"
    return "any"


def _delay_ms(lost_multiples: float) -> int:
    return round(min(lost_multiples * LOCAL_DELAY_PER_LOST_MULTIPLE_S, LOCAL_DELAY_CAP_S) * 1000)


def local_injections(port: ClusterPort, node: str, rank: int, scope: Literal["node", "group"]) -> list[str]:
    """The injected faults that make a local rank play ``node`` as the simulated fleet has it.

    A group test feels the node's scale-out links (``slow-nic``); a single-node test feels its NVLink
    (``slow-nvlink``) and a failed GPU (``failing-gpu``). Real clusters have no such model: empty.
    """
    health_of = getattr(port, "health", None)
    if health_of is None:
        return []
    health = health_of(node)
    specs: list[str] = []
    if scope == "group":
        if health.link_gbps < health.nominal_link_gbps:
            lost = health.nominal_link_gbps / max(health.link_gbps, 1e-9) - 1
            specs.append(f"{rank}:delay={_delay_ms(lost)}ms")
    else:
        if any(not gpu.healthy for gpu in health.gpus):
            specs.append(f"{rank}:fail")
        else:
            slowest = min(
                (g.nvlink_gbps / g.nominal_nvlink_gbps for g in health.gpus if g.nominal_nvlink_gbps > 0),
                default=1.0,
            )
            if slowest < 1.0:
                lost = 1 / max(slowest, 1e-9) - 1
                specs.append(f"{rank + 1}:delay={_delay_ms(lost)}ms")
    return specs


def plan_certification(
    selector: str = "",
    group_label: str = vocab.LABEL_RACK,
    launcher: str = "auto",
    accelerator: str = "auto",
    service: str = "auto",
    os: str = "auto",
    min_bytes: str = "auto",
    max_bytes: str = "auto",
    iters: int = 20,
    namespace: str = "",
    image: str = "",
    workflow_name: str = "",
    workflow_uid: str = "",
) -> CertifyPlan:
    """Discover the nodes to certify and the groups to test; choose the launcher and recipe criteria.

    Nodes opted out with ``dsx.dev/managed=false`` are left alone; nodes that are not Ready cannot be
    tested and are certified as failed. Output parameters for the workflow are written under
    ``$DSX_OUTPUT_DIR/params``: ``nodes`` and ``groups`` (JSON lists of names), ``launcher``, ``service``,
    ``accelerator`` and ``os``. ``workflow_name`` and ``workflow_uid`` name the Workflow the checks store
    their outcomes under; without them the run is a local one with a fresh uid.

    Raises:
        InputError: an option is malformed, no node matches, or the accelerator cannot be told from the
            nodes' labels.
    """
    try:
        options = CertifyOptions(
            selector=selector,
            group_label=group_label,
            launcher=launcher,
            accelerator=accelerator,
            service=service,
            os=os,
            min_bytes=min_bytes,
            max_bytes=max_bytes,
            iters=iters,
            namespace=namespace,
            image=image,
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        raise InputError(f"certify option {first['loc'][0]}: {first['msg']}") from None
    port = connect()
    try:
        given = workflow_name or workflow_uid
        run = (
            RunRef(name=workflow_name, uid=workflow_uid, namespace=port.namespace)
            if given
            else RunRef.local(port.namespace)
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        raise InputError(f"certify workflow {first['loc'][0]}: {first['msg']}") from None
    selected = port.list_nodes(options.selector or None)
    managed = [n for n in selected if n.managed]
    if not managed:
        what = f"selector {options.selector!r}" if options.selector else "the cluster"
        raise InputError(f"no node to certify: {what} matches no managed node")
    ready = [n for n in managed if n.ready]
    excluded = [Exclusion(node=n.name, reason="node is not Ready") for n in managed if not n.ready]
    if not ready:
        raise InputError(f"no node to certify: none of {', '.join(n.name for n in managed)} is Ready")
    chosen: Launcher
    if options.launcher == "auto":
        chosen = "local" if hasattr(port, "health") else "job"
    else:
        chosen = options.launcher
    if chosen == "local":
        accelerator = "cpu" if options.accelerator == "auto" else options.accelerator
        service = "local" if options.service == "auto" else options.service
        gpus = LOCAL_RANKS_PER_NODE
        default_min, default_max = "64KiB", "4MiB"
    else:
        accelerator = _accelerator(ready) if options.accelerator == "auto" else options.accelerator
        service = "any" if options.service == "auto" else options.service
        gpus = min((n.gpu_count for n in ready), default=0)
        if gpus < 1:
            raise InputError(f"node {min(ready, key=lambda n: n.gpu_count).name}: offers no nvidia.com/gpu")
        default_min, default_max = "1MiB", "8GiB"
    os_name = _os(ready) if options.os == "auto" else options.os
    smallest = parse_size(default_min if options.min_bytes == "auto" else options.min_bytes, "min-bytes")
    largest = parse_size(default_max if options.max_bytes == "auto" else options.max_bytes, "max-bytes")
    if smallest > largest:
        raise InputError(f"min-bytes {smallest} is larger than max-bytes {largest}")
    names = sorted(n.name for n in ready)
    groups = [Subject(kind="group", name="all", members=names)] if len(names) > 1 else []
    by_label: dict[str, list[str]] = {}
    for node in ready:
        value = node.labels.get(options.group_label)
        if value:
            by_label.setdefault(value, []).append(node.name)
    for value in sorted(by_label):
        members = sorted(by_label[value])
        if len(members) > 1 and members != names:
            groups.append(Subject(kind="group", name=value, members=members))
    injected: dict[str, list[str]] = {}
    if chosen == "local":
        for name in names:
            faults = local_injections(port, name, 0, "group") + local_injections(port, name, 0, "node")
            if faults:
                injected[name] = sorted(f.split(":", 1)[1] for f in faults)
    plan = CertifyPlan(
        options=options,
        launcher=chosen,
        nodes=names,
        excluded=excluded,
        groups=groups,
        gpus_per_node=gpus,
        min_bytes=smallest,
        max_bytes=largest,
        criteria={"service": service, "accelerator": accelerator, "os": os_name},
        injected=injected,
        started_at=_now(),
        run=run,
    )
    params = output_dir(None) / "params"
    values = {
        "nodes": json.dumps(names),
        "groups": json.dumps([g.name for g in groups]),
        "launcher": chosen,
        **plan.criteria,
    }
    for key, value in values.items():
        write_text(params / key, value)
    return plan


def _thresholds(recipe: dict[str, Any]) -> Thresholds:
    return load_thresholds(recipe.get("thresholds"))


def _healthy_s(plan: CertifyPlan, thresholds: Thresholds, scope: Literal["node", "multi-node"]) -> float:
    """How long a healthy sweep of the plan's sizes takes, from the recipe's expected bandwidth."""
    expected = [t.bus_bw_gbps for t in thresholds.all_reduce(scope)]
    busbw = min(expected) if expected else FALLBACK_BUSBW_GBPS
    sizes = size_series(plan.min_bytes, plan.max_bytes, 4)
    iterations = plan.options.iters + 5 + 1  # timed, warm-up, data check
    seconds = sum(iterations * size * 2 / (busbw * 1e9) for size in sizes)
    return LAUNCH_OVERHEAD_S + seconds


def _sweep(
    plan: CertifyPlan,
    recipe: dict[str, Any],
    subject: Subject,
    ranks: int,
    hosts: list[str],
    inject: list[str],
    scope: Literal["node", "multi-node"],
) -> SweepOutcome:
    thresholds = _thresholds(recipe)
    timeout = group_timeout(_healthy_s(plan, thresholds, scope), thresholds)
    request = SweepRequest(
        subject=subject,
        ranks=ranks,
        backend="gloo" if plan.launcher == "local" else "nccl",
        min_bytes=plan.min_bytes,
        max_bytes=plan.max_bytes,
        factor=4,
        iters=plan.options.iters,
        inject=inject,
        timeout_s=timeout,
        thresholds=recipe.get("thresholds"),
        scope=scope,
        rank_hosts=hosts,
    )
    if plan.launcher == "local":
        return run_allreduce_sweep(request)
    from steps.readiness.jobs import run_sweep_job

    return run_sweep_job(request, plan, connect())


def certify_node(node: str, plan: CertifyPlan, recipe: dict[str, Any]) -> CheckResult:
    """Single-node all-reduce sweep: the node's own GPUs (locally, two ranks standing for them).

    The full outcome is stored for the report (:mod:`steps.readiness.outcomes`); the result is one line.
    """
    if node not in plan.nodes:
        raise InputError(f"node {node!r} is not in the plan ({', '.join(plan.nodes)})")
    subject = Subject(kind="node", name=node, members=[node])
    port = connect()
    inject = local_injections(port, node, 0, "node") if plan.launcher == "local" else []
    ranks = plan.gpus_per_node
    outcome = _sweep(plan, recipe, subject, ranks, [node] * ranks, inject, "node")
    OutcomeStore(port, plan.run).put("node", outcome)
    return check_result("node", outcome)


def certify_group(group: str, plan: CertifyPlan, recipe: dict[str, Any]) -> CheckResult:
    """Multi-node all-reduce sweep over the plan's group named ``group`` (locally, one rank per node).

    The full outcome is stored for the report (:mod:`steps.readiness.outcomes`); the result is one line.
    """
    found = next((g for g in plan.groups if g.name == group), None)
    if found is None:
        raise InputError(f"group {group!r} is not in the plan ({', '.join(g.name for g in plan.groups)})")
    outcome = _certify_group(found, plan, recipe)
    OutcomeStore(connect(), plan.run).put("group", outcome)
    return check_result("group", outcome)


def _certify_group(group: Subject, plan: CertifyPlan, recipe: dict[str, Any]) -> SweepOutcome:
    inject: list[str] = []
    if plan.launcher == "local":
        port = connect()
        for rank, node in enumerate(group.members):
            inject += local_injections(port, node, rank, "group")
        return _sweep(plan, recipe, group, len(group.members), list(group.members), inject, "multi-node")
    ranks = len(group.members) * plan.gpus_per_node
    hosts = [node for node in group.members for _ in range(plan.gpus_per_node)]
    return _sweep(plan, recipe, group, ranks, hosts, inject, "multi-node")


def _stored_sweeps(store: OutcomeStore, plan: CertifyPlan) -> tuple[list[SweepOutcome], list[SweepOutcome]]:
    """The node and group outcomes the checks stored; a planned check that stored none is an error."""

    def planned(kind: Literal["node", "group"], subjects: list[Subject]) -> list[SweepOutcome]:
        found = {outcome.subject.name: outcome for outcome in store.sweeps(kind)}
        return [found.get(subject.name) or _missing(kind, subject, plan) for subject in subjects]

    nodes = [Subject(kind="node", name=n, members=[n]) for n in plan.nodes]
    return planned("node", nodes), planned("group", plan.groups)


def _missing(kind: str, subject: Subject, plan: CertifyPlan) -> SweepOutcome:
    message = (
        f"{kind} {subject.name}: its {kind}-check stored no outcome for workflow {plan.run.name} "
        "(the step did not finish)"
    )
    verdict = Verdict(subject=subject, test="allreduce-run", status="error", message=message)
    return SweepOutcome(
        subject=subject, status="error", verdicts=[verdict], evidence=[], out_dir="", elapsed_s=0.0
    )


def _failed_nodes(outcomes: list[SweepOutcome], excluded: list[Exclusion]) -> dict[str, str]:
    from steps.readiness.report import node_results

    members = sorted({m for o in outcomes for m in o.subject.members})
    verdicts = [v for o in outcomes for v in o.verdicts]
    failed = {r.name: r.reasons[0] for r in node_results(members, verdicts) if r.status == "failed"}
    failed.update({e.node: e.reason for e in excluded})
    return failed


def certify_smoke(plan: CertifyPlan, recipe: dict[str, Any]) -> CheckResult:
    """Training smoke run (DDP, a few transformer layers) on the nodes that passed the sweeps.

    Reads the sweeps' outcomes from the run's store and stores its own there; the result is one line.
    """
    store = OutcomeStore(connect(), plan.run)
    outcome = _smoke(plan, recipe, *_stored_sweeps(store, plan))
    store.put("smoke", outcome)
    return check_result("smoke", outcome)


def _smoke(
    plan: CertifyPlan, recipe: dict[str, Any], nodes: list[SweepOutcome], groups: list[SweepOutcome]
) -> SmokeOutcome:
    failed = _failed_nodes(nodes + groups, plan.excluded)
    passing = [n for n in plan.nodes if n not in failed]
    subject = Subject(kind="group", name="smoke", members=passing)
    if not passing:
        return SmokeOutcome(
            subject=subject,
            status="error",
            verdicts=[
                Verdict(
                    subject=subject,
                    test="training-smoke",
                    status="error",
                    message="no node passed the sweeps: nothing to run the smoke run on",
                )
            ],
            evidence=[],
            out_dir=str(output_dir(None)),
            elapsed_s=0.0,
        )
    thresholds = _thresholds(recipe)
    local = plan.launcher == "local"
    ranks = max(len(passing), 2) if local else len(passing) * plan.gpus_per_node
    hosts = (passing * 2)[:ranks] if local else [n for n in passing for _ in range(plan.gpus_per_node)]
    inject: list[str] = []
    if local:
        port = connect()
        for rank, node in enumerate(hosts):
            inject += local_injections(port, node, rank, "group")
    request = SmokeRequest(
        subject=subject,
        ranks=ranks,
        backend="gloo" if local else "nccl",
        inject=inject,
        timeout_s=group_timeout(LAUNCH_OVERHEAD_S * 3, thresholds),
        thresholds=recipe.get("thresholds"),
        rank_hosts=hosts,
    )
    if local:
        return run_training_smoke(request)
    from steps.readiness.jobs import run_smoke_job

    return run_smoke_job(request, plan, connect())


def _relative(groups: list[SweepOutcome], recipe: dict[str, Any]) -> list[Verdict]:
    """Groups of equal size compared with each other (median and MAD), where enough of them ran."""
    thresholds = _thresholds(recipe)
    by_size: dict[int, list[GroupRun]] = {}
    for outcome in groups:
        if outcome.run is not None and outcome.subject.name != "all":
            by_size.setdefault(len(outcome.subject.members), []).append(
                GroupRun(subject=outcome.subject, run=outcome.run)
            )
    verdicts: list[Verdict] = []
    for runs in by_size.values():
        if len(runs) >= thresholds.nccl.relative.min_groups:
            verdicts += judge_groups_relative(
                RelativeRequest(groups=runs, thresholds=recipe.get("thresholds"))
            )
    return verdicts


def finish_certification(plan: CertifyPlan, recipe: dict[str, Any]) -> CertifySummary:
    """Write the report (JSON, Markdown, plots) and label every node with its verdict.

    The outcomes come from the run's store. Every certified node gets
    ``dsx.dev/certification=passed|failed`` and annotations with the time, the recipe digest and, for a
    failure, the first reason; an Event records it on the node. The stored outcomes are deleted last,
    once the report holds them.
    """
    port = connect()
    store = OutcomeStore(port, plan.run)
    nodes, groups = _stored_sweeps(store, plan)
    smoke = store.smoke()
    digest = recipe.get("digest")
    excluded = [
        Verdict(
            subject=Subject(kind="node", name=e.node, members=[e.node]),
            test="node-ready",
            status="error",
            node=e.node,
            message=f"node {e.node}: {e.reason}",
        )
        for e in plan.excluded
    ]
    report = build_report(
        ReportRequest(
            nodes=plan.nodes + [e.node for e in plan.excluded],
            groups=plan.groups,
            sweeps=nodes + groups,
            smoke=[smoke] if smoke is not None else [],
            verdicts=excluded + _relative(groups, recipe),
            recipe_digest=digest if isinstance(digest, str) else None,
            started_at=plan.started_at,
            thresholds=recipe.get("thresholds"),
        )
    )
    stamp = _now()
    failed: dict[str, str] = {}
    for result in report.nodes:
        verdict = vocab.Certification.passed if result.status == "passed" else vocab.Certification.failed
        reason = result.reasons[0] if result.reasons else ""
        if result.status == "failed":
            failed[result.name] = reason
        port.set_labels(result.name, {vocab.LABEL_CERTIFICATION: verdict.value})
        port.set_annotations(
            result.name,
            {
                vocab.ANNOTATION_CERTIFIED_AT: stamp,
                vocab.ANNOTATION_CERTIFICATION_RECIPE: str(digest or ""),
                vocab.ANNOTATION_CERTIFICATION_REASON: reason[:250] or None,
            },
        )
        port.record_event(
            result.name,
            "DsxCertificationPassed" if result.status == "passed" else "DsxCertificationFailed",
            f"dsx certification {result.status}" + (f": {reason[:200]}" if reason else ""),
            "Normal" if result.status == "passed" else "Warning",
        )
    summary = CertifySummary(
        status=report.status,
        summary=report.summary,
        passed=sorted(n.name for n in report.nodes if n.status == "passed"),
        failed=dict(sorted(failed.items())),
        recipe_digest=report.recipe_digest,
        report_files=report.files,
    )
    write_text(output_dir(None) / "summary.json", summary.model_dump_json(indent=2) + "\n")
    store.delete()
    return summary


def certification_gate(summary: CertifySummary) -> str:
    """End the workflow Failed, naming each failed node and why, when certification failed."""
    if summary.status == "passed":
        return f"certification passed: {', '.join(summary.passed)}"
    lines = [f"{node}: {reason}" for node, reason in summary.failed.items()]
    raise DsxError("certification failed: " + ("; ".join(lines) or summary.summary))
