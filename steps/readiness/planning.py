"""The certification plan: which nodes, which groups, which launcher, which recipe criteria.

The plan step (:func:`steps.readiness.certify.plan`) checks the operator's options
(:func:`check_options`), reads the nodes the selector names and works out the rest
(:func:`make_plan`): nodes without GPUs or opted out are left alone, nodes that are not Ready are
certified as failed, the groups are the values of the group label (disjoint: racks) and then the whole
set, the launcher is ``local`` for a simulated fleet and ``job`` otherwise, and the recipe criteria come
from the nodes' labels (GPU product, managed service, OS image) unless the operator named them.
"""

import json
import re
from datetime import UTC, datetime
from typing import Any, Literal, get_args

from pydantic import Field, ValidationError

from steps.cluster import ClusterPort, Node
from steps.cluster import vocabulary as vocab
from steps.cluster.selectors import parse_selector
from steps.errors import InputError
from steps.models import input_error
from steps.readiness.bisect.evidence import P_MIN
from steps.readiness.diagnostics import check_run, node_runs
from steps.readiness.launchers.local import local_injections
from steps.readiness.models import Model, Subject
from steps.readiness.outcomes import RunRef
from steps.readiness.ranks.inject import parse_injections
from steps.readiness.ranks.sweep import DEFAULTS as SWEEP
from steps.readiness.sizes import parse_size
from steps.readiness.thresholds import Thresholds, load_thresholds

__all__ = [
    "ACCELERATORS",
    "AUTO",
    "DRILL_FAULTS",
    "LAUNCHERS",
    "LOCAL_RANKS_PER_NODE",
    "PLAN_OUTPUTS",
    "RECIPE_INTENT",
    "SERVICE_LABELS",
    "WHOLE",
    "CertifyOptions",
    "CertifyPlan",
    "Exclusion",
    "KeptRecipe",
    "Launcher",
    "check_options",
    "drill_injections",
    "make_plan",
    "now",
    "parse_drill",
    "plan_outputs",
    "sweep_sizes",
]

Launcher = Literal["local", "job"]
LAUNCHERS: tuple[Launcher, ...] = get_args(Launcher)
"""Where group tests run (the ``launcher`` option; ``auto`` picks one, see the module's notes)."""

AUTO = "auto"
"""The value of an option that the plan works out itself (launcher, recipe criteria, message sizes)."""

SWEEP_SIZES: dict[Launcher, tuple[str, str]] = {"local": ("64KiB", "4MiB"), "job": ("1MiB", "8GiB")}
"""The all-reduce sweep's smallest and largest message when the options leave them ``auto``, by
launcher: local gloo ranks on this machine's CPUs sweep small sizes; a cluster's GPUs sweep from 1 MiB,
where latency stops ruling, to 8 GiB, where bus bandwidth has settled (the fabric model's cap)."""

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

#: The faults a drill may play (``inject``); the training smoke run plays all but ``corrupt`` (it has no
#: reduced data to check).
DRILL_FAULTS = ("delay", "fail", "hang", "corrupt")
#: Ranks per node in a local single-node check (two stand for the node's GPUs over NVLink).
LOCAL_RANKS_PER_NODE = 2
#: Name of the group of every node; the groups of the group label are tested before it.
WHOLE = "all"


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
    iters: int = Field(default=SWEEP.iters, ge=1)
    namespace: str = Field(default="", description="namespace of group jobs (default: DSX_NAMESPACE)")
    image: str = Field(default="", description="image of group jobs (default: DSX_GPU_IMAGE)")
    inject: str = Field(
        default="",
        description="a fault drill: NODE:KIND[=VALUE] faults every rank on NODE plays, comma-separated",
    )
    diag: str = Field(
        default="auto",
        description="DCGM's diagnostics on each node: auto (a node under remediation or escalated by it: "
        "as its fault's check calls for, recipes/faults/diagnostics.yaml; any other node none), off, or "
        "what dcgmi diag -r takes for every node (a level 1-4, or test names comma-separated)",
    )
    dcgm_host: str = Field(
        default="", description="the DCGM host engine dcgmi asks (--host); empty: localhost"
    )
    p_min: float = Field(
        default=P_MIN,
        gt=0.0,
        le=1.0,
        description="the least share of tests a faulty node fails (its intermittence) that bisection "
        "screens for with 99%: a group is cleared after ceil(ln 0.01 / ln(1 - p_min)) passes",
    )


