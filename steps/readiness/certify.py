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
  the group's nodes (see :mod:`steps.readiness.jobs`).

``auto`` picks ``local`` for a simulated fleet (its nodes cannot run pods) and ``job`` otherwise.
"""

import json
import re
import sys
from datetime import UTC, datetime
from typing import Any, Literal, get_args

from pydantic import Field, ValidationError

from steps.cluster import ClusterPort, Node, connect
from steps.cluster import vocabulary as vocab
from steps.cluster.base import lease_name
from steps.cluster.health import health_source
from steps.cluster.selectors import parse_selector
from steps.errors import DsxError, InputError
from steps.files import write_text
from steps.models import input_error
from steps.readiness.bisect.records import with_bisection
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
from steps.readiness.evidence import output_dir
from steps.readiness.models import Model, Subject, Verdict, dump_json
from steps.readiness.outcomes import (
    LOCAL_RUN_NAME,
    CheckResult,
    OutcomeStore,
    RunRef,
    check_result,
    keep_report,
)
from steps.readiness.report import (
    INCOMPLETE_TEST,
    ReportRequest,
    build_report,
    node_results,
    render_markdown,
)
from steps.readiness.sizes import parse_size, size_series
from steps.readiness.thresholds import Thresholds, group_timeout, load_thresholds

__all__ = [
    "ACCELERATORS",
    "AUTO",
    "LAUNCHERS",
    "PLAN_OUTPUTS",
    "RECIPE_INTENT",
    "CertifyOptions",
    "CertifyPlan",
    "CertifySummary",
    "Exclusion",
    "check_options",
    "gate",
    "group_check",
    "group_members",
    "keep_recipe",
    "load_plan",
    "local_injections",
    "node_check",
    "plan",
    "release",
    "report",
    "smoke_check",
    "sweep_group",
]

Launcher = Literal["local", "job"]
LAUNCHERS: tuple[Launcher, ...] = get_args(Launcher)
"""Where group tests run (the ``launcher`` option; ``auto`` picks one, see the module's notes)."""

AUTO = "auto"
"""The value of an option that the plan works out itself (launcher, recipe criteria, message sizes)."""

RECIPE_INTENT = "training"
"""The recipe intent certification judges against: its tests are collectives and a training run."""

PLAN_OUTPUTS: tuple[str, ...] = (
    "nodes",
    "groups",
    "whole",
    "run",
    "launcher",
    "service",
    "accelerator",
    "os",
)
"""The plan's output parameters for the workflow, each a file under ``$DSX_OUTPUT_DIR/params``."""

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
#: Name of the group of every node; the groups of the group label are tested before it.
WHOLE = "all"
#: How long a run's hold on its nodes lasts if the run dies without releasing it (the checks' outer bound).
LEASE_TTL_S = 8 * 3600
#: How many node verdicts the gate's summary names one by one; the report has them all.
SUMMARY_NODES = 50


class CertifyOptions(Model):
    """What the operator chose when submitting the workflow."""

    selector: str = Field(default="", description="label selector of the nodes to certify (all when empty)")
    group_label: str = Field(default=vocab.LABEL_RACK, description="node label that forms the groups")
    launcher: Literal["auto", "local", "job"] = "auto"
    accelerator: str = Field(default=AUTO, description="recipe accelerator; auto: from GPU labels")
    service: str = Field(default=AUTO, description="recipe service; auto: local for local runs, else any")
    os: str = Field(default=AUTO, description="recipe os; auto: from the nodes' OS image")
    min_bytes: str = Field(default=AUTO, description="smallest message; auto: 64KiB local, 1MiB job")
    max_bytes: str = Field(default=AUTO, description="largest message; auto: 4MiB local, 8GiB job")
    iters: int = Field(default=20, ge=1)
    namespace: str = Field(default="", description="namespace of group jobs (default: DSX_NAMESPACE)")
    image: str = Field(default="", description="image of group jobs (default: DSX_GPU_IMAGE)")


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
    ignored: list[str] = Field(
        default_factory=list,
        description="selected by the selector but without GPUs: not certified, untouched",
    )
    groups: list[Subject] = Field(
        description="one group per value of the group label (disjoint), then the whole set (last)"
    )
    gpus_per_node: int
    min_bytes: int
    max_bytes: int
    criteria: dict[str, str] = Field(description="service, accelerator and os for the recipe")
    injected: dict[str, list[str]] = Field(
        default_factory=dict, description="local runs: faults the simulated fleet plays, per node"
    )
    started_at: str
    run: RunRef = Field(description="the Workflow whose steps share their outcomes (readiness.outcomes)")

    def group(self, name: str) -> Subject:
        """The planned group ``name``.

        Raises:
            InputError: the plan has no such group.
        """
        found = next((g for g in self.groups if g.name == name), None)
        if found is None:
            raise InputError(f"group {name!r} is not in the plan ({', '.join(g.name for g in self.groups)})")
        return found


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


#: Node label prefixes each managed Kubernetes service puts on its nodes, to the recipe's service names.
SERVICE_LABELS: tuple[tuple[str, str], ...] = (
    ("eks.amazonaws.com/", "eks"),
    ("cloud.google.com/gke-", "gke"),
    ("kubernetes.azure.com/", "aks"),
)


def _service(nodes: list[Node]) -> str:
    """The managed service the nodes run on, from the labels it puts on them; ``any`` when unknown or
    mixed. It selects the recipe's fabric (EFA on EKS...), so rank pods ask for the right devices."""
    found = {
        next((name for prefix, name in SERVICE_LABELS if any(k.startswith(prefix) for k in n.labels)), "any")
        for n in nodes
    }
    return found.pop() if len(found) == 1 else "any"


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

    A group test feels the node's scale-out links (``slow-nic``; ``hang``; ``flaky-nic``, played as a
    failure every time so that a local run repeats); a single-node test feels its NVLink (``slow-nvlink``)
    and a failed GPU (``failing-gpu``). Real clusters have no such model: empty.
    """
    source = health_source(port)
    if source is None:
        return []
    health = source.node_report(node)
    specs: list[str] = []
    if scope == "group":
        if health.link_hangs or health.link_failure_rate > 0:
            specs.append(f"{rank}:{'hang' if health.link_hangs else 'fail'}")
        elif health.link_gbps < health.nominal_link_gbps:
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


def _holder(run: RunRef) -> str:
    """Who holds a node's Lease while this run certifies it: the Workflow, by namespace, name and uid."""
    return f"dsx-certify/{run.namespace}/{run.name}/{run.uid}"


