"""A pod as dsx sees it (where it runs, what owns it) and what became of an eviction.

Drains and the launchers read pods through the cluster port; the pod's ``uid`` tells it from a later one
of the same name, so evictions and deletions can name it as a precondition.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field

from steps.cluster.node import GPU_RESOURCE
from steps.models import Strict

__all__ = ["EvictionOutcome", "EvictionResult", "Pod", "PodRef", "pod_ref"]

EvictionOutcome = Literal["evicted", "blocked", "gone"]


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
    gpus: int = Field(0, ge=0, description="the GPUs it holds (its containers' nvidia.com/gpu requests)")
    deleted_at: str = Field("", description="when its deletion was asked (deletionTimestamp): terminating")

    @property
    def ref(self) -> str:
        """``namespace/name``."""
        return f"{self.namespace}/{self.name}"

    @property
    def terminating(self) -> bool:
        """Whether it is being deleted and not gone yet (on a node whose kubelet does not confirm it)."""
        return bool(self.deleted_at)

    @property
    def daemonset(self) -> bool:
        """Whether a DaemonSet owns the pod (drains leave those alone)."""
        return self.owner_kind == "DaemonSet"

    @property
    def holds_gpus(self) -> bool:
        """Whether it holds GPUs now: it asks for some and has not ended (the scheduler counts every bound
        pod that has not Succeeded or Failed)."""
        return self.gpus > 0 and self.phase not in ("Succeeded", "Failed")

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
            gpus=_gpus(data.get("spec") or {}),
            deleted_at=str(meta.get("deletionTimestamp") or ""),
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
        if self.deleted_at:
            metadata["deletionTimestamp"] = self.deleted_at
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
        container: dict[str, Any] = {"name": "main", "image": "registry.local/workload:1"}
        if self.gpus:
            container["resources"] = {"limits": {GPU_RESOURCE: str(self.gpus)}}
        spec: dict[str, Any] = {"containers": [container]}
        if self.node:
            spec["nodeName"] = self.node
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": metadata,
            "spec": spec,
            # A running pod of the fleet is ready (the disruption controller counts only ready pods).
            "status": {
                "phase": self.phase,
                "conditions": [{"type": "Ready", "status": "True" if self.phase == "Running" else "False"}],
            },
        }


def _gpus(spec: Mapping[str, Any]) -> int:
    """The GPUs a pod spec asks for, as the scheduler counts them: the containers' sum, or the largest
    init container's if more (requests default to limits; an extended resource's are equal)."""

    def each(container: Mapping[str, Any]) -> int:
        resources = container.get("resources") or {}
        wanted = (resources.get("requests") or {}).get(GPU_RESOURCE) or (resources.get("limits") or {}).get(
            GPU_RESOURCE
        )
        try:
            return max(0, int(str(wanted or 0)))
        except ValueError:
            return 0

    running = sum(each(c) for c in spec.get("containers") or [])
    starting = max((each(c) for c in spec.get("initContainers") or []), default=0)
    return max(running, starting)


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
