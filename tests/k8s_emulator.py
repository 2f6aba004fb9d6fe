"""An emulated Kubernetes API server for tests: real HTTP on 127.0.0.1, in a thread.

It speaks the JSON the kubernetes client expects, for every call dsx makes:

- any kind under ``/api/v1`` and ``/apis/GROUP/VERSION``, namespaced or not: get, list (with
  ``labelSelector`` and ``fieldSelector``), create (with ``generateName``), replace, merge patch,
  strategic merge patch (conditions, addresses, containers... merged by key), delete;
- ``resourceVersion`` on every object, bumped on every write; a write naming a stale one gets 409;
- the status subresource (``/status`` changes only ``status``; the main resource ignores it);
- the eviction subresource, refusing with 429 and the API's message while a PodDisruptionBudget
  allows no disruption (500 when two budgets select the pod);
- a delete, or an eviction's ``deleteOptions``, whose ``preconditions.uid`` names another object than the
  one stored gets 409 (for an eviction after the budget check, as in the API server);
- controllers that replace a deleted or evicted ReplicaSet or Job pod on the least loaded schedulable
  node, and a DaemonSet pod on its own node;
- RBAC refusals (403) and a bearer token check (401), both configurable;
- fault injection: N answers with a status (500, 503, 429...), N injected conflicts, slow answers.

Everything it received is in :attr:`Emulator.requests`. The rules are written here independently of
the simulated fleet in ``steps.cluster.sim``, so the contract tests compare two implementations.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import re
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

__all__ = ["Emulator", "Request", "write_kubeconfig"]

KINDS = {
    "nodes": "Node",
    "pods": "Pod",
    "configmaps": "ConfigMap",
    "secrets": "Secret",
    "events": "Event",
    "namespaces": "Namespace",
    "services": "Service",
    "leases": "Lease",
    "poddisruptionbudgets": "PodDisruptionBudget",
    "deployments": "Deployment",
    "daemonsets": "DaemonSet",
    "replicasets": "ReplicaSet",
    "jobs": "Job",
}
CLUSTER_SCOPED = {"nodes", "namespaces", "persistentvolumes", "clusterroles", "clusterrolebindings"}
WITH_STATUS = {"nodes", "pods", "deployments", "daemonsets", "replicasets", "jobs"}
SMP_KEYS = {"conditions": "type", "addresses": "type", "containers": "name", "volumes": "name", "env": "name"}
TERMINAL = ("Succeeded", "Failed")

Key = tuple[str, str, str, str]  # group/version, plural, namespace ("" if none), name


@dataclass
class Request:
    """One request as the emulator saw it."""

    method: str
    path: str
    query: dict[str, str]
    status: int  # 0 while the answer is still being made
    content_type: str = ""


@dataclass
class _Fault:
    count: int
    status: int = 500
    method: str | None = None
    path: str | None = None
    delay: float = 0.0


@dataclass
class _Route:
    group_version: str
    plural: str
    namespace: str
    name: str
    sub: str

    @property
    def verb_resource(self) -> str:
        return f"{self.plural}/{self.sub}" if self.sub else self.plural


class _Answer(Exception):
    def __init__(self, code: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        super().__init__(code)
        self.code = code
        self.body = body
        self.headers = headers or {}


def status_body(
    code: int, reason: str, message: str, details: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A ``Status`` object as the API server sends it with an error."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure" if code >= 400 else "Success",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        body["details"] = details
    return body


def _fail(code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> _Answer:
    return _Answer(code, status_body(code, reason, message, details))


# ------------------------------------------------------------------------------- selectors and patches


def _label_match(selector: str, labels: dict[str, str]) -> bool:
    terms = re.split(r",(?![^()]*\))", selector)
    for raw in terms:
        term = raw.strip()
        if not term:
            continue
        m = re.fullmatch(r"(\S+)\s+(in|notin)\s+\((.*)\)", term)
        if m:
            values = {v.strip() for v in m.group(3).split(",")}
            inside = labels.get(m.group(1)) in values
            if inside != (m.group(2) == "in"):
                return False
            continue
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key.strip()) == value.strip():
                return False
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            if labels.get(key.strip()) != value.strip():
                return False
        elif term.startswith("!"):
            if term[1:].strip() in labels:
                return False
        elif term not in labels:
            return False
    return True


def _field_match(selector: str, obj: dict[str, Any]) -> bool:
    for term in selector.split(","):
        path, _, value = term.partition("=")
        node: Any = obj
        for part in path.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if (node or "") != value:
            return False
    return True


def _merge(target: Any, patch: Any, strategic: bool) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif strategic and key in SMP_KEYS and isinstance(value, list) and isinstance(out.get(key), list):
            merge_key = SMP_KEYS[key]
            items = out[key]
            for item in value:
                hit = [i for i, old in enumerate(items) if old.get(merge_key) == item.get(merge_key)]
                if item.get("$patch") == "delete":
                    items = [old for i, old in enumerate(items) if i not in hit]
                elif hit:
                    items[hit[0]] = _merge(items[hit[0]], item, strategic)
                else:
                    items.append(copy.deepcopy(item))
            out[key] = items
        else:
            out[key] = _merge(out.get(key), value, strategic)
    return out


# ------------------------------------------------------------------------------- the emulator


@dataclass
class Emulator:
    """The emulated API server. Use as a context manager, or call :meth:`start` and :meth:`stop`.

    Attributes:
        token: the bearer token every request must carry (``None`` accepts any).
        requests: every request received, in order.
    """

    token: str | None = "emulator-token"
    requests: list[Request] = field(default_factory=list)
    _objects: dict[Key, dict[str, Any]] = field(default_factory=dict)
    _revision: int = 0
    _faults: list[_Fault] = field(default_factory=list)
    _conflicts: int = 0
    _forbidden: set[tuple[str, str]] = field(default_factory=set)
    _owner_next: dict[str, int] = field(default_factory=dict)
    _lock: threading.RLock = field(default_factory=threading.RLock)
    _server: ThreadingHTTPServer | None = None

    # ------------------------------------------------------------------ life cycle

    def start(self) -> str:
        """Start serving on a free port of 127.0.0.1; returns the base URL."""
        emulator = self

        class Handler(_Handler):
            owner = emulator

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.02},
            name="k8s-emulator",
            daemon=True,
        ).start()
        return self.url

    def stop(self) -> None:
        """Stop serving."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> Emulator:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        assert self._server is not None, "the emulator is not started"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    # ------------------------------------------------------------------ test controls

    def seed(self, manifests: Iterable[dict[str, Any]]) -> None:
        """Store objects as they are (e.g. a simulated fleet's nodes, pods and budgets)."""
        with self._lock:
            for manifest in manifests:
                obj = copy.deepcopy(manifest)
                gv = obj["apiVersion"]
                plural = next((p for p, k in KINDS.items() if k == obj["kind"]), obj["kind"].lower() + "s")
                meta = obj.setdefault("metadata", {})
                self._revision += 1
                meta["resourceVersion"] = str(self._revision)
                meta.setdefault("uid", str(uuid.uuid4()))
                ns = meta.get("namespace", "") if plural not in CLUSTER_SCOPED else ""
                self._objects[(gv, plural, ns, meta["name"])] = obj
                self._count_owner(obj)

    def fail(self, count: int, status: int = 500, method: str | None = None, path: str | None = None) -> None:
        """Answer the next ``count`` requests (of ``method``, path containing ``path``) with ``status``."""
        with self._lock:
            self._faults.append(_Fault(count=count, status=status, method=method, path=path))

    def slow(
        self, seconds: float, count: int = 1, method: str | None = None, path: str | None = None
    ) -> None:
        """Delay the next ``count`` matching answers by ``seconds``."""
        with self._lock:
            self._faults.append(_Fault(count=count, status=0, method=method, path=path, delay=seconds))

    def conflict(self, count: int) -> None:
        """The next ``count`` writes naming a resourceVersion find the object changed by someone else."""
        with self._lock:
            self._conflicts += count

    def forbid(self, verb: str, resource: str) -> None:
        """RBAC refuses ``verb`` (``get``, ``patch``...) on ``resource`` (``nodes``, ``pods/eviction``)."""
        with self._lock:
            self._forbidden.add((verb, resource))

    def objects(self, plural: str, namespace: str | None = None) -> list[dict[str, Any]]:
        """Stored objects of a resource, sorted by namespace and name."""
        with self._lock:
            found = [
                copy.deepcopy(obj)
                for (_, p, ns, _), obj in self._objects.items()
                if p == plural and (namespace is None or ns == namespace)
            ]
        return sorted(found, key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]))

    def count(self, method: str, path_part: str = "") -> int:
        """Requests received of ``method`` whose path contains ``path_part``."""
        return sum(1 for r in self.requests if r.method == method and path_part in r.path)

    # ------------------------------------------------------------------ serving

    def _route(self, path: str) -> _Route:
        parts = [unquote(p) for p in path.strip("/").split("/")]
        if parts[:2] == ["api", "v1"]:
            gv, rest = "v1", parts[2:]
        elif parts[0] == "apis" and len(parts) >= 3:
            gv, rest = f"{parts[1]}/{parts[2]}", parts[3:]
        else:
            raise _fail(404, "NotFound", f"the server could not find the requested resource ({path})")
        namespace = ""
        if len(rest) >= 3 and rest[0] == "namespaces":
            namespace, rest = rest[1], rest[2:]
        if not rest:
            raise _fail(404, "NotFound", "the server could not find the requested resource")
        return _Route(
            gv, rest[0], namespace, rest[1] if len(rest) > 1 else "", rest[2] if len(rest) > 2 else ""
        )

    def handle(
        self, method: str, path: str, query: dict[str, str], headers: dict[str, str], body: Any
    ) -> tuple[int, dict[str, Any], dict[str, str]]:
        """Serve one request: ``(status, body, headers)``."""
        delay = 0.0
        with self._lock:
            for fault in self._faults:
                if (
                    fault.count > 0
                    and (fault.method in (None, method))
                    and (fault.path is None or fault.path in path)
                ):
                    fault.count -= 1
                    if fault.delay:
                        delay = fault.delay
                        break
                    details = {"retryAfterSeconds": 1} if fault.status == 429 else None
                    reason = "TooManyRequests" if fault.status == 429 else "InternalError"
                    extra = {"Retry-After": "1"} if fault.status == 429 else {}
                    return (
                        fault.status,
                        status_body(fault.status, reason, f"injected {fault.status}", details),
                        extra,
                    )
        if delay:
            time.sleep(delay)
        try:
            if self.token is not None and headers.get("authorization") != f"Bearer {self.token}":
                raise _fail(401, "Unauthorized", "Unauthorized")
            route = self._route(path)
            verb = {
                "GET": "get" if route.name else "list",
                "POST": "create",
                "PUT": "update",
                "PATCH": "patch",
                "DELETE": "delete",
            }[method]
            if method == "POST" and route.sub:
                verb = "create"
            with self._lock:
                if (verb, route.verb_resource) in self._forbidden:
                    group = route.group_version.rpartition("/")[0]
                    scope = (
                        f'in the namespace "{route.namespace}"' if route.namespace else "at the cluster scope"
                    )
                    subject = (
                        f'{route.plural} "{route.name}" is forbidden'
                        if route.name
                        else f"{route.plural} is forbidden"
                    )
                    raise _fail(
                        403,
                        "Forbidden",
                        f'{subject}: User "system:serviceaccount:dsx:dsx" cannot {verb} '
                        f'resource "{route.verb_resource}" in API group "{group}" {scope}',
                    )
                return self._serve(method, route, query, headers, body)
        except _Answer as answer:
            return answer.code, answer.body, answer.headers

    def _key(self, route: _Route, name: str | None = None) -> Key:
        ns = "" if route.plural in CLUSTER_SCOPED else route.namespace
        return (route.group_version, route.plural, ns, name if name is not None else route.name)

    def _kind(self, route: _Route, body: Any = None) -> str:
        if route.plural in KINDS:
            return KINDS[route.plural]
        if isinstance(body, dict) and body.get("kind"):
            return str(body["kind"])
        return route.plural[:-1].capitalize()

    def _bump(self, obj: dict[str, Any]) -> None:
        self._revision += 1
        obj["metadata"]["resourceVersion"] = str(self._revision)

    def _not_found(self, route: _Route) -> _Answer:
        return _fail(
            404,
            "NotFound",
            f'{route.plural} "{route.name}" not found',
            {"name": route.name, "kind": route.plural},
        )

    def _check_uid(self, route: _Route, current: dict[str, Any], options: Any) -> None:
        """A delete (or an eviction's deleteOptions) naming another object's uid is refused with 409, as the
        API server's storage refuses a failed precondition."""
        preconditions = (options.get("preconditions") or {}) if isinstance(options, dict) else {}
        wanted = preconditions.get("uid")
        actual = current["metadata"].get("uid", "")
        if wanted and wanted != actual:
            raise _fail(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {route.plural} "{route.name}": StorageError: invalid '
                f"object, Code: 4, AdditionalErrorMsg: Precondition failed: UID in precondition: {wanted}, "
                f"UID in object meta: {actual}",
                {"name": route.name, "kind": route.plural},
            )

    def _check_version(self, route: _Route, current: dict[str, Any], wanted: Any) -> None:
        if not wanted:
            return
        if self._conflicts > 0:
            self._conflicts -= 1
            self._bump(current)
        if str(wanted) != current["metadata"]["resourceVersion"]:
            raise _fail(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {route.plural} "{route.name}": the object '
                "has been modified; please apply your changes to the latest version and try again",
                {"name": route.name, "kind": route.plural},
            )

    def _serve(
        self, method: str, route: _Route, query: dict[str, str], headers: dict[str, str], body: Any
    ) -> tuple[int, dict[str, Any], dict[str, str]]:
        if method == "GET" and not route.name:
            return 200, self._list(route, query), {}
        if method == "POST" and route.sub == "eviction" and route.plural == "pods":
            return self._evict(route, body)
        if method == "POST" and not route.name:
            return 201, self._create(route, body), {}
        current = self._objects.get(self._key(route))
        if current is None:
            raise self._not_found(route)
        if method == "GET":
            return 200, copy.deepcopy(current), {}
        if method == "DELETE":
            self._check_uid(route, current, body)
            del self._objects[self._key(route)]
            self._controllers(current)
            return 200, copy.deepcopy(current), {}
        if method == "PUT":
            self._check_version(route, current, (body.get("metadata") or {}).get("resourceVersion"))
            new = copy.deepcopy(body)
            new.setdefault("metadata", {}).update(
                name=route.name,
                uid=current["metadata"].get("uid"),
                resourceVersion=current["metadata"]["resourceVersion"],
            )
            if route.namespace:
                new["metadata"]["namespace"] = route.namespace
            if route.plural in WITH_STATUS:
                new["status"] = current.get("status", {})
            new.setdefault("apiVersion", route.group_version)
            new.setdefault("kind", self._kind(route, body))
        elif method == "PATCH":
            content_type = headers.get("content-type", "").split(";")[0]
            strategic = content_type == "application/strategic-merge-patch+json"
            if content_type not in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
                raise _fail(
                    415,
                    "UnsupportedMediaType",
                    "the body of the request was in an unknown format - accepted media types include: "
                    "application/merge-patch+json, application/strategic-merge-patch+json "
                    f"(got {content_type})",
                )
            if strategic and route.plural not in KINDS:
                raise _fail(
                    415, "UnsupportedMediaType", "strategic merge patch is not supported for custom resources"
                )
            if not isinstance(body, dict):
                raise _fail(400, "BadRequest", "the patch is not a JSON object")
            self._check_version(route, current, (body.get("metadata") or {}).get("resourceVersion"))
            patch = copy.deepcopy(body)
            patch.get("metadata", {}).pop("resourceVersion", None)
            if route.sub == "status":
                patch = {"status": patch.get("status", {})}
            elif route.sub:
                raise _fail(404, "NotFound", f"no subresource {route.sub!r} for PATCH")
            elif route.plural in WITH_STATUS:
                patch.pop("status", None)
            new = _merge(current, patch, strategic)
            new["metadata"]["name"] = route.name
        else:
            raise _fail(405, "MethodNotAllowed", f"{method} is not supported here")
        self._bump(new)
        self._objects[self._key(route)] = new
        return 200, copy.deepcopy(new), {}

    def _list(self, route: _Route, query: dict[str, str]) -> dict[str, Any]:
        selector, fields = query.get("labelSelector", ""), query.get("fieldSelector", "")
        for term in filter(None, fields.split(",")):
            if term.partition("=")[0] not in ("spec.nodeName", "metadata.name", "metadata.namespace"):
                raise _fail(400, "BadRequest", f'field label not supported: "{term.partition("=")[0]}"')
        items = [
            copy.deepcopy(obj)
            for (gv, plural, ns, _), obj in sorted(self._objects.items())
            if gv == route.group_version
            and plural == route.plural
            and (not route.namespace or ns == route.namespace)
            and _label_match(selector, obj["metadata"].get("labels") or {})
            and _field_match(fields, obj)
        ]
        return {
            "kind": f"{self._kind(route)}List",
            "apiVersion": route.group_version,
            "metadata": {"resourceVersion": str(self._revision)},
            "items": items,
        }

    def _create(self, route: _Route, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise _fail(400, "BadRequest", "the body is not a JSON object")
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        if not meta.get("name"):
            raise _fail(
                422, "Invalid", f"{self._kind(route, body)} is invalid: metadata.name: Required value"
            )
        if route.namespace:
            meta["namespace"] = route.namespace
        key = self._key(route, meta["name"])
        if key in self._objects:
            raise _fail(
                409,
                "AlreadyExists",
                f'{route.plural} "{meta["name"]}" already exists',
                {"name": meta["name"], "kind": route.plural},
            )
        obj.setdefault("apiVersion", route.group_version)
        obj.setdefault("kind", self._kind(route, body))
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        if route.plural == "pods":
            obj.setdefault("status", {}).setdefault("phase", "Pending")
        self._bump(obj)
        self._objects[key] = obj
        self._count_owner(obj)
        return copy.deepcopy(obj)

    # ------------------------------------------------------------------ eviction and controllers

    def _budgets_for(self, pod: dict[str, Any]) -> list[dict[str, Any]]:
        labels = pod["metadata"].get("labels") or {}
        ns = pod["metadata"].get("namespace", "")
        return [
            pdb
            for (_, plural, pdb_ns, _), pdb in sorted(self._objects.items())
            if plural == "poddisruptionbudgets"
            and pdb_ns == ns
            and all(
                labels.get(k) == v
                for k, v in ((pdb.get("spec") or {}).get("selector") or {}).get("matchLabels", {}).items()
            )
        ]

    def _evict(self, route: _Route, body: Any = None) -> tuple[int, dict[str, Any], dict[str, str]]:
        pod = self._objects.get(self._key(route))
        if pod is None:
            raise self._not_found(route)
        phase = (pod.get("status") or {}).get("phase")
        budgets = self._budgets_for(pod)
        if budgets and phase == "Running":
            if len(budgets) > 1:
                raise _fail(
                    500,
                    "InternalError",
                    "This pod has more than one PodDisruptionBudget, which the eviction "
                    "subresource does not support.",
                )
            budget = budgets[0]
            selector = budget["spec"]["selector"]["matchLabels"]
            covered = [
                p
                for (_, plural, ns, _), p in self._objects.items()
                if plural == "pods"
                and ns == route.namespace
                and all((p["metadata"].get("labels") or {}).get(k) == v for k, v in selector.items())
                and (p.get("status") or {}).get("phase") not in TERMINAL
            ]
            expected = len(covered)
            healthy = sum(1 for p in covered if (p.get("status") or {}).get("phase") == "Running")
            spec = budget["spec"]

            def scaled(value: Any) -> int:
                if isinstance(value, str) and value.endswith("%"):
                    return -(-expected * int(value[:-1]) // 100)
                return int(value)

            if "minAvailable" in spec:
                desired = scaled(spec["minAvailable"])
            elif "maxUnavailable" in spec:
                desired = max(0, expected - scaled(spec["maxUnavailable"]))
            else:
                desired = expected
            if healthy - desired < 1:
                name = budget["metadata"]["name"]
                raise _fail(
                    429,
                    "TooManyRequests",
                    "Cannot evict pod as it would violate the pod's disruption budget.",
                    {
                        "causes": [
                            {
                                "reason": "DisruptionBudget",
                                "message": f"The disruption budget {name} needs "
                                f"{desired} healthy pods and has {healthy} currently",
                            }
                        ]
                    },
                )
        self._check_uid(route, pod, (body or {}).get("deleteOptions") if isinstance(body, dict) else None)
        del self._objects[self._key(route)]
        self._controllers(pod)
        return (
            201,
            {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201},
            {},
        )

    @staticmethod
    def _owner(pod: dict[str, Any]) -> dict[str, Any] | None:
        refs = pod["metadata"].get("ownerReferences") or []
        return next((r for r in refs if r.get("controller")), None)

    def _count_owner(self, pod: dict[str, Any]) -> None:
        if pod.get("kind") != "Pod" or not (owner := self._owner(pod)):
            return
        suffix = pod["metadata"]["name"].rpartition("-")[2]
        key = f"{owner['kind']}/{pod['metadata'].get('namespace', '')}/{owner['name']}"
        if suffix.isdigit():
            self._owner_next[key] = max(self._owner_next.get(key, 0), int(suffix) + 1)

    def _schedulable(self) -> list[str]:
        names = []
        for (_, plural, _, name), node in sorted(self._objects.items()):
            if plural != "nodes":
                continue
            ready = any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in (node.get("status") or {}).get("conditions", [])
            )
            spec = node.get("spec") or {}
            blocked = any(t.get("effect") in ("NoSchedule", "NoExecute") for t in spec.get("taints") or [])
            if ready and not spec.get("unschedulable") and not blocked:
                names.append(name)
        return names

    def _controllers(self, gone: dict[str, Any]) -> None:
        """What the DaemonSet, ReplicaSet and Job controllers do when one of their pods goes away."""
        if gone.get("kind", "Pod") != "Pod" or "spec" not in gone or not (owner := self._owner(gone)):
            return
        phase = (gone.get("status") or {}).get("phase")
        node = (gone.get("spec") or {}).get("nodeName", "")
        if owner["kind"] == "DaemonSet":
            if ("v1", "nodes", "", node) not in self._objects:
                return
        elif owner["kind"] in ("ReplicaSet", "Job") and phase not in TERMINAL:
            load = dict.fromkeys(self._schedulable(), 0)
            for (_, plural, _, _), pod in self._objects.items():
                where = (pod.get("spec") or {}).get("nodeName")
                if (
                    plural == "pods"
                    and where in load
                    and (pod.get("status") or {}).get("phase") not in TERMINAL
                ):
                    load[where] += 1
            node = min(load, key=lambda n: (load[n], n)) if load else ""
        else:
            return
        ns = gone["metadata"].get("namespace", "")
        key = f"{owner['kind']}/{ns}/{owner['name']}"
        index = self._owner_next.get(key, 0)
        self._owner_next[key] = index + 1
        pod = copy.deepcopy(gone)
        pod["metadata"].update(name=f"{owner['name']}-{index}", uid=str(uuid.uuid4()))
        pod["spec"]["nodeName"] = node
        if not node:
            pod["spec"].pop("nodeName")
        pod["status"] = {"phase": "Running" if node else "Pending"}
        self._bump(pod)
        self._objects[("v1", "pods", ns, pod["metadata"]["name"])] = pod


class _Handler(BaseHTTPRequestHandler):
    owner: Emulator
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body leave at once, not 40 ms apart

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _serve(self) -> None:
        split = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(split.query).items()}
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        headers = {k.lower(): v for k, v in self.headers.items()}
        seen = Request(self.command, split.path, query, 0, headers.get("content-type", ""))
        with self.owner._lock:
            self.owner.requests.append(seen)  # on arrival, so a request still being answered counts
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            code, answer, extra = 400, status_body(400, "BadRequest", "the body is not JSON"), {}
        else:
            code, answer, extra = self.owner.handle(self.command, split.path, query, headers, body)
        seen.status = code
        data = json.dumps(answer).encode()
        try:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in extra.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up waiting (a slow answer)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve


def write_kubeconfig(
    path: Path, server: str, token: str | None = "emulator-token", context: str = "emulator"
) -> Path:
    """Write a kubeconfig whose context ``context`` points at ``server`` with a bearer token."""
    user: dict[str, Any] = {"token": token} if token else {}
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": context, "cluster": {"server": server}}],
        "users": [{"name": context, "user": user}],
        "contexts": [{"name": context, "context": {"cluster": context, "user": context}}],
        "current-context": context,
    }
    path.write_text(json.dumps(config))
    return path
