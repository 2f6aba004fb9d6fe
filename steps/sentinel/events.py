"""The health event: one reading of one check about one entity of a node (DESIGN.md's contract).

Probes return health events; the agent keeps the last state of each ``(check, entity)`` (of each code
too, for the checks in :data:`PER_CODE_CHECKS`: XIDs and SXids) and turns a change into a node
condition, a Kubernetes Event, metrics and, for a fatal fault, a taint. A healthy event is a reading
too: it clears the earlier unhealthy ones for the same check and entity, and nothing else.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from typing import Literal, get_args

from pydantic import Field

from steps.cluster import vocabulary as vocab
from steps.models import Frozen

__all__ = [
    "ACTIONS",
    "CHECKS",
    "COMPONENTS",
    "PER_CODE_CHECKS",
    "SEVERITIES",
    "Action",
    "Component",
    "HealthEvent",
    "Severity",
    "condition_message",
    "condition_reading",
    "condition_reason",
    "severity_rank",
]

Severity = Literal["fatal", "degraded", "info"]
Action = Literal["none", "restart-app", "reset-gpu", "reboot", "replace", "contact-support"]
Component = vocab.SentinelComponent
SEVERITIES: tuple[Severity, ...] = ("fatal", "degraded", "info")
ACTIONS: tuple[Action, ...] = ("none", "restart-app", "reset-gpu", "reboot", "replace", "contact-support")
COMPONENTS: tuple[Component, ...] = get_args(vocab.SentinelComponent)

CHECKS: dict[str, Component] = {check: component for check, (component, _) in vocab.SENTINEL_CHECKS.items()}
"""Every check the probes run, with the component it is about (a view of
:data:`steps.cluster.vocabulary.SENTINEL_CHECKS`, which also names the node condition each sets)."""

PER_CODE_CHECKS: frozenset[str] = frozenset({"xid", "sxid"})
"""Checks whose faults are occurrences (kernel-log lines, NVML events), not levels: each code on an entity
is its own fault, reported and kept apart from the entity's other codes (an XID 31 after an XID 95 is
reported too, and does not replace it), until a healthy reading of that check and entity clears them
all (for XIDs: none since boot, so a reboot). Every other check keeps one fault per entity, its worst."""

_RANK = {"info": 0, "degraded": 1, "fatal": 2}


def severity_rank(severity: Severity) -> int:
    """How bad a severity is: info 0, degraded 1, fatal 2."""
    return _RANK[severity]


class HealthEvent(Frozen):
    """One reading of a check about one entity of a node.

    Attributes:
        node: the node's name.
        check: what was checked (one of :data:`CHECKS`).
        component: ``gpu``, ``nvlink``, ``nic`` or ``node``.
        entity: what the reading is about: a GPU UUID, a NIC port (``mlx5_0/1``), an NVSwitch's PCI
            address, a probe's name; state is kept per check and entity.
        code: the fault as its source names it: an XID number (``79``), an NVML condition
            (``volatile-uncorrectable``); empty for a healthy reading.
        severity: ``fatal`` (taint at once), ``degraded`` (a condition) or ``info`` (an Event only).
        action: what repairs it: ``none``, ``restart-app``, ``reset-gpu``, ``reboot``, ``replace``,
            ``contact-support``.
        healthy: ``True``: the check found no problem with this entity, clearing an earlier reading.
        message: one line for a person.
        observed_at: when the reading was made (UTC).
    """

    node: str
    check: str
    component: Component
    entity: str
    code: str = ""
    severity: Severity = "info"
    action: Action = "none"
    healthy: bool
    message: str = ""
    observed_at: dt.datetime = Field(default_factory=lambda: dt.datetime.now(dt.UTC))


def condition_reason(severity: Severity, action: Action) -> str:
    """The reason of a sentinel condition set for a fault of this severity and action: ``FatalReboot``,
    ``DegradedResetGpu``. The Sensor reads the severity back from it (``Fatal*``), ``guard`` both."""
    return "".join(part[:1].upper() + part[1:] for part in f"{severity}-{action}".split("-"))


def condition_message(findings: Iterable[HealthEvent]) -> str:
    """The message of a sentinel condition: every finding as ``SEVERITY (ACTION): MESSAGE``, separated by
    ``; `` (the repair request reads them back: :func:`steps.sentinel.repair.findings`)."""
    return "; ".join(f"{e.severity} ({e.action}): {e.message}" for e in findings)


_REASONS: dict[str, tuple[Severity, Action]] = {
    condition_reason(s, a): (s, a) for s in SEVERITIES for a in ACTIONS
}


def condition_reading(node: str, check: str, condition: Mapping[str, object]) -> HealthEvent | None:
    """The reading a node's sentinel condition stands for, as the Sensor passes it (the condition object
    of the node, ``{type, status, reason, message, lastTransitionTime, lastHeartbeatTime}``): unhealthy
    with the severity and action its reason names, observed when it turned True. ``None`` when the
    condition is not True or its reason is not one the agent writes (no fault to act on).
    """
    if str(condition.get("status")) != "True":
        return None
    named = _REASONS.get(str(condition.get("reason") or ""))
    if named is None:
        return None
    severity, action = named
    since = str(condition.get("lastTransitionTime") or "")
    try:
        observed = dt.datetime.fromisoformat(since.replace("Z", "+00:00")) if since else None
    except ValueError:
        observed = None
    return HealthEvent(
        node=node,
        check=check,
        component=CHECKS[check],
        entity=node,
        severity=severity,
        action=action,
        healthy=False,
        message=str(condition.get("message") or ""),
        **({"observed_at": observed} if observed is not None else {}),
    )