def _holder_alive(port: ClusterPort, holder: str) -> bool:
    """Whether the certification run that holds a Lease still exists (a killed run's hold is stale).

    A holder that is not a certification Workflow (remediation, a local run without a Workflow object)
    counts as alive: its Lease's own expiry decides.
    """
    parts = holder.split("/")
    if len(parts) != 4 or parts[0] != "dsx-certify" or parts[2] == LOCAL_RUN_NAME:
        return True
    workflow = port.get_object("argoproj.io/v1alpha1", "Workflow", parts[2], parts[1])
    return workflow is not None and (workflow.get("metadata") or {}).get("uid") == parts[3]


def _take_nodes(port: ClusterPort, run: RunRef, names: list[str]) -> None:
    """Take every node's Lease for this run, or none: two certifications of one node measure each other.

    Raises:
        InputError: a node is held by another certification (or remediation) that is still running.
    """
    holder = _holder(run)
    taken: list[str] = []
    for name in names:
        if port.acquire_lock(name, holder, LEASE_TTL_S):
            taken.append(name)
            continue
        lease = port.get_object("coordination.k8s.io/v1", "Lease", lease_name(name), port.namespace) or {}
        other = str((lease.get("spec") or {}).get("holderIdentity") or "")
        if other and not _holder_alive(port, other):
            port.release_lock(name, other)
            if port.acquire_lock(name, holder, LEASE_TTL_S):
                taken.append(name)
                continue
        for done in taken:
            port.release_lock(done, holder)
        raise InputError(
            f"node {name} is held by {other or 'another run'} (Lease {port.namespace}/{lease_name(name)}): "
            "two certifications of one node would measure each other; wait for it to end or stop it"
        )


def _release_nodes(port: ClusterPort, run: RunRef, names: list[str]) -> None:
    holder = _holder(run)
    for name in names:
        port.release_lock(name, holder)


def check_options(**values: Any) -> CertifyOptions:
    """The operator's options, checked before anything runs: types, the selector's syntax, the message
    sizes and their order. The plan step calls it first; ``dsx run`` calls it before a local run starts,
    so a typo is refused up front (exit 2) rather than failing the run's first step.

    Raises:
        InputError: an option is malformed, naming it.
    """
    try:
        options = CertifyOptions(**values)
    except ValidationError as exc:
        raise input_error(exc, "certify option") from None
    parse_selector(options.selector or None)
    if not re.fullmatch(
        r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?", options.group_label
    ):
        raise InputError(f"certify option: group_label: {options.group_label!r} is not a node label key")
    sizes = [
        parse_size(v, name)
        for v, name in ((options.min_bytes, "min-bytes"), (options.max_bytes, "max-bytes"))
        if v != AUTO
    ]
    if len(sizes) == 2 and sizes[0] > sizes[1]:
        raise InputError(f"min-bytes {sizes[0]} is larger than max-bytes {sizes[1]}")
    return options


