"""Group tests on a cluster: an Indexed Job with a headless Service, pinned to exactly the group's nodes.

Why an Indexed Job: it needs nothing beyond Kubernetes itself (no training operator to install and
keep in step with the recipe), gives every pod a stable index and host name (``JOB-0.SERVICE``) for
torchrun's rendezvous, and its ``activeDeadlineSeconds`` bounds the run even if dsx goes away. One pod
runs on each node (required node affinity to the group's host names, anti-affinity between the pods),
tolerating the ``dsx.dev/unhealthy`` taint and cordons so that quarantined nodes can be recertified.

Rank 0's pod publishes its result into a state ConfigMap named after the Job (``publish`` below); the
step that created the Job waits for it, judges it, and deletes the Job, its Service and the result.

    python -m steps.readiness.jobs publish NAME FILE EXIT_CODE
"""

import hashlib
import json
import os
import re
import shlex
import sys
import time
from typing import Any, Protocol

from steps.cluster import ClusterPort, connect
from steps.cluster import vocabulary as vocab
from steps.errors import DsxError, InputError
from steps.readiness.checks import (
    SmokeOutcome,
    SmokeRequest,
    SweepOutcome,
    SweepRequest,
    judge_smoke,
    smoke_config,
    sweep_config,
)
from steps.readiness.judge import judge_collective
from steps.readiness.models import CollectiveRun, Model, Subject, Verdict, worst
from steps.readiness.smoke import SmokeResult, smoke_args
from steps.readiness.sweep import sweep_args
from steps.readiness.thresholds import load_thresholds

__all__ = [
    "GroupJob",
    "JobSettings",
    "job_name",
    "publish",
    "render_group_job",
    "run_smoke_job",
    "run_sweep_job",
]

RENDEZVOUS_PORT = 29500
RESULT_FILE = "/tmp/dsx-out/result.json"
GROUP_LABEL = "dsx.dev/group-test"
HOSTNAME_LABEL = "kubernetes.io/hostname"
GPU_RESOURCE = "nvidia.com/gpu"
#: Time past a Job's own deadline for its controller to report the end, seconds.
REPORT_GRACE_S = 30.0


class _PlanLike(Protocol):
    """What a job needs from the certification plan."""

    @property
    def gpus_per_node(self) -> int: ...

    @property
    def options(self) -> Any: ...


class JobSettings(Model):
    """Where and as what group jobs run: from the plan's options, else the step's environment."""

    namespace: str
    image: str
    service_account: str
    gpus_per_node: int
    poll_s: float = 5.0


class GroupJob(Model):
    """The rendered manifests of one group test."""

    name: str
    namespace: str
    service: dict[str, Any]
    job: dict[str, Any]


def settings_for(plan: _PlanLike, port: ClusterPort | None = None) -> JobSettings:
    """Resolve namespace, image and service account for the group jobs of ``plan``.

    The namespace is the plan's, else ``DSX_NAMESPACE``, else the port's: the Job, its Service and the
    state ConfigMap rank 0 publishes into must all be in the one the step's port reads.

    Raises:
        InputError: no image is known (``DSX_IMAGE`` unset and none chosen).
    """
    image = plan.options.image or os.environ.get("DSX_IMAGE", "")
    if not image:
        raise InputError("group jobs need an image: set the workflow's image parameter or DSX_IMAGE")
    return JobSettings(
        namespace=plan.options.namespace
        or os.environ.get("DSX_NAMESPACE")
        or str(getattr(port, "namespace", "") or "default"),
        image=image,
        service_account=os.environ.get("DSX_SERVICE_ACCOUNT", "dsx-workflow"),
        gpus_per_node=plan.gpus_per_node,
        poll_s=float(os.environ.get("DSX_JOB_POLL_S", "5")),
    )


def job_name(test: str, subject: Subject) -> str:
    """A DNS-1123 name for the group test, unique to the test and its members, at most 52 characters."""
    digest = hashlib.sha256(json.dumps([test, subject.name, sorted(subject.members)]).encode()).hexdigest()
    stem = re.sub(r"[^a-z0-9-]+", "-", f"dsx-{test}-{subject.name}".lower()).strip("-")[:40].rstrip("-")
    return f"{stem}-{digest[:8]}"