class Exclusion(Model):
    """A selected node that cannot take part, and why."""

    node: str
    reason: str


class KeptRecipe(Model):
    """What a run keeps of its resolved recipe for its checks, smoke run, bisection and report: the
    digest, the thresholds as the recipe writes them (the report shows them so) and its fabric (the rank
    pods' profile). Checked when kept; :meth:`limits` is the thresholds parsed."""

    digest: str | None = None
    thresholds: dict[str, Any] | None = Field(default=None, description="the recipe's mapping, as written")
    fabric: dict[str, Any] | None = Field(default=None, description="the recipe's fabric (rankPod, sources)")

    def limits(self) -> Thresholds:
        """The thresholds every check judges against (dsx's defaults when the recipe has none).

        Raises:
            InputError: a threshold is missing or wrong (kept recipes were checked when kept).
        """
        return load_thresholds(self.thresholds)


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
        default_factory=dict,
        description="faults played on purpose, per node: a drill's, and in local runs the simulated fleet's",
    )
    diagnostics: dict[str, str] = Field(
        default_factory=dict,
        description="the DCGM diagnostics run (dcgmi diag -r) on each node that runs any",
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


def now() -> str:
    """The time now, as the plan and the node annotations write it (UTC, seconds)."""
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
    parse_drill(options.inject)
    if options.diag.strip() != "auto":
        check_run(options.diag, "certify option: diag")
    return options


def parse_drill(text: str) -> dict[str, list[str]]:
    """A fault drill's faults by node: ``node-02:delay=20ms,node-05:fail`` gives every rank that runs on
    ``node-02`` a 20 ms delay before each collective or step and makes every rank on ``node-05`` fail, in
    every test the node takes part in. A drill proves on a real cluster that certification and bisection
    name a node that drags its groups; every verdict and report labels the faults as injected.

    Raises:
        InputError: an entry is not ``NODE:KIND[=VALUE]``, its fault is not one of ``delay``, ``fail``,
            ``hang`` or ``corrupt``, or a node is named twice.
    """
    drill: dict[str, list[str]] = {}
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        node, _, fault = entry.partition(":")
        if not node or not fault:
            raise InputError(
                f"certify option: inject: {entry!r} is not NODE:KIND[=VALUE] (node-02:delay=20ms)"
            )
        if node in drill:
            raise InputError(f"certify option: inject: node {node!r} is named twice")
        try:
            (parsed,) = parse_injections([f"0:{fault}"], 1, DRILL_FAULTS)
        except InputError as exc:
            raise InputError(f"certify option: inject: {entry!r}: {exc}") from None
        drill[node] = [parsed.spec.split(":", 1)[1]]
    return drill


def drill_injections(plan: CertifyPlan, hosts: list[str], kinds: tuple[str, ...] = DRILL_FAULTS) -> list[str]:
    """The rank faults (``RANK:KIND[=VALUE]``) of the plan's drill for a run whose rank ``r`` runs on
    ``hosts[r]``, of the ``kinds`` that run plays."""
    drill = parse_drill(plan.options.inject)
    return [
        f"{rank}:{fault}"
        for rank, host in enumerate(hosts)
        for fault in drill.get(host, [])
        if fault.split("=", 1)[0] in kinds
    ]


def _candidates(port: ClusterPort, options: CertifyOptions) -> tuple[list[Node], list[Exclusion], list[str]]:
    """The selected managed nodes with GPUs that are Ready, those that are not (excluded: they fail),
    and those without GPUs (ignored: not certified, untouched).

    Raises:
        InputError: no node matches, or none of them is Ready.
    """
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
    return ready, excluded, ignored


def _groups(ready: list[Node], label: str) -> list[Subject]:
    """One group per value of ``label`` with more than one member (and not the whole set), then the
    whole set when it has more than one node.

    Raises:
        InputError: a node's label value is the whole set's name.
    """
    names = sorted(n.name for n in ready)
    by_label: dict[str, list[str]] = {}
    for node in ready:
        value = node.labels.get(label)
        if value:
            by_label.setdefault(value, []).append(node.name)
    groups: list[Subject] = []
    for value in sorted(by_label):
        members = sorted(by_label[value])
        if value == WHOLE:
            raise InputError(f"node label {label}={WHOLE}: '{WHOLE}' names the whole set")
        if len(members) > 1 and members != names:
            groups.append(Subject(kind="group", name=value, members=members))
    if len(names) > 1:
        groups.append(Subject(kind="group", name=WHOLE, members=names))
    return groups


def _settings(
    port: ClusterPort, options: CertifyOptions, ready: list[Node]
) -> tuple[Launcher, dict[str, str], int, int, int]:
    """The launcher, the recipe criteria, GPUs per node and the message sizes, each the operator's
    choice or, on ``auto``, what the cluster tells.

    Raises:
        InputError: the accelerator cannot be told from the nodes, or the sizes are out of order.
    """
    told: Launcher = "job" if port.runs_pods else "local"
    chosen: Launcher = told if options.launcher == "auto" else options.launcher
    if chosen == "local":
        accelerator = "cpu" if options.accelerator == AUTO else options.accelerator
        service = "local" if options.service == AUTO else options.service
        gpus = LOCAL_RANKS_PER_NODE
    else:
        accelerator = _accelerator(ready) if options.accelerator == AUTO else options.accelerator
        service = _service(ready) if options.service == AUTO else options.service
        gpus = min(n.gpu_count for n in ready)
    os_name = _os(ready) if options.os == AUTO else options.os
    smallest, largest = sweep_sizes(chosen, options.min_bytes, options.max_bytes)
    criteria = {"service": service, "accelerator": accelerator, "os": os_name}
    return chosen, criteria, gpus, smallest, largest


def sweep_sizes(launcher: Launcher, min_bytes: str, max_bytes: str) -> tuple[int, int]:
    """The sweep's smallest and largest message in bytes: as given, or :data:`SWEEP_SIZES`' on ``auto``.

    Raises:
        InputError: a size cannot be read, or the smallest is larger than the largest.
    """
    default_min, default_max = SWEEP_SIZES[launcher]
    smallest = parse_size(default_min if min_bytes == AUTO else min_bytes, "min-bytes")
    largest = parse_size(default_max if max_bytes == AUTO else max_bytes, "max-bytes")
    if smallest > largest:
        raise InputError(f"min-bytes {smallest} is larger than max-bytes {largest}")
    return smallest, largest


def make_plan(port: ClusterPort, options: CertifyOptions, run: RunRef) -> CertifyPlan:
    """The plan for ``options`` on the nodes ``port`` shows; nothing is written.

    Raises:
        InputError: no node matches, none is Ready, a group label value is ``all``, the accelerator
            cannot be told from the nodes' labels, or the message sizes are out of order.
    """
    ready, excluded, ignored = _candidates(port, options)
    diagnostics = node_runs(options.diag, ready)
    chosen, criteria, gpus, smallest, largest = _settings(port, options, ready)
    names = sorted(n.name for n in ready)
    injected: dict[str, list[str]] = {}
    if chosen == "local":
        for name in names:
            faults = local_injections(port, name, 0, "train") + local_injections(port, name, 0, "node")
            if faults:
                injected[name] = sorted(f.split(":", 1)[1] for f in faults)
    for name, faults in parse_drill(options.inject).items():
        if name not in names:
            raise InputError(
                f"certify option: inject: node {name!r} is not among the nodes to certify "
                f"({', '.join(names)})"
            )
        if name in injected:
            raise InputError(
                f"certify option: inject: node {name!r} already plays the simulated fleet's faults "
                f"({', '.join(injected[name])}): drill another node"
            )
        injected[name] = faults
    return CertifyPlan(
        options=options,
        launcher=chosen,
        nodes=names,
        excluded=excluded,
        ignored=ignored,
        groups=_groups(ready, options.group_label),
        gpus_per_node=gpus,
        min_bytes=smallest,
        max_bytes=largest,
        criteria=criteria,
        injected=injected,
        diagnostics=diagnostics,
        started_at=now(),
        run=run,
    )


def plan_outputs(plan: CertifyPlan) -> dict[str, str]:
    """The plan's output parameters (:data:`PLAN_OUTPUTS`) for the workflow, by name."""
    values: dict[str, Any] = {
        "nodes": json.dumps(plan.nodes),
        "groups": json.dumps([g.name for g in plan.groups if g.name != WHOLE]),
        "whole": WHOLE if any(g.name == WHOLE for g in plan.groups) else "",
        "run": plan.run.model_dump_json(),
        "launcher": plan.launcher,
        **plan.criteria,
    }
    return {key: str(values[key]) for key in PLAN_OUTPUTS}
