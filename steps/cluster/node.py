"""A node as dsx sees it: plain pydantic data read from and written to the Kubernetes JSON shape.

``from_manifest`` and ``to_manifest`` translate each model so both adapters of the cluster port agree on
one reading of every field; :attr:`Node.cordon` reads whose cordon a node carries from dsx's annotations
and the API server's field managers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field

from steps.cluster import vocabulary as vocab
from steps.models import Strict

__all__ = [
    "GPU_RESOURCE",
    "Condition",
    "Cordon",
    "CordonResult",
    "Node",
    "NodeInfo",
    "Taint",
    "TaintEffect",
]

GPU_RESOURCE = "nvidia.com/gpu"

TaintEffect = Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]


class Taint(Strict):
    """A node taint."""

    key: str
    value: str = ""
    effect: TaintEffect = "NoSchedule"

    def to_manifest(self) -> dict[str, str]:
        """The taint as the API writes it (``value`` left out when empty)."""
        out = {"key": self.key, "effect": self.effect}
        if self.value:
            out["value"] = self.value
        return out

    def __str__(self) -> str:
        return f"{self.key}={self.value}:{self.effect}" if self.value else f"{self.key}:{self.effect}"


class Condition(Strict):
    """A node condition. For dsx's own conditions ``status="True"`` means the problem is present."""

    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str = ""
    message: str = ""
    last_transition_time: str = ""
    last_heartbeat_time: str = ""

    @classmethod
    def from_manifest(cls, data: Mapping[str, Any]) -> Condition:
        """Read a condition from its API JSON."""
        return cls(
            type=str(data.get("type", "")),
            status=data.get("status", "Unknown"),
            reason=str(data.get("reason") or ""),
            message=str(data.get("message") or ""),
            last_transition_time=str(data.get("lastTransitionTime") or ""),
            last_heartbeat_time=str(data.get("lastHeartbeatTime") or ""),
        )

    def to_manifest(self) -> dict[str, str]:
        """The condition as the API writes it."""
        out = {"type": self.type, "status": self.status}
        for key, value in (
            ("reason", self.reason),
            ("message", self.message),
            ("lastTransitionTime", self.last_transition_time),
            ("lastHeartbeatTime", self.last_heartbeat_time),
        ):
            if value:
                out[key] = value
        return out


_NODE_INFO_KEYS = (
    ("os_image", "osImage"),
    ("kernel_version", "kernelVersion"),
    ("kubelet_version", "kubeletVersion"),
    ("container_runtime_version", "containerRuntimeVersion"),
    ("architecture", "architecture"),
    ("boot_id", "bootID"),
)


class NodeInfo(Strict):
    """Versions the kubelet reports in ``status.nodeInfo``."""

    os_image: str = ""
    kernel_version: str = ""
    kubelet_version: str = ""
    container_runtime_version: str = ""
    architecture: str = ""
    boot_id: str = ""
    """Changes each time the machine boots: a repair that rebooted the node shows a new one."""

    @classmethod
    def from_manifest(cls, data: Mapping[str, Any]) -> NodeInfo:
        """Read ``status.nodeInfo``."""
        return cls(**{field: str(data.get(key) or "") for field, key in _NODE_INFO_KEYS})

    def to_manifest(self) -> dict[str, str]:
        """``status.nodeInfo`` as the API writes it."""
        return {key: getattr(self, field) for field, key in _NODE_INFO_KEYS if getattr(self, field)}


class Cordon(Strict):
    """Whose cordon a node carries, as dsx reads it from the node (see :attr:`Node.cordon`).

    Attributes:
        owner: the dsx owner whose cordon it is (the ``by`` that made it); ``""`` when the cordon was
            made outside dsx (kubectl, another tool), which dsx never releases unless forced.
        recorded_by: a dsx owner who cordoned the node when it was already cordoned outside dsx
            (``dsx.dev/cordoned-before-dsx=true``): the record sits on someone else's cordon.
        reason: the recorded reason (the owner's, or ``recorded_by``'s).
        at: when it was recorded.
        manager: the field manager that last set ``spec.unschedulable``, when the API server says
            (``metadata.managedFields``): ``dsx`` for a cordon dsx made, e.g. ``kubectl-cordon`` otherwise.
    """

    owner: str = ""
    recorded_by: str = ""
    reason: str = ""
    at: str = ""
    manager: str = ""

    @property
    def holder(self) -> str:
        """The dsx owner a new cordon would have to take over: the owner, or the one recorded on top."""
        return self.owner or self.recorded_by

    def describe(self) -> str:
        """Whose cordon it is, in words: ``alice's cordon (bad NIC, since ...)``, or one made outside dsx."""
        if self.owner:
            details = ", ".join(x for x in (self.reason, f"since {self.at}" if self.at else "") if x)
            return f"{self.owner}'s cordon" + (f" ({details})" if details else "")
        made = "a cordon made outside dsx"
        if self.manager and self.manager != vocab.FIELD_MANAGER:
            made += f" (by {self.manager})"
        if self.recorded_by:
            made += f", before {self.recorded_by} cordoned it through dsx"
            if self.reason:
                made += f" ({self.reason})"
        return made


