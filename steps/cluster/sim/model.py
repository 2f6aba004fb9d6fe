"""State of a simulated fleet: nodes, their health, pods, budgets, other objects, API faults, the call log.

The health model is the physical truth the faults leave on a node: the bandwidth of its links, what each
GPU reports (:class:`steps.cluster.health.GpuReport`: XIDs, ECC errors, health, NVLink), and free
``readings`` for any further figure a later part needs to model. Other parts read it through the health
seam (:meth:`SimCluster.node_report <steps.cluster.sim.SimCluster.node_report>`), never from here.
"""

from __future__ import annotations

import math
import uuid
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from steps.cluster.fabric import FabricSettings
from steps.cluster.health import GpuReport, NicReport
from steps.cluster.port import Node, Pod

__all__ = ["ApiFaults", "CallRecord", "Fleet", "NodeHealth", "Pdb", "object_key", "owner_key"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class NodeHealth(_Model):
    """The physical truth about a simulated node, which the Kubernetes objects may not show.

    Attributes:
        ready: whether the kubelet is up (``False`` also turns the node's Ready condition False).
        link_gbps: bandwidth of the node's scale-out links, all NICs together, in Gbit/s.
        nominal_link_gbps: what the links should give.
        link_failure_rate: the probability that a multi-node collective fails on the node's links.
        link_hangs: whether a multi-node collective never completes on the node's links.
        gpus: what each GPU reports, by index (the health seam's model: faults replace an entry).
        faults: the faults injected so far, as written (``slow-nic``, ``xid=79@3``...).
        readings: further named figures (``reading:NAME=VALUE`` faults set them).
        nics: the node's network ports as sysfs shows them (the ``nic-down`` fault takes one down).
        uncabled: the ports among them that nobody cabled (the ``nic-unused`` fault): down, and a repair
            leaves them down.
    """

    ready: bool = True
    link_gbps: float
    nominal_link_gbps: float
    link_failure_rate: float = 0.0
    link_hangs: bool = False
    gpus: list[GpuReport] = Field(default_factory=list)
    faults: list[str] = Field(default_factory=list)
    readings: dict[str, float] = Field(default_factory=dict)
    nics: list[NicReport] = Field(default_factory=list)
    uncabled: list[str] = Field(default_factory=list)

    @property
    def healthy(self) -> bool:
        """No fault of any kind."""
        return not self.faults


class Pdb(_Model):
    """A PodDisruptionBudget (``matchLabels`` selectors only; ``None``: no selector at all)."""

    name: str
    namespace: str
    match_labels: dict[str, str] | None
    min_available: int | str | None = None
    max_unavailable: int | str | None = None

    def selects(self, pod: Pod) -> bool:
        """Whether the budget's selector matches the pod, for the disruption controller's count and the
        eviction API's check alike (policy/v1): an empty selector matches every pod of the namespace, a
        budget without one matches none."""
        if self.match_labels is None or pod.namespace != self.namespace:
            return False
        return all(pod.labels.get(k) == v for k, v in self.match_labels.items())

    @property
    def by_scale(self) -> bool:
        """Whether the expected count is the controllers' scale (``maxUnavailable``, or a percentage
        ``minAvailable``) rather than the number of matching pods (an integer ``minAvailable``)."""
        if self.max_unavailable is not None:
            return True
        return isinstance(self.min_available, str)

    def desired_healthy(self, expected: int) -> int:
        """Healthy pods the budget insists on, out of ``expected`` (percentages round up, as the API does)."""

        def scaled(value: int | str) -> int:
            if isinstance(value, str) and value.endswith("%"):
                return math.ceil(expected * int(value[:-1]) / 100)
            return int(value)

        if self.max_unavailable is not None:
            return max(0, expected - scaled(self.max_unavailable))
        if self.min_available is not None:
            return scaled(self.min_available)
        return 0

    @classmethod
    def from_manifest(cls, data: dict[str, Any]) -> Pdb:
        """Read a policy/v1 PodDisruptionBudget."""
        meta, spec = data.get("metadata") or {}, data.get("spec") or {}
        selector = spec.get("selector")
        return cls(
            name=meta["name"],
            namespace=meta.get("namespace") or "default",
            match_labels=None if selector is None else dict(selector.get("matchLabels") or {}),
            min_available=spec.get("minAvailable"),
            max_unavailable=spec.get("maxUnavailable"),
        )

    def to_manifest(self) -> dict[str, Any]:
        """The budget as the API writes it."""
        spec: dict[str, Any] = {}
        if self.match_labels is not None:
            spec["selector"] = {"matchLabels": dict(self.match_labels)}
        if self.min_available is not None:
            spec["minAvailable"] = self.min_available
        if self.max_unavailable is not None:
            spec["maxUnavailable"] = self.max_unavailable
        return {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": spec,
        }


class ApiFaults(_Model):
    """Misbehaviour of the simulated API server.

    Attributes:
        errors: the next N requests fail with HTTP 500.
        node_errors: per node, the next N requests about that node fail with HTTP 500.
        conflicts: the next N writes that carry a ``resourceVersion`` find the object changed (409).
        latency_ms: every request takes this long.
        forbidden: ``"VERB RESOURCE"`` pairs RBAC refuses (403), e.g. ``"patch nodes"``,
            ``"create pods/eviction"``; ``*`` as the verb refuses every verb.
    """

    errors: int = 0
    node_errors: dict[str, int] = Field(default_factory=dict)
    conflicts: int = 0
    latency_ms: int = 0
    forbidden: list[str] = Field(default_factory=list)


class CallRecord(_Model):
    """One port call on the simulated fleet, or one request the simulated API failed."""

    seq: int
    method: str
    args: dict[str, Any] = Field(default_factory=dict)
    result: Any = None
    error: str | None = None


def object_key(api_version: str, kind: str, namespace: str | None, name: str) -> str:
    """Key of a stored object in :attr:`Fleet.objects`."""
    return f"{api_version}|{kind}|{namespace or ''}|{name}"


def owner_key(pod: Pod) -> str:
    """Key of a pod's controller in :attr:`Fleet.owner_next`."""
    return f"{pod.owner_kind}/{pod.namespace}/{pod.owner_name}"


class Fleet(_Model):
    """The whole simulated cluster. Persisted as JSON for ``state:PATH`` fleets.

    Attributes:
        spec: the spec the fleet was built from, for reports.
        revision: the last ``resourceVersion`` handed out.
        nodes: by name.
        health: by node name.
        pods: by ``namespace/name``.
        pdbs: by ``namespace/name``.
        objects: every other object (ConfigMaps, Leases, Events, Secrets...) by :func:`object_key`.
        owner_next: per controller, the index its next pod gets (``-N`` suffix).
        scales: per controller (:func:`owner_key`), its desired replicas (a ReplicaSet's
            ``spec.replicas``): what a budget's expected count is made of.
        uids: the uids handed out so far (see :meth:`new_uid`).
        api: injected API misbehaviour.
        fabric: how the scale-out fabric behaves in modelled group tests (noise, seed).
        repair: how the repair system answers a repair request (``ok``, ``fail``, ``never``; see
            :mod:`steps.cluster.sim.repair`).
        repair_delay_s: seconds from the request to the reboot.
        repairs_due: per node, when (Unix time) its requested repair reboots it.
        reboot_ready_s: seconds from a reboot's new boot id to Ready.
        reboot_clear_s: seconds from Ready to the sentinel's conditions cleared.
        ready_due: per rebooted node, when it turns Ready.
        clear_due: per rebooted node, when its sentinel conditions clear.
        log: the call log, oldest first; at most ``log_limit`` entries are kept.
        dropped_calls: entries dropped from the front of the log.
    """

    spec: str = ""
    revision: int = 0
    nodes: dict[str, Node] = Field(default_factory=dict)
    health: dict[str, NodeHealth] = Field(default_factory=dict)
    pods: dict[str, Pod] = Field(default_factory=dict)
    pdbs: dict[str, Pdb] = Field(default_factory=dict)
    objects: dict[str, dict[str, Any]] = Field(default_factory=dict)
    owner_next: dict[str, int] = Field(default_factory=dict)
    scales: dict[str, int] = Field(default_factory=dict)
    uids: int = 0
    api: ApiFaults = Field(default_factory=ApiFaults)
    fabric: FabricSettings = Field(default_factory=FabricSettings)
    repair: str = "ok"
    repair_delay_s: float = 2.0
    repairs_due: dict[str, float] = Field(default_factory=dict)
    reboot_ready_s: float = 0.0
    reboot_clear_s: float = 0.0
    ready_due: dict[str, float] = Field(default_factory=dict)
    clear_due: dict[str, float] = Field(default_factory=dict)
    log: list[CallRecord] = Field(default_factory=list)
    dropped_calls: int = 0
    log_limit: int = 20000

    def next_revision(self) -> str:
        """A fresh ``resourceVersion``."""
        self.revision += 1
        return str(self.revision)

    def new_uid(self) -> str:
        """A fresh uid for a new pod, as the API server gives one on create (derived from a counter, so
        the same spec builds the same fleet)."""
        self.uids += 1
        return str(uuid.uuid5(uuid.NAMESPACE_URL, f"https://dsx.dev/sim/uid/{self.uids}"))

    def append_log(self, record: CallRecord) -> None:
        """Add a call to the log, dropping the oldest beyond ``log_limit``."""
        self.log.append(record)
        if len(self.log) > self.log_limit:
            drop = len(self.log) - self.log_limit
            del self.log[:drop]
            self.dropped_calls += drop

    def manifests(self) -> list[dict[str, Any]]:
        """Every object of the fleet as the API would show it: nodes, pods, budgets, the rest."""
        return (
            [n.to_manifest() for _, n in sorted(self.nodes.items())]
            + [p.to_manifest() for _, p in sorted(self.pods.items())]
            + [b.to_manifest() for _, b in sorted(self.pdbs.items())]
            + [dict(o) for _, o in sorted(self.objects.items())]
        )

    def next_seq(self) -> int:
        """Sequence number for the next log entry."""
        return self.dropped_calls + len(self.log) + 1
