"""The manifests of one group test on a cluster: state ConfigMap, headless Service, Indexed Job.

Why an Indexed Job: it needs nothing beyond Kubernetes itself (no training operator to install and
keep in step with the recipe), gives every pod a stable index and host name (``JOB-0.SERVICE``) for
torchrun's rendezvous, and its ``activeDeadlineSeconds`` bounds the run even if dsx goes away. One pod
runs on each node (required node affinity to the group's host names, anti-affinity between the pods),
tolerating the ``dsx.dev/unhealthy`` taint and cordons so that quarantined nodes can be recertified.

The Job, its Service and its state ConfigMap share one name made of the test, the subject and a digest
of (run uid, test, subject, members), so two runs never collide (:func:`job_name`). All three carry the
labels ``dsx.dev/certification-run`` and ``dsx.dev/group-test`` and, when given, an ownerReference to
the Workflow. How they are created, waited for and deleted is :mod:`steps.readiness.launchers.job`.

Settings of the step, from the plan's options, else the environment (:func:`settings_for`):
``DSX_GPU_IMAGE`` (the rank image; the plan's image option wins), ``DSX_RANK_SERVICE_ACCOUNT`` (default
``dsx-ranks``), ``DSX_NAMESPACE``, ``DSX_SCHEDULE_BUDGET_S`` (default 900), ``DSX_JOB_POLL_S`` (default
5), ``DSX_STALE_WAIT_S`` (default 120: how long to wait for a stale group's objects and pods to go),
``DSX_SHM_SIZE`` (default ``16Gi``).
"""

import copy
import hashlib
import json
import math
import os
import re
from collections.abc import Callable
from typing import Any, Protocol

from pydantic import Field

from steps.cluster import ClusterPort
from steps.cluster import vocabulary as vocab
from steps.errors import InputError
from steps.readiness.models import Model, Subject
from steps.readiness.outcomes import RunRef

__all__ = [
    "GPU_RESOURCE",
    "JOB_GRACE_S",
    "RANK_COMMAND",
    "RANK_UID",
    "RENDEZVOUS_PORT",
    "RESULT_FILE",
    "GroupJob",
    "JobSettings",
    "PlanLike",
    "PodPatch",
    "job_name",
    "render_group_job",
    "settings_for",
]

RENDEZVOUS_PORT = 29500
RESULT_FILE = "/tmp/dsx-out/result.json"
HOSTNAME_LABEL = "kubernetes.io/hostname"
GPU_RESOURCE = "nvidia.com/gpu"
#: The GPU image's user and group (the Dockerfile's ``USER 65532:65532``), which rank pods run as.
RANK_UID = 65532
#: The rank container's command; its arguments are those of :mod:`steps.readiness.launchers.rankpod`.
RANK_COMMAND = ["python", "-m", "steps.readiness.launchers.rankpod"]
#: Time the Job's own deadline leaves past the scheduling budget and the run deadline, seconds: the
#: step, not the Job controller, should be the one that calls a run a hang.
JOB_GRACE_S = 60.0
#: Longest name of a group test's objects: the Job controller names an Indexed Job's pods ``NAME-INDEX-``
#: plus five random characters and gives them the host name ``NAME-INDEX``, which must stay a DNS label
#: (63 characters).
MAX_NAME = 52
#: The label and annotation the Job controller puts the completion index under (Kubernetes 1.28+).

PodPatch = Callable[[dict[str, Any]], dict[str, Any]]
"""Turns a rank pod's spec into the one to run (a fabric profile's devices, env, annotations...)."""


class PlanLike(Protocol):
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
    api_outage_s: float = Field(default=300.0, gt=0)
    shm_size: str = "16Gi"


class GroupJob(Model):
    """The rendered manifests of one group test: state ConfigMap, headless Service, Indexed Job."""

    name: str
    namespace: str
    state: dict[str, Any]
    service: dict[str, Any]
    job: dict[str, Any]


def _env_seconds(name: str, default: float) -> float:
    raw = os.environ.get(name, "")
    try:
        value = float(raw) if raw else default
    except ValueError:
        raise InputError(f"{name}={raw!r} is not a number of seconds") from None
    if not value > 0:
        raise InputError(f"{name}={raw!r} must be more than 0 seconds")
    return value


def settings_for(plan: PlanLike, port: ClusterPort | None = None) -> JobSettings:
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
        api_outage_s=_env_seconds(vocab.ENV_API_OUTAGE_S, 300.0),
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


def _metadata(
    name: str, subject: Subject, settings: JobSettings, owners: list[dict[str, Any]] | None
) -> dict[str, Any]:
    """The metadata the three objects share: the group's name, labels, annotations and owner."""
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": settings.namespace,
        "labels": _labels(name, settings),
        "annotations": {
            vocab.ANNOTATION_MEMBERS: ",".join(sorted(subject.members)),
            vocab.ANNOTATION_SUBJECT: subject.name,
            vocab.ANNOTATION_WORKFLOW: settings.run.name,
        },
    }
    if owners:
        metadata["ownerReferences"] = copy.deepcopy(owners)
    return metadata


def _labels(name: str, settings: JobSettings) -> dict[str, str]:
    return {
        "app.kubernetes.io/part-of": "dsx",
        vocab.LABEL_GROUP_TEST: name,
        vocab.LABEL_CERTIFICATION_RUN: settings.run.uid,
    }


def _rank_args(name: str, nodes: int, settings: JobSettings, module: str, args: list[str]) -> list[str]:
    """The arguments of :data:`RANK_COMMAND`: where to publish, torchrun's rendezvous, the module."""
    return [
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


def _pod_spec(name: str, subject: Subject, settings: JobSettings, rank_args: list[str]) -> dict[str, Any]:
    """The rank pod's spec: one pod per member node (affinity in, anti-affinity between the pods),
    tolerating dsx's taint and cordons, with its GPUs, a /dev/shm for NCCL and the rankpod command."""
    return {
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
        # Pod Security "restricted", which a namespace may enforce: the GPU image's non-root user, the
        # runtime's default seccomp profile, no privilege escalation, every capability dropped (a fabric
        # profile may add some back; then the namespace must allow them).
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RANK_UID,
            "runAsGroup": RANK_UID,
            "fsGroup": RANK_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
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
                "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
            }
        ],
    }


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

    Each pod runs :data:`RANK_COMMAND` (:mod:`steps.readiness.launchers.rankpod`), which starts torchrun
    with ``gpus_per_node`` ranks; pod index ``i`` is torchrun's node rank ``i``; rank 0's pod publishes
    ``RESULT_FILE`` into the state ConfigMap. ``pod_patch`` gets a copy of the pod template (``metadata``
    and ``spec``) and returns the one to use: a fabric profile adds devices, env and capabilities to the
    spec and Multus annotations to the metadata (:func:`steps.readiness.launchers.profiles.rank_pod_patch`).
    """
    name = job_name(settings.run.uid, test, subject)
    nodes = len(subject.members)
    if nodes < 1:
        raise InputError(f"{subject.kind} {subject.name}: a group test needs at least one node")
    metadata = _metadata(name, subject, settings, owner_references)
    pod = _pod_spec(name, subject, settings, _rank_args(name, nodes, settings, module, args))
    template: dict[str, Any] = {"metadata": {"labels": _labels(name, settings)}, "spec": pod}
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
