"""The port's behaviour written once, on top of a few raw calls each adapter provides.

An adapter subclasses :class:`PortBase` and implements the primitives (``_get``, ``_list``,
``_create``, ``_replace``, ``_patch``, ``_delete``, ``_evict``): one request each, raising
:class:`~steps.cluster.retry.TransientError` for what may go away and
:class:`~steps.cluster.errors.ApiStatusError` for the rest. Everything else (retries with backoff,
read-modify-write with ``resourceVersion``, the cordon and taint rules, state ConfigMaps, Lease locks,
error messages naming the call and the node) lives here, so the adapters cannot drift apart.
"""

from __future__ import annotations

import abc
import contextlib
import copy
import datetime as dt
import functools
import re
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, cast

from steps.cluster import changes
from steps.cluster import vocabulary as vocab
from steps.cluster.errors import (
    ApiStatusError,
    ApiUnavailableError,
    ClusterError,
    ConflictError,
    NotFoundError,
    classify,
)
from steps.cluster.patches import merge_patch
from steps.cluster.port import (
    NODE_EVENT_NAMESPACE,
    CordonResult,
    EvictionResult,
    Node,
    Pod,
    PodRef,
    Propagation,
    StateChange,
    TaintEffect,
    pod_ref,
)
from steps.cluster.resources import Resource, resource
from steps.cluster.retry import RetryPolicy, TransientError
from steps.cluster.selectors import parse_selector
from steps.errors import DsxError, InputError

__all__ = ["CONFIGMAPS", "EVENTS", "LEASES", "NODES", "PODS", "PortBase", "lease_name", "logged"]

NODES = resource("v1", "Node")
PODS = resource("v1", "Pod")
CONFIGMAPS = resource("v1", "ConfigMap")
EVENTS = resource("v1", "Event")
LEASES = resource("coordination.k8s.io/v1", "Lease")

_T = TypeVar("_T")
_F = TypeVar("_F", bound=Callable[..., Any])

_LABEL_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)$")
_LABEL_PREFIX = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def lease_name(node: str) -> str:
    """The name of the Lease that locks ``node``."""
    return f"dsx-node-{node}"


def logged(method: _F) -> _F:
    """Record each call of a port method (arguments, result or error) through ``_record``."""

    @functools.wraps(method)
    def wrapper(self: PortBase, *args: Any, **kwargs: Any) -> Any:
        try:
            result = method(self, *args, **kwargs)
        except Exception as exc:
            self._record(method.__name__, args, kwargs, None, exc)
            raise
        self._record(method.__name__, args, kwargs, result, None)
        return result

    return cast(_F, wrapper)


def _check_labels(call: str, node: str, labels: Mapping[str, str | None], values: bool) -> None:
    for key, value in labels.items():
        prefix, _, name = key.rpartition("/")
        if not _LABEL_NAME.match(name) or (prefix and (len(prefix) > 253 or not _LABEL_PREFIX.match(prefix))):
            raise InputError(f"{call} node/{node}: {key!r} is not a valid label or annotation key")
        if values and value is not None and (len(value) > 63 or not _LABEL_VALUE.match(value)):
            raise InputError(f"{call} node/{node}: label {key}={value!r} is not a valid label value")


def _cordon_summary(call: str, result: CordonResult, by: str) -> str:
    """One line naming whose cordon the node carried and what became of it."""
    name, previous = result.node.name, result.previous
    reason = result.node.annotations.get(vocab.ANNOTATION_CORDON_REASON, "")
    if call == "uncordon":
        if previous is None:
            stale = "; a stale dsx cordon record was cleared" if result.changed else ""
            return f"{name} was not cordoned{stale}"
        return f"{name} uncordoned: released {previous.describe()}" + (" (forced)" if result.forced else "")
    if previous is None:
        return f"{name} cordoned by {by}: {reason}"
    if result.forced:
        return f"{name} cordoned by {by}: {reason}; took over {previous.describe()}"
    if previous.owner == by:
        return f"{name} was already cordoned by {by}" + (f"; new reason: {reason}" if result.changed else "")
    outside = previous.model_copy(update={"recorded_by": "", "reason": ""}).describe()
    return (
        f"{name} was already cordoned: {outside}; {by}'s reason is recorded with it ({reason}), "
        "and dsx will not uncordon it"
    )


