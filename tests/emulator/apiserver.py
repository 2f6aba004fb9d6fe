"""An emulated Kubernetes API server with the controllers dsx relies on: real HTTP on 127.0.0.1, in a thread.

It speaks the JSON the kubernetes client expects, for every call dsx makes:

- any kind under ``/api/v1`` and ``/apis/GROUP/VERSION``, namespaced or not: get, list (with
  ``labelSelector`` and ``fieldSelector``), create (with ``generateName``), replace, merge patch,
  strategic merge patch (conditions, addresses, containers... merged by key), delete;
- ``resourceVersion`` on every object, bumped on every write; a write naming a stale one gets 409;
- the status subresource (``/status`` changes only ``status``; the main resource ignores it);
- the eviction subresource, refusing with 429 and the API's message while a PodDisruptionBudget
  allows no disruption (500 when two budgets select the pod), by the budget's status as the
  disruption controller writes it (see below);
- a delete, or an eviction's ``deleteOptions``, whose ``preconditions.uid`` names another object than the
  one stored gets 409 (for an eviction after the budget check, as in the API server);
- RBAC refusals (403) and a bearer token check (401), both configurable;
- fault injection: N answers with a status (500, 503, 429...), N injected conflicts, slow answers.

It is as strict as the real API server and controllers of Kubernetes 1.33 where dsx depends on them.
Each rule, with where Kubernetes defines it (paths in kubernetes/kubernetes):

- 422 ``KIND.GROUP "NAME" is invalid: FIELD: ...`` with causes; 409 AlreadyExists, 404 NotFound and
  409 Conflict naming ``RESOURCE.GROUP``: apimachinery ``pkg/api/errors/errors.go``,
  ``pkg/util/validation/field/errors.go``.
- Node Events: core/v1 without ``eventTime`` only in ``default`` (or none), with it only in
  ``default``/``kube-system`` plus reportingComponent, reportingInstance, action and reason;
  events.k8s.io/v1 also needs eventTime, a Normal/Warning type and no deprecated fields:
  ``pkg/apis/core/validation/events.go``.
- DeleteOptions from the body when there is one, else from the query:
  apiserver ``pkg/endpoints/handlers/delete.go``.
- ``propagationPolicy`` (or deprecated ``orphanDependents``); batch/v1 Jobs default to Orphan, all else to
  Background: ``pkg/registry/batch/job/strategy.go`` DefaultGarbageCollectionPolicy.
- Orphan/Foreground add the ``orphan``/``foregroundDeletion`` finalizer; an object with finalizers gets a
  deletionTimestamp, keeps its name taken and leaves when they are gone:
  apiserver ``pkg/registry/generic/registry/store.go``.
- Garbage collector: a dependent whose owners (by uid) are all gone is deleted, one with a live owner loses
  the dangling references, Foreground owners go after their dependents, Orphan strips the references:
  ``pkg/controller/garbagecollector/garbagecollector.go``.
- Job defaults (completions/parallelism 1, backoffLimit 6, NonIndexed, TerminatingOrFailed):
  ``pkg/apis/batch/v1/defaults.go``; generated selector and ``(batch.kubernetes.io/)job-name``,
  ``controller-uid`` template labels: ``pkg/registry/batch/job/strategy.go`` generateSelector; restartPolicy
  Never/OnFailure, completions for Indexed: ``pkg/apis/batch/validation/validation.go``.
- Job controller: startTime on first sight; pods ``JOB-INDEX-xxxxx`` with the job-tracking finalizer, a
  controller ownerReference, index label and annotation, env ``JOB_COMPLETION_INDEX`` from the label,
  hostname ``JOB-INDEX``; a pod Failed or deleted before it succeeded counts as failed; backoffLimit
  (BackoffLimitExceeded); backoffLimitPerIndex (backoffLimit then defaults to MaxInt32; an index whose
  failed pods exceed it is failed, never started again, listed in ``failedIndexes``; once every index has
  succeeded or failed, FailedIndexes; maxFailedIndexes, MaxFailedIndexesExceeded); activeDeadlineSeconds
  from startTime, Pending included (DeadlineExceeded: active pods deleted); FailureTarget then Failed once
  nothing terminates; SuccessCriteriaMet then Complete (CompletionsReached) and completionTime; replacements
  after a back-off of 10 s doubling (at most 10 min); orphan pods lose the tracking finalizer:
  ``pkg/controller/job/job_controller.go``, ``indexed_job_utils.go``, ``backoff_utils.go``.
  Not modelled: ttlSecondsAfterFinished (finished Jobs stay), suspend, podFailurePolicy, successPolicy,
  the per-index back-off delay (the Job's own is used).
- Pods: requests default to limits: ``pkg/apis/core/v1/defaults.go``; not-ready/unreachable NoExecute
  tolerations for 300 s: ``plugin/pkg/admission/defaulttolerationseconds``; a service account other than
  ``default`` must exist (403): ``plugin/pkg/admission/serviceaccount``.
- Scheduler (bind, filters, FitError message): :mod:`tests.emulator.kubelet`, run in the control loop here.
  Kubelet: :class:`tests.emulator.kubelet.Kubelet`, started separately (``emulated_cluster``).
- Graceful pod deletion: a bound, unfinished pod on a node a kubelet double runs gets deletionTimestamp
  now + its grace period (DeleteOptions' gracePeriodSeconds, else terminationGracePeriodSeconds, 30) and
  stays, holding its node's resources, until the kubelet confirms its containers stopped:
  ``pkg/registry/core/pod/strategy.go`` CheckGracefulDelete. With no kubelet double it leaves at once.
  A node the kubelet double holds ``down`` confirms nothing: its pods stay terminating, until the pod
  garbage collector's rule for a node not Ready with the taint ``node.kubernetes.io/out-of-service``
  removes them (``pkg/controller/podgc/gc_controller.go`` gcTerminating; the e2e tier compares).
- Disruption controller: a budget's status (currentHealthy: ready pods not being deleted and not in
  disruptedPods for less than 2 minutes; desiredHealthy and expectedPods: an integer minAvailable
  over every matching pod, maxUnavailable or a percentage over the scale of the pods' controllers, a
  pod whose controller has no scale (a Job's) failing safe with no disruption allowed;
  disruptionsAllowed, never while no pod is expected): ``pkg/controller/disruption/disruption.go``.
  Eviction: pending, finished and terminating pods go without a check; a budget with an empty selector
  guards every pod of its namespace (policy/v1; the real API server refuses the eviction so), one without
  a selector none; an unready
  pod goes while the budget is met; else the stored status must allow a disruption (429 while its
  observedGeneration lags), which the eviction decrements and records in disruptedPods:
  ``pkg/registry/core/pod/storage/eviction.go``. With the controllers running, the status is brought up
  to date before each eviction (a controller that has seen every change).
  Seeded outside controllers have the scale of their seeded pods.
- Events live ``event_ttl`` seconds (1 h, the API server's default ``--event-ttl``) from their last
  write, as each write leases them in etcd: ``pkg/registry/core/event/storage/storage.go`` (TTLFunc), the
  lease a little longer by ``k8s.io/apiserver`` ``pkg/storage/etcd3/lease_manager.go`` (at most 5%).
- Not modelled: namespaces need not exist; no watch; no server-side apply; no priorities or preemption.
- Seeded pods whose owners are not seeded (a simulated fleet's ReplicaSets, DaemonSets and Jobs) belong
  to controllers outside the store: the garbage collector keeps them, and one that goes away is replaced
  at once (on the least loaded schedulable node, a DaemonSet's on its node), as the simulated fleet does.

The controllers run in a background thread that wakes on every write and at the next deadline;
with ``controllers=False`` they run only when a test calls :meth:`Emulator.settle`. Time comes from
``clock`` (epoch seconds; :class:`ManualClock` for tests that move time by hand). Everything the
emulator received is in :attr:`Emulator.requests`. The rules are written here independently of the
simulated fleet in ``steps.cluster.sim``, so the contract tests compare two implementations.
"""

from __future__ import annotations

import base64
import copy
import datetime as dt
import functools
import heapq
import json
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

__all__ = ["Emulator", "ManualClock", "Request", "status_body", "write_kubeconfig"]

KINDS = {
    "nodes": "Node",
    "pods": "Pod",
    "configmaps": "ConfigMap",
    "secrets": "Secret",
    "events": "Event",
    "namespaces": "Namespace",
    "services": "Service",
    "serviceaccounts": "ServiceAccount",
    "leases": "Lease",
    "poddisruptionbudgets": "PodDisruptionBudget",
    "deployments": "Deployment",
    "daemonsets": "DaemonSet",
    "replicasets": "ReplicaSet",
    "statefulsets": "StatefulSet",
    "jobs": "Job",
}
CLUSTER_SCOPED = {
    "nodes",
    "namespaces",
    "persistentvolumes",
    "clusterroles",
    "clusterrolebindings",
    "priorityclasses",
    "storageclasses",
    "customresourcedefinitions",
    "clusterworkflowtemplates",
}
WITH_STATUS = {
    "nodes",
    "pods",
    "deployments",
    "daemonsets",
    "replicasets",
    "statefulsets",
    "jobs",
    "poddisruptionbudgets",
}
SMP_KEYS = {"conditions": "type", "addresses": "type", "containers": "name", "volumes": "name", "env": "name"}
TERMINAL = ("Succeeded", "Failed")
OUT_OF_SERVICE = "node.kubernetes.io/out-of-service"
SCALED = ("ReplicaSet", "StatefulSet", "Deployment", "ReplicationController")  # kinds with a scale