def plan(
    selector: str = "",
    group_label: str = vocab.LABEL_RACK,
    launcher: str = AUTO,
    accelerator: str = AUTO,
    service: str = AUTO,
    os: str = AUTO,
    min_bytes: str = AUTO,
    max_bytes: str = AUTO,
    iters: int = 20,
    namespace: str = "",
    image: str = "",
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
    options = check_options(
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
    port = connect()
    try:
        given = workflow_name or workflow_uid
        run = (
            RunRef(name=workflow_name, uid=workflow_uid, namespace=port.namespace)
            if given
            else RunRef.local(port.namespace)
        )
    except ValidationError as exc:
        raise input_error(exc, "certify workflow") from None
    selected = port.list_nodes(options.selector or None)
    managed = [n for n in selected if n.managed]
    with_gpus = [n for n in managed if n.gpu_count > 0]
    ignored = sorted(n.name for n in managed if n.gpu_count <= 0)
    if not with_gpus:
        what = f"selector {options.selector!r}" if options.selector else "the cluster"
        why = "managed node with GPUs" if managed else "managed node"
        raise InputError(f"no node to certify: {what} matches no {why}")
    ready = [n for n in with_gpus if n.ready]
    excluded = [Exclusion(node=n.name, reason="node is not Ready") for n in with_gpus if not n.ready]
    if not ready:
        raise InputError(f"no node to certify: none of {', '.join(n.name for n in with_gpus)} is Ready")
    chosen: Launcher
    if options.launcher == "auto":  # a Literal: mypy narrows it to a Launcher below
        chosen = "local" if health_source(port) is not None else "job"
    else:
        chosen = options.launcher
    if chosen == "local":
        accelerator = "cpu" if options.accelerator == AUTO else options.accelerator
        service = "local" if options.service == AUTO else options.service
        gpus = LOCAL_RANKS_PER_NODE
        default_min, default_max = "64KiB", "4MiB"
    else:
        accelerator = _accelerator(ready) if options.accelerator == AUTO else options.accelerator
        service = _service(ready) if options.service == AUTO else options.service
        gpus = min(n.gpu_count for n in ready)
        default_min, default_max = "1MiB", "8GiB"
    os_name = _os(ready) if options.os == AUTO else options.os
    smallest = parse_size(default_min if options.min_bytes == AUTO else options.min_bytes, "min-bytes")
    largest = parse_size(default_max if options.max_bytes == AUTO else options.max_bytes, "max-bytes")
    if smallest > largest:
        raise InputError(f"min-bytes {smallest} is larger than max-bytes {largest}")
    names = sorted(n.name for n in ready)
    groups: list[Subject] = []
    by_label: dict[str, list[str]] = {}
    for node in ready:
        value = node.labels.get(options.group_label)
        if value:
            by_label.setdefault(value, []).append(node.name)
    for value in sorted(by_label):
        members = sorted(by_label[value])
        if value == WHOLE:
            raise InputError(f"node label {options.group_label}={WHOLE}: '{WHOLE}' names the whole set")
        if len(members) > 1 and members != names:
            groups.append(Subject(kind="group", name=value, members=members))
    if len(names) > 1:
        groups.append(Subject(kind="group", name=WHOLE, members=names))
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
        ignored=ignored,
        groups=groups,
        gpus_per_node=gpus,
        min_bytes=smallest,
        max_bytes=largest,
        criteria={"service": service, "accelerator": accelerator, "os": os_name},
        injected=injected,
        started_at=_now(),
        run=run,
    )
    certified = names + [e.node for e in excluded]
    _take_nodes(port, run, certified)
    OutcomeStore(port, run).put_document("plan", plan.model_dump_json())
    for name in certified:
        port.set_labels(name, {vocab.LABEL_CERTIFICATION: vocab.Certification.pending.value})
    params = output_dir(None) / "params"
    values = {
        "nodes": json.dumps(names),
        "groups": json.dumps([g.name for g in groups if g.name != WHOLE]),
        "whole": WHOLE if any(g.name == WHOLE for g in groups) else "",
        "run": run.model_dump_json(),
        "launcher": chosen,
        **plan.criteria,
    }
    for key in PLAN_OUTPUTS:
        write_text(params / key, values[key])
    return plan


def load_plan(run: RunRef, port: ClusterPort | None = None) -> tuple[CertifyPlan, dict[str, Any]]:
    """The run's stored plan and recipe (digest and thresholds).

    Raises:
        DsxError: the run stored no plan or recipe.
    """
    store = OutcomeStore(port or connect(), run)
    plan = CertifyPlan.model_validate_json(store.document("plan"))
    recipe = json.loads(store.document("recipe"))
    return plan, recipe if isinstance(recipe, dict) else {}


def keep_recipe(run: RunRef, recipe: dict[str, Any]) -> str:
    """Keep the resolved recipe's digest and thresholds for the run's checks, smoke run and report.

    Raises:
        InputError: ``recipe`` is not a resolved recipe (no thresholds).
    """
    if not isinstance(recipe.get("thresholds"), dict):
        raise InputError(
            "recipe: not a resolved recipe (no 'thresholds' mapping); pass the resolve step's result"
        )
    load_thresholds(recipe["thresholds"])  # refuse malformed thresholds before any test runs
    kept = {"digest": recipe.get("digest"), "thresholds": recipe["thresholds"]}
    if "fabric" in recipe:
        kept["fabric"] = recipe["fabric"]
    OutcomeStore(connect(), run).put_document("recipe", json.dumps(kept, sort_keys=True))
    return f"recipe {kept['digest'] or '(no digest)'} kept for {run.name}"


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
    from steps.readiness.rankpods import rank_pod_patch

    return run_sweep_job(request, plan, connect(), pod_patch=rank_pod_patch(recipe))


def _summary_file(result: CheckResult) -> CheckResult:
    """Write the check's one line as the ``verdict`` output parameter too: Argo keeps a step's result only
    when a later step refers to it, but always shows output parameters."""
    write_text(output_dir(None) / "params" / "verdict", result.model_dump_json())
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
    OutcomeStore(port, plan.run).put("node", outcome)
    return _summary_file(check_result("node", outcome))


def group_members(plan: CertifyPlan, store: OutcomeStore, group: Subject) -> list[str]:
    """The members of ``group`` that earlier stages left standing: a group of racks tests the nodes that
    passed their own test; the whole set, those that also passed (or were in no) group of the group label.

    Testing a node already failed, or in doubt, would only fail (or cloud) the group with what is known.
    """
    nodes = {o.subject.name: o for o in store.sweeps("node")}
    standing = [m for m in group.members if m in nodes and nodes[m].status == "pass"]
    if group.name != WHOLE:
        return standing
    racks = {
        o.subject.name: o for o in with_bisection(store.sweeps("group"), store) if o.subject.name != WHOLE
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
                kind="group",
                subject=group,
                status="pass",
                message=f"group {group}: not tested: fewer than two members passed earlier stages ({left})",
            )
        )
    subject = Subject(kind="group", name=group, members=members)
    outcome = _certify_group(subject, plan, recipe)
    store.put("group", outcome)
    return _summary_file(check_result("group", outcome))


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


