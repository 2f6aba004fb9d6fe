"""The ``not-ready`` check: a node whose own Ready condition has not been True for too long.

Kubernetes says a node is down through its Ready condition, which the node lifecycle controller turns
``Unknown`` once the kubelet stops renewing its Lease for the grace period (``NodeStatusUnknown``: the
machine is off, hung or cut off), and the kubelet writes ``False`` when it runs but its runtime, network
or own checks fail. The controller taints the node (``node.kubernetes.io/unreachable`` or ``not-ready``)
and, after the pods' toleration seconds, deletes them; on a node whose kubelet is gone they stay
terminating until a person confirms the node is down with the taint ``node.kubernetes.io/out-of-service``,
when the pod garbage collector force-deletes them (``pkg/controller/podgc/gc_controller.go``,
``gcTerminating``). Nothing repairs the node.

The check judges the Ready condition with the catalogue's rules (``recipes/faults/conditions.yaml``):

- ``ready-unknown`` and ``ready-false``: Ready has stayed so for the code's threshold (seconds, since its
  ``lastTransitionTime``), longer than a GPU server takes to reboot;
- ``out-of-service``: Ready is not True and a person put the out-of-service taint on: at once.

Ready True is a healthy reading (it clears the check's condition). A node not Ready for less than the
threshold, or one cordoned by someone other than dsx (a cordon dsx did not make: a planned reboot by
kured, an upgrade, a person's maintenance), gives no reading: the condition stays as it is.
dsx-reconcile applies it to every node (the node's own agent may be down with it) and writes the
condition; the agent applies it to its node, so a node that comes back clears it on the agent's first
pass.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from steps.cluster import changes
from steps.cluster import vocabulary as vocab
from steps.cluster.node import Node
from steps.sentinel.catalogue import FaultCatalogue
from steps.sentinel.events import HealthEvent

__all__ = ["NOT_READY", "cordoned_by_others", "not_ready_events"]

NOT_READY = "not-ready"
"""The check's name (its node condition: ``DsxNodeNotReady``)."""
_CODES = {"Unknown": "ready-unknown", "False": "ready-false"}


def cordoned_by_others(node: Node) -> bool:
    """Whether someone other than dsx cordoned the node (it is theirs: kured's reboot, an upgrade)."""
    cordon = node.cordon
    return cordon is not None and not cordon.owner


def _since(stamp: str) -> dt.datetime | None:
    try:
        return changes.parse_time(stamp)
    except (TypeError, ValueError):
        return None


def not_ready_events(node: Node, catalogue: FaultCatalogue, now: dt.datetime) -> list[HealthEvent]:
    """The ``not-ready`` reading of ``node`` at ``now`` (see the module docstring): one event, or none
    when there is nothing to say (the check off, Ready missing, not Ready for less than the threshold,
    cordoned by others)."""
    if catalogue.mode(NOT_READY) == "off":
        return []
    ready = node.condition("Ready")
    if ready is None:
        return []
    if ready.status == "True":
        return [_event(node, now, healthy=True, message="node: Ready")]
    down = node.has_taint(vocab.TAINT_OUT_OF_SERVICE)
    if cordoned_by_others(node) and not down:
        return []
    said = f"Ready {ready.status}" + (f" ({ready.reason})" if ready.reason else "")
    if down:
        code = "out-of-service"
        message = f"node: {said}, and a person confirmed it down (taint {vocab.TAINT_OUT_OF_SERVICE})"
    else:
        code = _CODES.get(ready.status, "ready-unknown")
        wait = catalogue.rule(NOT_READY, code).threshold or 0.0
        since = _since(ready.last_transition_time)
        if since is None or (now - since).total_seconds() < wait:
            return []
        message = f"node: {said} since {ready.last_transition_time} (over {wait:g}s)"
        message += f": {ready.message}" if ready.message else ""
    rule = catalogue.rule(NOT_READY, code)
    return [
        _event(
            node, now, healthy=False, code=code, severity=rule.severity, action=rule.action, message=message
        )
    ]


def _event(node: Node, now: dt.datetime, **fields: Any) -> HealthEvent:
    return HealthEvent(
        node=node.name, check=NOT_READY, component="node", entity="node", observed_at=now, **fields
    )
