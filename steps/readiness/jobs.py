"""Group tests on a cluster: an Indexed Job with a headless Service, pinned to exactly the group's nodes.

Why an Indexed Job: it needs nothing beyond Kubernetes itself (no training operator to install and
keep in step with the recipe), gives every pod a stable index and host name (``JOB-0.SERVICE``) for
torchrun's rendezvous, and its ``activeDeadlineSeconds`` bounds the run even if dsx goes away. One pod
runs on each node (required node affinity to the group's host names, anti-affinity between the pods),
tolerating the ``dsx.dev/unhealthy`` taint and cordons so that quarantined nodes can be recertified.

The lifecycle of one group test, and the rule each step follows:

* **Names carry the run.** The Job, its Service and its state ConfigMap share one name made of the test,
  the subject and a digest of (run uid, test, subject, members), so two runs never collide. All three
  carry the labels ``dsx.dev/certification-run`` and ``dsx.dev/group-test`` and an ownerReference to
  the Workflow (when it exists in their namespace), so Kubernetes removes them with the Workflow.
* **A stale copy is replaced, not a crash.** A 409 on create means an earlier try of this very step (a
  retried step, or a killed one) left its objects: they are deleted (Background), their pods waited out
  (bounded), and the objects created again. An object of that name that dsx did not make is an error.
* **The state ConfigMap is made first**, by the step; rank 0's pod (:mod:`steps.readiness.rankpod`)
  only updates it with its result and exit code, so it can never outlive its labels or owner.
* **Waiting ends when rank 0 has published, or the Job has ended** (``Complete`` or ``Failed``), never at
  the first failed pod: ``backoffLimitPerIndex: 0`` fails an index without failing the Job, so rank 0
  always gets to publish.
* **Two clocks.** The scheduling budget (``DSX_SCHEDULE_BUDGET_S``) runs from creation until every pod
  of the group is Running; running out is the verdict ``unschedulable``, which says nothing about the
  nodes. The run deadline (the request's ``timeout_s``) starts when all pods run; past it, ``hang``.
  The Job's own ``activeDeadlineSeconds`` counts from the Job's start, Pending and image pulls included,
  so it is the outer bound: budget + deadline + :data:`JOB_GRACE_S`.
* **Cleanup always runs**: in ``finally``, and on SIGTERM (Argo stops a workflow by signalling its
  pods), which the waiting turns into :class:`Terminated` so that the ``finally`` runs. Everything is
  deleted with ``propagationPolicy: Background`` (a batch/v1 Job orphans its pods without it), and the
  step returns once the group's pods are gone, so the next test finds the GPUs free.

Environment of the step: ``DSX_GPU_IMAGE`` (the rank image; the plan's image option wins),
``DSX_RANK_SERVICE_ACCOUNT`` (default ``dsx-ranks``), ``DSX_NAMESPACE``, ``DSX_SCHEDULE_BUDGET_S``
(default 900), ``DSX_JOB_POLL_S`` (default 5), ``DSX_STALE_WAIT_S`` (default 120: how long to wait
for a stale group's objects and pods to go), ``DSX_SHM_SIZE`` (default ``16Gi``).
"""

import copy
import hashlib
import json
import math
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Literal, Protocol, TypeVar

from pydantic import BaseModel, Field

from steps.cluster import ClusterPort, ConflictError
from steps.cluster import vocabulary as vocab
from steps.errors import DsxError, InputError
from steps.readiness.checks import (
    SmokeOutcome,
    SmokeRequest,
    SweepOutcome,
    SweepRequest,
    judge_smoke,
    judged,
    smoke_config,
    sweep_config,
)
from steps.readiness.judge import judge_collective
from steps.readiness.models import CollectiveRun, Model, Subject, Verdict
from steps.readiness.outcomes import RunRef, workflow_owner
from steps.readiness.rankpod import STATE_ERROR, STATE_EXIT_CODE, STATE_RESULT, read_published
from steps.readiness.smoke import SmokeResult, smoke_args
from steps.readiness.sweep import sweep_args
from steps.readiness.thresholds import load_thresholds

