"""What the controllers and the eviction API of a real cluster do, for the simulated fleet.

- A pod of a ReplicaSet or a Job that is deleted or evicted is replaced at once, on the schedulable
  node with the fewest pods (ties by name); with no such node the replacement stays ``Pending``.
  A DaemonSet pod is replaced on its own node. A bare pod is simply gone.
- An eviction is refused while the pod's PodDisruptionBudget allows no disruption: healthy (Running)
  pods minus the pods the budget insists on must be at least one. Two budgets on one pod is an error,
  as in the API server.
"""

from __future__ import annotations

from steps.cluster.port import Pod
from steps.cluster.sim.model import Fleet, owner_key

__all__ = ["MULTIPLE_BUDGETS", "disruption_refusal", "replace_pod", "schedulable_nodes"]

MULTIPLE_BUDGETS = (
    "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."
)
_BLOCKED = "Cannot evict pod as it would violate the pod's disruption budget."
_TERMINAL = ("Succeeded", "Failed")


def schedulable_nodes(fleet: Fleet) -> list[str]:
    """Nodes a new pod may land on: Ready, not cordoned, without NoSchedule or NoExecute taints."""
    return [
        name
        for name, node in sorted(fleet.nodes.items())
        if node.ready
        and not node.unschedulable
        and not any(t.effect in ("NoSchedule", "NoExecute") for t in node.taints)
    ]


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


def disruption_refusal(fleet: Fleet, pod: Pod) -> tuple[int, str] | None:
    """Why the eviction API would refuse ``pod`` now, as ``(status, message)``; ``None`` if it allows it."""
    budgets = [b for b in fleet.pdbs.values() if b.selects(pod)]
    if not budgets or pod.phase != "Running":
        return None
    if len(budgets) > 1:
        return 500, MULTIPLE_BUDGETS
    budget = budgets[0]
    covered = [p for p in fleet.pods.values() if budget.selects(p) and p.phase not in _TERMINAL]
    healthy = sum(1 for p in covered if p.phase == "Running")
    desired = budget.desired_healthy(len(covered))
    if healthy - desired >= 1:
        return None
    return (
        429,
        f"{_BLOCKED} The disruption budget {budget.name} needs {desired} healthy pods "
        f"and has {healthy} currently",
    )