def render_group_job(
    test: str, subject: Subject, module: str, args: list[str], settings: JobSettings, timeout_s: float
) -> GroupJob:
    """The headless Service and Indexed Job that run ``python -m module args`` under torchrun on the group.

    Each pod starts ``gpus_per_node`` ranks (``torchrun --nproc-per-node``); pod index ``i`` is torchrun's
    node rank ``i``; rank 0's pod publishes the result file into the state ConfigMap named like the Job.
    """
    name = job_name(test, subject)
    nodes = len(subject.members)
    labels = {"app.kubernetes.io/part-of": "dsx", GROUP_LABEL: name}
    torchrun = [
        "torchrun",
        f"--nnodes={nodes}",
        f"--nproc-per-node={settings.gpus_per_node}",
        "--node-rank=$JOB_COMPLETION_INDEX",
        f"--master-addr={name}-0.{name}",
        f"--master-port={RENDEZVOUS_PORT}",
        "-m",
        module,
        *args,
    ]
    command = " ".join(a if a.startswith("--node-rank=") else shlex.quote(a) for a in torchrun)
    script = (
        f"mkdir -p /tmp/dsx-out; {command}; rc=$?; "
        'if [ "$JOB_COMPLETION_INDEX" = 0 ]; then '
        f"python -m steps.readiness.jobs publish {name} {RESULT_FILE} $rc || rc=1; fi; exit $rc"
    )
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": settings.namespace, "labels": labels},
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {GROUP_LABEL: name},
            "ports": [{"name": "rendezvous", "port": RENDEZVOUS_PORT}],
        },
    }
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": settings.namespace,
            "labels": labels,
            "annotations": {"dsx.dev/members": ",".join(subject.members)},
        },
        "spec": {
            "completionMode": "Indexed",
            "completions": nodes,
            "parallelism": nodes,
            "backoffLimit": 0,
            "activeDeadlineSeconds": max(1, int(timeout_s)),
            "ttlSecondsAfterFinished": 3600,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "subdomain": name,
                    "restartPolicy": "Never",
                    "serviceAccountName": settings.service_account,
                    "affinity": {
                        "nodeAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": {
                                "nodeSelectorTerms": [
                                    {
                                        "matchExpressions": [
                                            {
                                                "key": HOSTNAME_LABEL,
                                                "operator": "In",
                                                "values": sorted(subject.members),
                                            }
                                        ]
                                    }
                                ]
                            }
                        },
                        "podAntiAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": [
                                {
                                    "labelSelector": {"matchLabels": {GROUP_LABEL: name}},
                                    "topologyKey": HOSTNAME_LABEL,
                                }
                            ]
                        },
                    },
                    "tolerations": [
                        {"key": vocab.TAINT_UNHEALTHY, "operator": "Exists"},
                        {
                            "key": "node.kubernetes.io/unschedulable",
                            "operator": "Exists",
                            "effect": "NoSchedule",
                        },
                        {"key": GPU_RESOURCE, "operator": "Exists"},
                    ],
                    "containers": [
                        {
                            "name": "ranks",
                            "image": settings.image,
                            "command": ["sh", "-c", script],
                            "env": [
                                {"name": "DSX_NAMESPACE", "value": settings.namespace},
                                {"name": "DSX_CLUSTER", "value": "kube"},
                                {
                                    "name": "DSX_NODE_NAME",
                                    "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}},
                                },
                            ],
                            "ports": [{"name": "rendezvous", "containerPort": RENDEZVOUS_PORT}],
                            "resources": {"limits": {GPU_RESOURCE: str(settings.gpus_per_node)}},
                        }
                    ],
                },
            },
        },
    }
    return GroupJob(name=name, namespace=settings.namespace, service=service, job=job)


def publish(name: str, path: str, exit_code: int, port: ClusterPort | None = None) -> None:
    """Store rank 0's result file (and the run's exit code) in the state ConfigMap ``name``."""
    try:
        text = open(path, encoding="utf-8").read()  # noqa: SIM115 - a one-shot read
    except OSError as exc:
        text = json.dumps({"error": f"rank 0 wrote no result at {path}: {exc.strerror}"})
    target = port or connect()
    target.update_state(name, lambda _: {"result.json": text, "exit-code": str(exit_code)})


def _finished(job: dict[str, Any] | None) -> str | None:
    """``Complete`` or ``Failed`` once the Job has ended, else ``None``."""
    if job is None:
        return "Failed"
    status = job.get("status") or {}
    for condition in status.get("conditions") or []:
        if condition.get("status") == "True" and condition.get("type") in ("Complete", "Failed"):
            return str(condition["type"])
    if int(status.get("failed") or 0) > 0:
        return "Failed"
    completions = int((job.get("spec") or {}).get("completions") or 1)
    if int(status.get("succeeded") or 0) >= completions:
        return "Complete"
    return None


def _run_job(
    port: ClusterPort, group: GroupJob, timeout_s: float, poll_s: float
) -> tuple[str, dict[str, str]]:
    """Create the Service and Job, wait for the end (bounded), return ``(ending, result state)``."""
    for manifest in (group.service, group.job):
        port.create_object(manifest)
    deadline = time.monotonic() + timeout_s + REPORT_GRACE_S
    ending: str | None = None
    try:
        while ending is None:
            job = port.get_object("batch/v1", "Job", group.name, group.namespace)
            ending = _finished(job)
            if ending is None:
                if time.monotonic() > deadline:
                    ending = "Timeout"
                    break
                time.sleep(poll_s)
        return ending, port.get_state(group.name)
    finally:
        port.delete_object("batch/v1", "Job", group.name, group.namespace)
        port.delete_object("v1", "Service", group.name, group.namespace)
        port.delete_object("v1", "ConfigMap", group.name, group.namespace)