__all__ = [
    "GPU_RESOURCE",
    "JOB_GRACE_S",
    "RANK_COMMAND",
    "RENDEZVOUS_PORT",
    "RESULT_FILE",
    "GroupJob",
    "GroupRunResult",
    "JobSettings",
    "PodPatch",
    "Terminated",
    "job_name",
    "render_group_job",
    "run_group_job",
    "run_smoke_job",
    "run_sweep_job",
    "settings_for",
]

RENDEZVOUS_PORT = 29500
RESULT_FILE = "/tmp/dsx-out/result.json"
HOSTNAME_LABEL = "kubernetes.io/hostname"
GPU_RESOURCE = "nvidia.com/gpu"
#: The rank container's command; its arguments are those of :mod:`steps.readiness.rankpod`.
RANK_COMMAND = ["python", "-m", "steps.readiness.rankpod"]
#: Time the Job's own deadline leaves past the scheduling budget and the run deadline, seconds: the
#: step, not the Job controller, should be the one that calls a run a hang.
JOB_GRACE_S = 60.0
#: Longest name of a group test's objects: the Job controller names an Indexed Job's pods ``NAME-INDEX-``
#: plus five random characters and gives them the host name ``NAME-INDEX``, which must stay a DNS label
#: (63 characters).
MAX_NAME = 52
#: The label and annotation the Job controller puts the completion index under (Kubernetes 1.28+).
_INDEX_KEY = "batch.kubernetes.io/job-completion-index"
_RUNNING = ("Running", "Succeeded", "Failed")

PodPatch = Callable[[dict[str, Any]], dict[str, Any]]
"""Turns a rank pod's spec into the one to run (a fabric profile's devices, env, annotations...)."""


class Terminated(SystemExit):
    """The step got SIGTERM while a group job ran: raised in the waiting so that cleanup runs.

    A :class:`SystemExit` with the shell's code for it (143), so no ``except Exception`` swallows it.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)


class _PlanLike(Protocol):
    """What a job needs from the certification plan."""

    @property
    def gpus_per_node(self) -> int: ...

    @property
    def options(self) -> Any: ...

    @property
    def run(self) -> RunRef: ...


class JobSettings(Model):
    """Where, as what and how patiently group jobs run: from the plan's options, else the environment."""

    namespace: str
    image: str
    service_account: str
    gpus_per_node: int = Field(ge=1)
    run: RunRef
    poll_s: float = Field(default=5.0, gt=0)
    schedule_budget_s: float = Field(default=900.0, gt=0)
    stale_wait_s: float = Field(default=120.0, gt=0)
    shm_size: str = "16Gi"


class GroupJob(Model):
    """The rendered manifests of one group test: state ConfigMap, headless Service, Indexed Job."""

    name: str
    namespace: str
    state: dict[str, Any]
    service: dict[str, Any]
    job: dict[str, Any]


class GroupRunResult(Model):
    """How a group job ended: rank 0's result text (or ``None``) and any verdict the ending itself gives."""

    name: str
    text: str | None
    verdicts: list[Verdict]
    evidence: list[str]
    elapsed_s: float


def _env_seconds(name: str, default: float) -> float:
    raw = os.environ.get(name, "")
    try:
        value = float(raw) if raw else default
    except ValueError:
        raise InputError(f"{name}={raw!r} is not a number of seconds") from None
    if not value > 0:
        raise InputError(f"{name}={raw!r} must be more than 0 seconds")
    return value


