"""The cluster port: what dsx needs from Kubernetes, named in the operator's words.

Two adapters implement :class:`ClusterPort`: :class:`steps.cluster.kube.KubeCluster` (the kubernetes
client, against a real API server) and :class:`steps.cluster.sim.SimCluster` (a simulated GPU fleet).
Steps receive a port from :func:`steps.cluster.connect` and never know which one they hold.

The models here are plain pydantic data; ``from_manifest`` and ``to_manifest`` translate them from and
to the Kubernetes JSON shape so both adapters agree on one reading of every field.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from steps.cluster import vocabulary as vocab

__all__ = [
    "GPU_RESOURCE",
    "NODE_EVENT_NAMESPACE",
    "ClusterPort",
    "Condition",
    "EvictionOutcome",
    "EvictionResult",
    "Node",
    "NodeInfo",
    "Pod",
    "PodRef",
    "Propagation",
    "StateChange",
    "Taint",
    "TaintEffect",
    "pod_ref",
]

GPU_RESOURCE = "nvidia.com/gpu"

TaintEffect = Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]
EvictionOutcome = Literal["evicted", "blocked", "gone"]
Propagation = Literal["Background", "Foreground", "Orphan"]
"""How a deletion treats the objects the deleted one owns (``DeleteOptions.propagationPolicy``)."""

NODE_EVENT_NAMESPACE = "default"
"""Where Events about Nodes go. The API server accepts a core/v1 Event about a cluster-scoped object
without ``eventTime`` only in namespace ``default`` (or none) and answers 422 elsewhere (kubernetes
``legacyValidateEvent`` in pkg/apis/core/validation/events.go)."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Taint(_Model):
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


class Condition(_Model):
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
)


class NodeInfo(_Model):
    """Versions the kubelet reports in ``status.nodeInfo``."""

    os_image: str = ""
    kernel_version: str = ""
    kubelet_version: str = ""
    container_runtime_version: str = ""
    architecture: str = ""

    @classmethod
    def from_manifest(cls, data: Mapping[str, Any]) -> NodeInfo:
        """Read ``status.nodeInfo``."""
        return cls(**{field: str(data.get(key) or "") for field, key in _NODE_INFO_KEYS})

    def to_manifest(self) -> dict[str, str]:
        """``status.nodeInfo`` as the API writes it."""
        return {key: getattr(self, field) for field, key in _NODE_INFO_KEYS if getattr(self, field)}


class Node(_Model):
    """A node as dsx sees it."""

    name: str
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    taints: list[Taint] = Field(default_factory=list)
    unschedulable: bool = False
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


class Pod(_Model):
    """A pod as dsx sees it: where it runs and what owns it."""

    name: str
    namespace: str
    node: str = ""
    owner_kind: str = ""
    owner_name: str = ""
    phase: str = "Running"
    labels: dict[str, str] = Field(default_factory=dict)

    @property
    def ref(self) -> str:
        """``namespace/name``."""
        return f"{self.namespace}/{self.name}"

    @property
    def daemonset(self) -> bool:
        """Whether a DaemonSet owns the pod (drains leave those alone)."""
        return self.owner_kind == "DaemonSet"

    @classmethod
    def from_manifest(cls, data: Mapping[str, Any]) -> Pod:
        """Read a pod from its API JSON; the owner is the controller reference, if any."""
        meta = data.get("metadata") or {}
        owners = meta.get("ownerReferences") or []
        owner = next((o for o in owners if o.get("controller")), owners[0] if owners else {})
        return cls(
            name=str(meta.get("name", "")),
            namespace=str(meta.get("namespace") or "default"),
            node=str((data.get("spec") or {}).get("nodeName") or ""),
            owner_kind=str(owner.get("kind", "")),
            owner_name=str(owner.get("name", "")),
            phase=str((data.get("status") or {}).get("phase") or "Pending"),
            labels=dict(meta.get("labels") or {}),
        )

    def to_manifest(self) -> dict[str, Any]:
        """The pod as the API writes it (the fields dsx models)."""
        metadata: dict[str, Any] = {
            "name": self.name,
            "namespace": self.namespace,
            "labels": dict(self.labels),
        }
        if self.owner_kind:
            api_version = "batch/v1" if self.owner_kind == "Job" else "apps/v1"
            metadata["ownerReferences"] = [
                {
                    "apiVersion": api_version,
                    "kind": self.owner_kind,
                    "name": self.owner_name,
                    "controller": True,
                    "uid": f"uid-{self.owner_kind.lower()}-{self.owner_name}",
                }
            ]
        spec: dict[str, Any] = {"containers": [{"name": "main", "image": "registry.local/workload:1"}]}
        if self.node:
            spec["nodeName"] = self.node
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": metadata,
            "spec": spec,
            "status": {"phase": self.phase},
        }


PodRef = Pod | str
"""A pod, or its ``namespace/name``."""


def pod_ref(pod: PodRef) -> tuple[str, str]:
    """``(namespace, name)`` of a pod or of a ``namespace/name`` string (namespace ``default`` if absent)."""
    if isinstance(pod, Pod):
        return pod.namespace, pod.name
    namespace, _, name = pod.rpartition("/")
    return namespace or "default", name


class EvictionResult(_Model):
    """What became of an eviction: ``evicted``, ``blocked`` (a PodDisruptionBudget, HTTP 429) or ``gone``."""

    pod: str
    outcome: EvictionOutcome
    message: str = ""