def sweep_group(group: Subject, plan: CertifyPlan, recipe: dict[str, Any]) -> SweepOutcome:
    """A multi-node sweep of ``group`` as the plan runs group tests (bisection tests its parts with it)."""
    return _certify_group(group, plan, recipe)


def _stored_sweeps(store: OutcomeStore, plan: CertifyPlan) -> tuple[list[SweepOutcome], list[SweepOutcome]]:
    """The node and group outcomes the checks stored; a planned check that stored none is an error.

    A group expects an outcome only when at least two of its members were left standing to test it.
    """
    nodes_found = {o.subject.name: o for o in store.sweeps("node")}
    nodes = [
        nodes_found.get(n) or _missing("node", Subject(kind="node", name=n, members=[n]), plan)
        for n in plan.nodes
    ]
    groups_found = {o.subject.name: o for o in with_bisection(store.sweeps("group"), store)}
    groups: list[SweepOutcome] = []
    for group in plan.groups:
        if group.name in groups_found:
            groups.append(groups_found[group.name])
        elif len(group_members(plan, store, group)) >= 2:
            groups.append(_missing("group", group, plan))
    return nodes, groups


def _missing(kind: str, subject: Subject, plan: CertifyPlan) -> SweepOutcome:
    message = (
        f"{kind} {subject.name}: its {kind}-check stored no outcome for workflow {plan.run.name} "
        "(the step did not finish)"
    )
    verdict = Verdict(subject=subject, test=INCOMPLETE_TEST, status="error", message=message)
    return SweepOutcome(
        subject=subject, status="error", verdicts=[verdict], evidence=[], out_dir="", elapsed_s=0.0
    )


