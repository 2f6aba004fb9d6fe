"""The health event: one reading of one check about one entity of a node (DESIGN.md's contract).

Probes return health events; the agent keeps the last state of each ``(check, entity)`` and turns a
change into a node condition, a Kubernetes Event, metrics and, for a fatal fault, a taint. A healthy
event is a reading too: it clears the earlier unhealthy one for the same check and entity, and nothing
else.
"""

from __future__ import annotations

import datetime as dt
from typing import Literal

from pydantic import Field

from steps.models import Frozen

__all__ = [
    "ACTIONS",
    "CHECKS",
    "COMPONENTS",
    "SEVERITIES",
    "Action",
    "Component",
    "HealthEvent",
    "Severity",
    "severity_rank",
]

Severity = Literal["fatal", "degraded", "info"]
Action = Literal["none", "restart-app", "reset-gpu", "reboot", "replace", "contact-support"]
Component = Literal["gpu", "nvlink", "nic", "node"]
SEVERITIES: tuple[Severity, ...] = ("fatal", "degraded", "info")
ACTIONS: tuple[Action, ...] = ("none", "restart-app", "reset-gpu", "reboot", "replace", "contact-support")
COMPONENTS: tuple[Component, ...] = ("gpu", "nvlink", "nic", "node")

CHECKS: dict[str, Component] = {
    "gpu-missing": "gpu",
    "xid": "gpu",
    "sxid": "nvlink",
    "ecc": "gpu",
    "remap": "gpu",
    "thermal": "gpu",
    "pcie": "gpu",
    "nvlink": "nvlink",
    "reset-required": "gpu",
    "nic": "nic",
    "nvml": "node",
    "probe": "node",
}
"""Every check the probes run, with the component it is about. Each sets one node condition
(:data:`steps.cluster.vocabulary.CONDITION_SENTINEL`)."""

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
