"""The reconciler: remediation started from the nodes' state, not only from the edges the Sensor sees.

The Sensor fires on a change (a condition turning fatal in one update of the node). Edges get lost: the
EventSource's informer lists nodes after a restart as ADDs, which it does not watch; a submission can
fail past its retries; a firing waiting on the rate limit dies with the Sensor's pod; the breaker
refuses nodes and nothing asks again after a person resets it. The reconciler reads the level instead:
every few minutes (the ``dsx-reconcile`` CronWorkflow, or ``dsx sentinel reconcile``) it starts
``dsx-remediate`` for every node that

- is managed (not ``dsx.dev/managed=false``),
- carries the sentinel's taint ``dsx.dev/unhealthy:NoSchedule``,
- has no ``dsx.dev/state`` (no remediation stands on it, none escalated it),
- has a sentinel condition ``True`` that the quarantine policy sends to remediation (severity and
  action read from its reason; the worst one when several), whose fault still stands
  (:mod:`steps.sentinel.standing`: written after the node's last return to service), and
- no unfinished ``dsx-remediate`` Workflow names (a run holding the node's mutex, or waiting on it).

It passes the condition as the run's ``event``, as the Sensor does, so ``guard`` judges it the same way.

Before that, each pass judges every node's own Ready condition (:mod:`steps.sentinel.unready`), since a
node that is down has no agent to say so: a managed GPU node with no ``dsx.dev/state`` whose Ready has not
been True for the catalogue's threshold (or that a person marked out of service) gets the condition
``DsxNodeNotReady`` ``True`` and the sentinel's taint, as its agent would have written them, and so a
remediation in the same pass; one Ready again has the condition cleared. When most nodes are not Ready at
once (more than two, and over :data:`MASS_OUTAGE_SHARE` of the managed GPU nodes, the node lifecycle
controller's own bound for a disrupted zone), the control plane or the network is at fault, not the nodes:
the pass marks none and says so.
While the circuit breaker is open it starts nothing (each run would be refused): ``dsx sentinel breaker
reset`` reconciles right after closing it, which re-submits the nodes the breaker refused.
"""

import datetime as dt
import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from steps.cluster import ClusterPort, connect
from steps.cluster import vocabulary as vocab
from steps.cluster.errors import ConflictError
from steps.cluster.node import Condition, Node
from steps.errors import InputError
from steps.sentinel import ledger
from steps.sentinel.catalogue import FaultCatalogue, given_catalogue
from steps.sentinel.events import (
    HealthEvent,
    condition_message,
    condition_reading,
    condition_reason,
    severity_rank,
)
from steps.sentinel.policy import Breaker, QuarantinePolicy, decide
from steps.sentinel.standing import standing
from steps.sentinel.unready import NOT_READY, not_ready_events

__all__ = [
    "REMEDIATE",
    "Plan",
    "Skip",
    "Start",
    "create_workflow",
    "mark_not_ready",
    "plan",
    "reconcile",
    "remediations",
    "submit_workflow",
]

REMEDIATE = vocab.WORKFLOW_REMEDIATE
"""The WorkflowTemplate the reconciler starts."""
MASS_OUTAGE_SHARE = 0.55
"""Over this share of the managed nodes not Ready at once (and more than two), no node is marked: the
node lifecycle controller's ``--unhealthy-zone-threshold`` default, past which it stops evicting too."""
_WORKFLOW = ("argoproj.io/v1alpha1", "Workflow")
_SUFFIX = "bcdfghjklmnpqrstvwxz2456789"  # the alphabet of Kubernetes' generateName suffixes


@dataclass(frozen=True)
class Start:
    """A remediation to start: the node, the check and its condition (the run's ``event``), and why."""

    node: str
    check: str
    event: str
    why: str


@dataclass(frozen=True)
class Skip:
    """A tainted node the reconciler leaves alone, and why."""

    node: str
    why: str


@dataclass
class Plan:
    """What one reconciler pass found."""

    starts: list[Start] = field(default_factory=list)
    skips: list[Skip] = field(default_factory=list)
    breaker: str = ""
    """Why nothing starts while the circuit breaker is open (empty: closed)."""

    def lines(self, started: Mapping[str, str] | None = None) -> list[str]:
        """One line per node for a person; ``started`` maps a node to the Workflow started for it."""
        out = [f"circuit breaker open: {self.breaker}; nothing started"] if self.breaker else []
        for s in self.starts:
            verb = "would start" if started is None else f"started {started.get(s.node, '?')}"
            out.append(f"{s.node}: {verb} {REMEDIATE} for {s.check} ({s.why})")
        out += [f"{s.node}: left alone: {s.why}" for s in self.skips]
        return out or ["no node carries the sentinel's taint: nothing to reconcile"]


def _condition_json(condition: Condition) -> str:
    """The condition as the API server (and the Sensor's ``dataKey``) writes it."""
    return json.dumps(condition.to_manifest(), separators=(",", ":"))


