"""The core every port call stands on: the raw calls an adapter provides, and how they are run.

An adapter implements the primitives (``_get``, ``_list``, ``_create``, ``_replace``, ``_patch``,
``_delete``, ``_evict``, ``_delete_pod``): one request each, raising
:class:`~steps.cluster.retry.TransientError` for what may go away and
:class:`~steps.cluster.errors.ApiStatusError` for the rest. :meth:`PortCore._run` retries the first where
that is safe and names the call and the target in every error; :meth:`PortCore._change_node` is the
read-modify-write with ``resourceVersion`` that every node change goes through.
"""

from __future__ import annotations

import abc
import copy
import datetime as dt
import functools
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, cast

from steps.cluster import vocabulary as vocab
from steps.cluster.errors import ApiStatusError, ApiUnavailableError, ConflictError, NotFoundError, classify
from steps.cluster.node import Node
from steps.cluster.port import Propagation
from steps.cluster.resources import Resource, resource
from steps.cluster.retry import RetryPolicy, TransientError
from steps.errors import InputError

__all__ = ["CONFIGMAPS", "EVENTS", "LEASES", "NODES", "PODS", "PortCore", "logged"]

NODES = resource("v1", "Node")
PODS = resource("v1", "Pod")
CONFIGMAPS = resource("v1", "ConfigMap")
EVENTS = resource("v1", "Event")
LEASES = resource("coordination.k8s.io/v1", "Lease")

_T = TypeVar("_T")
_F = TypeVar("_F", bound=Callable[..., Any])


def logged(method: _F) -> _F:
    """Record each call of a port method (arguments, result or error) through ``_record``."""

    @functools.wraps(method)
    def wrapper(self: PortCore, *args: Any, **kwargs: Any) -> Any:
        try:
            result = method(self, *args, **kwargs)
        except Exception as exc:
            self._record(method.__name__, args, kwargs, None, exc)
            raise
        self._record(method.__name__, args, kwargs, result, None)
        return result

    return cast(_F, wrapper)


def _utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class PortCore(abc.ABC):
    """The primitives an adapter implements and the machinery that runs them.

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

    @property
    @abc.abstractmethod
    def runs_pods(self) -> bool:
        """Whether a check runs as pods on this cluster (see :class:`~steps.cluster.port.ClusterPort`)."""

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
