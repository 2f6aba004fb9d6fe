"""The simulated-fleet adapter: the port over a :class:`~steps.cluster.sim.model.Fleet`.

Each primitive is one simulated API request, carried out under the store's lock with the API
server's rules: ``resourceVersion`` preconditions (409), merge and strategic merge patches, the
status subresource, field and label selectors, evictions checked against PodDisruptionBudgets, and
controllers that replace evicted pods. Injected API faults (500 bursts, conflicts, latency, RBAC
refusals) act on each request before it is carried out.
"""

from __future__ import annotations

import datetime as dt
import json
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import ValidationError

from steps.cluster import vocabulary as vocab
from steps.cluster.base import PortBase
from steps.cluster.changes import format_time
from steps.cluster.errors import ApiStatusError, NotFoundError
from steps.cluster.fabric import FabricSettings
from steps.cluster.health import GpuResetError, NodeReport
from steps.cluster.patches import merge_patch, strategic_merge_patch
from steps.cluster.port import CordonResult, EvictionResult, Node, Pod, Propagation
from steps.cluster.resources import Resource
from steps.cluster.retry import RetryPolicy, TransientError
from steps.cluster.selectors import parse_selector
from steps.cluster.sim import repair
from steps.cluster.sim.controllers import (
    collect_dependents,
    collect_terminating,
    configmap_refusal,
    default_propagation,
    disruption_refusal,
    event_refusal,
    take_pod,
)
from steps.cluster.sim.faults import apply_fault
from steps.cluster.sim.model import CallRecord, Fleet, NodeHealth, Pdb, object_key, owner_key
from steps.cluster.sim.store import FleetStore, MemoryStore

__all__ = ["SimCluster"]

_TYPED = {("v1", "Node"), ("v1", "Pod"), ("policy/v1", "PodDisruptionBudget")}


def _conflict(res: Resource, name: str) -> ApiStatusError:
    return ApiStatusError(
        409,
        f'Operation cannot be fulfilled on {res.plural} "{name}": the object has been modified; '
        "please apply your changes to the latest version and try again",
    )


def _check_uid(pod: Pod, uid: str | None) -> None:
    """A deletion whose uid precondition names another pod than the one of that name: 409, as the API
    server's storage refuses it."""
    if uid and uid != pod.uid:
        raise ApiStatusError(
            409,
            f'Operation cannot be fulfilled on pods "{pod.name}": Precondition failed: '
            f"UID in precondition: {uid}, UID in object meta: {pod.uid}",
        )


def _copy(obj: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of JSON data (faster than ``copy.deepcopy``)."""
    result: dict[str, Any] = json.loads(json.dumps(obj))
    return result


def _forbidden(verb: str, res: Resource, name: str | None, namespace: str | None) -> str:
    """RBAC's refusal, in the API server's words."""
    subject = f'{res.plural} "{name}" is forbidden' if name else f"{res.plural} is forbidden"
    group = res.api_version.rpartition("/")[0]
    scope = f'in the namespace "{namespace}"' if res.namespaced and namespace else "at the cluster scope"
    return (
        f'{subject}: User "system:serviceaccount:dsx:dsx" cannot {verb} resource "{res.plural}" '
        f'in API group "{group}" {scope}'
    )


def _summary(value: Any) -> Any:
    """A short, JSON-friendly account of a port call's result for the call log."""
    if isinstance(value, Node):
        return {
            "node": value.name,
            "unschedulable": value.unschedulable,
            "taints": [str(t) for t in value.taints],
        }
    if isinstance(value, CordonResult):
        return {**_summary(value.node), "summary": value.summary}
    if isinstance(value, EvictionResult):
        return value.model_dump()
    if isinstance(value, Pod):
        return value.ref
    if isinstance(value, list):
        if value and isinstance(value[0], Node):
            return [n.name for n in value]
        if value and isinstance(value[0], Pod):
            return [p.ref for p in value]
        return f"{len(value)} items"
    if isinstance(value, dict):
        meta = value.get("metadata")
        if isinstance(meta, Mapping):
            return f"{value.get('kind', 'object')} {meta.get('name')}"
        return dict(sorted(value.items()))
    return value


def _plain(value: Any) -> Any:
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, Pod):
        return value.ref
    if callable(value):
        return "<function>"
    return str(value)


