"""The cluster port's contract suite against the real API server (``tests/steps/cluster``'s third target,
beside the emulator and the simulated fleet).

A :class:`Plane` is a cluster of its own inside the session's control plane: a second kube-apiserver on the
same etcd under another ``--etcd-prefix`` (so its nodes are not the process kubelet's, and nothing of the
e2e tests shows), a kube-controller-manager of its own running the controllers the contract reads (garbage
collector, disruption, ReplicaSet, DaemonSet, Job), a kube-scheduler, and :class:`Kubelets`, a stand-in
for its nodes' kubelets: a bound pod starts, a pod deleted with a grace period goes. Before each test it is
emptied and a fleet seeded in it (:meth:`Plane.seed`); a test waits for the controllers and kubelets to
finish what a call set going with :meth:`Plane.settle`, where a real cluster is asynchronous.

dsx talks to it through a :class:`Proxy` (plain HTTP on loopback, as it talks to the emulator) that
forwards every request as a user of its own, the RBAC authorizer judging, and injects the faults a test
asks for: server errors answered without forwarding, and a writer of its own that changes the object
just before a write naming a resourceVersion (the API server then refuses that write itself).

The tests' fleets come from the simulated fleet's model (``load_fleet``); the plane adds what a real
cluster needs under them (namespaces and their default service accounts, the owners' objects) and nothing
a test reads.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from tests.e2e.cluster import Cluster, _free_port
from tests.e2e.pki import sign_client

__all__ = ["PREFIX", "TOUCHED", "USER", "Plane", "Proxy", "plane"]

#: Where the plane keeps its objects in the session's etcd.
PREFIX = "/dsx-contract"
#: The user dsx acts as on the plane (the proxy's client certificate).
USER = "dsx-contract"
#: The annotation the proxy's own writer changes to make a write naming a resourceVersion conflict.
TOUCHED = "contract.dsx.dev/touched"

#: Namespaces every fleet's objects and the tests' own objects go into.
NAMESPACES = (
    "default", "dsx", "gpu-ops", "gpu-operator", "serving", "research", "cert-manager", "monitoring",
)  # fmt: skip

#: kind -> (path of its group version, plural, namespaced): what a fleet seeds and a test leaves behind.
KINDS: dict[str, tuple[str, str, bool]] = {
    "Node": ("/api/v1", "nodes", False),
    "Pod": ("/api/v1", "pods", True),
    "Secret": ("/api/v1", "secrets", True),
    "ConfigMap": ("/api/v1", "configmaps", True),
    "Event": ("/api/v1", "events", True),
    "PodDisruptionBudget": ("/apis/policy/v1", "poddisruptionbudgets", True),
    "ReplicaSet": ("/apis/apps/v1", "replicasets", True),
    "DaemonSet": ("/apis/apps/v1", "daemonsets", True),
    "Job": ("/apis/batch/v1", "jobs", True),
    "Lease": ("/apis/coordination.k8s.io/v1", "leases", True),
    "Workflow": ("/apis/argoproj.io/v1alpha1", "workflows", True),
}

#: The owners' groups as an ownerReference names them.
OWNER_API = {"ReplicaSet": "apps/v1", "DaemonSet": "apps/v1", "Job": "batch/v1"}

VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")


class ApiError(RuntimeError):
    def __init__(self, status: int, text: str) -> None:
        super().__init__(f"{status}: {text[:500]}")
        self.status = status


class Api:
    """The plane as its administrator sees it: JSON over HTTPS with a client certificate."""

    def __init__(self, url: str, pki: Path, stem: str = "admin") -> None:
        self.url = url
        self.context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        self.context.load_cert_chain(str(pki / f"{stem}.crt"), str(pki / f"{stem}.key"))

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        allow: tuple[int, ...] = (),
    ) -> Any:
        """The answer's JSON; ``None`` for a status in ``allow``. A 429 is asked again after the time it
        names, as a client does (the API server answers one while a new resource's cache fills: "storage
        is (re)initializing").

        Raises:
            ApiError: any other status of 400 or more, or a 429 still after 30 s.
        """
        data = json.dumps(body).encode() if body is not None else None
        deadline = time.monotonic() + 30
        while True:
            request = urllib.request.Request(
                self.url + path,
                data=data,
                method=method,
                headers={"Content-Type": content_type, "Accept": "application/json"},
            )
            try:
                with urllib.request.urlopen(request, context=self.context, timeout=60) as response:
                    return json.loads(response.read() or b"{}")
            except urllib.error.HTTPError as exc:
                if exc.code in allow:
                    return None
                text = exc.read().decode(errors="replace")
                if exc.code != 429 or time.monotonic() > deadline:
                    raise ApiError(exc.code, text) from None
                time.sleep(min(1.0, float(exc.headers.get("Retry-After") or 1)))

    def path(self, kind: str, namespace: str = "", name: str = "") -> str:
        group, plural, namespaced = KINDS[kind]
        where = f"/namespaces/{namespace}" if namespaced and namespace else ""
        return f"{group}{where}/{plural}" + (f"/{name}" if name else "")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def _forward(self) -> None:
        self.server.proxy.forward(self)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _forward

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    proxy: Proxy


class Proxy:
    """Plain HTTP on loopback in front of the plane, as the user :data:`USER`; faults on demand."""

    def __init__(self, upstream: str, pki: Path, admin: Api) -> None:
        parsed = urllib.parse.urlsplit(upstream)
        self.host, self.port = parsed.hostname or "", parsed.port or 443
        self.context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        self.context.load_cert_chain(str(pki / f"{USER}.crt"), str(pki / f"{USER}.key"))
        self.admin = admin
        self.answers: list[int] = []
        self._errors = 0
        self._conflicts = 0
        self._touches = 0
        self._lock = threading.Lock()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.proxy = self
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def clear(self) -> None:
        with self._lock:
            self.answers.clear()
            self._errors = self._conflicts = 0

    def fail(self, count: int) -> None:
        """Answer the next ``count`` requests 500 without forwarding them."""
        with self._lock:
            self._errors += count

    def conflict(self, count: int) -> None:
        """Before each of the next ``count`` writes naming a resourceVersion, change the object."""
        with self._lock:
            self._conflicts += count

    def forward(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else b""
        with self._lock:
            failing = self._errors > 0
            self._errors -= failing
            touching = (
                not failing
                and self._conflicts > 0
                and handler.command in ("PUT", "PATCH")
                and _names_version(body)
            )
            self._conflicts -= touching
        if failing:
            status, data = 500, _status(500, "InternalError", "an error the test injected")
        else:
            if touching:
                self._touch(handler.path)
            status, data = self._upstream(handler, body)
        with self._lock:
            self.answers.append(status)
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def _upstream(self, handler: BaseHTTPRequestHandler, body: bytes) -> tuple[int, bytes]:
        connection = http.client.HTTPSConnection(self.host, self.port, context=self.context, timeout=60)
        try:
            kept = ("content-type", "accept", "user-agent")
            headers = {k: v for k, v in handler.headers.items() if k.lower() in kept}
            connection.request(handler.command, handler.path, body=body or None, headers=headers)
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    def _touch(self, path: str) -> None:
        """Another writer changes the object ``path`` names, as a concurrent client would: a node's
        kubelet writes its status (the images it holds, which dsx never reads); anything else gets an
        annotation of :data:`TOUCHED`."""
        target = urllib.parse.urlsplit(path).path.removesuffix("/status")
        self._touches += 1
        if target.startswith("/api/v1/nodes/"):
            image = {"names": [f"registry.local/touched:{self._touches}"], "sizeBytes": self._touches}
            patch: dict[str, Any] = {"status": {"images": [image]}}
            target += "/status"
        else:
            patch = {"metadata": {"annotations": {TOUCHED: str(self._touches)}}}
        self.admin.call("PATCH", target, patch, "application/merge-patch+json")


def _names_version(body: bytes) -> bool:
    try:
        parsed = json.loads(body)
    except ValueError:
        return False
    return isinstance(parsed, dict) and bool((parsed.get("metadata") or {}).get("resourceVersion"))


def _status(code: int, reason: str, message: str) -> bytes:
    status = {"kind": "Status", "apiVersion": "v1", "status": "Failure"}
    return json.dumps({**status, "code": code, "reason": reason, "message": message}).encode()


class Kubelets:
    """What the kubelets of the plane's nodes do that the contract reads: a pod bound to a node starts
    (Running and Ready), and a pod deleted with a grace period (an eviction, a graceful delete) is gone
    once its containers stopped, both at once. Pods the fleet seeded keep the status it gave them."""

    def __init__(self, admin: Api) -> None:
        self.admin = admin
        self.seeded: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def pods(self) -> list[dict[str, Any]]:
        return list(self.admin.call("GET", "/api/v1/pods")["items"])

    def unfinished(self, pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The pods the scheduler or a kubelet has yet to act on: not yet judged by the scheduler (no
        node, no PodScheduled condition), bound and not started, or terminating."""
        return [
            p for p in pods if p["metadata"].get("deletionTimestamp") or self._to_start(p) or _unjudged(p)
        ]

    def _to_start(self, pod: dict[str, Any]) -> bool:
        return (
            bool(pod["spec"].get("nodeName"))
            and pod["metadata"]["uid"] not in self.seeded
            and (pod.get("status") or {}).get("phase", "Pending") == "Pending"
        )

    def _loop(self) -> None:
        while not self._stop.wait(0.05):
            with contextlib.suppress(ApiError, OSError):
                for pod in self.pods():
                    if pod["metadata"].get("deletionTimestamp") or self._to_start(pod):
                        self._act(pod)

    def _act(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        path = self.admin.path("Pod", meta["namespace"], meta["name"])
        if meta.get("deletionTimestamp"):
            body = {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}}
            self.admin.call("DELETE", path, body, allow=(404, 409))
            return
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        conditions = [
            {"type": kind, "status": "True", "lastTransitionTime": now}
            for kind in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
        ]
        status = {"phase": "Running", "startTime": now, "conditions": conditions}
        patch = {"metadata": {"uid": meta["uid"]}, "status": status}
        self.admin.call("PATCH", f"{path}/status", patch, "application/merge-patch+json", allow=(404, 409))


class Plane:
    """A cluster of its own for the contract suite; see the module's docstring."""

    def __init__(self, cluster: Cluster, url: str) -> None:
        self.cluster = cluster
        self.url = url
        self.admin = Api(url, cluster.pki)
        self.proxy = Proxy(url, cluster.pki, self.admin)
        self.kubelets = Kubelets(self.admin)
        self.forbidden: set[tuple[str, str]] = set()
        self.resources: list[str] = []

    # ------------------------------------------------------------------------------------- set-up

    def prepare(self) -> None:
        crds = self.cluster.argo_tree() / "manifests" / "base" / "crds" / "full"
        crd = yaml.safe_load((crds / "argoproj.io_workflows.yaml").read_text())
        path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
        self.admin.call("POST", path, crd, allow=(409,))

        def established() -> bool:
            conditions = (
                self.admin.call("GET", f"{path}/{crd['metadata']['name']}").get("status") or {}
            ).get("conditions") or []
            return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

        self._until(established, "the Workflow CRD established")
        for namespace in NAMESPACES:
            self.admin.call("POST", "/api/v1/namespaces", _named("Namespace", namespace), allow=(409,))
            account = {**_named("ServiceAccount", "default"), "apiVersion": "v1"}
            path = f"/api/v1/namespaces/{namespace}/serviceaccounts"
            self.admin.call("POST", path, account, allow=(409,))
        self.resources = self._discover()
        binding = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": USER},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": USER},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}],
        }
        self.admin.call("POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", binding)
        self._write_role()
        self._wait_allowed("get", "nodes", True)

    def _discover(self) -> list[str]:
        """Every resource and subresource name the plane serves."""
        names = {r["name"] for r in self.admin.call("GET", "/api/v1")["resources"]}
        for group in self.admin.call("GET", "/apis")["groups"]:
            version = group["preferredVersion"]["groupVersion"]
            names |= {r["name"] for r in self.admin.call("GET", f"/apis/{version}")["resources"]}
        return sorted(names)

    # ----------------------------------------------------------------------------------- per test

    def reset(self) -> None:
        """Empty the plane: every object a fleet or a test made, faults and refusals gone. The owners go
        first, so that no controller replaces a pod deleted here; each kind is deleted in the namespaces
        that hold one."""
        self.proxy.clear()
        if self.forbidden:
            self.forbidden.clear()
            self._write_role()
            self._wait_allowed("get", "nodes", True)
        owners_first = sorted((k for k in KINDS if KINDS[k][2]), key=lambda kind: kind not in OWNER_API)
        for kind in owners_first:
            items = self.admin.call("GET", self.admin.path(kind))["items"]
            held = {item["metadata"]["namespace"] for item in items}
            body = {"gracePeriodSeconds": 0} if kind == "Pod" else {"propagationPolicy": "Background"}
            for namespace in sorted(held):
                self.admin.call("DELETE", self.admin.path(kind, namespace), body, allow=(404,))
        self.admin.call("DELETE", "/api/v1/nodes")
        self._until(lambda: not self.kubelets.pods(), "the pods deleted")
        self.kubelets.seeded.clear()

    def seed(self, manifests: list[dict[str, Any]]) -> None:
        """Create a fleet: its nodes, Ready as the node lifecycle controller leaves a Ready node (without
        the not-ready taint admission gives every new node); its pods with their status, then their owners,
        whose controllers adopt them (as they adopt the pods that match them); then the budgets, once
        every controller has caught up."""
        pods = [m for m in manifests if m["kind"] == "Pod"]
        for manifest in manifests:
            if manifest["kind"] not in ("Pod", "PodDisruptionBudget"):
                created = self._create(manifest)
                if manifest["kind"] == "Node":
                    self._ready(created)
        for pod in pods:
            self._create_pod(pod)
        owners = _owners(pods)
        for (kind, namespace, name), members in owners.items():
            self._create(_owner(kind, namespace, name, members))
        self._until(
            lambda: self._adopted(len([p for p in pods if p["metadata"].get("ownerReferences")])), "adoption"
        )
        for manifest in manifests:
            if manifest["kind"] == "PodDisruptionBudget":
                self._create(manifest)
        self.settle()

    def _ready(self, node: dict[str, Any]) -> None:
        taints = [t for t in node["spec"].get("taints") or [] if t["key"] != "node.kubernetes.io/not-ready"]
        if taints != (node["spec"].get("taints") or []):
            patch = {
                "metadata": {"resourceVersion": node["metadata"]["resourceVersion"]},
                "spec": {"taints": taints},
            }
            self.admin.call(
                "PATCH",
                self.admin.path("Node", name=node["metadata"]["name"]),
                patch,
                "application/merge-patch+json",
            )

    def _adopted(self, owned: int) -> bool:
        return sum(1 for p in self.kubelets.pods() if p["metadata"].get("ownerReferences")) >= owned

    def _create(self, manifest: dict[str, Any]) -> Any:
        meta = manifest["metadata"]
        namespace = meta.get("namespace") or ("default" if KINDS[manifest["kind"]][2] else "")
        kept = {k: v for k, v in meta.items() if k not in ("uid", "resourceVersion")}
        clean = {**manifest, "metadata": kept}
        return self.admin.call("POST", self.admin.path(manifest["kind"], namespace), clean)

    def _create_pod(self, pod: dict[str, Any]) -> None:
        """A pod as an orphan (its owner adopts it), then its status, as its kubelet wrote it."""
        meta = {k: v for k, v in pod["metadata"].items() if k != "ownerReferences"}
        status = pod.get("status") or {}
        created = self._create({k: v for k, v in {**pod, "metadata": meta}.items() if k != "status"})
        self.kubelets.seeded.add(created["metadata"]["uid"])
        if status:
            path = self.admin.path("Pod", meta.get("namespace") or "default", meta["name"]) + "/status"
            self.admin.call("PATCH", path, {"status": status}, "application/merge-patch+json")

    def settle(self) -> None:
        """Wait for what a call set going to end: no pod left for the scheduler or a kubelet, every controller
        caught up with its object (a ReplicaSet's replicas, a DaemonSet's pods, a Job's active pods) and
        the disruption controller with every budget's healthy pods."""
        self._until(
            lambda: not self.kubelets.unfinished(self.kubelets.pods()),
            "the scheduler's and kubelets' work done",
        )
        self._until(self._caught_up, "the controllers caught up")

    def _caught_up(self) -> bool:
        pods = [p for p in self.kubelets.pods() if not p["metadata"].get("deletionTimestamp")]
        for kind in ("ReplicaSet", "DaemonSet", "Job", "PodDisruptionBudget"):
            for item in self.admin.call("GET", self.admin.path(kind))["items"]:
                status = item.get("status") or {}
                if any(c.get("reason") == "SyncFailed" for c in status.get("conditions") or []):
                    continue  # a budget the disruption controller failed safe on (a Job's pods: no scale)
                if status.get("observedGeneration", 1) < item["metadata"].get("generation", 1):
                    return False
                if not _caught_up(kind, item["spec"], status, _selected(item, pods)):
                    return False
        return True

    # --------------------------------------------------------------------------------------- RBAC

    def forbid(self, verb: str, resource: str) -> None:
        """RBAC no longer grants :data:`USER` ``verb`` on ``resource`` (``nodes``, ``pods/eviction``)."""
        self.forbidden.add((verb, resource))
        self._write_role()
        self._wait_allowed(verb, resource, False)

    def _write_role(self) -> None:
        refused = {r for _, r in self.forbidden}
        rules: list[dict[str, Any]] = [{"nonResourceURLs": ["*"], "verbs": ["get"]}]
        if refused:
            others = [r for r in self.resources if r not in refused]
            rules.append({"apiGroups": ["*"], "resources": others, "verbs": ["*"]})
            for resource in sorted(refused):
                verbs = [v for v in VERBS if (v, resource) not in self.forbidden]
                rules.append({"apiGroups": ["*"], "resources": [resource], "verbs": verbs})
        else:
            rules.append({"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]})
        role = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": USER},
            "rules": rules,
        }
        path = f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{USER}"
        if self.admin.call("GET", path, allow=(404,)) is None:
            self.admin.call("POST", "/apis/rbac.authorization.k8s.io/v1/clusterroles", role)
        else:
            self.admin.call("PUT", path, role)

    def _wait_allowed(self, verb: str, resource: str, allowed: bool) -> None:
        plural, _, sub = resource.partition("/")
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": USER,
                "groups": ["system:authenticated"],
                "resourceAttributes": {"verb": verb, "resource": plural, "subresource": sub, "group": "*"},
            },
        }
        path = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
        self._until(
            lambda: bool(self.admin.call("POST", path, review)["status"].get("allowed")) == allowed,
            f"RBAC {'granting' if allowed else 'refusing'} {verb} {resource}",
        )

    @staticmethod
    def _until(check: Any, what: str, seconds: float = 30.0) -> None:
        deadline = time.monotonic() + seconds
        while not check():
            if time.monotonic() > deadline:
                raise RuntimeError(f"contract plane: {what} not within {seconds:.0f} s")
            time.sleep(0.05)