def _run_group_job(
    test: str,
    subject: Subject,
    module: str,
    args: list[str],
    timeout_s: float,
    plan: _PlanLike,
    port: ClusterPort,
) -> tuple[str | None, list[Verdict], list[str], float]:
    """Run ``module`` as the group job of ``test``; rank 0's result text (or None) and the verdicts so far.

    A Job that outlives its deadline is a ``hang``; one that ends without a result from rank 0 an
    ``error``. The evidence is where the result was published.
    """
    settings = settings_for(plan, port)
    group = render_group_job(test, subject, module, [*args, "--out", RESULT_FILE], settings, timeout_s)
    started = time.monotonic()
    ending, state = _run_job(port, group, timeout_s, settings.poll_s)
    elapsed = round(time.monotonic() - started, 3)
    evidence = [f"configmap/{group.namespace}/{group.name}"]
    where = f"{subject.kind} {subject.name}: job {group.name}"
    if ending == "Timeout":
        message = f"{where} did not finish within its deadline"
        return None, [Verdict(subject=subject, test=test, status="hang", message=message)], evidence, elapsed
    if "result.json" not in state:
        message = f"{where} ended {ending} without a result from rank 0"
        return None, [Verdict(subject=subject, test=test, status="error", message=message)], evidence, elapsed
    return state["result.json"], [], evidence, elapsed


def _unreadable(subject: Subject, test: str, text: str) -> Verdict:
    return Verdict(
        subject=subject,
        test=test,
        status="error",
        message=f"{subject.kind} {subject.name}: rank 0's result is not readable: {text[:200]}",
    )


def run_sweep_job(request: SweepRequest, plan: _PlanLike, port: ClusterPort) -> SweepOutcome:
    """Run the sweep of ``request`` as a group job (NCCL) and judge rank 0's result."""
    config = sweep_config(request.model_copy(update={"backend": "nccl", "inject": []}))
    text, verdicts, evidence, elapsed = _run_group_job(
        "allreduce-sweep",
        request.subject,
        "steps.readiness.sweep",
        sweep_args(config),
        request.timeout_s,
        plan,
        port,
    )
    run: CollectiveRun | None = None
    if text is not None:
        try:
            run = CollectiveRun.model_validate_json(text)
        except ValueError:
            verdicts.append(_unreadable(request.subject, "allreduce-sweep", text))
    if run is not None:
        thresholds = load_thresholds(request.thresholds)
        verdicts += judge_collective(run, request.subject, thresholds, request.scope, evidence)
    return SweepOutcome(
        subject=request.subject,
        status=worst([v.status for v in verdicts]),
        run=run,
        verdicts=verdicts,
        evidence=evidence,
        out_dir=evidence[0],
        elapsed_s=elapsed,
    )


def run_smoke_job(request: SmokeRequest, plan: _PlanLike, port: ClusterPort) -> SmokeOutcome:
    """Run the training smoke run of ``request`` as a group job (NCCL) and judge rank 0's result."""
    thresholds = load_thresholds(request.thresholds)
    config = smoke_config(request.model_copy(update={"backend": "nccl", "inject": []}), thresholds)
    text, verdicts, evidence, elapsed = _run_group_job(
        "training-smoke",
        request.subject,
        "steps.readiness.smoke",
        smoke_args(config),
        request.timeout_s,
        plan,
        port,
    )
    result: SmokeResult | None = None
    if text is not None:
        try:
            result = SmokeResult.model_validate_json(text)
        except ValueError:
            verdicts.append(_unreadable(request.subject, "training-smoke", text))
    if result is not None:
        verdicts += judge_smoke(result, request.subject, thresholds, request.min_loss_drop, evidence)
    return SmokeOutcome(
        subject=request.subject,
        status=worst([v.status for v in verdicts]),
        result=result,
        verdicts=verdicts,
        evidence=evidence,
        out_dir=evidence[0],
        elapsed_s=elapsed,
    )


def main(argv: list[str]) -> int:
    """``publish NAME FILE EXIT_CODE``: called by rank 0's pod at the end of a group job."""
    if len(argv) != 4 or argv[0] != "publish":
        print("usage: python -m steps.readiness.jobs publish NAME FILE EXIT_CODE", file=sys.stderr)
        return 2
    try:
        publish(argv[1], argv[2], int(argv[3]))
    except (DsxError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