def settings_for(plan: _PlanLike, port: ClusterPort | None = None) -> JobSettings:
    """Resolve namespace, image, service account and budgets for the group jobs of ``plan``.

    The namespace is the plan's, else ``DSX_NAMESPACE``, else the port's. The image is the plan's,
    else ``DSX_GPU_IMAGE`` (a CUDA image with torchrun and dsx: the control image cannot run ranks).

    Raises:
        InputError: no image is known, or a budget in the environment is not a positive number.
    """
    image = plan.options.image or os.environ.get(vocab.ENV_GPU_IMAGE, "")
    if not image:
        raise InputError("group jobs need a GPU image: set the workflow's image parameter or DSX_GPU_IMAGE")
    return JobSettings(
        namespace=plan.options.namespace
        or os.environ.get(vocab.ENV_NAMESPACE)
        or str(getattr(port, "namespace", "") or "default"),
        image=image,
        service_account=os.environ.get(vocab.ENV_RANK_SERVICE_ACCOUNT) or "dsx-ranks",
        gpus_per_node=plan.gpus_per_node,
        run=plan.run,
        poll_s=_env_seconds(vocab.ENV_JOB_POLL_S, 5.0),
        schedule_budget_s=_env_seconds(vocab.ENV_SCHEDULE_BUDGET_S, 900.0),
        stale_wait_s=_env_seconds(vocab.ENV_STALE_WAIT_S, 120.0),
        shm_size=os.environ.get(vocab.ENV_SHM_SIZE) or "16Gi",
    )


def job_name(run_uid: str, test: str, subject: Subject) -> str:
    """A DNS-1123 label for the group test of this run, at most :data:`MAX_NAME` characters.

    Readable part first (``dsx-TEST-SUBJECT``, cut to fit), then a digest of the run's uid, the test,
    the subject and its members: another run, or another set of members, gets another name.
    """
    key = json.dumps([run_uid, test, subject.name, sorted(subject.members)])
    digest = hashlib.sha256(key.encode()).hexdigest()[:10]
    stem = re.sub(r"[^a-z0-9-]+", "-", f"dsx-{test}-{subject.name}".lower()).strip("-")
    stem = stem[: MAX_NAME - len(digest) - 1].rstrip("-")
    return f"{stem}-{digest}"