# Finalizers and labels the API server and the Job controller use (batch/v1 types.go).
ORPHAN = "orphan"
FOREGROUND = "foregroundDeletion"
JOB_TRACKING = "batch.kubernetes.io/job-tracking"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
CONTROLLER_UID = "batch.kubernetes.io/controller-uid"
JOB_NAME = "batch.kubernetes.io/job-name"
JOB_BACKOFF_S = 10.0
JOB_BACKOFF_MAX_S = 600.0
GENERATED_NAME_MAX = 58  # names.MaxGeneratedNameLength: 63 minus the 5 random characters
SUCCESS_MESSAGE = "Reached expected number of succeeded pods"

Key = tuple[str, str, str, str]  # group/version, plural, namespace ("" if none), name


class ManualClock:
    """A clock a test moves by hand (epoch seconds); pass it as ``Emulator(clock=...)``."""

    def __init__(self, start: float = 1_740_830_400.0) -> None:  # 2025-03-01T12:00:00Z
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move time forward (then call :meth:`Emulator.settle`, or let the control loop notice)."""
        self.now += seconds


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

    @property
    def group(self) -> str:
        return self.group_version.rpartition("/")[0]

    @property
    def qualified(self) -> str:
        """``jobs.batch``, ``pods``: the GroupResource as the API server spells it in messages."""
        return f"{self.plural}.{self.group}" if self.group else self.plural


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
        body["details"] = {k: v for k, v in details.items() if v not in ("", None)}
    return body


def _fail(code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> _Answer:
    return _Answer(code, status_body(code, reason, message, details))


@dataclass(frozen=True)
class _FieldError:
    """One field error, printed as apimachinery's ``field.Error`` prints it."""

    kind: str  # FieldValueInvalid, FieldValueRequired, FieldValueNotSupported, FieldValueTooLong
    path: str
    value: Any = ""
    detail: str = ""

    def body(self) -> str:
        if self.kind == "FieldValueTooLong":
            return f"Too long: {self.detail}"
        words = {
            "FieldValueInvalid": "Invalid value",
            "FieldValueRequired": "Required value",
            "FieldValueNotSupported": "Unsupported value",
        }[self.kind]
        if self.kind == "FieldValueRequired":
            text = words
        elif isinstance(self.value, str):
            text = f"{words}: {json.dumps(self.value)}"
        else:
            text = f"{words}: {self.value}"
        return f"{text}: {self.detail}" if self.detail else text

    def __str__(self) -> str:
        return f"{self.path}: {self.body()}"


#: What a ConfigMap's data and binaryData may hold together, bytes: ``core.MaxSecretSize``
#: (kubernetes pkg/apis/core/types.go), which ``ValidateConfigMap`` holds the values to.
CONFIGMAP_MAX_BYTES = 1024 * 1024
#: The largest request body the API server reads: the generic apiserver's ``MaxRequestBodyBytes``
#: (k8s.io/apiserver pkg/server/config.go, 3 MiB); a larger one is answered 413 before any decoding.
#: Behind it etcd refuses a write over its ``--max-request-bytes`` (1.5 MiB by default).
MAX_REQUEST_BODY_BYTES = 3 * 1024 * 1024


def _check_configmap_size(route: _Route, obj: dict[str, Any]) -> None:
    """The API server refuses a ConfigMap whose values (binaryData decoded) exceed 1 MiB together, on
    create and on every update: ``ValidateConfigMap`` (pkg/apis/core/validation/validation.go) adds
    ``field.TooLong(field.NewPath(""), "", core.MaxSecretSize)``, which reads ``: Too long: may not be
    more than 1048576 bytes`` (apimachinery's ``field.TooLong``). Keys do not count."""
    if route.plural != "configmaps" or route.group_version != "v1":
        return
    size = sum(len(str(v).encode()) for v in (obj.get("data") or {}).values())
    for value in (obj.get("binaryData") or {}).values():
        try:
            size += len(base64.b64decode(str(value), validate=True))
        except ValueError:
            size += len(str(value)) * 3 // 4
    if size > CONFIGMAP_MAX_BYTES:
        name = (obj.get("metadata") or {}).get("name", "")
        detail = f"may not be more than {CONFIGMAP_MAX_BYTES} bytes"
        raise _invalid("ConfigMap", "", name, [_FieldError("FieldValueTooLong", "", "", detail)])


def _invalid(kind: str, group: str, name: str, errors: list[_FieldError]) -> _Answer:
    """422 as NewInvalid builds it: ``Kind.group "name" is invalid: [e1, e2]``."""
    texts = list(dict.fromkeys(str(e) for e in errors))
    qualified = f"{kind}.{group}" if group else kind
    aggregate = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
    return _fail(
        422,
        "Invalid",
        f'{qualified} "{name}" is invalid: {aggregate}',
        {
            "name": name,
            "group": group,
            "kind": kind,
            "causes": [{"reason": e.kind, "message": e.body(), "field": e.path} for e in errors],
        },
    )


def _now_text(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_time(text: str | None) -> float | None:
    if not text:
        return None
    return dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC).timestamp()


def plural_of(kind: str) -> str:
    """The API's plural of a kind (the emulator's own copy of the rule)."""
    for plural, known in KINDS.items():
        if known == kind:
            return plural
    lower = kind.lower()
    if lower.endswith(("s", "x", "ch", "sh")):
        return lower + "es"
    if lower.endswith("y") and len(lower) > 1 and lower[-2] not in "aeiou":
        return lower[:-1] + "ies"
    return lower + "s"


# ------------------------------------------------------------------------------- selectors and patches


def _label_matcher(selector: str) -> Callable[[dict[str, str]], bool]:
    """The test of a label selector, its terms read once (a list may test thousands of objects)."""
    tests: list[Callable[[dict[str, str]], bool]] = []
    for raw in re.split(r",(?![^()]*\))", selector):
        term = raw.strip()
        if not term:
            continue
        m = re.fullmatch(r"(\S+)\s+(in|notin)\s+\((.*)\)", term)
        if m:
            key, values, inside = m.group(1), {v.strip() for v in m.group(3).split(",")}, m.group(2) == "in"
            tests.append(lambda labels, k=key, vs=values, want=inside: (labels.get(k) in vs) == want)
        elif "!=" in term:
            key, value = (t.strip() for t in term.split("!=", 1))
            tests.append(lambda labels, k=key, v=value: labels.get(k) != v)
        elif "=" in term:
            key, value = (t.strip() for t in term.replace("==", "=").split("=", 1))
            tests.append(lambda labels, k=key, v=value: labels.get(k) == v)
        elif term.startswith("!"):
            tests.append(lambda labels, k=term[1:].strip(): k not in labels)
        else:
            tests.append(lambda labels, k=term: k in labels)
    return lambda labels: all(test(labels) for test in tests)


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


def _controller_ref(obj: dict[str, Any]) -> dict[str, Any] | None:
    refs = obj["metadata"].get("ownerReferences") or []
    return next((r for r in refs if r.get("controller")), None)


def _index_ranges(indexes: Iterable[int]) -> str:
    """``0-2,4``: completedIndexes as the Job controller writes them."""
    out: list[str] = []
    run: list[int] = []
    for i in sorted(set(indexes)):
        if run and i == run[-1] + 1:
            run.append(i)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [i]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def _parse_ranges(text: str) -> set[int]:
    found: set[int] = set()
    for part in filter(None, (text or "").split(",")):
        low, _, high = part.partition("-")
        found.update(range(int(low), int(high or low) + 1))
    return found


# ------------------------------------------------------------------------------- validation


def _validate_event(group_version: str, namespace: str, event: dict[str, Any]) -> list[_FieldError]:
    """ValidateEventCreate for core/v1 and events.k8s.io/v1 (field paths are the internal type's)."""
    strict = group_version == "events.k8s.io/v1"
    if strict:
        involved = event.get("regarding") or {}
        message = event.get("note") or ""
        old = {
            "firstTimestamp": event.get("deprecatedFirstTimestamp"),
            "lastTimestamp": event.get("deprecatedLastTimestamp"),
            "count": event.get("deprecatedCount"),
            "source": event.get("deprecatedSource"),
        }
        controller = event.get("reportingController") or ""
    else:
        involved = event.get("involvedObject") or {}
        message = event.get("message") or ""
        controller = event.get("reportingComponent") or ""
        old = {}
    errors: list[_FieldError] = []
    involved_ns = involved.get("namespace") or ""
    mismatch = _FieldError(
        "FieldValueInvalid", "involvedObject.namespace", involved_ns, "does not match event.namespace"
    )
    if not event.get("eventTime"):
        if not involved_ns:
            if namespace not in ("", "default"):
                errors.append(mismatch)
        elif namespace != involved_ns:
            errors.append(mismatch)
    else:
        if not involved_ns and namespace not in ("default", "kube-system"):
            errors.append(mismatch)
        if not controller:
            errors.append(_FieldError("FieldValueRequired", "reportingController"))
        for name, value in (
            ("reportingInstance", event.get("reportingInstance") or ""),
            ("action", event.get("action") or ""),
            ("reason", event.get("reason") or ""),
        ):
            if not value:
                errors.append(_FieldError("FieldValueRequired", name))
            elif len(value) > 128:
                errors.append(_FieldError("FieldValueInvalid", name, "", "can have at most 128 characters"))
        if len(message) > 1024:
            errors.append(_FieldError("FieldValueInvalid", "message", "", "can have at most 1024 characters"))
    if strict:
        if not event.get("eventTime"):
            errors.append(_FieldError("FieldValueRequired", "eventTime"))
        if event.get("type") not in ("Normal", "Warning"):
            errors.append(
                _FieldError("FieldValueInvalid", "type", "", f"has invalid value: {event.get('type') or ''}")
            )
        for name, value in old.items():
            if value:
                errors.append(_FieldError("FieldValueInvalid", name, "", "needs to be unset"))
    return errors


