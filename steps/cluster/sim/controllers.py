"""What the controllers and the eviction API of a real cluster do, for the simulated fleet.

- A pod of a ReplicaSet or a Job that is deleted or evicted is replaced at once, on the schedulable
  node with the fewest pods (ties by name); with no such node the replacement stays ``Pending``.
  A DaemonSet pod is replaced on its own node. A bare pod is simply gone. A pod deleted on a node that
  is not Ready stays terminating (no kubelet confirms it) until the node is Ready again or carries the
  out-of-service taint (the pod garbage collector's ``gcTerminating``); an eviction of a pod already
  terminating skips its budget (``canIgnorePDB``): :func:`take_pod`, :func:`collect_terminating`.
- An eviction is refused while the pod's PodDisruptionBudget allows no disruption, with the status the
  disruption controller computes (:func:`budget_status`: expected pods from the controllers' scale, so
  a missing replica counts against the budget; healthy pods the running ones). A budget with an empty
  selector guards nothing; two budgets on one pod is an error, as in the API server
  (kubernetes ``pkg/registry/core/pod/storage/eviction.go``, ``pkg/controller/disruption``).
- Deleting an object deletes what it owns (``Background`` and ``Foreground``; a dependent that still has
  another owner only loses the reference) or leaves it with the reference removed (``Orphan``). With no
  policy the server's default for the kind applies: batch/v1 Jobs orphan their pods, the rest do not.
- A core/v1 Event without ``eventTime`` about a cluster-scoped object is accepted only in namespace
  ``default`` (or none), as the API server's legacy Event validation has it.
"""

from __future__ import annotations

import base64
from typing import Any

from steps.cluster import vocabulary as vocab
from steps.cluster.port import Pod, Propagation
from steps.cluster.sim.model import Fleet, Pdb, owner_key

__all__ = [
    "MULTIPLE_BUDGETS",
    "budget_status",
    "collect_dependents",
    "default_propagation",
    "disruption_refusal",
    "event_refusal",
    "replace_pod",
    "schedulable_nodes",
]

MULTIPLE_BUDGETS = (
    "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."
)
_BLOCKED = "Cannot evict pod as it would violate the pod's disruption budget."
_TERMINAL = ("Succeeded", "Failed")
_SCALED = ("ReplicaSet", "StatefulSet", "ReplicationController", "Deployment")
"""Controllers whose scale the disruption controller can read (a Job has none)."""


def schedulable_nodes(fleet: Fleet) -> list[str]:
    """Nodes a new pod may land on: Ready, not cordoned, without NoSchedule or NoExecute taints."""
    return [
        name
        for name, node in sorted(fleet.nodes.items())
        if node.ready
        and not node.unschedulable
        and not any(t.effect in ("NoSchedule", "NoExecute") for t in node.taints)
    ]


def take_pod(fleet: Fleet, pod: Pod, grace_seconds: int | None, now: str) -> None:
    """Delete ``pod`` as the API server does. A pod that is bound to a node, running and given a grace
    period leaves only once its kubelet confirms it has stopped: the simulated fleet's kubelets confirm at
    once, but on a node that is not Ready nobody does, so the pod stays terminating (``deleted_at``) until
    the node is Ready again or the pod garbage collector takes it (:func:`collect_terminating`). Grace 0
    (a force delete), an unbound pod or a finished one leaves at once. Its controller replaces it either
    way (a ReplicaSet or a Job counts a terminating pod as gone); a pod already terminating is not
    replaced twice."""
    node = fleet.nodes.get(pod.node)
    if grace_seconds == 0 or node is None or node.ready or pod.phase in _TERMINAL:
        fleet.pods.pop(pod.ref, None)
    elif not pod.terminating:
        fleet.pods[pod.ref] = pod.model_copy(update={"deleted_at": now})
    if not pod.terminating:
        replace_pod(fleet, pod)