def render_group_job(
    test: str,
    subject: Subject,
    module: str,
    args: list[str],
    settings: JobSettings,
    timeout_s: float,
    *,
    owner_references: list[dict[str, Any]] | None = None,
    pod_patch: PodPatch | None = None,
) -> GroupJob:
    """The state ConfigMap, headless Service and Indexed Job that run ``module args`` under torchrun.

    Each pod runs :data:`RANK_COMMAND` (:mod:`steps.readiness.rankpod`), which starts torchrun with
    ``gpus_per_node`` ranks; pod index ``i`` is torchrun's node rank ``i``; rank 0's pod publishes
    ``RESULT_FILE`` into the state ConfigMap. ``pod_patch`` gets a copy of the pod template (``metadata``
    and ``spec``) and returns the one to use: a fabric profile adds devices, env and capabilities to the
    spec and Multus annotations to the metadata (:func:`steps.readiness.rankpods.rank_pod_patch`).
    """
    name = job_name(settings.run.uid, test, subject)
    nodes = len(subject.members)
    if nodes < 1:
        raise InputError(f"{subject.kind} {subject.name}: a group test needs at least one node")
    labels = {
        "app.kubernetes.io/part-of": "dsx",
        vocab.LABEL_GROUP_TEST: name,
        vocab.LABEL_CERTIFICATION_RUN: settings.run.uid,
    }
    annotations = {
        vocab.ANNOTATION_MEMBERS: ",".join(sorted(subject.members)),
        vocab.ANNOTATION_SUBJECT: subject.name,
        vocab.ANNOTATION_WORKFLOW: settings.run.name,
    }
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": settings.namespace,
        "labels": labels,
        "annotations": annotations,
    }
    if owner_references:
        metadata["ownerReferences"] = copy.deepcopy(owner_references)
    rank_args = [
        "--publish",
        name,
        "--result",
        RESULT_FILE,
        "--nnodes",
        str(nodes),
        "--nproc-per-node",
        str(settings.gpus_per_node),
        "--master-addr",
        f"{name}-0.{name}",
        "--master-port",
        str(RENDEZVOUS_PORT),
        "--",
        module,
        *args,
    ]
    pod: dict[str, Any] = {
        "subdomain": name,
        "restartPolicy": "Never",
        "serviceAccountName": settings.service_account,
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": HOSTNAME_LABEL, "operator": "In", "values": sorted(subject.members)}
                            ]
                        }
                    ]
                }
            },
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "labelSelector": {"matchLabels": {vocab.LABEL_GROUP_TEST: name}},
                        "topologyKey": HOSTNAME_LABEL,
                    }
                ]
            },
        },
        "tolerations": [
            {"key": vocab.TAINT_UNHEALTHY, "operator": "Exists"},
            {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
            {"key": GPU_RESOURCE, "operator": "Exists"},
        ],
        # NCCL keeps its buffers in /dev/shm; a container's default is 64 MiB.
        "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": settings.shm_size}}],
        "containers": [
            {
                "name": "ranks",
                "image": settings.image,
                "command": list(RANK_COMMAND),
                "args": rank_args,
                "env": [
                    {"name": vocab.ENV_NAMESPACE, "value": settings.namespace},
                    {"name": vocab.ENV_CLUSTER, "value": "kube"},
                    {"name": vocab.ENV_NODE_NAME, "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                ],
                "ports": [{"name": "rendezvous", "containerPort": RENDEZVOUS_PORT}],
                "resources": {"limits": {GPU_RESOURCE: str(settings.gpus_per_node)}},
                "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
            }
        ],
    }
    template: dict[str, Any] = {"metadata": {"labels": dict(labels)}, "spec": pod}
    if pod_patch is not None:
        template = pod_patch(copy.deepcopy(template))
        if (template.get("metadata") or {}).get("labels", {}).get(vocab.LABEL_GROUP_TEST) != name:
            raise InputError(
                f"job {name}: the rank pod profile removed the pods' {vocab.LABEL_GROUP_TEST} label"
            )
    state = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": copy.deepcopy(metadata)}
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": copy.deepcopy(metadata),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {vocab.LABEL_GROUP_TEST: name},
            "ports": [{"name": "rendezvous", "port": RENDEZVOUS_PORT}],
        },
    }
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": copy.deepcopy(metadata),
        "spec": {
            "completionMode": "Indexed",
            "completions": nodes,
            "parallelism": nodes,
            # A failed index does not fail the Job (nor stop rank 0 before it publishes); the Job ends
            # Failed once every index has ended. backoffLimit then defaults to the maximum.
            "backoffLimitPerIndex": 0,
            # Counted from the Job's start, Pending and image pulls included: the outer bound only.
            "activeDeadlineSeconds": math.ceil(settings.schedule_budget_s + timeout_s + JOB_GRACE_S),
            "ttlSecondsAfterFinished": 3600,
            "template": template,
        },
    }
    return GroupJob(name=name, namespace=settings.namespace, state=state, service=service, job=job)


# ----------------------------------------------------------------------------- lifecycle


_KINDS = (("batch/v1", "Job"), ("v1", "Service"), ("v1", "ConfigMap"))


def _selector(group: GroupJob) -> str:
    return f"{vocab.LABEL_GROUP_TEST}={group.name}"


def _pods(port: ClusterPort, group: GroupJob) -> list[dict[str, Any]]:
    return port.list_objects("v1", "Pod", group.namespace, _selector(group))