def _default_job(job: dict[str, Any]) -> list[_FieldError]:
    """The API server's defaults, generated selector and validation for a new batch/v1 Job."""
    spec = job.setdefault("spec", {})
    if spec.get("completions") is None and spec.get("parallelism") is None:
        spec["completions"] = 1
        spec["parallelism"] = 1
    spec.setdefault("parallelism", 1)
    # With backoffLimitPerIndex the whole Job's limit defaults to MaxInt32 (pkg/apis/batch/v1/defaults.go).
    spec.setdefault("backoffLimit", 6 if spec.get("backoffLimitPerIndex") is None else 2**31 - 1)
    spec.setdefault("completionMode", "NonIndexed")
    spec.setdefault("suspend", False)
    spec.setdefault("podReplacementPolicy", "TerminatingOrFailed")
    template = spec.setdefault("template", {})
    pod_spec = template.setdefault("spec", {})
    pod_spec.setdefault("restartPolicy", "Always")
    meta = job["metadata"]
    labels = template.setdefault("metadata", {}).setdefault("labels", {})
    for key in ("job-name", JOB_NAME):
        labels.setdefault(key, meta["name"])
    for key in ("controller-uid", CONTROLLER_UID):
        labels.setdefault(key, meta["uid"])
    if not spec.get("manualSelector"):
        spec.setdefault("selector", {}).setdefault("matchLabels", {}).setdefault(CONTROLLER_UID, meta["uid"])
    errors: list[_FieldError] = []
    if pod_spec["restartPolicy"] not in ("OnFailure", "Never"):
        errors.append(
            _FieldError(
                "FieldValueNotSupported",
                "spec.template.spec.restartPolicy",
                pod_spec["restartPolicy"],
                'supported values: "OnFailure", "Never"',
            )
        )
    if spec["completionMode"] == "Indexed" and spec.get("completions") is None:
        errors.append(
            _FieldError("FieldValueRequired", "spec.completions", "", "when completion mode is Indexed")
        )
    if spec["completionMode"] not in ("Indexed", "NonIndexed"):
        errors.append(
            _FieldError(
                "FieldValueNotSupported",
                "spec.completionMode",
                spec["completionMode"],
                'supported values: "NonIndexed", "Indexed"',
            )
        )
    return errors


POD_SECURITY_ENFORCE = "pod-security.kubernetes.io/enforce"
_BASELINE_CAPABILITIES = {
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
    "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
}  # fmt: skip


def _containers_phrase(names: list[str]) -> str:
    quoted = ", ".join(f'"{n}"' for n in names)
    return f"container {quoted}" if len(names) == 1 else f"containers {quoted}"


def pod_security_violations(pod: dict[str, Any], level: str) -> list[str]:
    """What the PodSecurity admission plugin says a pod violates at ``level`` (baseline, restricted), in its
    words and order (``k8s.io/pod-security-admission/policy``, the checks of version latest that dsx's pods
    meet): host namespaces, privileged, added capabilities, hostPath volumes; then, for restricted, volume
    types, allowPrivilegeEscalation, capabilities not dropping ALL or adding more than NET_BIND_SERVICE,
    runAsNonRoot, runAsUser 0, seccompProfile."""
    if level not in ("baseline", "restricted"):
        return []
    spec = pod.get("spec") or {}
    pod_sc = spec.get("securityContext") or {}
    containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
    problems = []
    hosts = [f"{k}=true" for k in ("hostNetwork", "hostPID", "hostIPC") if spec.get(k)]
    if hosts:
        problems.append(f"host namespaces ({', '.join(hosts)})")
    privileged = [c["name"] for c in containers if (c.get("securityContext") or {}).get("privileged")]
    if privileged:
        problems.append(
            f"privileged ({_containers_phrase(privileged)} must not set securityContext.privileged=true)"
        )
    for c in containers:
        added = ((c.get("securityContext") or {}).get("capabilities") or {}).get("add") or []
        extra = [a for a in added if a not in _BASELINE_CAPABILITIES]
        if extra:
            quoted = ", ".join(f'"{a}"' for a in extra)
            problems.append(
                f'non-default capabilities (container "{c["name"]}" must not include {quoted} in '
                "securityContext.capabilities.add)"
            )
    host_paths = [v["name"] for v in spec.get("volumes") or [] if "hostPath" in v]
    if host_paths:
        quoted = ", ".join(f'"{v}"' for v in host_paths)
        problems.append(
            f"hostPath volumes (volume {quoted})"
            if len(host_paths) == 1
            else f"hostPath volumes (volumes {quoted})"
        )
    if level == "baseline":
        return problems
    escalating = [
        c["name"]
        for c in containers
        if (c.get("securityContext") or {}).get("allowPrivilegeEscalation") is not False
    ]
    if escalating:
        problems.append(
            f"allowPrivilegeEscalation != false ({_containers_phrase(escalating)} must set "
            "securityContext.allowPrivilegeEscalation=false)"
        )
    undropped = [
        c["name"]
        for c in containers
        if "ALL" not in (((c.get("securityContext") or {}).get("capabilities") or {}).get("drop") or [])
    ]
    if undropped:
        problems.append(
            f"unrestricted capabilities ({_containers_phrase(undropped)} must set "
            'securityContext.capabilities.drop=["ALL"])'
        )
    root = [
        c["name"]
        for c in containers
        if (c.get("securityContext") or {}).get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is not True
    ]
    if root:
        who = f"pod or {_containers_phrase(root)}"
        problems.append(f"runAsNonRoot != true ({who} must set securityContext.runAsNonRoot=true)")
    seccomp = [
        c["name"]
        for c in containers
        if ((c.get("securityContext") or {}).get("seccompProfile") or pod_sc.get("seccompProfile") or {}).get(
            "type"
        )
        not in ("RuntimeDefault", "Localhost")
    ]
    if seccomp:
        problems.append(
            f"seccompProfile (pod or {_containers_phrase(seccomp)} must set "
            'securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost")'
        )
    return problems