def collect_terminating(fleet: Fleet, collect: bool = True) -> bool:
    """Whether terminating pods may go now (and, with ``collect``, remove them): those whose node is Ready
    again (its kubelet confirms them), gone, or not Ready with the taint ``node.kubernetes.io/out-of-service``
    (the pod garbage collector's ``gcTerminating``)."""
    gone = []
    # Every read of a node or pod asks this first: the scan stays one pass of a comprehension over the
    # fleet's pods (``deleted_at`` is what ``Pod.terminating`` reads), since few pods, if any, terminate.
    for ref, pod in [(ref, pod) for ref, pod in fleet.pods.items() if pod.deleted_at]:
        node = fleet.nodes.get(pod.node)
        if node is None or node.ready or node.has_taint(vocab.TAINT_OUT_OF_SERVICE):
            gone.append(ref)
    if collect:
        for ref in gone:
            del fleet.pods[ref]
    return bool(gone)


def replace_pod(fleet: Fleet, gone: Pod) -> Pod | None:
    """Let the pod's controller replace it; the replacement, or ``None`` for a pod nobody replaces."""
    if gone.owner_kind == "DaemonSet":
        if gone.node not in fleet.nodes:
            return None
        node = gone.node
    elif gone.owner_kind in ("ReplicaSet", "Job") and gone.phase not in _TERMINAL:
        load = {name: 0 for name in schedulable_nodes(fleet)}
        for pod in fleet.pods.values():
            if pod.node in load and pod.phase not in _TERMINAL:
                load[pod.node] += 1
        node = min(load, key=lambda n: (load[n], n)) if load else ""
    else:
        return None
    key = owner_key(gone)
    index = fleet.owner_next.get(key, 0)
    fleet.owner_next[key] = index + 1
    pod = gone.model_copy(
        update={
            "name": f"{gone.owner_name}-{index}",
            "uid": fleet.new_uid(),
            "node": node,
            "phase": "Running" if node else "Pending",
        }
    )
    fleet.pods[pod.ref] = pod
    return pod


def budget_status(fleet: Fleet, budget: Pdb) -> tuple[int, int, int]:
    """``(expected, desired healthy, disruptions allowed)`` of a budget, as the disruption controller
    computes them.

    Expected pods: for ``maxUnavailable`` or a percentage ``minAvailable``, the sum of the scales of the
    controllers of the matching pods (a pod whose controller has no scale, a Job's, makes the controller
    fail safe: no disruption allowed; a bare pod counts for nothing); for an integer ``minAvailable``,
    every matching pod, finished ones included. Healthy: ready pods (``Running`` here) not being deleted.
    Nothing is allowed while no pod is expected.
    """
    pods = [p for p in fleet.pods.values() if budget.selects(p)]
    healthy = sum(1 for p in pods if p.phase == "Running")
    if not budget.by_scale:
        desired = budget.desired_healthy(0)
        return len(pods), desired, max(0, healthy - desired) if pods else 0
    scales: dict[str, int] = {}
    for pod in pods:
        if not pod.owner_kind:
            continue  # unmanaged: the controller warns and leaves it out
        if pod.owner_kind not in _SCALED:
            return 0, budget.desired_healthy(0), 0  # "found no controllers": fail safe
        key = owner_key(pod)
        scales[key] = fleet.scales.get(key, sum(1 for p in fleet.pods.values() if owner_key(p) == key))
    expected = sum(scales.values())
    desired = budget.desired_healthy(expected)
    return expected, desired, max(0, healthy - desired) if expected > 0 else 0


def disruption_refusal(fleet: Fleet, pod: Pod) -> tuple[int, str] | None:
    """Why the eviction API would refuse ``pod`` now, as ``(status, message)``; ``None`` if it allows it.

    A pod that is not running (pending or finished) is removed without a budget check (``canIgnorePDB``);
    a budget with an empty selector guards every pod of its namespace, one without a selector none.
    """
    budgets = [b for _, b in sorted(fleet.pdbs.items()) if b.selects(pod)]
    if not budgets or pod.phase != "Running":
        return None
    if len(budgets) > 1:
        return 500, MULTIPLE_BUDGETS
    budget = budgets[0]
    _, desired, allowed = budget_status(fleet, budget)
    if allowed > 0:
        return None
    healthy = sum(1 for p in fleet.pods.values() if budget.selects(p) and p.phase == "Running")
    return (
        429,
        f"{_BLOCKED} The disruption budget {budget.name} needs {desired} healthy pods "
        f"and has {healthy} currently",
    )