def _is_ours(obj: dict[str, Any], group: GroupJob) -> bool:
    """Whether an object of the group's name was made by a dsx group test of that name."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return bool(labels.get(vocab.LABEL_GROUP_TEST) == group.name)


def _existing(port: ClusterPort, group: GroupJob) -> list[tuple[str, str, dict[str, Any]]]:
    """The group's Job, Service and state ConfigMap that exist, as ``(apiVersion, kind, object)``."""
    found = []
    for api_version, kind in _KINDS:
        obj = port.get_object(api_version, kind, group.name, group.namespace)
        if obj is not None:
            found.append((api_version, kind, obj))
    return found


def _remaining(port: ClusterPort, group: GroupJob) -> list[str]:
    """The group's own objects and pods that still exist, as ``kind/name``."""
    left = [f"{kind.lower()}/{group.name}" for _, kind, obj in _existing(port, group) if _is_ours(obj, group)]
    return left + [f"pod/{p['metadata']['name']}" for p in _pods(port, group)]


def _wait_gone(port: ClusterPort, group: GroupJob, settings: JobSettings, why: str) -> None:
    """Wait (bounded by ``stale_wait_s``) until none of the group's objects and pods is left."""
    deadline = time.monotonic() + settings.stale_wait_s
    while left := _remaining(port, group):
        if time.monotonic() > deadline:
            raise DsxError(
                f"group test {group.namespace}/{group.name}: {', '.join(left)} still there "
                f"{settings.stale_wait_s:g}s after {why}"
            )
        time.sleep(min(settings.poll_s, 1.0))


def _clear_stale(port: ClusterPort, group: GroupJob, settings: JobSettings) -> None:
    """Delete what an earlier try of this group test left (Background), and wait until it is gone.

    Raises:
        DsxError: an object of that name exists that dsx's group test did not make, or the stale
            objects did not go within ``stale_wait_s``.
    """
    found = _existing(port, group)
    for _, kind, obj in found:
        if not _is_ours(obj, group):
            raise DsxError(
                f"{kind} {group.namespace}/{group.name} exists and was not made by a dsx group test "
                f"(no {vocab.LABEL_GROUP_TEST}={group.name} label): delete or rename it"
            )
    pods = _pods(port, group)
    runs = sorted({str(o["metadata"]["labels"].get(vocab.LABEL_CERTIFICATION_RUN, "?")) for *_, o in found})
    what = ", ".join([f"{kind.lower()}/{group.name}" for _, kind, _ in found] + [f"{len(pods)} pods"])
    print(
        f"group test {group.namespace}/{group.name}: replacing what an earlier try left ({what}; "
        f"run {', '.join(runs) or '?'})",
        file=sys.stderr,
    )
    for api_version, kind, _ in found:
        port.delete_object(api_version, kind, group.name, group.namespace, propagation="Background")
    for pod in pods:
        port.delete_object("v1", "Pod", pod["metadata"]["name"], group.namespace, propagation="Background")
    _wait_gone(port, group, settings, "deleting them")


def _create(port: ClusterPort, group: GroupJob, settings: JobSettings) -> None:
    """Create the state ConfigMap, the Service and the Job, replacing a stale earlier try's copies.

    Pods of an earlier try still labelled for this group (its Job already deleted) are waited out
    first: they hold the GPUs, and rank 0 of a stale try must not publish into the new state.
    """
    if _pods(port, group):
        _clear_stale(port, group, settings)
    for attempt in range(2):
        try:
            for manifest in (group.state, group.service, group.job):
                port.create_object(manifest)
            return
        except ConflictError as exc:
            if attempt:
                raise DsxError(
                    f"group test {group.namespace}/{group.name}: {exc.target} exists again right after "
                    "dsx removed a stale copy: is another step running the same test?"
                ) from None
            _clear_stale(port, group, settings)


