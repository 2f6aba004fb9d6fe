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

from pydantic import Field

from steps.cluster import vocabulary as vocab
from steps.models import Strict

__all__ = [
    "GPU_RESOURCE",
    "NODE_EVENT_NAMESPACE",
    "ClusterPort",
    "Condition",
    "Cordon",
    "CordonResult",
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


class Pod(Strict):
    """A pod as dsx sees it: where it runs and what owns it.

    ``uid`` tells this pod from a later one of the same name (a StatefulSet's, or one created again):
    evictions and deletions name it as a precondition, so a retry never reaches the newcomer.
    """

    name: str
    namespace: str
    uid: str = ""
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
            uid=str(meta.get("uid") or ""),
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
        if self.uid:
            metadata["uid"] = self.uid
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


class EvictionResult(Strict):
    """What became of an eviction: ``evicted``, ``blocked`` (a PodDisruptionBudget, HTTP 429) or ``gone``."""

    pod: str
    outcome: EvictionOutcome
    message: str = ""


StateChange = Callable[[dict[str, str]], dict[str, str]]
"""Turns the current state (a copy) into the new state; may be called again after a conflict."""


@runtime_checkable
class ClusterPort(Protocol):
    """Everything dsx asks of a Kubernetes cluster.

    Node calls take the node name and return the node as it is after the call (``cordon`` and
    ``uncordon`` return it in a :class:`CordonResult` that also says whose cordon it was). Calls that
    change a node read it first and write with its ``resourceVersion``, retrying on a conflict; calls
    that cannot be repeated safely are never retried blindly. Failures raise
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

    def cordon(self, node: str, reason: str, by: str = "dsx", force: bool = False) -> CordonResult:
        """Mark the node unschedulable for the owner ``by``, recording who, why, when, and whether the
        node was cordoned outside dsx before.

        A node cordoned by another dsx owner is refused (:class:`~steps.cluster.errors.CordonRefusedError`
        naming that owner), never written over; ``force=True`` takes the cordon over and the result says
        whose it was. The same owner again only updates the reason. All in one read-modify-write with
        ``resourceVersion``, so a concurrent cordon or uncordon (dsx's or kubectl's) is never lost.
        """
        ...

    def uncordon(self, node: str, by: str = "dsx", force: bool = False) -> CordonResult:
        """Release the owner ``by``'s cordon: make the node schedulable and clear dsx's cordon annotations.

        A cordon of another owner, one made outside dsx (kubectl, another tool), or one that was there
        before dsx is refused (:class:`~steps.cluster.errors.CordonRefusedError` naming whose it is);
        ``force=True`` releases it anyway and the result says whose cordon it released. A node that is
        not cordoned is left as it is (a stale dsx record is cleared).
        """
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

    def set_node_metadata(
        self,
        node: str,
        labels: Mapping[str, str | None] | None = None,
        annotations: Mapping[str, str | None] | None = None,
    ) -> Node:
        """Merge labels and annotations into the node in ONE patch; a value of ``None`` removes the key.

        The patch carries the node's ``resourceVersion`` (re-read and retried on a conflict), so a reader
        never sees a label without the annotations written with it (a verdict and its evidence).
        """
        ...

    def set_labels(self, node: str, labels: Mapping[str, str | None]) -> Node:
        """Merge labels into the node; a value of ``None`` removes the label (:meth:`set_node_metadata`)."""
        ...

    def set_annotations(self, node: str, annotations: Mapping[str, str | None]) -> Node:
        """Merge annotations into the node; ``None`` removes the annotation (:meth:`set_node_metadata`)."""
        ...

    def set_condition(self, node: str, type_: str, status: bool, reason: str, message: str) -> Node:
        """Set a node condition through the status subresource (``status=True`` means a problem)."""
        ...

    def pods_on(self, node: str) -> list[Pod]:
        """Pods bound to the node, sorted by namespace and name."""
        ...

    def evict(self, pod: PodRef, grace_seconds: int | None = None) -> EvictionResult:
        """Ask the API to evict a pod; PodDisruptionBudgets may block it.

        The eviction names the pod's uid (the :class:`Pod`'s, or the one there when the call starts), so
        a retry never evicts a new pod of the same name: a pod replaced meanwhile reads as ``gone``.
        """
        ...

    def delete_pod(self, pod: PodRef, grace_seconds: int | None = None) -> bool:
        """Delete a pod outright; ``False`` if it was already gone (or replaced by a new pod of its name).

        Like :meth:`evict`, the deletion names the pod's uid as a precondition.
        """
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