def _selected(owner: dict[str, Any], pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pods in ``owner``'s namespace its selector's labels match (an empty selector: all of them; a
    budget without one: none)."""
    selector = owner["spec"].get("selector")
    if selector is None:
        return []
    wanted = selector.get("matchLabels") or {}
    namespace = owner["metadata"]["namespace"]
    return [
        p
        for p in pods
        if p["metadata"]["namespace"] == namespace
        and all((p["metadata"].get("labels") or {}).get(k) == v for k, v in wanted.items())
    ]


def _caught_up(kind: str, spec: dict[str, Any], status: dict[str, Any], pods: list[dict[str, Any]]) -> bool:
    if kind == "ReplicaSet":
        return status.get("replicas", 0) == spec.get("replicas", 1) == len(pods)
    if kind == "DaemonSet":
        return status.get("currentNumberScheduled", -1) == status.get("desiredNumberScheduled", -2)
    if kind == "Job":
        return spec.get("suspend") or status.get("active", 0) == spec.get("parallelism", 1)
    ready = [p for p in pods if _ready(p)]
    return not status.get("disruptedPods") and status.get("currentHealthy", -1) == len(ready)


def _unjudged(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return not pod["spec"].get("nodeName") and not any(c["type"] == "PodScheduled" for c in conditions)


def _ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def _named(kind: str, name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": kind, "metadata": {"name": name}}


def _owners(pods: list[dict[str, Any]]) -> dict[tuple[str, str, str], list[dict[str, Any]]]:
    found: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for pod in pods:
        namespace = pod["metadata"].get("namespace") or "default"
        for ref in pod["metadata"].get("ownerReferences") or []:
            found.setdefault((ref["kind"], namespace, ref["name"]), []).append(pod)
    return found


def _owner(kind: str, namespace: str, name: str, pods: list[dict[str, Any]]) -> dict[str, Any]:
    """The object owning ``pods``: a selector and a template their shared labels match, as many
    replicas as there are pods (a DaemonSet replaces no pod it finds: ``OnDelete``)."""
    labels = [p["metadata"].get("labels") or {} for p in pods]
    common = {k: v for k, v in labels[0].items() if all(other.get(k) == v for other in labels)}
    if not common:
        raise ValueError(f"{kind} {namespace}/{name}: its pods share no label to select them by")
    container = pods[0]["spec"]["containers"][0]
    template = {
        "metadata": {"labels": common},
        "spec": {
            "containers": [{"name": container["name"], "image": container["image"]}],
            **({"restartPolicy": "Never"} if kind == "Job" else {}),
        },
    }
    spec: dict[str, Any] = {"selector": {"matchLabels": common}, "template": template}
    if kind == "Job":
        spec |= {"parallelism": len(pods), "manualSelector": True}
    elif kind == "ReplicaSet":
        spec["replicas"] = len(pods)
    else:
        spec["updateStrategy"] = {"type": "OnDelete"}
    meta = {"name": name, "namespace": namespace}
    return {"apiVersion": OWNER_API[kind], "kind": kind, "metadata": meta, "spec": spec}


@contextlib.contextmanager
def plane(cluster: Cluster) -> Iterator[Plane]:
    """A :class:`Plane` in ``cluster`` while the block runs; every process of it stopped when it ends."""
    sign_client(cluster.pki, USER, USER)
    with cluster.apiserver("contract-apiserver", f"--etcd-prefix={PREFIX}") as url:
        kubeconfig = cluster.kubeconfig_for(url, "admin", "contract-controllers")
        argv = [
            str(cluster.bin / "kube-controller-manager"),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--controllers=garbagecollector,disruption,replicaset,daemonset,job",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={_free_port()}",
        ]
        scheduler = [
            str(cluster.bin / "kube-scheduler"),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={_free_port()}",
        ]
        with cluster.running("contract-controllers", argv), cluster.running("contract-scheduler", scheduler):
            made = Plane(cluster, url)
            made.prepare()
            made.proxy.start()
            made.kubelets.start()
            try:
                yield made
            finally:
                made.kubelets.stop()
                made.proxy.stop()