def _delete_group(port: ClusterPort, group: GroupJob, settings: JobSettings) -> None:
    """Delete the group's own Job, Service and state ConfigMap (Background); wait, bounded, for its pods.

    Only objects that carry the group's label are deleted (one of that name that dsx did not make is
    left alone). Never raises: a failure here must not hide how the test ended. What is left is
    reported on stderr; the Job's ``ttlSecondsAfterFinished`` and the Workflow's ownerReference
    remove it later.
    """
    try:
        for api_version, kind, obj in _existing(port, group):
            if _is_ours(obj, group):
                port.delete_object(api_version, kind, group.name, group.namespace, propagation="Background")
        _wait_gone(port, group, settings, "the test ended")
    except DsxError as exc:
        print(f"warning: cleaning up group test {group.namespace}/{group.name}: {exc}", file=sys.stderr)


class _StopOnSigterm:
    """Within the block, the first SIGTERM raises :class:`Terminated` so that the cleanup runs.

    Once :meth:`disarm` is called (the cleanup has begun) a SIGTERM is only noted, and raised as
    :class:`Terminated` when the block ends. Python runs signal handlers in the main thread only;
    elsewhere this does nothing.
    """

    def __init__(self, what: str) -> None:
        self.what = what
        self.armed = True
        self.received: int | None = None
        self._previous: Any = None
        self._installed = False

    def __enter__(self) -> "_StopOnSigterm":
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handle)
            self._installed = True
        return self

    def _handle(self, signum: int, _frame: object) -> None:
        if self.received is None:
            print(f"{self.what}: stopped by signal {signum}; deleting its objects", file=sys.stderr)
        self.received = signum
        if self.armed:
            self.armed = False
            raise Terminated(signum)

    def disarm(self) -> None:
        """From now on a SIGTERM waits for the end of the block."""
        self.armed = False

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if self._installed:
            signal.signal(signal.SIGTERM, self._previous)
        if exc_type is None and self.received is not None:
            raise Terminated(self.received)


# ----------------------------------------------------------------------------- waiting


Ending = Literal["published", "ended", "unschedulable", "hang"]


class _Outcome(Model):
    ending: Ending
    state: dict[str, str] = Field(default_factory=dict)
    detail: str = ""


def _state(port: ClusterPort, group: GroupJob) -> dict[str, str]:
    return read_published(port.get_object("v1", "ConfigMap", group.name, group.namespace))


def _job_end(job: dict[str, Any] | None) -> str | None:
    """``Complete``/``Failed`` (with the reason and message) once the Job has ended, else ``None``."""
    if job is None:
        return "by deletion"
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("status") == "True" and condition.get("type") in ("Complete", "Failed"):
            why = ": ".join(str(condition[k]) for k in ("reason", "message") if condition.get(k))
            return f"{condition['type']} ({why})" if why else str(condition["type"])
    return None


def _index(pod: dict[str, Any], job: str) -> int | None:
    meta = pod.get("metadata") or {}
    for source in (meta.get("labels") or {}, meta.get("annotations") or {}):
        if str(source.get(_INDEX_KEY, "")).isdigit():
            return int(source[_INDEX_KEY])
    host = str((pod.get("spec") or {}).get("hostname") or meta.get("name") or "")
    match = re.match(rf"^{re.escape(job)}-(\d+)", host)
    return int(match.group(1)) if match else None