def remediations(port: ClusterPort, namespace: str | None = None) -> dict[str, str]:
    """Node -> the unfinished ``dsx-remediate`` Workflow that names it (running, or waiting on the node's
    mutex), from the Workflows in ``namespace`` (dsx's, by default)."""
    found: dict[str, str] = {}
    for wf in port.list_objects(*_WORKFLOW, namespace=namespace or port.namespace):
        spec = wf.get("spec") or {}
        if (spec.get("workflowTemplateRef") or {}).get("name") != REMEDIATE:
            continue
        if (wf.get("status") or {}).get("phase") in vocab.WORKFLOW_FINISHED_PHASES:
            continue
        params = {
            str(p.get("name")): str(p.get("value", ""))
            for p in (spec.get("arguments") or {}).get("parameters") or []
        }
        if params.get("node"):
            found.setdefault(params["node"], str((wf.get("metadata") or {}).get("name", "")))
    return found


def _candidate(port: ClusterPort, node: Node, policy: QuarantinePolicy) -> Start | str:
    """The remediation to start for a tainted node, or why none."""
    if not node.managed:
        return "opts out (dsx.dev/managed=false)"
    state = node.labels.get(vocab.LABEL_STATE)
    if state:
        return f"dsx.dev/state={state}" + (": a person must look at it" if state == "escalated" else "")
    found: list[tuple[int, str, Condition]] = []
    faulty: list[str] = []
    for check, name in sorted(vocab.CONDITION_SENTINEL.items()):
        condition = node.condition(name)
        if condition is None or condition.status != "True":
            continue
        faulty.append(name)
        reading = condition_reading(node.name, check, condition.to_manifest())
        if reading is None or decide(reading, node, policy).decision != "remediate":
            continue
        found.append((severity_rank(reading.severity), check, condition))
    if not found:
        if not faulty:
            return "no sentinel condition is True (the taint is left for a person or the agent)"
        return f"the policy remediates none of its True conditions ({', '.join(faulty)})"
    history = ledger.entries(port, node.name)
    for _, check, condition in sorted(found, key=lambda f: (-f[0], f[1])):
        verdict = standing(node, check, history)
        if verdict.stands:
            why = f"{condition.type}={condition.reason} since {condition.last_transition_time or '?'}"
            return Start(node.name, check, _condition_json(condition), why)
    return f"no fault stands: {verdict.why}" + (f" (handled by {verdict.handled})" if verdict.handled else "")


def plan(port: ClusterPort, namespace: str | None = None) -> Plan:
    """What to start now (see the module docstring)."""
    result = Plan()
    status = Breaker(port).status()
    if status.state == "open":
        result.breaker = f"since {status.tripped_at}: {status.tripped_reason}"
    tainted = [n for n in port.list_nodes() if n.has_taint(vocab.TAINT_UNHEALTHY)]
    running = remediations(port, namespace) if tainted else {}
    policy = QuarantinePolicy()
    for node in sorted(tainted, key=lambda n: n.name):
        if node.name in running:
            result.skips.append(Skip(node.name, f"{running[node.name]} is on it"))
            continue
        found = _candidate(port, node, policy)
        if isinstance(found, str):
            result.skips.append(Skip(node.name, found))
        elif result.breaker:
            result.skips.append(Skip(node.name, f"waits for the breaker ({found.check}: {found.why})"))
        else:
            result.starts.append(found)
    return result


def submit_workflow(
    port: ClusterPort, start: Start, parameters: Mapping[str, str], namespace: str | None = None, by: str = ""
) -> str:
    """Create the ``dsx-remediate`` Workflow for ``start`` (what ``argo submit --from
    workflowtemplate/dsx-remediate`` does) with ``parameters`` besides node, check and event; its name."""
    values = {**parameters, "node": start.node, "check": start.check, "event": start.event}
    return create_workflow(
        port,
        REMEDIATE,
        values,
        namespace,
        annotations={"dsx.dev/started-by": by or vocab.WORKFLOW_RECONCILE},
    )


def create_workflow(
    port: ClusterPort,
    template: str,
    values: Mapping[str, str],
    namespace: str | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
) -> str:
    """Create a Workflow from the WorkflowTemplate ``template`` (``workflowTemplateRef``) with the
    parameters ``values``, named ``<template>-xxxxx`` as ``argo submit --from`` names it; its name.

    Raises:
        InputError: no free name after 5 tries.
    """
    for _ in range(5):
        name = f"{template}-{''.join(secrets.choice(_SUFFIX) for _ in range(5))}"
        manifest: dict[str, Any] = {
            "apiVersion": _WORKFLOW[0],
            "kind": _WORKFLOW[1],
            "metadata": {
                "name": name,
                "namespace": namespace or port.namespace,
                "labels": {"app.kubernetes.io/part-of": "dsx", **(labels or {})},
                "annotations": dict(annotations or {}),
            },
            "spec": {
                "workflowTemplateRef": {"name": template},
                "arguments": {"parameters": [{"name": k, "value": v} for k, v in values.items()]},
            },
        }
        try:
            port.create_object(manifest)
        except ConflictError:  # 409: the name is taken (AlreadyExists)
            continue
        return name
    raise InputError(f"no free Workflow name for {template} after 5 tries")