def _utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class PortBase(abc.ABC):
    """Shared implementation of :class:`~steps.cluster.port.ClusterPort`.

    Args:
        namespace: where dsx keeps its ConfigMaps and Leases (Events about nodes go to ``default``).
        retry: backoff for transient failures and for conflicts.
        clock: the current time (tests pass a fixed clock to age Leases).
        field_manager: the name every write gives the API server as its field manager (``dsx``); a port
            built with another name acts as another client (tests play kubectl with one).
    """

    def __init__(
        self,
        namespace: str = "dsx",
        retry: RetryPolicy | None = None,
        clock: Callable[[], dt.datetime] | None = None,
        field_manager: str = vocab.FIELD_MANAGER,
    ) -> None:
        self.namespace = namespace
        self.field_manager = field_manager
        self._retry = retry or RetryPolicy()
        self._clock = clock or _utc_now

    # ----------------------------------------------------------------- primitives (one request each)

    @property
    @abc.abstractmethod
    def endpoint(self) -> str:
        """Where the port points, for reports."""

    @abc.abstractmethod
    def _get(self, res: Resource, name: str, namespace: str | None) -> dict[str, Any] | None:
        """One object, ``None`` on 404."""

    @abc.abstractmethod
    def _list(
        self, res: Resource, namespace: str | None, label_selector: str | None, field_selector: str | None
    ) -> list[dict[str, Any]]:
        """Objects of a resource."""

    @abc.abstractmethod
    def _create(self, res: Resource, namespace: str | None, manifest: Mapping[str, Any]) -> dict[str, Any]:
        """Create an object (409 if it exists)."""

    @abc.abstractmethod
    def _replace(
        self, res: Resource, name: str, namespace: str | None, manifest: Mapping[str, Any]
    ) -> dict[str, Any]:
        """Replace an object; its ``metadata.resourceVersion`` must be current (409 otherwise)."""

    @abc.abstractmethod
    def _patch(
        self,
        res: Resource,
        name: str,
        namespace: str | None,
        patch: Mapping[str, Any],
        strategic: bool = False,
        subresource: str | None = None,
    ) -> dict[str, Any]:
        """Merge-patch (or strategic-merge-patch) an object; a ``resourceVersion`` in it is a precondition."""

    @abc.abstractmethod
    def _delete(
        self,
        res: Resource,
        name: str,
        namespace: str | None,
        grace_seconds: int | None,
        propagation: Propagation | None = None,
    ) -> bool:
        """Delete an object (``propagationPolicy`` when given), ``False`` on 404."""

    @abc.abstractmethod
    def _evict(
        self, namespace: str, name: str, grace_seconds: int | None, uid: str | None
    ) -> tuple[int, str]:
        """Post an Eviction: ``(status, message)`` for 201, 404, or a disruption-budget refusal; 409 when
        ``uid`` is given and the pod of that name has another one."""

    @abc.abstractmethod
    def _delete_pod(self, namespace: str, name: str, grace_seconds: int | None, uid: str | None) -> bool:
        """Delete a pod, ``False`` on 404; 409 when ``uid`` is given and the pod of that name has another."""

    def _record(  # noqa: B027 - an optional hook, not an abstract method
        self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any, error: Exception | None
    ) -> None:
        """Hook called after every port call (the simulated fleet keeps a log)."""

    # ----------------------------------------------------------------- machinery

    def _run(self, call: str, target: str, idempotent: bool, fn: Callable[[], _T]) -> _T:
        """Run one primitive, retrying transient failures where that is safe, naming call and target."""
        retry = 0
        while True:
            try:
                return fn()
            except TransientError as exc:
                may_retry = idempotent or not exc.sent
                if may_retry and retry + 1 < self._retry.attempts:
                    self._retry.wait(retry, exc.retry_after)
                    retry += 1
                    continue
                tries = retry + 1
                why = (
                    f"gave up after {tries} tries" if may_retry else "not retried: the call is not idempotent"
                )
                raise ApiUnavailableError(call, target, f"{exc.detail} ({why})", exc.status) from None
            except ApiStatusError as exc:
                raise classify(call, target, exc.status, exc.detail) from None

    def _read_node(self, call: str, name: str) -> Node:
        if not name:
            raise InputError(f"{call}: no node name given")
        data = self._run(call, f"node/{name}", True, lambda: self._get(NODES, name, None))
        if data is None:
            raise NotFoundError(call, f"node/{name}", f'not found (404): nodes "{name}" not found', 404)
        return Node.from_manifest(data)

    def _change_node(
        self, call: str, name: str, compute: Callable[[Node], dict[str, Any] | None], status: bool = False
    ) -> Node:
        """Read-modify-write a node with its ``resourceVersion``; re-read and retry on a conflict."""
        target = f"node/{name}"
        for attempt in range(self._retry.conflict_attempts):
            node = self._read_node(call, name)
            change = compute(node)
            if change is None:
                return node
            body = copy.deepcopy(change)  # keeps the nulls that remove fields
            body.setdefault("metadata", {})["resourceVersion"] = node.resource_version
            try:
                send = functools.partial(
                    self._patch,
                    NODES,
                    name,
                    None,
                    body,
                    strategic=status,
                    subresource="status" if status else None,
                )
                data = self._run(call, target, True, send)
            except ConflictError:
                self._retry.wait_conflict(attempt)
                continue
            return Node.from_manifest(data)
        raise ConflictError(call, target, "conflict (409): the node kept changing under dsx; try again", 409)

    # ----------------------------------------------------------------- nodes

    @logged
    def list_nodes(self, selector: str | None = None) -> list[Node]:
        """Nodes matching a label selector, sorted by name."""
        parse_selector(selector)
        target = f"nodes -l {selector}" if selector else "nodes"
        items = self._run("list_nodes", target, True, lambda: self._list(NODES, None, selector, None))
        return sorted((Node.from_manifest(i) for i in items), key=lambda n: n.name)

    @logged
    def get_node(self, name: str) -> Node:
        """One node."""
        return self._read_node("get_node", name)

    def _change_cordon(
        self, call: str, node: str, by: str, force: bool, plan: Callable[[Node], dict[str, Any] | None]
    ) -> CordonResult:
        """Run a cordon or uncordon plan in one read-modify-write; say what it found and did."""
        if not by or by != by.strip() or not by.isprintable() or len(by) > 253:
            raise InputError(f"{call} node/{node}: the owner (by) must be a name on one line, not {by!r}")
        seen: list[Node] = []

        def compute(n: Node) -> dict[str, Any] | None:
            seen.append(n)
            return plan(n)

        after = self._change_node(call, node, compute)
        before = seen[-1]  # the read the write was based on
        previous = before.cordon
        if previous is None:
            forced = False
        elif call == "uncordon":
            forced = force and previous.owner != by
        else:
            forced = force and previous.holder not in ("", by)
        result = CordonResult(node=after, previous=previous, changed=after is not before, forced=forced)
        return result.model_copy(update={"summary": _cordon_summary(call, result, by)})

    @logged
    def cordon(self, node: str, reason: str, by: str = "dsx", force: bool = False) -> CordonResult:
        """Cordon the node for ``by``; another owner's cordon is refused unless ``force`` takes it over."""
        now = self._clock()
        return self._change_cordon(
            "cordon", node, by, force, lambda n: changes.cordon_patch(n, reason, by, force, now)
        )

    @logged
    def uncordon(self, node: str, by: str = "dsx", force: bool = False) -> CordonResult:
        """Release ``by``'s cordon; anyone else's (or one made outside dsx) is refused unless ``force``."""
        return self._change_cordon(
            "uncordon", node, by, force, lambda n: changes.uncordon_patch(n, by, force)
        )

    @logged
    def add_taint(
        self, node: str, key: str = vocab.TAINT_UNHEALTHY, value: str = "", effect: TaintEffect = "NoSchedule"
    ) -> Node:
        """Add a taint (replacing one with the same key and effect)."""
        _check_labels("add_taint", node, {key: value}, values=True)

        def compute(n: Node) -> dict[str, Any] | None:
            taints = changes.taints_with(n, key, value, effect)
            return None if taints is None else {"spec": {"taints": [t.to_manifest() for t in taints]}}

        return self._change_node("add_taint", node, compute)

    @logged
    def remove_taint(
        self, node: str, key: str = vocab.TAINT_UNHEALTHY, effect: TaintEffect | None = None
    ) -> Node:
        """Remove the taints with this key (and effect)."""

        def compute(n: Node) -> dict[str, Any] | None:
            taints = changes.taints_without(n, key, effect)
            if taints is None:
                return None
            return {"spec": {"taints": [t.to_manifest() for t in taints] or None}}

        return self._change_node("remove_taint", node, compute)

    def _set_metadata(
        self,
        call: str,
        node: str,
        labels: Mapping[str, str | None] | None,
        annotations: Mapping[str, str | None] | None,
    ) -> Node:
        """Labels and annotations in one patch carrying the node's ``resourceVersion``; nothing is written
        when the node already says all of it."""
        wanted_labels, wanted_annotations = dict(labels or {}), dict(annotations or {})
        _check_labels(call, node, wanted_labels, values=True)
        _check_labels(call, node, wanted_annotations, values=False)

        def compute(n: Node) -> dict[str, Any] | None:
            metadata: dict[str, Any] = {}
            if changed := changes.annotations_patch(n.labels, wanted_labels):
                metadata["labels"] = changed
            if changed := changes.annotations_patch(n.annotations, wanted_annotations):
                metadata["annotations"] = changed
            return {"metadata": metadata} if metadata else None

        return self._change_node(call, node, compute)

    @logged
    def set_node_metadata(
        self,
        node: str,
        labels: Mapping[str, str | None] | None = None,
        annotations: Mapping[str, str | None] | None = None,
    ) -> Node:
        """Merge labels and annotations into the node in one patch (``None`` removes a key).

        One write, with the node's ``resourceVersion`` (re-read and retried on a conflict): a reader
        sees the labels and the annotations change together, never one without the other.
        """
        return self._set_metadata("set_node_metadata", node, labels, annotations)

    @logged
    def set_labels(self, node: str, labels: Mapping[str, str | None]) -> Node:
        """Merge labels into the node (``None`` removes one); :meth:`set_node_metadata` with labels only."""
        return self._set_metadata("set_labels", node, labels, None)

    @logged
    def set_annotations(self, node: str, annotations: Mapping[str, str | None]) -> Node:
        """Merge annotations into the node (``None`` removes one); :meth:`set_node_metadata` with
        annotations only."""
        return self._set_metadata("set_annotations", node, None, annotations)

    @logged
    def set_condition(self, node: str, type_: str, status: bool, reason: str, message: str) -> Node:
        """Set a node condition through the status subresource."""
        if not re.match(r"^[A-Za-z][A-Za-z0-9]*$", type_) or (
            reason and not re.match(r"^[A-Za-z0-9]+$", reason)
        ):
            raise InputError(f"set_condition node/{node}: condition type and reason must be CamelCase words")

        def compute(n: Node) -> dict[str, Any] | None:
            condition = changes.condition_after(n, type_, status, reason, message, self._clock())
            return None if condition is None else {"status": {"conditions": [condition.to_manifest()]}}

        return self._change_node("set_condition", node, compute, status=True)

    # ----------------------------------------------------------------- pods

    @logged
    def pods_on(self, node: str) -> list[Pod]:
        """Pods bound to the node, sorted by namespace and name."""
        self._read_node("pods_on", node)
        items = self._run(
            "pods_on", f"node/{node}", True, lambda: self._list(PODS, None, None, f"spec.nodeName={node}")
        )
        return sorted((Pod.from_manifest(i) for i in items), key=lambda p: (p.namespace, p.name))

    def _pod_uid(self, call: str, pod: PodRef) -> str | None:
        """The uid the call pins: the :class:`Pod`'s own, else that of the pod there now (``None``: no pod;
        ``""``: a pod the server gave no uid)."""
        if isinstance(pod, Pod) and pod.uid:
            return pod.uid
        namespace, name = pod_ref(pod)
        data = self._run(call, f"pod/{namespace}/{name}", True, lambda: self._get(PODS, name, namespace))
        return None if data is None else str((data.get("metadata") or {}).get("uid") or "")

    def _replaced(self, call: str, pod: PodRef, uid: str) -> str | None:
        """Why the pod with ``uid`` is gone (deleted, or a new pod holds its name); ``None`` if it is not."""
        namespace, name = pod_ref(pod)
        data = self._run(call, f"pod/{namespace}/{name}", True, lambda: self._get(PODS, name, namespace))
        if data is None:
            return f'pods "{name}" not found'
        now = str((data.get("metadata") or {}).get("uid") or "")
        return None if now == uid else f'pod "{name}" {uid} is gone; a new pod of that name has uid {now}'

    @logged
    def evict(self, pod: PodRef, grace_seconds: int | None = None) -> EvictionResult:
        """Ask the API to evict a pod: evicted, blocked by a PodDisruptionBudget, or already gone.

        The Eviction names the pod's uid in its ``deleteOptions.preconditions``: a retry after a lost
        answer never evicts a new pod of the same name, and a pod replaced meanwhile reads as gone.
        """
        namespace, name = pod_ref(pod)
        ref = f"{namespace}/{name}"
        uid = self._pod_uid("evict", pod)
        if uid is None:
            return EvictionResult(pod=ref, outcome="gone", message=f'pods "{name}" not found')
        try:
            status, message = self._run(
                "evict", f"pod/{ref}", True, lambda: self._evict(namespace, name, grace_seconds, uid or None)
            )
        except ConflictError:
            why = self._replaced("evict", pod, uid) if uid else None
            if why is None:
                raise
            return EvictionResult(pod=ref, outcome="gone", message=why)
        if status == 404:
            return EvictionResult(pod=ref, outcome="gone", message=message)
        if status in (429, 500):
            return EvictionResult(pod=ref, outcome="blocked", message=message)
        return EvictionResult(pod=ref, outcome="evicted", message=message)

    @logged
    def delete_pod(self, pod: PodRef, grace_seconds: int | None = None) -> bool:
        """Delete a pod; ``False`` if it was already gone or replaced by a new pod of the same name.

        The deletion names the pod's uid as a precondition, as :meth:`evict` does.
        """
        namespace, name = pod_ref(pod)
        uid = self._pod_uid("delete_pod", pod)
        if uid is None:
            return False
        try:
            return self._run(
                "delete_pod",
                f"pod/{namespace}/{name}",
                True,
                lambda: self._delete_pod(namespace, name, grace_seconds, uid or None),
            )
        except ConflictError:
            if not uid or self._replaced("delete_pod", pod, uid) is None:
                raise
            return False

    @logged
    def record_event(self, node: str, reason: str, message: str, type_: str = "Normal") -> bool:
        """Record an Event about the node in :data:`NODE_EVENT_NAMESPACE`, best-effort.

        Events about a Node (cluster-scoped) go to ``default``: the API server refuses a core/v1
        Event without ``eventTime`` about a cluster-scoped object in any other namespace (422). An
        event is never the reason a step fails: any error is one line on stderr and ``False``.
        """
        target = f"node/{node}"
        try:
            if type_ not in ("Normal", "Warning"):
                raise InputError(f"event type must be Normal or Warning, not {type_!r}")
            stamp = changes.format_time(self._clock())
            # The name is made here, so a retry after a lost answer finds the first copy (409) instead
            # of recording the event twice.
            name = f"{node}.{time.time_ns():x}"
            manifest = {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": name, "namespace": NODE_EVENT_NAMESPACE},
                "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node},
                "reason": reason,
                "message": " ".join(message.split()),
                "type": type_,
                "source": {"component": "dsx"},
                "reportingComponent": "dsx",
                "reportingInstance": "dsx",
                "firstTimestamp": stamp,
                "lastTimestamp": stamp,
                "count": 1,
            }
            with contextlib.suppress(ConflictError):  # an earlier try went through; its answer was lost
                self._run(
                    "record_event",
                    target,
                    True,
                    lambda: self._create(EVENTS, NODE_EVENT_NAMESPACE, manifest),
                )
        except DsxError as exc:
            where = "" if isinstance(exc, ClusterError) else f"record_event {target}: "
            print(f"warning: {where}{exc} (event {reason} not recorded)", file=sys.stderr)
            return False
        return True

    # ----------------------------------------------------------------- state and locks

    @logged
    def get_state(self, name: str) -> dict[str, str]:
        """The data of the state ConfigMap (empty if it does not exist)."""
        target = f"configmap/{self.namespace}/{name}"
        data = self._run("get_state", target, True, lambda: self._get(CONFIGMAPS, name, self.namespace))
        return dict((data or {}).get("data") or {})

    @logged
    def update_state(self, name: str, change: StateChange) -> dict[str, str]:
        """Read-modify-write the state ConfigMap; on a conflict read again and re-apply ``change``."""
        call, target, ns = "update_state", f"configmap/{self.namespace}/{name}", self.namespace
        for attempt in range(self._retry.conflict_attempts):
            current = self._run(call, target, True, lambda: self._get(CONFIGMAPS, name, ns))
            old = dict((current or {}).get("data") or {})
            new = change(dict(old))
            if not all(isinstance(k, str) and isinstance(v, str) for k, v in new.items()):
                raise InputError(f"{call} {target}: state keys and values must be strings")
            if new == old and (current is not None or not new):
                return new
            try:
                if current is None:
                    body = {
                        "apiVersion": "v1",
                        "kind": "ConfigMap",
                        "metadata": {"name": name, "namespace": ns},
                    }
                    body["data"] = dict(sorted(new.items()))
                    self._run(call, target, True, functools.partial(self._create, CONFIGMAPS, ns, body))
                else:
                    body = merge_patch(current, {"data": None})
                    body["data"] = dict(sorted(new.items()))
                    self._run(
                        call, target, True, functools.partial(self._replace, CONFIGMAPS, name, ns, body)
                    )
            except ConflictError:
                self._retry.wait_conflict(attempt)
                continue
            return new
        raise ConflictError(call, target, "conflict (409): the state kept changing under dsx; try again", 409)

    def _lease_write(
        self, call: str, node: str, holder: str, decide: Callable[[dict[str, Any] | None], Any]
    ) -> bool:
        """Read the node's Lease, let ``decide`` give the new spec (or ``False``), write it back."""
        name, ns = lease_name(node), self.namespace
        target = f"lease/{ns}/{name}"
        if not holder:
            raise InputError(f"{call} node/{node}: no lock holder given")
        for attempt in range(self._retry.conflict_attempts):
            current = self._run(call, target, True, lambda: self._get(LEASES, name, ns))
            spec = decide(None if current is None else dict(current.get("spec") or {}))
            if spec is False:
                return False
            try:
                if current is None:
                    body = {
                        "apiVersion": "coordination.k8s.io/v1",
                        "kind": "Lease",
                        "metadata": {
                            "name": name,
                            "namespace": ns,
                            "labels": {vocab.LABEL_LOCKED_NODE: node},
                        },
                        "spec": spec,
                    }
                    self._run(call, target, True, functools.partial(self._create, LEASES, ns, body))
                else:
                    body = merge_patch(current, {"spec": None})
                    body["spec"] = spec
                    self._run(call, target, True, functools.partial(self._replace, LEASES, name, ns, body))
            except ConflictError:
                self._retry.wait_conflict(attempt)
                continue
            return True
        return False

    @logged
    def acquire_lock(self, node: str, holder: str, ttl_seconds: int) -> bool:
        """Take the node's Lease for ``holder`` unless someone else holds it and it has not expired."""
        now = self._clock()

        def decide(spec: dict[str, Any] | None) -> Any:
            if (
                spec
                and spec.get("holderIdentity") not in (None, "", holder)
                and not changes.lease_expired(spec, now)
            ):
                return False
            return changes.lease_spec(spec, holder, ttl_seconds, now)

        return self._lease_write("acquire_lock", node, holder, decide)

    @logged
    def renew_lock(self, node: str, holder: str, ttl_seconds: int) -> bool:
        """Extend the Lease if ``holder`` still holds it."""
        now = self._clock()

        def decide(spec: dict[str, Any] | None) -> Any:
            if not spec or spec.get("holderIdentity") != holder:
                return False
            return changes.lease_spec(spec, holder, ttl_seconds, now)

        return self._lease_write("renew_lock", node, holder, decide)

    @logged
    def release_lock(self, node: str, holder: str) -> bool:
        """Give the Lease up if ``holder`` holds it."""

        def decide(spec: dict[str, Any] | None) -> Any:
            if not spec or spec.get("holderIdentity") != holder:
                return False
            return {k: v for k, v in spec.items() if k not in ("holderIdentity", "renewTime", "acquireTime")}

        return self._lease_write("release_lock", node, holder, decide)

    # ----------------------------------------------------------------- any object

    @staticmethod
    def _target(res: Resource, name: str, namespace: str | None) -> str:
        ns = res.namespace_for(namespace)
        return f"{res.kind.lower()}/{ns}/{name}" if ns else f"{res.kind.lower()}/{name}"

    @logged
    def get_object(
        self, api_version: str, kind: str, name: str, namespace: str | None = None
    ) -> dict[str, Any] | None:
        """Any object, or ``None`` if it does not exist."""
        res = resource(api_version, kind)
        ns = res.namespace_for(namespace)
        return self._run("get_object", self._target(res, name, ns), True, lambda: self._get(res, name, ns))

    @logged
    def create_object(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        """Create an object; not retried after the server may have acted on it."""
        api_version, kind = manifest.get("apiVersion"), manifest.get("kind")
        name = (manifest.get("metadata") or {}).get("name")
        if not isinstance(api_version, str) or not isinstance(kind, str) or not isinstance(name, str):
            raise InputError("create_object: the manifest needs apiVersion, kind and metadata.name")
        res = resource(api_version, kind)
        ns = res.namespace_for((manifest.get("metadata") or {}).get("namespace"))
        body = merge_patch(manifest, {"metadata": {"namespace": ns}}) if ns else dict(manifest)
        return self._run(
            "create_object", self._target(res, name, ns), False, lambda: self._create(res, ns, body)
        )

    @logged
    def patch_object(
        self, api_version: str, kind: str, name: str, patch: Mapping[str, Any], namespace: str | None = None
    ) -> dict[str, Any]:
        """Merge-patch an object."""
        res = resource(api_version, kind)
        ns = res.namespace_for(namespace)
        return self._run(
            "patch_object", self._target(res, name, ns), True, lambda: self._patch(res, name, ns, patch)
        )

    @logged
    def delete_object(
        self,
        api_version: str,
        kind: str,
        name: str,
        namespace: str | None = None,
        propagation: Propagation | None = "Background",
    ) -> bool:
        """Delete an object with ``propagationPolicy`` (server default when ``None``); ``False`` if gone.

        batch/v1 Jobs orphan their pods unless the policy is given: the pods would run on and keep
        their GPUs.
        """
        if propagation not in (None, "Background", "Foreground", "Orphan"):
            raise InputError(
                f"delete_object: propagation must be Background, Foreground or Orphan, not {propagation!r}"
            )
        res = resource(api_version, kind)
        ns = res.namespace_for(namespace)
        return self._run(
            "delete_object",
            self._target(res, name, ns),
            True,
            lambda: self._delete(res, name, ns, None, propagation),
        )

    @logged
    def list_objects(
        self, api_version: str, kind: str, namespace: str | None = None, label_selector: str | None = None
    ) -> list[dict[str, Any]]:
        """Objects of a kind, sorted by namespace and name, each with its apiVersion and kind."""
        parse_selector(label_selector)
        res = resource(api_version, kind)
        target = f"{res.plural} in {namespace}" if namespace and res.namespaced else res.plural
        items = self._run(
            "list_objects",
            target,
            True,
            lambda: self._list(res, namespace if res.namespaced else None, label_selector, None),
        )
        out = [{"apiVersion": api_version, "kind": kind, **item} for item in items]
        return sorted(
            out, key=lambda o: ((o.get("metadata") or {}).get("namespace") or "", o["metadata"]["name"])
        )