def default_propagation(api_version: str, kind: str) -> Propagation:
    """The server's policy when a deletion names none: batch/v1 Jobs orphan their pods (kept for backward
    compatibility by the Job strategy); every other kind is collected in the background."""
    return "Orphan" if (api_version, kind) == ("batch/v1", "Job") else "Background"


def _owned_by(meta: dict[str, Any], kind: str, name: str, uid: str) -> list[dict[str, Any]]:
    refs: list[dict[str, Any]] = meta.get("ownerReferences") or []
    return [
        r for r in refs if (r.get("uid") == uid if uid else (r.get("kind"), r.get("name")) == (kind, name))
    ]


def collect_dependents(
    fleet: Fleet, owner: dict[str, Any], propagation: Propagation, revision: Any = None
) -> None:
    """What the garbage collector does once ``owner`` (an object's JSON) is deleted.

    Dependents are pods whose controller is the owner (by kind and name in its namespace) and stored
    objects whose ``ownerReferences`` name its uid. ``revision`` gives a fresh ``resourceVersion`` for
    a dependent that is changed rather than deleted.
    """
    meta = owner.get("metadata") or {}
    kind, name, uid = str(owner.get("kind", "")), str(meta.get("name", "")), str(meta.get("uid") or "")
    namespace = meta.get("namespace") or None
    orphan = propagation == "Orphan"
    for ref, pod in list(fleet.pods.items()):
        if (pod.owner_kind, pod.owner_name) != (kind, name) or (namespace and pod.namespace != namespace):
            continue
        if orphan:
            fleet.pods[ref] = pod.model_copy(update={"owner_kind": "", "owner_name": ""})
        else:
            del fleet.pods[ref]
    for key, obj in list(fleet.objects.items()):
        dep_meta = obj.get("metadata") or {}
        if namespace and dep_meta.get("namespace") != namespace:
            continue
        hits = _owned_by(dep_meta, kind, name, uid)
        if not hits:
            continue
        rest = [r for r in dep_meta.get("ownerReferences") or [] if r not in hits]
        if orphan or rest:
            if rest:
                dep_meta["ownerReferences"] = rest
            else:
                dep_meta.pop("ownerReferences", None)
            if revision is not None:
                dep_meta["resourceVersion"] = revision()
            continue
        del fleet.objects[key]
        collect_dependents(fleet, obj, "Background", revision)


#: What a ConfigMap's data and binaryData may hold together, bytes: kubernetes ``ValidateConfigMap``
#: (pkg/apis/core/validation) refuses more than ``core.MaxSecretSize`` with ``field.TooLong``.
CONFIGMAP_MAX_BYTES = 1024 * 1024


def configmap_refusal(configmap: dict[str, Any]) -> str | None:
    """Why the API server would refuse to store this ConfigMap (422: its values, binaryData decoded, are
    over 1 MiB together), or ``None``."""
    size = sum(len(str(v).encode()) for v in (configmap.get("data") or {}).values())
    for value in (configmap.get("binaryData") or {}).values():
        try:
            size += len(base64.b64decode(str(value), validate=True))
        except ValueError:
            size += len(str(value)) * 3 // 4
    if size <= CONFIGMAP_MAX_BYTES:
        return None
    name = (configmap.get("metadata") or {}).get("name", "")
    return f'ConfigMap "{name}" is invalid: : Too long: may not be more than {CONFIGMAP_MAX_BYTES} bytes'


def event_refusal(event: dict[str, Any]) -> str | None:
    """Why the API server would refuse to create this core/v1 Event (422), or ``None``."""
    meta = event.get("metadata") or {}
    namespace = meta.get("namespace") or ""
    involved = str((event.get("involvedObject") or {}).get("namespace") or "")
    if involved:
        allowed = namespace == involved
    elif event.get("eventTime"):
        allowed = namespace in ("default", "kube-system")
    else:
        allowed = namespace in ("", "default")
    if allowed:
        return None
    return (
        f'Event "{meta.get("name", "")}" is invalid: involvedObject.namespace: Invalid value: '
        f'"{involved}": does not match event.namespace'
    )