def _standing_nodes(plan: CertifyPlan, outcomes: list[SweepOutcome]) -> list[str]:
    """The planned nodes no sweep failed or left in doubt."""
    verdicts = [v for o in outcomes for v in o.verdicts]
    results = {r.name: r.status for r in node_results(plan.nodes, verdicts)}
    return [n for n in plan.nodes if results.get(n) == "passed"]


def smoke_check(run: RunRef) -> CheckResult:
    """Training smoke run (DDP, a few transformer layers) on the nodes that passed the sweeps.

    Reads the sweeps' outcomes from the run's store and stores its own there; the result is one line.
    """
    port = connect()
    plan, recipe = load_plan(run, port)
    store = OutcomeStore(port, plan.run)
    outcome = _smoke(plan, recipe, *_stored_sweeps(store, plan))
    store.put("smoke", outcome)
    return _summary_file(check_result("smoke", outcome))


def _smoke(
    plan: CertifyPlan, recipe: dict[str, Any], nodes: list[SweepOutcome], groups: list[SweepOutcome]
) -> SmokeOutcome:
    passing = _standing_nodes(plan, nodes + groups)
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
    from steps.readiness.rankpods import rank_pod_patch

    return run_smoke_job(request, plan, connect(), pod_patch=rank_pod_patch(recipe))


def _relative(groups: list[SweepOutcome], recipe: dict[str, Any]) -> list[Verdict]:
    """Groups of equal size compared with each other (median and MAD), where enough of them ran."""
    thresholds = _thresholds(recipe)
    by_size: dict[int, list[GroupRun]] = {}
    for outcome in groups:
        if outcome.run is not None and outcome.subject.name != WHOLE:
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


def _label_nodes(
    port: ClusterPort, results: list[Any], digest: str, stamp: str
) -> tuple[list[str], list[str]]:
    """Write each node's verdict label with its annotations, failed nodes first; keep going past errors.

    Returns the nodes labelled and the ones that could not be (they keep the ``pending`` the plan set).
    """
    order = {"failed": 0, "pending": 1, "passed": 2}
    done: list[str] = []
    missed: list[str] = []
    for result in sorted(results, key=lambda r: (order[r.status], r.name)):
        reason = result.reasons[0] if result.reasons else ""
        try:
            port.set_node_metadata(
                result.name,
                labels={vocab.LABEL_CERTIFICATION: vocab.Certification(result.status).value},
                annotations={
                    vocab.ANNOTATION_CERTIFIED_AT: stamp,
                    vocab.ANNOTATION_CERTIFICATION_RECIPE: digest,
                    vocab.ANNOTATION_CERTIFICATION_REASON: reason[:250] or None,
                },
            )
        except DsxError as exc:
            print(f"warning: node {result.name}: verdict {result.status} not written: {exc}", file=sys.stderr)
            missed.append(result.name)
            continue
        done.append(result.name)
        port.record_event(
            result.name,
            {"passed": "DsxCertificationPassed", "failed": "DsxCertificationFailed"}.get(
                result.status, "DsxCertificationPending"
            ),
            f"dsx certification {result.status}" + (f": {reason[:200]}" if reason else ""),
            "Normal" if result.status == "passed" else "Warning",
        )
    return done, missed


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
    kept = keep_report(port, plan.run, dump_json(report), render_markdown(report))
    _, missed = _label_nodes(port, report.nodes, str(digest or ""), _now())
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
    _release_nodes(port, plan.run, plan.nodes + [e.node for e in plan.excluded])
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
    holder = _holder(run)
    leases = port.list_objects("coordination.k8s.io/v1", "Lease", port.namespace, vocab.LABEL_LOCKED_NODE)
    released = []
    for lease in leases:
        node = ((lease.get("metadata") or {}).get("labels") or {}).get(vocab.LABEL_LOCKED_NODE, "")
        if (
            node
            and (lease.get("spec") or {}).get("holderIdentity") == holder
            and port.release_lock(node, holder)
        ):
            released.append(node)
    return f"released {len(released)} node(s) held by {run.name}" + (
        f": {', '.join(sorted(released))}" if released else ""
    )