def _default_pod(pod: dict[str, Any]) -> None:
    """Defaults and the DefaultTolerationSeconds admission plugin."""
    spec = pod.setdefault("spec", {})
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    account = spec.get("serviceAccountName") or spec.get("serviceAccount") or "default"
    spec["serviceAccountName"] = spec["serviceAccount"] = account
    for container in [*spec.get("containers", []), *spec.get("initContainers", [])]:
        resources = container.get("resources") or {}
        limits = resources.get("limits") or {}
        if limits:
            requests = dict(limits)
            requests.update(resources.get("requests") or {})
            container["resources"] = {**resources, "requests": requests}
    tolerations = spec.setdefault("tolerations", [])
    for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):
        if not any(
            t.get("key") in (key, None, "")
            and t.get("effect") in ("NoExecute", None, "")
            and (t.get("key") or t.get("operator") == "Exists")
            for t in tolerations
        ):
            tolerations.append(
                {"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
            )
    pod["status"] = {"phase": "Pending"}


# ------------------------------------------------------------------------------- the emulator


@dataclass
class Emulator:
    """The emulated API server. Use as a context manager, or call :meth:`start` and :meth:`stop`.

    Attributes:
        token: the bearer token every request must carry (``None`` accepts any).
        clock: the time, in epoch seconds (``time.time``, or a :class:`ManualClock`).
        controllers: run the garbage collector, the Job controller and the scheduler in a background
            thread (else only in :meth:`settle`).
        requests: every request received, in order.
    """

    token: str | None = "emulator-token"
    clock: Callable[[], float] = time.time
    controllers: bool = True
    requests: list[Request] = field(default_factory=list)
    _objects: dict[Key, dict[str, Any]] = field(default_factory=dict)
    _revision: int = 0
    _faults: list[_Fault] = field(default_factory=list)
    _conflicts: int = 0
    _forbidden: set[tuple[str, str]] = field(default_factory=set)
    _owner_next: dict[str, int] = field(default_factory=dict)
    _external_owners: set[str] = field(default_factory=set)
    _external_scale: dict[str, int] = field(default_factory=dict)  # outside controller uid -> its pods
    _created: dict[str, int] = field(default_factory=dict)  # uid -> creation order
    _job_start: dict[str, float] = field(default_factory=dict)  # uid -> when the controller first saw it
    _job_backoff: dict[str, tuple[int, float]] = field(default_factory=dict)  # uid -> (failures, last)
    _lock: threading.RLock = field(default_factory=threading.RLock)
    _server: ThreadingHTTPServer | None = None
    _running: bool = False
    _loop: threading.Thread | None = None
    #: Set by a kubelet double: whether it runs a node (its pods then get graceful deletion).
    kubelet: Callable[[str], bool] | None = None
    #: How long an Event lives after its last write, in seconds: the API server's ``--event-ttl`` (1 h by
    #: default), which gives every Event write an etcd lease of that length.
    event_ttl: float = 3600.0
    _event_expiry: list[tuple[float, int, Key]] = field(default_factory=list)  # a heap: (when, revision, key)

    def __post_init__(self) -> None:
        self.changed = threading.Condition(self._lock)
        self.generation = 0  # bumped on every write; wait on :attr:`changed` to see it move

    # ------------------------------------------------------------------ life cycle

    def start(self) -> str:
        """Start serving on a free port of 127.0.0.1 (and the control loop); returns the base URL."""
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
        if self.controllers:
            self._running = True
            self._loop = threading.Thread(target=self._control_loop, name="k8s-controllers", daemon=True)
            self._loop.start()
        return self.url

    def stop(self) -> None:
        """Stop serving and the control loop."""
        with self._lock:
            self._running = False
            self.changed.notify_all()
        if self._loop is not None:
            self._loop.join(timeout=5)
            self._loop = None
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
        """Store objects as they are (e.g. a simulated fleet's nodes, pods and budgets).

        Owners that seeded objects name but that are not seeded themselves stand for controllers
        outside the store: the garbage collector keeps their dependents.
        """
        with self._lock:
            batch = [copy.deepcopy(m) for m in manifests]
            uids = {o.get("metadata", {}).get("uid") for o in batch} | {
                o["metadata"].get("uid") for o in self._objects.values()
            }
            for obj in batch:
                gv = obj["apiVersion"]
                plural = plural_of(obj["kind"])
                meta = obj.setdefault("metadata", {})
                meta.setdefault("uid", str(uuid.uuid4()))
                for ref in meta.get("ownerReferences") or []:
                    if ref.get("uid") not in uids:
                        self._external_owners.add(str(ref.get("uid")))
                        if ref.get("controller") and plural == "pods":
                            uid = str(ref.get("uid"))
                            self._external_scale[uid] = self._external_scale.get(uid, 0) + 1
                if plural == "poddisruptionbudgets":
                    meta.setdefault("generation", 1)
                ns = meta.get("namespace", "") if plural not in CLUSTER_SCOPED else ""
                self._created[meta["uid"]] = len(self._created)
                self._bump(obj)
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

    def recover(self) -> None:
        """The API server is back: every failure and delay :meth:`fail` and :meth:`slow` injected and not
        yet spent ends now (conflicts and RBAC refusals stay)."""
        with self._lock:
            self._faults.clear()

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

    def get(self, plural: str, name: str, namespace: str = "") -> dict[str, Any] | None:
        """One stored object (any group), or ``None``."""
        with self._lock:
            for (_, p, ns, n), obj in self._objects.items():
                if p == plural and n == name and ns == ("" if plural in CLUSTER_SCOPED else namespace):
                    return copy.deepcopy(obj)
        return None

    def count(self, method: str, path_part: str = "") -> int:
        """Requests received of ``method`` whose path contains ``path_part``."""
        return sum(1 for r in self.requests if r.method == method and path_part in r.path)

    def update(
        self, plural: str, namespace: str, name: str, change: Callable[[dict[str, Any]], None], uid: str = ""
    ) -> dict[str, Any] | None:
        """Apply ``change`` to a stored object as a controller's write would (the kubelet double uses it).

        Returns the new object, or ``None`` when it is gone (or, with ``uid``, replaced by another).
        """
        with self._lock:
            found = next(
                (
                    (key, obj)
                    for key, obj in self._objects.items()
                    if key[1] == plural
                    and key[3] == name
                    and key[2] == ("" if plural in CLUSTER_SCOPED else namespace)
                ),
                None,
            )
            if found is None or (uid and found[1]["metadata"].get("uid") != uid):
                return None
            key, obj = found
            new = copy.deepcopy(obj)
            change(new)
            self._store(key, new)
            return copy.deepcopy(new) if key in self._objects else None

    def wake(self) -> None:
        """Let the control loop and the kubelet look again (after a change they cannot see as a write)."""
        with self._lock:
            self.generation += 1
            self.changed.notify_all()

    def settle(self, passes: int = 50) -> None:
        """Run the controllers (garbage collector, Job controller, scheduler) until nothing changes."""
        with self._lock:
            self._reconcile(passes)

    def now(self) -> float:
        """The emulator's time (epoch seconds)."""
        return self.clock()

    def job_deadline(self, namespace: str, name: str) -> float | None:
        """When the Job's activeDeadlineSeconds runs out (epoch seconds), if it has one and has started."""
        with self._lock:
            job = self._objects.get(("batch/v1", "jobs", namespace, name))
            deadline = ((job or {}).get("spec") or {}).get("activeDeadlineSeconds")
            start = self._job_start.get(str((job or {}).get("metadata", {}).get("uid")))
            return None if deadline is None or start is None else start + float(deadline)

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
                        f'resource "{route.verb_resource}" in API group "{route.group}" {scope}',
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
        if obj.get("kind") == "Event":
            meta = obj["metadata"]
            key = (str(obj.get("apiVersion")), "events", meta.get("namespace", ""), meta["name"])
            heapq.heappush(self._event_expiry, (self.clock() + self.event_ttl, self._revision, key))
        self.generation += 1
        self.changed.notify_all()

    def _not_found(self, route: _Route) -> _Answer:
        return _fail(
            404,
            "NotFound",
            f'{route.qualified} "{route.name}" not found',
            {"name": route.name, "group": route.group, "kind": route.plural},
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
                f'Operation cannot be fulfilled on {route.qualified} "{route.name}": the object '
                "has been modified; please apply your changes to the latest version and try again",
                {"name": route.name, "group": route.group, "kind": route.plural},
            )

    def _expire_events(self) -> None:
        """Drop the Events whose last write is older than :attr:`event_ttl`, as their etcd lease runs out
        (kubernetes ``pkg/registry/core/event/storage/storage.go``: a TTL on create and on update)."""
        now = self.clock()
        while self._event_expiry and self._event_expiry[0][0] <= now:
            _, revision, key = heapq.heappop(self._event_expiry)
            event = self._objects.get(key)
            if event is not None and event["metadata"].get("resourceVersion") == str(revision):
                del self._objects[key]  # written since: a later entry of the heap expires it

    def _serve(
        self, method: str, route: _Route, query: dict[str, str], headers: dict[str, str], body: Any
    ) -> tuple[int, dict[str, Any], dict[str, str]]:
        self._expire_events()
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
            policy, grace = self._delete_options(route, query, body)
            return 200, self._delete(self._key(route), policy, grace), {}
        if method == "PUT":
            if not isinstance(body, dict):
                raise _fail(400, "BadRequest", "the body is not a JSON object")
            self._check_version(route, current, (body.get("metadata") or {}).get("resourceVersion"))
            new = copy.deepcopy(body)
            new.setdefault("metadata", {})
            for kept in (
                "uid",
                "resourceVersion",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
            ):
                if kept in current["metadata"]:
                    new["metadata"][kept] = current["metadata"][kept]
            new["metadata"]["name"] = route.name
            if route.namespace:
                new["metadata"]["namespace"] = route.namespace
            if route.sub == "status":
                new = {**copy.deepcopy(current), "status": new.get("status", {})}
            elif route.plural in WITH_STATUS:
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
            for kept in ("uid", "deletionTimestamp", "deletionGracePeriodSeconds", "creationTimestamp"):
                if kept in current["metadata"]:
                    new["metadata"][kept] = current["metadata"][kept]
        else:
            raise _fail(405, "MethodNotAllowed", f"{method} is not supported here")
        _check_configmap_size(route, new)
        key = self._key(route)
        self._store(key, new)
        return 200, copy.deepcopy(new), {}

    def _store(self, key: Key, new: dict[str, Any]) -> None:
        """Write an object; one being deleted whose finalizers are all gone (and, for a pod, whose kubelet
        has confirmed) leaves the store."""
        meta = new["metadata"]
        if (
            meta.get("deletionTimestamp")
            and not meta.get("finalizers")
            and not meta.get("deletionGracePeriodSeconds")
        ):
            self._remove(key)
            return
        self._bump(new)
        self._objects[key] = new

    def _list(self, route: _Route, query: dict[str, str]) -> dict[str, Any]:
        selector, fields = query.get("labelSelector", ""), query.get("fieldSelector", "")
        for term in filter(None, fields.split(",")):
            if term.partition("=")[0] not in ("spec.nodeName", "metadata.name", "metadata.namespace"):
                raise _fail(400, "BadRequest", f'field label not supported: "{term.partition("=")[0]}"')
        labelled = _label_matcher(selector)
        items = [
            json.loads(json.dumps(obj))  # a copy; stored objects are JSON, and this is faster than deepcopy
            for (gv, plural, ns, _), obj in sorted(self._objects.items())
            if gv == route.group_version
            and plural == route.plural
            and (not route.namespace or ns == route.namespace)
            and labelled(obj["metadata"].get("labels") or {})
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
        kind = self._kind(route, body)
        if route.namespace:
            meta["namespace"] = route.namespace
        if route.plural == "events" and route.group_version in ("v1", "events.k8s.io/v1"):
            errors = _validate_event(route.group_version, route.namespace, obj)
            if errors:
                raise _invalid("Event", route.group, meta.get("name") or meta.get("generateName", ""), errors)
        if route.plural == "pods" and route.group_version == "v1":
            self._admit_pod(obj, route.namespace)
        _check_configmap_size(route, obj)
        return self._insert(route, obj, kind)

    def _insert(self, route: _Route, obj: dict[str, Any], kind: str) -> dict[str, Any]:
        """Name, uid, defaults and storage of a new object (the API's create after admission)."""
        meta = obj["metadata"]
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        if not meta.get("name"):
            raise _invalid(
                kind,
                route.group,
                "",
                [_FieldError("FieldValueRequired", "metadata.name", "", "name or generateName is required")],
            )
        key = self._key(route, meta["name"])
        if key in self._objects:
            raise _fail(
                409,
                "AlreadyExists",
                f'{route.qualified} "{meta["name"]}" already exists',
                {"name": meta["name"], "group": route.group, "kind": route.plural},
            )
        for read_only in ("deletionTimestamp", "deletionGracePeriodSeconds", "resourceVersion"):
            meta.pop(read_only, None)
        obj["apiVersion"] = route.group_version
        obj["kind"] = kind
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = _now_text(self.clock())
        if route.plural == "poddisruptionbudgets":
            meta["generation"] = 1
            obj["status"] = {}
        if route.plural == "jobs" and route.group_version == "batch/v1":
            meta["generation"] = 1
            errors = _default_job(obj)
            if errors:
                raise _invalid("Job", "batch", meta["name"], errors)
            obj["status"] = {}
        self._created[meta["uid"]] = len(self._created)
        self._bump(obj)
        self._objects[key] = obj
        self._count_owner(obj)
        return copy.deepcopy(obj)

    def _admit_pod(self, pod: dict[str, Any], namespace: str) -> None:
        _default_pod(pod)
        ns = self._objects.get(("v1", "namespaces", "", namespace)) or {}
        level = ((ns.get("metadata") or {}).get("labels") or {}).get(POD_SECURITY_ENFORCE, "privileged")
        problems = pod_security_violations(pod, level)
        if problems:
            meta = pod["metadata"]
            name = meta.get("name") or meta.get("generateName") or ""
            raise _fail(
                403,
                "Forbidden",
                f'pods "{name}" is forbidden: violates PodSecurity "{level}:latest": {", ".join(problems)}',
                {"name": name, "kind": "pods"},
            )
        account = pod["spec"]["serviceAccountName"]
        if account != "default" and ("v1", "serviceaccounts", namespace, account) not in self._objects:
            meta = pod["metadata"]
            name = meta.get("name") or meta.get("generateName") or ""
            subject = f'pods "{name}" is forbidden' if name else "pods is forbidden"
            raise _fail(
                403,
                "Forbidden",
                f"{subject}: error looking up service account {namespace}/{account}: "
                f'serviceaccount "{account}" not found',
                {"name": name, "kind": "pods"},
            )

    # ------------------------------------------------------------------ deletion and garbage collection

    def _delete_options(self, route: _Route, query: dict[str, str], body: Any) -> tuple[str, int | None]:
        """propagationPolicy and gracePeriodSeconds of a DELETE: the body's DeleteOptions if it has a
        body, else the query."""
        options: dict[str, Any] = body if isinstance(body, dict) else dict(query)  # a body, even {}, wins
        grace = options.get("gracePeriodSeconds")
        grace = None if grace is None else int(grace)
        policy = options.get("propagationPolicy")
        orphan = options.get("orphanDependents")
        if isinstance(orphan, str):
            orphan = orphan.lower() == "true"
        errors: list[_FieldError] = []
        if policy is not None and policy not in ("Orphan", "Background", "Foreground"):
            errors.append(
                _FieldError(
                    "FieldValueNotSupported",
                    "propagationPolicy",
                    policy,
                    'supported values: "Foreground", "Background", "Orphan", "nil"',
                )
            )
        if policy is not None and orphan is not None:
            errors.append(
                _FieldError(
                    "FieldValueInvalid",
                    "propagationPolicy",
                    policy,
                    "orphanDependents and deletionPropagation cannot be both set",
                )
            )
        if errors:
            raise _invalid("DeleteOptions", "meta.k8s.io", "", errors)
        if policy:
            return str(policy), grace
        if orphan is not None:
            return ("Orphan" if orphan else "Background"), grace
        # batch/v1 Jobs keep their pods unless told otherwise (back-compatibility of batch/v1).
        default = "Orphan" if (route.group_version, route.plural) == ("batch/v1", "jobs") else "Background"
        return default, grace

    def _grace_period(self, key: Key, obj: dict[str, Any], grace: int | None) -> int:
        """Seconds a pod being deleted keeps running: a bound, unfinished pod on a node a kubelet double
        runs gets its grace period (the options', else its terminationGracePeriodSeconds); any other
        object, or a pod no kubelet double runs, none."""
        node = (obj.get("spec") or {}).get("nodeName")
        if key[1] != "pods" or not node or _phase(obj) in TERMINAL or not self.kubelet_runs(node):
            return 0
        if grace is None:
            grace = int((obj.get("spec") or {}).get("terminationGracePeriodSeconds", 30))
        return max(0, grace)

    def kubelet_runs(self, node: str) -> bool:
        """Whether a kubelet double runs ``node`` (it then confirms its pods' deletions)."""
        return self.kubelet is not None and self.kubelet(node)

    def _delete(self, key: Key, policy: str, grace: int | None = None) -> dict[str, Any]:
        """Delete as the registry does: at once, or mark it and wait for its finalizers and, for a pod
        on a running node, for the kubelet to confirm its containers have stopped."""
        obj = copy.deepcopy(self._objects[key])
        meta = obj["metadata"]
        period = self._grace_period(key, obj, grace)
        if meta.get("deletionTimestamp"):
            if period < int(meta.get("deletionGracePeriodSeconds") or 0):
                meta["deletionGracePeriodSeconds"] = period  # a shorter grace period replaces a longer one
                self._store(key, obj)
            return copy.deepcopy(self._objects.get(key, obj))
        finalizers = list(meta.get("finalizers") or [])
        wanted = {"Orphan": ORPHAN, "Foreground": FOREGROUND}.get(policy)
        if wanted and wanted not in finalizers:
            finalizers.append(wanted)
        if not finalizers and not period:
            self._remove(key)
            return obj
        if finalizers:
            meta["finalizers"] = finalizers
        meta["deletionTimestamp"] = _now_text(self.clock() + period)
        meta["deletionGracePeriodSeconds"] = period
        self._store(key, obj)
        return copy.deepcopy(obj)

    def confirm_deletion(self, namespace: str, name: str, uid: str) -> None:
        """The kubelet's final word on a pod being deleted: its containers have stopped."""
        with self._lock:
            key = ("v1", "pods", namespace, name)
            pod = self._objects.get(key)
            if (
                pod is None
                or pod["metadata"].get("uid") != uid
                or not pod["metadata"].get("deletionTimestamp")
            ):
                return
            new = copy.deepcopy(pod)
            new["metadata"]["deletionGracePeriodSeconds"] = 0
            self._store(key, new)

    def _remove(self, key: Key) -> None:
        gone = self._objects.pop(key, None)
        if gone is None:
            return
        self.generation += 1
        self.changed.notify_all()
        self._job_start.pop(gone["metadata"].get("uid", ""), None)
        self._legacy_replace(gone)

    def _owner_of(self, ref: dict[str, Any], namespace: str) -> dict[str, Any] | None:
        plural = plural_of(str(ref.get("kind", "")))
        ns = "" if plural in CLUSTER_SCOPED else namespace
        owner = self._objects.get((str(ref.get("apiVersion", "")), plural, ns, str(ref.get("name", ""))))
        if owner is None or owner["metadata"].get("uid") != ref.get("uid"):
            return None
        return owner

    def _collect_garbage(self) -> bool:
        """One pass of the garbage collector; whether it changed anything."""
        changed = False
        dependents: dict[str, list[Key]] = {}
        for key, obj in self._objects.items():
            for ref in obj["metadata"].get("ownerReferences") or []:
                dependents.setdefault(str(ref.get("uid")), []).append(key)
        for key in list(self._objects):
            found = self._objects.get(key)
            if found is None or not found["metadata"].get("ownerReferences"):
                continue
            obj = found
            solid, gone, waiting = [], [], []
            for ref in obj["metadata"]["ownerReferences"]:
                owner = None if ref.get("uid") in self._external_owners else self._owner_of(ref, key[2])
                if ref.get("uid") in self._external_owners:
                    solid.append(ref)
                elif owner is None:
                    gone.append(ref)
                elif owner["metadata"].get("deletionTimestamp") and FOREGROUND in (
                    owner["metadata"].get("finalizers") or []
                ):
                    waiting.append(ref)
                else:
                    solid.append(ref)
            if not gone and not waiting:
                continue
            if solid:
                new = copy.deepcopy(obj)
                new["metadata"]["ownerReferences"] = solid
                self._store(key, new)
                changed = True
            elif not obj["metadata"].get("deletionTimestamp"):
                has_own = bool(dependents.get(obj["metadata"].get("uid", "")))
                self._delete(key, "Foreground" if waiting and has_own else "Background")
                changed = True
        for key in list(self._objects):
            found = self._objects.get(key)
            if found is None or not found["metadata"].get("deletionTimestamp"):
                continue
            obj = found
            finalizers = list(obj["metadata"].get("finalizers") or [])
            uid = obj["metadata"].get("uid", "")
            live = [k for k in dependents.get(uid, []) if k in self._objects]
            if ORPHAN in finalizers:
                for dep_key in live:
                    dep = copy.deepcopy(self._objects[dep_key])
                    refs = dep["metadata"].get("ownerReferences") or []
                    dep["metadata"]["ownerReferences"] = [r for r in refs if r.get("uid") != uid]
                    if not dep["metadata"]["ownerReferences"]:
                        dep["metadata"].pop("ownerReferences")
                    self._store(dep_key, dep)
                finalizers.remove(ORPHAN)
            elif FOREGROUND in finalizers and not live:
                finalizers.remove(FOREGROUND)
            else:
                continue
            new = copy.deepcopy(obj)
            new["metadata"]["finalizers"] = finalizers
            self._store(key, new)
            changed = True
        return changed

    def _set_finalizers(self, key: Key, finalizers: list[str]) -> None:
        new = copy.deepcopy(self._objects[key])
        new["metadata"]["finalizers"] = finalizers
        if not finalizers:
            new["metadata"].pop("finalizers")
        self._store(key, new)

    # ------------------------------------------------------------------ the control loop

    def _reconcile(self, passes: int = 50) -> None:
        from tests.emulator.kubelet import schedule_pending

        for _ in range(passes):
            changed = self._collect_garbage()
            changed = self._gc_out_of_service() or changed
            changed = self._sync_jobs() or changed
            changed = schedule_pending(self) or changed
            changed = self._sync_budgets() or changed
            if not changed:
                return

    def _gc_out_of_service(self) -> bool:
        """The pod garbage collector's rule for a node a person confirmed down: a terminating pod on a node
        that is not Ready and carries ``node.kubernetes.io/out-of-service`` is marked Failed and deleted
        with grace 0, so it leaves once its finalizers are gone (``pkg/controller/podgc/gc_controller.go``
        gcTerminating, markFailedAndDeletePod)."""
        down = {
            name
            for (_, plural, _, name), node in self._objects.items()
            if plural == "nodes"
            and any(t.get("key") == OUT_OF_SERVICE for t in (node.get("spec") or {}).get("taints") or [])
            and not any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in (node.get("status") or {}).get("conditions") or []
            )
        }
        gone = [
            key
            for key, pod in self._objects.items()
            if key[1] == "pods"
            and pod["metadata"].get("deletionTimestamp")
            and pod["metadata"].get("deletionGracePeriodSeconds")
            and (pod.get("spec") or {}).get("nodeName") in down
        ]
        for key in gone:
            pod = copy.deepcopy(self._objects[key])
            pod.setdefault("status", {})["phase"] = "Failed"
            pod["metadata"]["deletionGracePeriodSeconds"] = 0
            self._store(key, pod)
        return bool(gone)

    def _next_due(self) -> float:
        """Seconds until the next Job deadline or back-off ends (at most a quarter second)."""
        now = self.clock()
        due = now + 0.25
        for (gv, plural, _, _), job in self._objects.items():
            if (gv, plural) != ("batch/v1", "jobs") or self._job_finished(job):
                continue
            uid = job["metadata"]["uid"]
            deadline = (job.get("spec") or {}).get("activeDeadlineSeconds")
            if deadline is not None and uid in self._job_start:
                due = min(due, self._job_start[uid] + float(deadline))
            if uid in self._job_backoff:
                due = min(due, self._backoff_until(uid))
        return max(0.005, due - now)

    def _control_loop(self) -> None:
        with self._lock:
            while self._running:
                self._reconcile()
                seen = self.generation
                self.changed.wait_for(functools.partial(self._moved_from, seen), self._next_due())

    def _moved_from(self, seen: int) -> bool:
        return self.generation != seen or not self._running

    # ------------------------------------------------------------------ the Job controller

    @staticmethod
    def _condition(job: dict[str, Any], kind: str) -> dict[str, Any] | None:
        return next(
            (
                c
                for c in (job.get("status") or {}).get("conditions") or []
                if c.get("type") == kind and c.get("status") == "True"
            ),
            None,
        )

    def _job_finished(self, job: dict[str, Any]) -> bool:
        return bool(self._condition(job, "Complete") or self._condition(job, "Failed"))

    def _backoff_until(self, uid: str) -> float:
        failures, last = self._job_backoff[uid]
        return float(last + min(JOB_BACKOFF_S * 2 ** (failures - 1), JOB_BACKOFF_MAX_S))

    def _sync_jobs(self) -> bool:
        changed = False
        pods: dict[str, list[Key]] = {}
        for key, obj in self._objects.items():
            if key[1] == "pods" and (ref := _controller_ref(obj)) is not None:
                pods.setdefault(str(ref.get("uid")), []).append(key)
        for key, job in list(self._objects.items()):
            if (key[0], key[1]) == ("batch/v1", "jobs") and (job.get("spec") or {}).get("template"):
                changed = self._sync_job(key, job, pods.get(job["metadata"]["uid"], [])) or changed
        for key in [
            k
            for k, o in self._objects.items()
            if k[1] == "pods" and JOB_TRACKING in (o["metadata"].get("finalizers") or [])
        ]:
            pod = self._objects[key]
            ref = _controller_ref(pod)
            owner: dict[str, Any] | None = None
            if ref is not None and (ref.get("apiVersion"), ref.get("kind")) == ("batch/v1", "Job"):
                owner = self._owner_of(ref, key[2])
            if owner is None or self._job_finished(owner):
                self._set_finalizers(key, [f for f in pod["metadata"]["finalizers"] if f != JOB_TRACKING])
                changed = True
        return changed

    def _sync_job(self, key: Key, job: dict[str, Any], pod_keys: list[Key]) -> bool:
        """One syncJob: count pods, start, deadline, back-off limit, create pods, finish."""
        if self._job_finished(job):
            return False
        spec = job["spec"]
        meta = job["metadata"]
        uid = meta["uid"]
        status = copy.deepcopy(job.get("status") or {})
        now = self.clock()
        pods = [self._objects[k] for k in pod_keys if k in self._objects]
        indexed = spec.get("completionMode") == "Indexed"
        completions = spec.get("completions")

        active = [p for p in pods if _pod_active(p)]
        tracked = [p for p in pods if JOB_TRACKING in (p["metadata"].get("finalizers") or [])]
        new_failed = [p for p in tracked if _pod_failed(p)]
        new_succeeded = [p for p in tracked if _phase(p) == "Succeeded" and not _pod_failed(p)]
        if new_failed:
            failures = self._job_backoff.get(uid, (0, now))[0]
            self._job_backoff[uid] = (failures + len(new_failed), now)
        elif new_succeeded:
            self._job_backoff.pop(uid, None)
        failed = int(status.get("failed") or 0) + len(new_failed)
        succeeded_indexes = _parse_ranges(status.get("completedIndexes", ""))
        succeeded = int(status.get("succeeded") or 0)
        for p in new_succeeded:
            ix = _completion_index(p)
            if not indexed:
                succeeded += 1
            elif ix is not None and ix < int(completions):
                succeeded_indexes.add(ix)
        if indexed:
            succeeded = len(succeeded_indexes)
        failed_indexes = _parse_ranges(status.get("failedIndexes", ""))
        per_index = spec.get("backoffLimitPerIndex") if indexed else None
        if per_index is not None:
            # An index fails once its failed pods exceed the limit (job_controller.go, backoff per index).
            counts: dict[int, int] = {}
            for p in pods:
                ix = _completion_index(p)
                if ix is not None and _pod_failed(p):
                    counts[ix] = counts.get(ix, 0) + 1
            failed_indexes |= {ix for ix, n in counts.items() if n > int(per_index)}
            failed_indexes -= succeeded_indexes
        if uid not in self._job_start:
            start = _parse_time(status.get("startTime"))
            self._job_start[uid] = start if start is not None else now
        status.setdefault("startTime", _now_text(self._job_start[uid]))
        conditions = list(status.get("conditions") or [])

        def condition(kind: str, reason: str, message: str) -> dict[str, Any]:
            stamp = _now_text(now)
            return {
                "type": kind,
                "status": "True",
                "lastProbeTime": stamp,
                "lastTransitionTime": stamp,
                "reason": reason,
                "message": message,
            }

        finishing = self._condition(job, "SuccessCriteriaMet") or self._condition(job, "FailureTarget")
        if finishing is None:
            deadline = spec.get("activeDeadlineSeconds")
            most = spec.get("maxFailedIndexes")
            if failed > int(spec.get("backoffLimit", 6)):
                finishing = condition(
                    "FailureTarget", "BackoffLimitExceeded", "Job has reached the specified backoff limit"
                )
            elif per_index is not None and most is not None and len(failed_indexes) > int(most):
                finishing = condition(
                    "FailureTarget",
                    "MaxFailedIndexesExceeded",
                    "Job has exceeded the specified maximal number of failed indexes",
                )
            elif (
                failed_indexes
                and completions is not None
                and len(failed_indexes | succeeded_indexes) >= int(completions)
            ):
                finishing = condition("FailureTarget", "FailedIndexes", "Job has failed indexes")
            elif deadline is not None and now - self._job_start[uid] >= float(deadline):
                finishing = condition(
                    "FailureTarget", "DeadlineExceeded", "Job was active longer than specified deadline"
                )
            if finishing is not None:
                conditions.append(finishing)
        failing = finishing is not None and finishing["type"] == "FailureTarget"
        if failing:
            for p in active:
                self._delete(_pod_key(p), "Background")
            active = []
        elif not meta.get("deletionTimestamp"):
            # A failed index is never started again: counted with the succeeded ones for what to create.
            ended = succeeded_indexes | failed_indexes
            self._manage_job(job, active, succeeded + len(failed_indexes), ended, now)
            active = [self._objects[k] for k in self._job_pod_keys(uid) if _pod_active(self._objects[k])]
            if completions is None:
                done = succeeded > 0 and not active
            else:
                done = succeeded >= int(completions) and not active
            if done and finishing is None:
                finishing = condition("SuccessCriteriaMet", "CompletionsReached", SUCCESS_MESSAGE)
                conditions.append(finishing)
        # Count finished pods and let them go (trackJobStatusAndRemoveFinalizers): when the Job is
        # failing every pod not yet finished counts as failed.
        counted_failed = int(status.get("failed") or 0)
        for p in tracked:
            pkey = _pod_key(p)
            current = self._objects.get(pkey)
            if current is None:
                continue
            if _phase(current) == "Succeeded" and not _pod_failed(current):
                pass
            elif _pod_failed(current) or failing:
                counted_failed += 1
            elif not meta.get("deletionTimestamp") and finishing is None:
                continue
            self._set_finalizers(pkey, [f for f in current["metadata"]["finalizers"] if f != JOB_TRACKING])
        terminating = sum(
            1
            for k in self._job_pod_keys(uid)
            if self._objects[k]["metadata"].get("deletionTimestamp")
            and _phase(self._objects[k]) not in TERMINAL
        )
        status.update(
            active=len(active),
            ready=sum(1 for p in active if _pod_ready(p)),
            terminating=terminating,
            succeeded=succeeded,
            failed=counted_failed,
            uncountedTerminatedPods={},
        )
        if indexed:
            status["completedIndexes"] = _index_ranges(succeeded_indexes)
        if per_index is not None:
            status["failedIndexes"] = _index_ranges(failed_indexes)
        if finishing is not None and terminating == 0:
            final = "Complete" if finishing["type"] == "SuccessCriteriaMet" else "Failed"
            conditions.append(condition(final, finishing["reason"], finishing["message"]))
            if final == "Complete":
                status["completionTime"] = _now_text(now)
            self._job_backoff.pop(uid, None)
        if conditions:
            status["conditions"] = conditions
        if status == (job.get("status") or {}) or key not in self._objects:
            return False
        new = copy.deepcopy(self._objects[key])
        new["status"] = status
        self._store(key, new)
        return True

    def _job_pod_keys(self, uid: str) -> list[Key]:
        return [
            k
            for k, o in self._objects.items()
            if k[1] == "pods" and (ref := _controller_ref(o)) is not None and ref.get("uid") == uid
        ]

    def _manage_job(
        self,
        job: dict[str, Any],
        active: list[dict[str, Any]],
        succeeded: int,
        succeeded_indexes: set[int],
        now: float,
    ) -> None:
        spec = job["spec"]
        if spec.get("suspend"):
            return
        uid = job["metadata"]["uid"]
        completions = spec.get("completions")
        parallelism = int(spec.get("parallelism", 1))
        if completions is None:
            want = len(active) if succeeded > 0 else parallelism
        else:
            want = max(0, min(int(completions) - succeeded, parallelism))
        missing = want - len(active)
        if missing <= 0:
            return
        if uid in self._job_backoff and self._job_backoff[uid][0] > 0 and now < self._backoff_until(uid):
            return
        if spec.get("completionMode") == "Indexed":
            busy = {
                int(i)
                for p in active
                if (i := (p["metadata"].get("annotations") or {}).get(COMPLETION_INDEX, "")).isdigit()
            }
            free = [i for i in range(int(completions)) if i not in succeeded_indexes and i not in busy]
            indexes: list[int | None] = list(free[:missing])
        else:
            indexes = [None] * missing
        for index in indexes:
            if not self._create_job_pod(job, index):
                break  # slow start: after a refused create the controller tries again later

    def _create_job_pod(self, job: dict[str, Any], index: int | None) -> bool:
        """A pod from the Job's template, as the Job controller makes it; whether the API took it."""
        meta = job["metadata"]
        name = meta["name"]
        template = copy.deepcopy(job["spec"]["template"])
        pod_meta = template.get("metadata") or {}
        spec = template.get("spec") or {}
        labels = dict(pod_meta.get("labels") or {})
        annotations = dict(pod_meta.get("annotations") or {})
        if index is None:
            generate = f"{name}-"
        else:
            labels[COMPLETION_INDEX] = annotations[COMPLETION_INDEX] = str(index)
            spec["hostname"] = f"{name}-{index}"
            suffix = f"-{index}-"
            generate = (
                (name + suffix)[: GENERATED_NAME_MAX - len(suffix)] + suffix
                if len(name + suffix) > GENERATED_NAME_MAX
                else name + suffix
            )
            for container in [*spec.get("initContainers", []), *spec.get("containers", [])]:
                env = container.setdefault("env", [])
                if not any(e.get("name") == "JOB_COMPLETION_INDEX" for e in env):
                    env.append(
                        {
                            "name": "JOB_COMPLETION_INDEX",
                            "valueFrom": {
                                "fieldRef": {"fieldPath": f"metadata.labels['{COMPLETION_INDEX}']"}
                            },
                        }
                    )
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "generateName": generate,
                "namespace": meta.get("namespace", ""),
                "labels": labels,
                "annotations": annotations,
                "finalizers": [JOB_TRACKING],
                "ownerReferences": [
                    {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "name": name,
                        "uid": meta["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": spec,
        }
        route = _Route("v1", "pods", meta.get("namespace", ""), "", "")
        try:
            self._admit_pod(pod, route.namespace)
            self._insert(route, pod, "Pod")
        except _Answer as refused:
            self._record(job, "Warning", "FailedCreate", f"Error creating: {refused.body.get('message', '')}")
            return False
        return True

    def _record(self, about: dict[str, Any], type_: str, reason: str, message: str) -> None:
        """An Event about ``about`` from a controller (same reason and message counted, not repeated)."""
        meta = about["metadata"]
        ns = meta.get("namespace", "") or "default"
        for (_, plural, e_ns, _), event in self._objects.items():
            if (
                plural == "events"
                and e_ns == ns
                and (event.get("involvedObject") or {}).get("uid") == meta.get("uid")
                and event.get("reason") == reason
                and event.get("message") == message
            ):
                return
        stamp = _now_text(self.clock())
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{meta['name']}.{uuid.uuid4().hex[:16]}", "namespace": ns},
            "involvedObject": {
                "apiVersion": about.get("apiVersion", ""),
                "kind": about.get("kind", ""),
                "name": meta["name"],
                "namespace": meta.get("namespace", ""),
                "uid": meta.get("uid", ""),
            },
            "reason": reason,
            "message": message,
            "type": type_,
            "source": {"component": "job-controller"},
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        self._insert(_Route("v1", "events", ns, "", ""), event, "Event")

    # ------------------------------------------------------------------ eviction and outside controllers

    def _budgets(self, namespace: str) -> list[tuple[Key, dict[str, Any]]]:
        return [
            (key, pdb)
            for key, pdb in sorted(self._objects.items())
            if key[1] == "poddisruptionbudgets" and key[2] == namespace
        ]

    def _selected(self, pdb: dict[str, Any], namespace: str) -> list[dict[str, Any]]:
        """Every pod of the namespace the budget's selector matches (the disruption controller's list:
        finished and terminating pods included)."""
        from tests.emulator.kubelet import _label_selector

        selector = (pdb.get("spec") or {}).get("selector")
        return [
            p
            for (_, plural, ns, _), p in sorted(self._objects.items())
            if plural == "pods"
            and ns == namespace
            and _label_selector(selector, p["metadata"].get("labels") or {})
        ]

    def _scale_of(self, ref: dict[str, Any], namespace: str) -> int | None:
        """The scale of a pod's controller (a Deployment's for its ReplicaSet), or ``None`` when the
        disruption controller finds none (a Job has no scale)."""
        if ref.get("kind") not in SCALED:
            return None
        if ref.get("uid") in self._external_scale:
            return self._external_scale[str(ref.get("uid"))]
        owner = self._owner_of(ref, namespace)
        if owner is None:
            return None
        above = _controller_ref(owner)
        if ref.get("kind") == "ReplicaSet" and above and above.get("kind") == "Deployment":
            deployment = self._owner_of(above, namespace)
            return None if deployment is None else int((deployment.get("spec") or {}).get("replicas", 1))
        return int((owner.get("spec") or {}).get("replicas", 1))

    def _expected(self, pdb: dict[str, Any], pods: list[dict[str, Any]]) -> tuple[int, int]:
        """``(expectedPods, desiredHealthy)`` as the disruption controller's getExpectedPodCount has them;
        raises ``LookupError`` where it fails (a pod whose controller has no scale)."""
        spec = pdb.get("spec") or {}
        if "maxUnavailable" not in spec and isinstance(spec.get("minAvailable"), int):
            return len(pods), int(spec["minAvailable"])
        if "maxUnavailable" not in spec and "minAvailable" not in spec:
            return 0, 0
        scales: dict[str, int] = {}
        for pod in pods:
            ref = _controller_ref(pod)
            if ref is None:
                continue  # unmanaged: the controller warns and leaves it out
            scale = self._scale_of(ref, pod["metadata"].get("namespace", ""))
            if scale is None:
                raise LookupError(f'found no controllers for pod "{pod["metadata"]["name"]}"')
            scales[str(ref.get("uid"))] = scale
        expected = sum(scales.values())

        def scaled(value: Any) -> int:
            if isinstance(value, str) and value.endswith("%"):
                return -(-expected * int(value[:-1]) // 100)  # rounded up
            return int(value)

        if "maxUnavailable" in spec:
            return expected, max(0, expected - scaled(spec["maxUnavailable"]))
        return expected, scaled(spec["minAvailable"])

    def _budget_status(self, pdb: dict[str, Any]) -> dict[str, Any]:
        """The status the disruption controller writes (trySync, else failSafe)."""
        ns = pdb["metadata"].get("namespace", "")
        status = copy.deepcopy(pdb.get("status") or {})
        generation = pdb["metadata"].get("generation", 1)
        pods = self._selected(pdb, ns)
        try:
            expected, desired = self._expected(pdb, pods)
        except LookupError as exc:
            status.update(disruptionsAllowed=0, observedGeneration=generation)
            status["conditions"] = [_allowed_condition(False, "SyncFailed", str(exc), generation)]
            return status
        now = self.clock()
        disrupted: dict[str, str] = {}
        for pod in pods:
            at = _parse_time((status.get("disruptedPods") or {}).get(pod["metadata"]["name"]))
            if at is not None and not pod["metadata"].get("deletionTimestamp") and at + 120 > now:
                disrupted[pod["metadata"]["name"]] = _now_text(at)  # DeletionTimeout: 2 minutes
        healthy = sum(
            1
            for p in pods
            if not p["metadata"].get("deletionTimestamp")
            and p["metadata"]["name"] not in disrupted
            and _pod_ready(p)
        )
        allowed = max(0, healthy - desired) if expected > 0 else 0
        reason = "SufficientPods" if allowed > 0 else "InsufficientPods"
        return {
            "currentHealthy": healthy,
            "desiredHealthy": desired,
            "expectedPods": expected,
            "disruptionsAllowed": allowed,
            "disruptedPods": disrupted,
            "observedGeneration": generation,
            "conditions": [_allowed_condition(allowed > 0, reason, "", generation)],
        }

    def _sync_budgets(self) -> bool:
        """One pass of the disruption controller; whether it changed a budget's status."""
        changed = False
        for key, pdb in [(k, o) for k, o in sorted(self._objects.items()) if k[1] == "poddisruptionbudgets"]:
            status = self._budget_status(pdb)
            if status != (pdb.get("status") or {}):
                new = copy.deepcopy(pdb)
                new["status"] = status
                self._store(key, new)
                changed = True
        return changed

    def _evict(self, route: _Route, body: Any) -> tuple[int, dict[str, Any], dict[str, str]]:
        """The eviction subresource as the API server's EvictionREST.Create (kubernetes
        ``pkg/registry/core/pod/storage/eviction.go``): a pod that is pending, finished or already being
        deleted goes without a budget check; otherwise its one budget (an empty selector matches every pod)
        must allow a disruption by its stored status, which the eviction decrements, naming the pod in
        ``disruptedPods`` so the controller counts it unhealthy until it is deleted or two minutes pass."""
        from tests.emulator.kubelet import _label_selector

        pod = self._objects.get(self._key(route))
        if pod is None:
            raise self._not_found(route)
        options = (body or {}).get("deleteOptions") if isinstance(body, dict) else None
        ignore = _phase(pod) in (*TERMINAL, "Pending") or bool(pod["metadata"].get("deletionTimestamp"))
        labels = pod["metadata"].get("labels") or {}
        budgets = [
            (key, pdb)
            for key, pdb in self._budgets(route.namespace)
            if _label_selector((pdb.get("spec") or {}).get("selector"), labels)
        ]
        if budgets and not ignore:
            if len(budgets) > 1:
                raise _fail(
                    500,
                    "InternalError",
                    "This pod has more than one PodDisruptionBudget, which the eviction "
                    "subresource does not support.",
                )
            if self.controllers:
                self._sync_budgets()  # the disruption controller has seen every change so far
            key, pdb = budgets[0][0], self._objects[budgets[0][0]]
            self._check_budget(key, pdb, pod)
        self._check_uid(route, pod, options)
        grace = (options or {}).get("gracePeriodSeconds")
        self._delete(self._key(route), "Background", None if grace is None else int(grace))
        return (
            201,
            {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201},
            {},
        )

    def _check_budget(self, key: Key, pdb: dict[str, Any], pod: dict[str, Any]) -> None:
        """checkAndDecrement: refuse with 429 (or 403), else take one disruption and record the pod."""
        status = pdb.get("status") or {}
        name = pdb["metadata"]["name"]
        desired, healthy = int(status.get("desiredHealthy", 0)), int(status.get("currentHealthy", 0))
        if not _pod_ready(pod) and healthy >= desired > 0:
            return  # an unready pod counts for nothing: it may go without a disruption
        if int(status.get("observedGeneration", 0)) < int(pdb["metadata"].get("generation", 1)):
            raise _too_many(f"The disruption budget {name} is still being processed by the server.")
        allowed = int(status.get("disruptionsAllowed", 0))
        if allowed < 0:
            raise _fail(403, "Forbidden", f'poddisruptionbudget.policy "{name}" is forbidden')
        if allowed == 0:
            raise _too_many(
                f"The disruption budget {name} needs {desired} healthy pods and has {healthy} currently"
            )
        new = copy.deepcopy(pdb)
        new["status"]["disruptionsAllowed"] = allowed - 1
        new["status"].setdefault("disruptedPods", {})[pod["metadata"]["name"]] = _now_text(self.clock())
        self._store(key, new)

    def _count_owner(self, pod: dict[str, Any]) -> None:
        if pod.get("kind") != "Pod" or not (owner := _controller_ref(pod)):
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

    def _legacy_replace(self, gone: dict[str, Any]) -> None:
        """What the outside DaemonSet, ReplicaSet and Job controllers do when one of their pods goes away."""
        if gone.get("kind", "Pod") != "Pod" or "spec" not in gone or not (owner := _controller_ref(gone)):
            return
        if owner.get("uid") not in self._external_owners:
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
        for transient in ("deletionTimestamp", "deletionGracePeriodSeconds", "finalizers"):
            pod["metadata"].pop(transient, None)
        pod["spec"]["nodeName"] = node
        if not node:
            pod["spec"].pop("nodeName")
        pod["status"] = {"phase": "Running" if node else "Pending"}
        if node:  # started at once by the outside controller's node, ready
            pod["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
        self._created[pod["metadata"]["uid"]] = len(self._created)
        self._bump(pod)
        self._objects[("v1", "pods", ns, pod["metadata"]["name"])] = pod


def _too_many(cause: str) -> _Answer:
    return _fail(
        429,
        "TooManyRequests",
        "Cannot evict pod as it would violate the pod's disruption budget.",
        {"causes": [{"reason": "DisruptionBudget", "message": cause}]},
    )


def _allowed_condition(allowed: bool, reason: str, message: str, generation: int) -> dict[str, Any]:
    return {
        "type": "DisruptionAllowed",
        "status": "True" if allowed else "False",
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
    }


def _phase(pod: dict[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase") or "")


def _pod_active(pod: dict[str, Any]) -> bool:
    """Neither finished nor being deleted (controller.FilterActivePods)."""
    return _phase(pod) not in TERMINAL and not pod["metadata"].get("deletionTimestamp")


def _pod_failed(pod: dict[str, Any]) -> bool:
    """isPodFailed: Failed, or deleted before it succeeded."""
    phase = _phase(pod)
    return phase == "Failed" or (bool(pod["metadata"].get("deletionTimestamp")) and phase != "Succeeded")


def _completion_index(pod: dict[str, Any]) -> int | None:
    value = (pod["metadata"].get("annotations") or {}).get(COMPLETION_INDEX, "")
    return int(value) if value.isdigit() else None


def _pod_key(pod: dict[str, Any]) -> Key:
    return ("v1", "pods", pod["metadata"].get("namespace", ""), pod["metadata"]["name"])


def _pod_ready(pod: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


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
        extra: dict[str, str] = {}
        if length > MAX_REQUEST_BODY_BYTES:
            # limitedReadBody (k8s.io/apiserver pkg/endpoints/handlers/rest.go): NewRequestEntityTooLargeError
            message = f"Request entity too large: limit is {MAX_REQUEST_BODY_BYTES}"
            code, answer = 413, status_body(413, "RequestEntityTooLarge", message)
        else:
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                code, answer = 400, status_body(400, "BadRequest", "the body is not JSON")
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