StateChange = Callable[[dict[str, str]], dict[str, str]]
"""Turns the current state (a copy) into the new state; may be called again after a conflict."""


@runtime_checkable
class ClusterPort(Protocol):
    """Everything dsx asks of a Kubernetes cluster.

    Node calls take the node name and return the node as it is after the call. Calls that change a
    node read it first and write with its ``resourceVersion``, retrying on a conflict; calls that
    cannot be repeated safely are never retried blindly. Failures raise
    :class:`steps.cluster.errors.ClusterError` subclasses naming the call and the node.
    """

    namespace: str
    """Where dsx keeps its ConfigMaps and Leases (Events about nodes go to :data:`NODE_EVENT_NAMESPACE`)."""

    @property
    def endpoint(self) -> str:
        """Where the port points, for reports: an API server URL or ``sim:...``."""
        ...

    def list_nodes(self, selector: str | None = None) -> list[Node]:
        """Nodes matching a label selector (``a=b,c!=d,e``), sorted by name."""
        ...

    def get_node(self, name: str) -> Node:
        """One node; :class:`~steps.cluster.errors.NotFoundError` if it does not exist."""
        ...

    def cordon(self, node: str, reason: str, by: str = "dsx") -> Node:
        """Mark the node unschedulable, recording who and why, and whether it was cordoned before."""
        ...

    def uncordon(self, node: str) -> Node:
        """Make the node schedulable again and clear dsx's cordon annotations."""
        ...

    def add_taint(
        self, node: str, key: str = vocab.TAINT_UNHEALTHY, value: str = "", effect: TaintEffect = "NoSchedule"
    ) -> Node:
        """Add a taint (replacing one with the same key and effect); no change if it is already there."""
        ...

    def remove_taint(
        self, node: str, key: str = vocab.TAINT_UNHEALTHY, effect: TaintEffect | None = None
    ) -> Node:
        """Remove the taints with this key (and effect, when given); no change if there are none."""
        ...

    def set_labels(self, node: str, labels: Mapping[str, str | None]) -> Node:
        """Merge labels into the node; a value of ``None`` removes the label."""
        ...

    def set_annotations(self, node: str, annotations: Mapping[str, str | None]) -> Node:
        """Merge annotations into the node; a value of ``None`` removes the annotation."""
        ...

    def set_condition(self, node: str, type_: str, status: bool, reason: str, message: str) -> Node:
        """Set a node condition through the status subresource (``status=True`` means a problem)."""
        ...

    def pods_on(self, node: str) -> list[Pod]:
        """Pods bound to the node, sorted by namespace and name."""
        ...

    def evict(self, pod: PodRef, grace_seconds: int | None = None) -> EvictionResult:
        """Ask the API to evict a pod; PodDisruptionBudgets may block it."""
        ...

    def delete_pod(self, pod: PodRef, grace_seconds: int | None = None) -> bool:
        """Delete a pod outright; ``False`` if it was already gone."""
        ...

    def record_event(self, node: str, reason: str, message: str, type_: str = "Normal") -> bool:
        """Record a Kubernetes Event about the node (shown by ``kubectl describe node``), best-effort.

        The Event goes to :data:`NODE_EVENT_NAMESPACE`. It never raises: a refusal or an unreachable
        API is reported on stderr in one line and the result is ``False``; ``True`` once recorded.
        """
        ...

    def get_state(self, name: str) -> dict[str, str]:
        """The data of dsx's state ConfigMap ``name`` (empty if it does not exist)."""
        ...

    def update_state(self, name: str, change: StateChange) -> dict[str, str]:
        """Read-modify-write the state ConfigMap with optimistic concurrency; returns the new data."""
        ...

    def acquire_lock(self, node: str, holder: str, ttl_seconds: int) -> bool:
        """Take the node's Lease for ``holder``; ``False`` if someone else holds it and it has not expired."""
        ...

    def renew_lock(self, node: str, holder: str, ttl_seconds: int) -> bool:
        """Extend the Lease; ``False`` if ``holder`` no longer holds it."""
        ...

    def release_lock(self, node: str, holder: str) -> bool:
        """Give the Lease up; ``False`` if ``holder`` did not hold it."""
        ...

    def get_object(
        self, api_version: str, kind: str, name: str, namespace: str | None = None
    ) -> dict[str, Any] | None:
        """Any object as JSON, or ``None`` if it does not exist."""
        ...

    def create_object(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        """Create an object from its manifest (not retried on server errors); returns it as stored."""
        ...

    def patch_object(
        self, api_version: str, kind: str, name: str, patch: Mapping[str, Any], namespace: str | None = None
    ) -> dict[str, Any]:
        """Merge-patch an object (RFC 7386); returns it as stored."""
        ...

    def delete_object(
        self,
        api_version: str,
        kind: str,
        name: str,
        namespace: str | None = None,
        propagation: Propagation | None = "Background",
    ) -> bool:
        """Delete an object; ``False`` if it was already gone.

        ``propagation`` is sent as ``propagationPolicy``: ``Background`` (the default here) lets the
        garbage collector delete what the object owns, ``Foreground`` deletes that first, ``Orphan``
        leaves it; ``None`` takes the server's default for the kind (batch/v1 Jobs orphan their pods).
        """
        ...

    def list_objects(
        self, api_version: str, kind: str, namespace: str | None = None, label_selector: str | None = None
    ) -> list[dict[str, Any]]:
        """Objects of a kind (all namespaces when ``namespace`` is ``None``), sorted by namespace and name."""
        ...
