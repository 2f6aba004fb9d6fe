"""The rules both adapters share for changing nodes, state and locks, as pure functions.

Each function looks at what was read and returns what to write (a merge patch, a new list, a new
Lease spec) or ``None`` when nothing needs to change, so every call is idempotent.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from steps.cluster import vocabulary as vocab
from steps.cluster.port import Condition, Node, Taint, TaintEffect

__all__ = [
    "annotations_patch",
    "condition_after",
    "cordon_patch",
    "format_micro_time",
    "format_time",
    "lease_expired",
    "lease_spec",
    "parse_time",
    "taints_with",
    "taints_without",
    "uncordon_patch",
]


def format_time(moment: dt.datetime) -> str:
    """RFC 3339 in UTC to the second, as the API writes ``Time`` fields."""
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def format_micro_time(moment: dt.datetime) -> str:
    """RFC 3339 in UTC to the microsecond, as the API writes ``MicroTime`` fields (Leases)."""
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: str) -> dt.datetime:
    """Read a ``Time`` or ``MicroTime`` field."""
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def cordon_patch(node: Node, reason: str, by: str) -> dict[str, Any] | None:
    """The patch that cordons ``node``, or ``None`` if it is already cordoned by ``by`` for ``reason``.

    ``dsx.dev/cordoned-before-dsx`` records whether the node was unschedulable before dsx first
    cordoned it; a later cordon keeps the first answer.
    """
    before = node.annotations.get(vocab.ANNOTATION_CORDONED_BEFORE)
    if before is None:
        before = "true" if node.unschedulable else "false"
    wanted = {
        vocab.ANNOTATION_CORDONED_BY: by,
        vocab.ANNOTATION_CORDON_REASON: " ".join(reason.split()),
        vocab.ANNOTATION_CORDONED_BEFORE: before,
    }
    if node.unschedulable and all(node.annotations.get(k) == v for k, v in wanted.items()):
        return None
    return {"metadata": {"annotations": wanted}, "spec": {"unschedulable": True}}


def uncordon_patch(node: Node) -> dict[str, Any] | None:
    """The patch that makes ``node`` schedulable and drops dsx's cordon annotations, or ``None``."""
    present = [k for k in vocab.CORDON_ANNOTATIONS if k in node.annotations]
    if not node.unschedulable and not present:
        return None
    patch: dict[str, Any] = {"spec": {"unschedulable": None}}
    if present:
        patch["metadata"] = {"annotations": dict.fromkeys(present)}
    return patch


def annotations_patch(current: Mapping[str, str], wanted: Mapping[str, str | None]) -> dict[str, str | None]:
    """The entries of ``wanted`` that change ``current`` (``None`` removes a key that is there)."""
    return {
        k: v
        for k, v in sorted(wanted.items())
        if (v is None and k in current) or (v is not None and current.get(k) != v)
    }


def taints_with(node: Node, key: str, value: str, effect: TaintEffect) -> list[Taint] | None:
    """The node's taints with this one added (replacing one with the same key and effect), or ``None``."""
    wanted = Taint(key=key, value=value, effect=effect)
    if wanted in node.taints:
        return None
    return [t for t in node.taints if not (t.key == key and t.effect == effect)] + [wanted]


def taints_without(node: Node, key: str, effect: TaintEffect | None) -> list[Taint] | None:
    """The node's taints without those of this key (and effect), or ``None`` if there are none."""
    kept = [t for t in node.taints if not (t.key == key and (effect is None or t.effect == effect))]
    return None if len(kept) == len(node.taints) else kept


def condition_after(
    node: Node, type_: str, status: bool, reason: str, message: str, now: dt.datetime
) -> Condition | None:
    """The condition to write, or ``None`` if the node already says exactly this.

    The transition time moves only when the status changes; the heartbeat time moves on every write.
    """
    wanted_status = "True" if status else "False"
    current = node.condition(type_)
    if current and (current.status, current.reason, current.message) == (wanted_status, reason, message):
        return None
    stamp = format_time(now)
    transition = current.last_transition_time if current and current.status == wanted_status else stamp
    return Condition(
        type=type_,
        status=wanted_status,
        reason=reason,
        message=" ".join(message.split()),
        last_transition_time=transition or stamp,
        last_heartbeat_time=stamp,
    )


def lease_expired(spec: Mapping[str, Any], now: dt.datetime) -> bool:
    """Whether a Lease's holder has let it lapse (or nobody holds it)."""
    if not spec.get("holderIdentity"):
        return True
    renewed = spec.get("renewTime") or spec.get("acquireTime")
    if not renewed:
        return True
    duration = dt.timedelta(seconds=int(spec.get("leaseDurationSeconds") or 0))
    return parse_time(str(renewed)) + duration <= now


def lease_spec(
    current: Mapping[str, Any] | None, holder: str, ttl_seconds: int, now: dt.datetime
) -> dict[str, Any]:
    """The Lease spec after ``holder`` takes or renews it at ``now``."""
    current = current or {}
    stamp = format_micro_time(now)
    same = current.get("holderIdentity") == holder
    transitions = int(current.get("leaseTransitions") or 0)
    return {
        "holderIdentity": holder,
        "leaseDurationSeconds": int(ttl_seconds),
        "acquireTime": current.get("acquireTime", stamp) if same else stamp,
        "renewTime": stamp,
        "leaseTransitions": transitions if same or not current else transitions + 1,
    }
