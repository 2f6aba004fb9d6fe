"""The cluster port: what dsx needs from Kubernetes, named in the operator's words.

Two adapters implement :class:`ClusterPort`: :class:`steps.cluster.kube.KubeCluster` (the kubernetes
client, against a real API server) and :class:`steps.cluster.sim.SimCluster` (a simulated GPU fleet).
Steps receive a port from :func:`steps.cluster.connect` and never know which one they hold.

The data the port speaks is plain pydantic: nodes in :mod:`steps.cluster.node`, pods and evictions in
:mod:`steps.cluster.pod`; both are re-exported here, the names the port's signatures use.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal, Protocol, runtime_checkable

from steps.cluster import vocabulary as vocab
from steps.cluster.node import (
    GPU_RESOURCE,
    Condition,
    Cordon,
    CordonResult,
    Node,
    NodeInfo,
    Taint,
    TaintEffect,
)
from steps.cluster.pod import EvictionOutcome, EvictionResult, Pod, PodRef, pod_ref

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

Propagation = Literal["Background", "Foreground", "Orphan"]
"""How a deletion treats the objects the deleted one owns (``DeleteOptions.propagationPolicy``)."""

NODE_EVENT_NAMESPACE = "default"
"""Where Events about Nodes go. The API server accepts a core/v1 Event about a cluster-scoped object
without ``eventTime`` only in namespace ``default`` (or none) and answers 422 elsewhere (kubernetes
``legacyValidateEvent`` in pkg/apis/core/validation/events.go)."""

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

    @property
    def runs_pods(self) -> bool:
        """Whether a check runs as pods on this cluster (Jobs its kubelets start): true of a real API
        server; false of a simulated fleet, whose checks run as local ranks playing its nodes."""
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

    def update_state(
        self, name: str, change: StateChange, labels: Mapping[str, str] | None = None
    ) -> dict[str, str]:
        """Read-modify-write the state ConfigMap with optimistic concurrency; returns the new data.

        ``labels`` are put on the ConfigMap (merged into those it has), so that a label selector
        (:meth:`list_objects`) finds it among others of its kind: one per node and month of the
        remediation ledger, say.
        """
        ...

    def acquire_lock(self, node: str, holder: str, ttl_seconds: int) -> bool:
        """Take the node's Lease for ``holder``; ``False`` if someone else holds it and it has not expired."""
        ...

    def renew_lock(self, node: str, holder: str, ttl_seconds: int) -> bool:
        """Extend the Lease; ``False`` if ``holder`` no longer holds it."""
        ...

    def acquire_mutex(self, key: str, holder: str, ttl_seconds: int) -> bool:
        """Take the mutex ``key`` (a Lease, so it holds between processes and machines) for ``holder``;
        ``False`` if someone else holds it and it has not expired."""
        ...

    def renew_mutex(self, key: str, holder: str, ttl_seconds: int) -> bool:
        """Extend the mutex; ``False`` if ``holder`` no longer holds it."""
        ...

    def release_mutex(self, key: str, holder: str) -> bool:
        """Give the mutex up; ``False`` if ``holder`` did not hold it."""
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