def _waiting_for(pod: dict[str, Any]) -> str:
    """Why a pod is not running yet: its PodScheduled condition, else its containers' waiting reason."""
    status = pod.get("status") or {}
    node = (pod.get("spec") or {}).get("nodeName")
    scheduled = next((c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"), None)
    if scheduled is not None and scheduled.get("status") != "True":
        reason = scheduled.get("reason") or "not scheduled"
        message = " ".join(str(scheduled.get("message") or "").split())
        return f"{reason}: {message}" if message else str(reason)
    if not node:
        return "not scheduled yet"
    for container in status.get("containerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting")
        if waiting:
            message = " ".join(str(waiting.get("message") or "").split())
            reason = waiting.get("reason") or "waiting"
            return f"on {node}: {reason}" + (f": {message}" if message else "")
    return f"on {node}: {status.get('phase') or 'Pending'}"


def _not_running(pods: list[dict[str, Any]], group: GroupJob, nodes: int) -> list[str]:
    """One line per index whose pod has not run yet (Running, or already ended)."""
    newest: dict[int, dict[str, Any]] = {}
    for pod in pods:
        index = _index(pod, group.name)
        if index is None:
            continue
        stamp = str((pod.get("metadata") or {}).get("creationTimestamp") or "")
        old = newest.get(index)
        if old is None or stamp >= str((old.get("metadata") or {}).get("creationTimestamp") or ""):
            newest[index] = pod
    lines = []
    for index in range(nodes):
        found = newest.get(index)
        if found is None:
            lines.append(f"index {index}: no pod yet")
        elif (found.get("status") or {}).get("phase") not in _RUNNING:
            lines.append(f"pod {found['metadata']['name']}: {_waiting_for(found)}")
    return lines


def _wait(
    port: ClusterPort, group: GroupJob, settings: JobSettings, nodes: int, timeout_s: float
) -> _Outcome:
    """Wait until rank 0 published, the Job ended, scheduling ran out of budget, or the run hung."""
    created = time.monotonic()
    running_since: float | None = None
    while True:
        state = _state(port, group)
        if STATE_EXIT_CODE in state:
            return _Outcome(ending="published", state=state)
        ended = _job_end(port.get_object("batch/v1", "Job", group.name, group.namespace))
        if ended is not None:
            return _Outcome(ending="ended", state=_state(port, group), detail=ended)
        now = time.monotonic()
        if running_since is None:
            waiting = _not_running(_pods(port, group), group, nodes)
            if not waiting:
                running_since = now
            elif now - created > settings.schedule_budget_s:
                return _Outcome(ending="unschedulable", detail="; ".join(waiting))
        if running_since is not None and now - running_since > timeout_s:
            return _Outcome(ending="hang")
        time.sleep(settings.poll_s)


def run_group_job(
    test: str,
    subject: Subject,
    module: str,
    args: list[str],
    timeout_s: float,
    settings: JobSettings,
    port: ClusterPort,
    *,
    pod_patch: PodPatch | None = None,
) -> GroupRunResult:
    """Run ``module args`` as the group job of ``test`` on ``subject``'s nodes; rank 0's result text.

    The verdicts are those the ending itself gives: ``unschedulable`` (the pods could not all be
    scheduled within the budget), ``hang`` (no result within ``timeout_s`` of all pods running) or
    ``error`` (the Job ended without a result from rank 0, or rank 0 wrote none).
    """
    owner = workflow_owner(port, settings.run, settings.namespace)
    group = render_group_job(
        test,
        subject,
        module,
        [*args, "--out", RESULT_FILE],
        settings,
        timeout_s,
        owner_references=owner,
        pod_patch=pod_patch,
    )
    started = time.monotonic()
    with _StopOnSigterm(f"group test {group.namespace}/{group.name}") as stop:
        try:
            _create(port, group, settings)
            outcome = _wait(port, group, settings, len(subject.members), timeout_s)
        finally:
            stop.disarm()
            _delete_group(port, group, settings)
    elapsed = round(time.monotonic() - started, 3)
    evidence = [f"job/{group.namespace}/{group.name}"]
    where = f"{subject.kind} {subject.name}: job {group.name}"

    def ends(status: Literal["unschedulable", "hang", "error"], message: str) -> GroupRunResult:
        verdict = Verdict(
            subject=subject, test=test, status=status, message=message[:1000], evidence=evidence
        )
        return GroupRunResult(
            name=group.name, text=None, verdicts=[verdict], evidence=evidence, elapsed_s=elapsed
        )

    if outcome.ending == "unschedulable":
        return ends(
            "unschedulable",
            f"{where}: not every pod was running within the scheduling budget of "
            f"{settings.schedule_budget_s:g}s, so nothing was measured: {outcome.detail}",
        )
    if outcome.ending == "hang":
        return ends("hang", f"{where} did not finish within {timeout_s:g}s of all its pods running")
    text = outcome.state.get(STATE_RESULT)
    if text is None:
        if STATE_EXIT_CODE in outcome.state:
            why = outcome.state.get(STATE_ERROR) or "no result file"
            code = outcome.state[STATE_EXIT_CODE]
            return ends("error", f"{where}: rank 0 exited {code} without a result: {why}")
        return ends("error", f"{where}: the Job ended {outcome.detail} without a result from rank 0")
    return GroupRunResult(name=group.name, text=text, verdicts=[], evidence=evidence, elapsed_s=elapsed)


# ----------------------------------------------------------------------------- the two tests


def _unreadable(subject: Subject, test: str, text: str) -> Verdict:
    return Verdict(
        subject=subject,
        test=test,
        status="error",
        message=f"{subject.kind} {subject.name}: rank 0's result is not readable: {text[:200]}",
    )


_Result = TypeVar("_Result", bound=BaseModel)


def _run_check_job(
    test: str,
    module: str,
    args: list[str],
    request: SweepRequest | SmokeRequest,
    plan: _PlanLike,
    port: ClusterPort,
    pod_patch: PodPatch | None,
) -> GroupRunResult:
    """:func:`run_group_job` for a check's request, with the plan's Job settings."""
    return run_group_job(
        test,
        request.subject,
        module,
        args,
        request.timeout_s,
        settings_for(plan, port),
        port,
        pod_patch=pod_patch,
    )


def _read_result(
    ran: GroupRunResult, model: type[_Result], subject: Subject, test: str
) -> tuple[_Result | None, list[Verdict]]:
    """Rank 0's result read as ``model``, and the verdicts so far (an unreadable result adds one)."""
    verdicts = list(ran.verdicts)
    if ran.text is None:
        return None, verdicts
    try:
        return model.model_validate_json(ran.text), verdicts
    except ValueError:
        return None, [*verdicts, _unreadable(subject, test, ran.text)]


def run_sweep_job(
    request: SweepRequest, plan: _PlanLike, port: ClusterPort, *, pod_patch: PodPatch | None = None
) -> SweepOutcome:
    """Run the sweep of ``request`` as a group job (NCCL) and judge rank 0's result."""
    config = sweep_config(request.model_copy(update={"backend": "nccl", "inject": []}))
    ran = _run_check_job(
        "allreduce-sweep", "steps.readiness.sweep", sweep_args(config), request, plan, port, pod_patch
    )
    run, verdicts = _read_result(ran, CollectiveRun, request.subject, "allreduce-sweep")
    if run is not None:
        thresholds = load_thresholds(request.thresholds)
        verdicts += judge_collective(run, request.subject, thresholds, request.scope, ran.evidence)
    return judged(
        SweepOutcome, request.subject, verdicts, ran.evidence, ran.evidence[0], ran.elapsed_s, run=run
    )


def run_smoke_job(
    request: SmokeRequest, plan: _PlanLike, port: ClusterPort, *, pod_patch: PodPatch | None = None
) -> SmokeOutcome:
    """Run the training smoke run of ``request`` as a group job (NCCL) and judge rank 0's result."""
    thresholds = load_thresholds(request.thresholds)
    config = smoke_config(request.model_copy(update={"backend": "nccl", "inject": []}), thresholds)
    ran = _run_check_job(
        "training-smoke", "steps.readiness.smoke", smoke_args(config), request, plan, port, pod_patch
    )
    result, verdicts = _read_result(ran, SmokeResult, request.subject, "training-smoke")
    if result is not None:
        verdicts += judge_smoke(result, request.subject, thresholds, request.min_loss_drop, ran.evidence)
    return judged(
        SmokeOutcome, request.subject, verdicts, ran.evidence, ran.evidence[0], ran.elapsed_s, result=result
    )