class SimCluster(PortBase):
    """The port over a simulated fleet.

    Args:
        store: where the fleet lives (in memory, or a shared JSON file).
        namespace: where dsx keeps its ConfigMaps and Leases (Events about nodes go to ``default``).
        retry: backoff for injected transient failures.
        clock: the current time.
        field_manager: who this port's writes are, as ``managedFields`` records the owner of
            ``spec.unschedulable`` (another name plays another client, e.g. kubectl).
    """

    def __init__(
        self,
        store: FleetStore | Fleet,
        namespace: str = "dsx",
        retry: RetryPolicy | None = None,
        clock: Callable[[], dt.datetime] | None = None,
        field_manager: str = vocab.FIELD_MANAGER,
    ) -> None:
        super().__init__(namespace=namespace, retry=retry, clock=clock, field_manager=field_manager)
        self.store: FleetStore = MemoryStore(store) if isinstance(store, Fleet) else store

    @property
    def endpoint(self) -> str:
        """``sim:...`` or ``state:PATH``."""
        return self.store.describe()

    @property
    def runs_pods(self) -> bool:
        """No: a simulated fleet's checks run as local ranks playing its nodes."""
        return False

    # ----------------------------------------------------------------- simulation controls

    def fleet(self) -> Fleet:
        """A copy of the whole fleet as it is now."""
        with self.store.transaction(write=False) as fleet:
            return fleet.model_copy(deep=True)

    def health(self, node: str) -> NodeHealth:
        """The physical health of a node (what NVML and sysfs would show)."""
        with self.store.transaction(write=False) as fleet:
            return _health_of(fleet, node).model_copy(deep=True)

    def node_report(self, node: str) -> NodeReport:
        """What the node's GPUs and NICs would report: the simulated fleet as a health source.

        Read in place, with no copy of the node's health: the report is frozen, as are the GPU and NIC
        reports it shares (a bisection reads 4,096 of them, and copying each would cost seconds).

        Raises:
            NotFoundError: no such node in the fleet.
        """
        with self.store.transaction(write=False) as fleet:
            health = _health_of(fleet, node)
            return NodeReport(
                node=node,
                link_gbps=health.link_gbps,
                nominal_link_gbps=health.nominal_link_gbps,
                gpus=tuple(health.gpus),
                link_failure_rate=health.link_failure_rate,
                link_hangs=health.link_hangs,
                nics=tuple(health.nics),
            )

    def gpu_holders(self, node: str, uuid: str) -> list[str]:
        """What holds the GPU ``uuid`` of ``node`` (:func:`steps.cluster.sim.repair.holding_gpus`): the GPU
        resetter's half of the simulated fleet.

        Raises:
            GpuResetError: no such GPU on the node.
        """
        with self.store.transaction(write=False) as fleet:
            health = _health_of(fleet, node)
            if not any(g.uuid == uuid for g in health.gpus):
                raise GpuResetError(f"{node} has no GPU {uuid}")
            return repair.holding_gpus(fleet, node)

    def reset_gpu(self, node: str, uuid: str) -> str:
        """Reset the GPU ``uuid`` of ``node`` (:func:`steps.cluster.sim.repair.reset_gpu`), logged as a
        call; what the reset says.

        Raises:
            GpuResetError: no such GPU on the node, or the reset refused (a lost GPU, one in use).
        """
        with self.store.transaction() as fleet:
            _health_of(fleet, node)
            said = repair.reset_gpu(fleet, node, uuid)
        self.store.append_log(CallRecord(seq=0, method="reset_gpu", args={"node": node, "uuid": uuid}))
        return said

    def fabric_settings(self) -> FabricSettings:
        """How the fleet's fabric behaves in modelled group tests (``noise`` and ``seed`` of the spec):
        the simulated fleet as a :class:`~steps.cluster.fabric.FabricSource`."""
        with self.store.transaction(write=False) as fleet:
            return fleet.fabric

    def calls(self) -> list[CallRecord]:
        """Every port call made on this fleet so far, oldest first (from all processes sharing it)."""
        return self.store.read_log()

    def inject(self, node: str, fault: str) -> None:
        """Inject a fault into a node (see :mod:`steps.cluster.sim.faults`)."""
        with self.store.transaction() as fleet:
            apply_fault(fleet, node, fault)
        self.store.append_log(CallRecord(seq=0, method="inject", args={"node": node, "fault": fault}))

    def check_faults(self, faults: list[tuple[str, str]]) -> None:
        """Raise as :meth:`inject` of each ``(node, fault)`` in turn would, changing nothing (on a copy)."""
        trial = self.fleet()
        for node, fault in faults:
            apply_fault(trial, node, fault)

    def inject_api(
        self,
        errors: int = 0,
        conflicts: int = 0,
        latency_ms: int | None = None,
        forbid: list[str] | None = None,
    ) -> None:
        """Make the next ``errors`` requests fail with 500 and the next ``conflicts`` writes conflict;
        set the latency and the RBAC refusals (``"patch nodes"``...) when given."""
        with self.store.transaction() as fleet:
            fleet.api.errors += errors
            fleet.api.conflicts += conflicts
            if latency_ms is not None:
                fleet.api.latency_ms = latency_ms
            if forbid is not None:
                fleet.api.forbidden = list(forbid)

    # ----------------------------------------------------------------- request gate

    def _gate(
        self,
        fleet: Fleet,
        verb: str,
        res: Resource,
        name: str | None,
        node: str | None = None,
        namespace: str | None = None,
    ) -> None:
        """What the simulated API does before serving a request: latency, RBAC, injected errors."""
        if fleet.api.latency_ms:
            time.sleep(fleet.api.latency_ms / 1000)
        plural = res.plural
        for rule in fleet.api.forbidden:
            rule_verb, _, rule_res = rule.partition(" ")
            if rule_verb in (verb, "*") and rule_res.strip() == plural:
                raise ApiStatusError(403, _forbidden(verb, res, name, namespace))
        about = node or (name if res.kind == "Node" else None)
        if about and fleet.api.node_errors.get(about, 0) > 0:
            fleet.api.node_errors[about] -= 1
            self._log_fault(verb, plural, name, "injected 500 for node " + about)
            raise TransientError(500, "the API answered 500: Internal error (injected)", sent=True)
        if fleet.api.errors > 0:
            fleet.api.errors -= 1
            self._log_fault(verb, plural, name, "injected 500")
            raise TransientError(500, "the API answered 500: Internal error (injected)", sent=True)

    def _log_fault(self, verb: str, plural: str, name: str | None, what: str) -> None:
        self.store.append_log(
            CallRecord(seq=0, method=f"api:{verb}", args={"resource": plural, "name": name}, error=what)
        )

    def _precondition(self, fleet: Fleet, res: Resource, name: str, current: str, wanted: Any) -> None:
        """A write that names a resourceVersion: 409 if stale, or if a conflict is injected."""
        if not wanted:
            return
        if fleet.api.conflicts > 0:
            fleet.api.conflicts -= 1
            self._log_fault("write", res.plural, name, "injected 409")
            self._touch(fleet, res, name)
            raise _conflict(res, name)
        if str(wanted) != str(current):
            raise _conflict(res, name)

    def _touch(self, fleet: Fleet, res: Resource, name: str) -> None:
        """Another writer changed the object (for injected conflicts)."""
        if res.kind == "Node" and name in fleet.nodes:
            fleet.nodes[name].resource_version = fleet.next_revision()
        else:
            for key, obj in fleet.objects.items():
                if key.split("|")[3] == name and key.split("|")[1] == res.kind:
                    obj["metadata"]["resourceVersion"] = fleet.next_revision()

    # ----------------------------------------------------------------- reading typed state as objects

    @staticmethod
    def _typed(res: Resource) -> bool:
        return (res.api_version, res.kind) in _TYPED

    def _render(self, fleet: Fleet, res: Resource) -> list[dict[str, Any]]:
        if res.kind == "Node":
            return [n.to_manifest() for _, n in sorted(fleet.nodes.items())]
        if res.kind == "Pod":
            return [p.to_manifest() for _, p in sorted(fleet.pods.items())]
        return [b.to_manifest() for _, b in sorted(fleet.pdbs.items())]

    @staticmethod
    def _ident(obj: Mapping[str, Any]) -> tuple[str | None, str]:
        meta = obj.get("metadata") or {}
        return meta.get("namespace"), str(meta.get("name"))

    def _find(self, fleet: Fleet, res: Resource, name: str, namespace: str | None) -> dict[str, Any] | None:
        if res.kind == "Node" and self._typed(res):
            node = fleet.nodes.get(name)
            return node.to_manifest() if node else None
        if res.kind == "Pod" and self._typed(res):
            pod = fleet.pods.get(f"{namespace}/{name}")
            return pod.to_manifest() if pod else None
        if self._typed(res):
            pdb = fleet.pdbs.get(f"{namespace}/{name}")
            return pdb.to_manifest() if pdb else None
        found = fleet.objects.get(object_key(res.api_version, res.kind, namespace, name))
        return _copy(found) if found is not None else None

    def _store(self, fleet: Fleet, res: Resource, obj: dict[str, Any]) -> dict[str, Any]:
        """Save an object (typed kinds into their models); returns it as stored."""
        if (res.api_version, res.kind) == ("v1", "ConfigMap"):
            refusal = configmap_refusal(obj)
            if refusal is not None:
                raise ApiStatusError(422, refusal)
        namespace, name = self._ident(obj)
        try:
            if res.kind == "Node" and self._typed(res):
                node = Node.from_manifest(obj)
                before = fleet.nodes.get(name)
                managers = before.unschedulable_managers if before else []
                if node.unschedulable != (before.unschedulable if before else False):
                    # As managedFields record an update: the writer that changed the field owns it.
                    managers = [self.field_manager] if node.unschedulable else []
                update = {"resource_version": fleet.next_revision(), "unschedulable_managers": managers}
                node = node.model_copy(update=update)
                repair.schedule(fleet, before, node, time.time())
                fleet.nodes[name] = node
                return node.to_manifest()
            if res.kind == "Pod" and self._typed(res):
                pod = Pod.from_manifest(obj)
                fleet.pods[pod.ref] = pod
                _, _, suffix = pod.name.rpartition("-")
                if pod.owner_kind and suffix.isdigit():
                    key = owner_key(pod)
                    fleet.owner_next[key] = max(fleet.owner_next.get(key, 0), int(suffix) + 1)
                return pod.to_manifest()
            if self._typed(res):
                pdb = Pdb.from_manifest(obj)
                fleet.pdbs[f"{pdb.namespace}/{pdb.name}"] = pdb
                return pdb.to_manifest()
        except (ValidationError, KeyError, TypeError, ValueError) as exc:
            raise ApiStatusError(422, f'{res.kind} "{name}" is invalid: {str(exc).splitlines()[0]}') from None
        stored: dict[str, Any] = merge_patch(obj, {"apiVersion": res.api_version, "kind": res.kind})
        stored["metadata"]["resourceVersion"] = fleet.next_revision()
        stored["metadata"].setdefault("uid", str(uuid.uuid4()))
        stored["metadata"].setdefault("creationTimestamp", format_time(self._clock()))
        fleet.objects[object_key(res.api_version, res.kind, namespace, name)] = stored
        return _copy(stored)

    # ----------------------------------------------------------------- primitives

    def _settle(self) -> None:
        """Let the simulated repair system reboot the nodes whose repair is due, and the terminating pods
        that may go now leave (:func:`~steps.cluster.sim.controllers.collect_terminating`)."""
        now = time.time()
        with self.store.transaction(write=False) as fleet:
            if not repair.due(fleet, now) and not collect_terminating(fleet, collect=False):
                return
        with self.store.transaction() as fleet:
            repair.settle(fleet, now)
            collect_terminating(fleet)

    def _get(self, res: Resource, name: str, namespace: str | None) -> dict[str, Any] | None:
        if res.kind in ("Node", "Pod"):
            self._settle()
        with self.store.transaction(write=False) as fleet:
            self._gate(fleet, "get", res, name, namespace=namespace)
            return self._find(fleet, res, name, namespace)

    def _list(
        self, res: Resource, namespace: str | None, label_selector: str | None, field_selector: str | None
    ) -> list[dict[str, Any]]:
        node = None
        if field_selector:
            key, _, node = field_selector.partition("=")
            if key != "spec.nodeName" or res.kind != "Pod":
                raise ApiStatusError(400, f'field label not supported: "{key}"')
        if res.kind in ("Node", "Pod"):
            self._settle()
        with self.store.transaction(write=False) as fleet:
            self._gate(fleet, "list", res, None, node=node, namespace=namespace)
            # Typed kinds are rendered afresh; other objects are copied only once they match (a label
            # selector over thousands of ConfigMaps reads a few).
            typed = self._typed(res)
            prefix = f"{res.api_version}|{res.kind}|"
            stored = (
                self._render(fleet, res)
                if typed
                else [obj for key, obj in sorted(fleet.objects.items()) if key.startswith(prefix)]
            )
            wanted = parse_selector(label_selector)
            out = []
            for obj in stored:
                meta = obj.get("metadata") or {}
                if namespace and meta.get("namespace") != namespace:
                    continue
                if not all(r.matches(meta.get("labels") or {}) for r in wanted):
                    continue
                if node is not None and (obj.get("spec") or {}).get("nodeName") != node:
                    continue
                out.append(obj if typed else _copy(obj))
            return out

    def _create(self, res: Resource, namespace: str | None, manifest: Mapping[str, Any]) -> dict[str, Any]:
        obj = merge_patch(manifest, {"metadata": {"namespace": namespace}} if namespace else {})
        _, name = self._ident(obj)
        with self.store.transaction() as fleet:
            self._gate(fleet, "create", res, name, namespace=namespace)
            if self._find(fleet, res, name, namespace) is not None:
                raise ApiStatusError(409, f'{res.plural} "{name}" already exists')
            if res.kind == "Pod" and self._typed(res):
                obj["metadata"]["uid"] = fleet.new_uid()  # the server names every new pod afresh
            if (res.api_version, res.kind) == ("v1", "Event"):
                refusal = event_refusal(obj)
                if refusal is not None:
                    raise ApiStatusError(422, refusal)
            return self._store(fleet, res, obj)

    def _replace(
        self, res: Resource, name: str, namespace: str | None, manifest: Mapping[str, Any]
    ) -> dict[str, Any]:
        with self.store.transaction() as fleet:
            self._gate(fleet, "update", res, name, namespace=namespace)
            current = self._find(fleet, res, name, namespace)
            if current is None:
                raise ApiStatusError(404, f'{res.plural} "{name}" not found')
            current_rv = (current.get("metadata") or {}).get("resourceVersion", "")
            self._precondition(
                fleet, res, name, current_rv, (manifest.get("metadata") or {}).get("resourceVersion")
            )
            obj = merge_patch(manifest, {"metadata": {"name": name, "namespace": namespace}})
            if current.get("status") is not None and res.kind == "Node":
                obj["status"] = current["status"]
            meta = current.get("metadata") or {}
            for kept in ("uid", "creationTimestamp"):
                if kept in meta:
                    obj["metadata"][kept] = meta[kept]
            return self._store(fleet, res, obj)

    def _patch(
        self,
        res: Resource,
        name: str,
        namespace: str | None,
        patch: Mapping[str, Any],
        strategic: bool = False,
        subresource: str | None = None,
    ) -> dict[str, Any]:
        verb_res = (
            res
            if subresource is None
            else Resource(res.api_version, res.kind, f"{res.plural}/{subresource}", res.namespaced)
        )
        with self.store.transaction() as fleet:
            self._gate(fleet, "patch", verb_res, name, namespace=namespace)
            current = self._find(fleet, res, name, namespace)
            if current is None:
                raise ApiStatusError(404, f'{res.plural} "{name}" not found')
            meta = current.get("metadata") or {}
            self._precondition(
                fleet,
                res,
                name,
                meta.get("resourceVersion", ""),
                (patch.get("metadata") or {}).get("resourceVersion"),
            )
            body = merge_patch(patch, {"metadata": {"resourceVersion": None}})
            if subresource == "status":
                body = {"status": body.get("status") or {}}
            elif res.kind == "Node":
                body.pop("status", None)
            apply = strategic_merge_patch if strategic else merge_patch
            obj = apply(current, body)
            obj["metadata"]["name"], obj["metadata"]["namespace"] = name, namespace
            if not namespace:
                obj["metadata"].pop("namespace")
            return self._store(fleet, res, obj)

    def _delete(
        self,
        res: Resource,
        name: str,
        namespace: str | None,
        grace_seconds: int | None,
        propagation: Propagation | None = None,
    ) -> bool:
        with self.store.transaction() as fleet:
            self._gate(fleet, "delete", res, name, namespace=namespace)
            if res.kind == "Node" and self._typed(res):
                return fleet.nodes.pop(name, None) is not None
            if res.kind == "Pod" and self._typed(res):
                pod = fleet.pods.get(f"{namespace}/{name}")
                if pod is not None:
                    take_pod(fleet, pod, grace_seconds, format_time(self._clock()))
                return pod is not None
            if self._typed(res):
                return fleet.pdbs.pop(f"{namespace}/{name}", None) is not None
            gone = fleet.objects.pop(object_key(res.api_version, res.kind, namespace, name), None)
            if gone is None:
                return False
            policy = propagation or default_propagation(res.api_version, res.kind)
            collect_dependents(fleet, gone, policy, fleet.next_revision)
            return True

    def _delete_pod(self, namespace: str, name: str, grace_seconds: int | None, uid: str | None) -> bool:
        from steps.cluster.base import PODS

        with self.store.transaction() as fleet:
            pod = fleet.pods.get(f"{namespace}/{name}")
            self._gate(fleet, "delete", PODS, name, node=pod.node if pod else None, namespace=namespace)
            if pod is None:
                return False
            _check_uid(pod, uid)
            take_pod(fleet, pod, grace_seconds, format_time(self._clock()))
            return True

    def _evict(
        self, namespace: str, name: str, grace_seconds: int | None, uid: str | None
    ) -> tuple[int, str]:
        from steps.cluster.base import PODS

        eviction = Resource("v1", "Pod", "pods/eviction", True)
        with self.store.transaction() as fleet:
            pod = fleet.pods.get(f"{namespace}/{name}")
            self._gate(fleet, "create", eviction, name, node=pod.node if pod else None, namespace=namespace)
            if pod is None:
                return 404, f'{PODS.plural} "{name}" not found'
            if pod.terminating:  # already being deleted: no budget check, nothing more to do (canIgnorePDB)
                return 201, ""
            refusal = disruption_refusal(fleet, pod)
            if refusal is not None:
                return refusal
            _check_uid(pod, uid)  # after the budget, as the API server's eviction checks it
            take_pod(fleet, pod, grace_seconds, format_time(self._clock()))
            return 201, ""

    # ----------------------------------------------------------------- the call log

    def _record(
        self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any, error: Exception | None
    ) -> None:
        import inspect

        signature = inspect.signature(getattr(PortBase, method))
        bound = signature.bind_partial(self, *args, **kwargs)
        named = {k: _plain(v) for k, v in bound.arguments.items() if k != "self"}
        self.store.append_log(
            CallRecord(
                seq=0,
                method=method,
                args=named,
                result=None if error else _plain(_summary(result)),
                error=str(error) if error else None,
            )
        )


def _health_of(fleet: Fleet, node: str) -> NodeHealth:
    if node not in fleet.health:
        raise NotFoundError("health", f"node/{node}", f'not found (404): nodes "{node}" not found', 404)
    return fleet.health[node]
