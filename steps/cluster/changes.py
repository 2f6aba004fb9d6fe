"""The rules both adapters share for changing nodes, state and locks, as pure functions.

Each function looks at what was read and returns what to write (a merge patch, a new list, a new
Lease spec) or ``None`` when nothing needs to change, so every call is idempotent.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from steps.cluster import vocabulary as vocab
from steps.cluster.errors import CordonRefusedError
from steps.cluster.node import Condition, Node, Taint, TaintEffect

__all__ = [
    "condition_after",
    "cordon_patch",
    "format_micro_time",
    "format_time",
    "lease_expired",
    "lease_spec",
    "metadata_map_patch",
    "parse_time",
    "taints_with",
    "taints_without",
    "timestamp_or_zero",
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


def timestamp_or_zero(text: str | None) -> float:
    """Unix time of a stored RFC 3339 time (an annotation, a ConfigMap's value), as a metric gives it: 0
    when there is none or it is not a time."""
    if not text:
        return 0.0
    try:
        return parse_time(text).timestamp()
    except ValueError:
        return 0.0


def cordon_patch(node: Node, reason: str, by: str, force: bool, now: dt.datetime) -> dict[str, Any] | None:
    """The patch that cordons ``node`` for the owner ``by``, or ``None`` if ``by`` already holds it so.

    - not cordoned (a stale record included): cordon it, recording ``by``, the reason and the time;
    - cordoned by ``by``: only a new reason is written (the cordon keeps its start);
    - cordoned outside dsx, with no owner recorded: record ``by`` with ``cordoned-before-dsx=true``,
      so that no dsx uncordon releases it;
    - held by another owner: refused, unless ``force`` takes it over.

    Raises:
        CordonRefusedError: another owner holds the cordon and ``force`` is not set.
    """
    current = node.cordon
    reason = " ".join(reason.split())
    record = {
        vocab.ANNOTATION_CORDONED_BY: by,
        vocab.ANNOTATION_CORDON_REASON: reason,
        vocab.ANNOTATION_CORDONED_AT: format_time(now),
        vocab.ANNOTATION_CORDONED_BEFORE: "false",
    }
    if current is None:
        return {"metadata": {"annotations": record}, "spec": {"unschedulable": True}}
    if current.holder == by:
        if current.reason == reason:
            return None
        return {"metadata": {"annotations": {vocab.ANNOTATION_CORDON_REASON: reason}}}
    if current.holder and not force:
        first = f"uncordon it as {current.owner} first, or " if current.owner else ""
        raise CordonRefusedError(
            "cordon",
            f"node/{node.name}",
            f"{node.name} carries {current.describe()}; dsx does not write over another owner's cordon "
            f"({first}--force to take it over)",
            current,
            node.resource_version,
        )
    if not current.owner:
        record[vocab.ANNOTATION_CORDONED_BEFORE] = "true"
    return {"metadata": {"annotations": record}}


def uncordon_patch(node: Node, by: str, force: bool) -> dict[str, Any] | None:
    """The patch that releases ``by``'s cordon and drops dsx's cordon annotations, or ``None``.

    A node that is not cordoned only loses a stale record, if it has one.

    Raises:
        CordonRefusedError: the cordon is not ``by``'s (another owner's, or one made outside dsx, before
            or after dsx came) and ``force`` is not set.
    """
    current = node.cordon
    present = [k for k in vocab.CORDON_ANNOTATIONS if k in node.annotations]
    clear = {"metadata": {"annotations": dict.fromkeys(present)}} if present else {}
    if current is None:
        return clear or None
    if current.owner != by and not force:
        if current.owner:
            how = f"dsx releases a cordon only for its owner (uncordon it as {current.owner}, or --force)"
        else:
            how = "dsx never releases a cordon it did not make (kubectl uncordon it, or --force)"
        raise CordonRefusedError(
            "uncordon",
            f"node/{node.name}",
            f"{node.name} carries {current.describe()}; {how}",
            current,
            node.resource_version,
        )
    return {**clear, "spec": {"unschedulable": None}}


def metadata_map_patch(current: Mapping[str, str], wanted: Mapping[str, str | None]) -> dict[str, str | None]:
    """The merge patch of a metadata map (a node's labels or annotations): the entries of ``wanted`` that
    change ``current`` (``None`` removes a key that is there), sorted; empty when nothing changes."""
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