class Node(Strict):
    """A node as dsx sees it.

    ``unschedulable_managers`` are the field managers the API server names as owners of
    ``spec.unschedulable`` in ``metadata.managedFields`` (empty when it does not say): they tell a cordon
    dsx made from one set again outside dsx after dsx's was lifted, which the annotations cannot.
    """

    name: str
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    taints: list[Taint] = Field(default_factory=list)
    unschedulable: bool = False
    unschedulable_managers: list[str] = Field(default_factory=list)
    conditions: list[Condition] = Field(default_factory=list)
    capacity: dict[str, str] = Field(default_factory=dict)
    allocatable: dict[str, str] = Field(default_factory=dict)
    node_info: NodeInfo = Field(default_factory=NodeInfo)
    resource_version: str = ""

    @property
    def ready(self) -> bool:
        """Whether the kubelet reports the ``Ready`` condition as ``True``."""
        return any(c.type == "Ready" and c.status == "True" for c in self.conditions)

    @property
    def managed(self) -> bool:
        """Whether dsx may act on this node (not opted out with ``dsx.dev/managed=false``)."""
        return vocab.is_managed(self.labels)

    @property
    def gpu_product(self) -> str:
        """The GPU product GPU Feature Discovery reported, or an empty string."""
        return self.labels.get("nvidia.com/gpu.product", "")

    @property
    def gpu_count(self) -> int:
        """GPUs the node offers to pods (allocatable ``nvidia.com/gpu``)."""
        try:
            return int(self.allocatable.get(GPU_RESOURCE, "0"))
        except ValueError:
            return 0

    @property
    def cordon(self) -> Cordon | None:
        """Whose cordon the node carries; ``None`` when it is schedulable (any dsx record left on it then
        is stale: someone uncordoned the node outside dsx)."""
        if not self.unschedulable:
            return None
        notes = self.annotations
        by = notes.get(vocab.ANNOTATION_CORDONED_BY, "")
        reason = notes.get(vocab.ANNOTATION_CORDON_REASON, "")
        at = notes.get(vocab.ANNOTATION_CORDONED_AT, "")
        managers = self.unschedulable_managers
        manager = ",".join(managers)
        if by and notes.get(vocab.ANNOTATION_CORDONED_BEFORE) == "true":
            return Cordon(recorded_by=by, reason=reason, at=at, manager=manager)
        if by and managers in ([], [vocab.FIELD_MANAGER]):
            return Cordon(owner=by, reason=reason, at=at, manager=manager)
        # No record, or a record whose cordon was lifted and set again by another field manager.
        return Cordon(manager=manager)

    def condition(self, type_: str) -> Condition | None:
        """The condition of this type, if the node has one."""
        return next((c for c in self.conditions if c.type == type_), None)

    def has_taint(self, key: str, effect: str | None = None) -> bool:
        """Whether the node carries a taint with this key (and effect, when given)."""
        return any(t.key == key and (effect is None or t.effect == effect) for t in self.taints)

    @classmethod
    def from_manifest(cls, data: Mapping[str, Any]) -> Node:
        """Read a node from its API JSON."""
        meta = data.get("metadata") or {}
        spec = data.get("spec") or {}
        status = data.get("status") or {}
        return cls(
            name=str(meta.get("name", "")),
            labels=dict(meta.get("labels") or {}),
            annotations=dict(meta.get("annotations") or {}),
            taints=[
                Taint(key=t["key"], value=str(t.get("value") or ""), effect=t.get("effect", "NoSchedule"))
                for t in spec.get("taints") or []
            ],
            unschedulable=bool(spec.get("unschedulable", False)),
            unschedulable_managers=_unschedulable_managers(meta.get("managedFields")),
            conditions=[Condition.from_manifest(c) for c in status.get("conditions") or []],
            capacity={k: str(v) for k, v in (status.get("capacity") or {}).items()},
            allocatable={k: str(v) for k, v in (status.get("allocatable") or {}).items()},
            node_info=NodeInfo.from_manifest(status.get("nodeInfo") or {}),
            resource_version=str(meta.get("resourceVersion") or ""),
        )

    def to_manifest(self) -> dict[str, Any]:
        """The node as the API writes it (the fields dsx models)."""
        metadata: dict[str, Any] = {"name": self.name, "labels": dict(self.labels)}
        if self.annotations:
            metadata["annotations"] = dict(self.annotations)
        if self.resource_version:
            metadata["resourceVersion"] = self.resource_version
        if self.unschedulable_managers:
            metadata["managedFields"] = [
                {
                    "manager": manager,
                    "operation": "Update",
                    "apiVersion": "v1",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:spec": {"f:unschedulable": {}}},
                }
                for manager in self.unschedulable_managers
            ]
        spec: dict[str, Any] = {}
        if self.unschedulable:
            spec["unschedulable"] = True
        if self.taints:
            spec["taints"] = [t.to_manifest() for t in self.taints]
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": metadata,
            "spec": spec,
            "status": {
                "capacity": dict(self.capacity),
                "allocatable": dict(self.allocatable),
                "conditions": [c.to_manifest() for c in self.conditions],
                "nodeInfo": self.node_info.to_manifest(),
            },
        }


def _unschedulable_managers(entries: Any) -> list[str]:
    """The managers that own ``spec.unschedulable`` in a ``metadata.managedFields`` list, sorted."""
    found = set()
    for entry in entries if isinstance(entries, list) else []:
        fields = entry.get("fieldsV1") if isinstance(entry, Mapping) else None
        spec = fields.get("f:spec") if isinstance(fields, Mapping) else None
        if isinstance(spec, Mapping) and "f:unschedulable" in spec and entry.get("manager"):
            found.add(str(entry["manager"]))
    return sorted(found)


class CordonResult(Strict):
    """What a cordon or an uncordon did, and whose cordon the node carried before it.

    Attributes:
        node: the node as it is after the call.
        previous: the cordon the call found (``None``: the node was schedulable).
        changed: whether the call wrote anything.
        forced: whether ``force`` took over a cordon that was not the caller's.
        summary: one line for the operator, naming whose cordon it was.
    """

    node: Node
    previous: Cordon | None = None
    changed: bool = False
    forced: bool = False
    summary: str = ""