def mark_not_ready(
    port: ClusterPort, catalogue: FaultCatalogue | None = None, dry_run: bool = False
) -> list[str]:
    """Write ``DsxNodeNotReady`` on the nodes the ``not-ready`` check judges (see the module docstring):
    ``True`` with the sentinel's taint where it finds a fault on a managed node with no state, ``False``
    where the node is Ready again. A line per node written (or, with ``dry_run``, that would be)."""
    catalogue = catalogue or given_catalogue()
    now = dt.datetime.now(dt.UTC)
    nodes = [n for n in port.list_nodes() if n.managed and n.gpu_count > 0]
    down = [n.name for n in nodes if n.condition("Ready") is not None and not n.ready]
    mass = len(down) > 2 and len(down) > MASS_OUTAGE_SHARE * len(nodes)
    lines: list[str] = []
    if mass:
        lines.append(
            f"{len(down)} of {len(nodes)} managed GPU nodes are not Ready: the control plane or the network, "
            f"not the nodes; no node marked {vocab.CONDITION_SENTINEL[NOT_READY]}"
        )
    enforce = not mass and catalogue.mode(NOT_READY) == "enforce"
    for node in sorted(nodes, key=lambda n: n.name):
        for event in not_ready_events(node, catalogue, now):
            line = _mark(port, node, event, dry_run, enforce=enforce)
            lines += [line] if line else []
    return lines


def _mark(port: ClusterPort, node: Node, event: HealthEvent, dry_run: bool, enforce: bool) -> str:
    """Write the ``not-ready`` reading ``event`` on ``node`` as its condition (and the taint, for a fatal
    fault, as the agent does); the line saying so, empty when nothing changes."""
    name = vocab.CONDITION_SENTINEL[NOT_READY]
    current = node.condition(name)
    if event.healthy:
        if current is None or current.status != "True":
            return ""
        if not dry_run:
            port.set_condition(node.name, name, False, "NoProblem", "node: Ready")
        return f"{node.name}: {'would clear' if dry_run else 'cleared'} {name} (Ready again)"
    if not enforce or node.labels.get(vocab.LABEL_STATE):
        return ""  # under remediation (its own reboot), or a mass outage
    message = condition_message([event])
    taint = event.severity == "fatal" and not node.has_taint(vocab.TAINT_UNHEALTHY)
    written = current is not None and current.status == "True" and current.message == message
    if written and not taint:
        return ""
    if not dry_run:
        # The taint first, then the condition, as the agent writes them: the Sensor starts a remediation on
        # a condition turning fatal on a node already tainted. Written the other way round, it saw the
        # condition on an untainted node, then a taint with no condition turning fatal, and started one only
        # when its informer happened to merge the two updates.
        if taint:
            port.add_taint(node.name, vocab.TAINT_UNHEALTHY, "", vocab.TAINT_UNHEALTHY_EFFECT)
        if not written:
            port.set_condition(node.name, name, True, condition_reason(event.severity, event.action), message)
            port.record_event(node.name, name, message, "Warning")
    return f"{node.name}: {'would mark' if dry_run else 'marked'} {name} ({event.code}: {event.message})"


def _parameters(text: str) -> dict[str, str]:
    try:
        data = json.loads(text or "{}")
    except ValueError as exc:
        raise InputError(f"parameter remediate_parameters: not JSON ({exc})") from None
    if not isinstance(data, dict) or not all(isinstance(v, str | int | float) for v in data.values()):
        raise InputError('parameter remediate_parameters: expected an object of strings, e.g. {"iters": "5"}')
    reserved = sorted({"node", "check", "event"} & set(data))
    if reserved:
        raise InputError(f"parameter remediate_parameters: {', '.join(reserved)} are the reconciler's to set")
    return {str(k): str(v) for k, v in data.items()}


def reconcile(
    dry_run: bool = False, remediate_parameters: str = "{}", workflow_name: str = "", remediate: bool = True
) -> str:
    """One reconciler pass (the ``dsx-reconcile`` CronWorkflow's step): the not-ready check on every GPU
    node (:func:`mark_not_ready`), then a ``dsx-remediate`` Workflow for every node that needs it and no
    run names, printing a line per tainted node. ``remediate_parameters`` (a JSON object) sets other
    parameters of the runs it starts; ``remediate`` false starts none (it lists them: remediation is a
    person's where the Sensor is not installed); ``dry_run`` writes nothing at all. Returns a summary."""
    extra = _parameters(remediate_parameters)
    port = connect()
    for line in mark_not_ready(port, dry_run=dry_run):
        print(line)
    found = plan(port)
    started: dict[str, str] = {}
    listed = dry_run or not remediate
    if not listed:
        for s in found.starts:
            started[s.node] = submit_workflow(port, s, extra, by=workflow_name)
    for line in found.lines(None if listed else started):
        print(line)
    if not remediate and found.starts:
        print("remediate=false: nothing started (without the Sensor, remediation is a person's to start)")
    verb = "would start" if listed else "started"
    return f"{verb} {len(found.starts)} remediation(s); {len(found.skips)} tainted node(s) left alone"
