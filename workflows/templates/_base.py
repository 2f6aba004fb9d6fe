"""Conventions every dsx workflow definition follows.

Image, namespace and service accounts are chart values: the compiled YAML carries the defaults below and
the Helm chart rewrites them from ``values.yaml`` when it installs the files (``charts/dsx/templates``).
Every WorkflowTemplate explains itself in the Argo UI: a description annotation, a description on every
parameter and an ``enum`` where the values are fixed.

What Argo does with the fields set here (read in Argo Workflows v4.1's source):

Retries (``retryStrategy.retryPolicy``; ``workflow/controller/operator.go``, ``processNodeRetries``):

- ``Always`` retries a node that ended ``Failed`` or ``Error``.
- ``OnFailure`` retries ``Failed`` only: the main container exited non-zero. This is the default when a
  strategy names no policy (``RetryStrategy.RetryPolicyActual``) and it is the wrong way round for dsx: it
  repeats deterministic failures (an ``InputError``, a 422 from the API server) and never retries what
  the infrastructure broke.
- ``OnError`` retries ``Error`` only: the pod was deleted (a drained or lost node: "pod deleted"), Argo's
  ``init`` or ``wait`` container failed (an artifact that could not be saved), the pod failed before its
  main container started (``inferFailedReason``), or the controller could not create the pod. A pod
  that the kubelet evicts for node pressure while its step runs carries the kubelet's message and is
  ``Failed``, so ``OnError`` does not repeat it; the controller's ``failedPodRestart`` setting restarts
  pods evicted before their main container ran.
- ``OnTransientError`` retries either phase when the node's message matches Argo's transient error
  patterns (timeouts, refused connections, ``TRANSIENT_ERROR_PATTERN``).

dsx steps retry the Kubernetes API themselves (429, 5xx, timeouts: ``steps.cluster.retry``), so a step
that still fails has failed for a reason a new pod would meet again: :func:`step` retries ``OnError``
only, with a backoff.

Deadlines (``pkg/apis/workflow/v1alpha1/workflow_types.go``, ``workflow/controller/workflowpod.go``):

- A template's ``timeout`` counts from the node's start: the time the pod waits for a node and pulls
  its image is included, and the controller fails a node still Pending past it. When it is set, Argo
  also replaces the pod's ``activeDeadlineSeconds`` with what is left of it when the pod is created
  (``createWorkflowPod``), so the template's own ``activeDeadlineSeconds`` no longer applies.
- A template's ``activeDeadlineSeconds`` becomes the pod's: the kubelet counts it from the moment it
  accepts the pod (``status.startTime``), after scheduling and before pulling the image.

:func:`step` therefore bounds the work with ``activeDeadlineSeconds`` (the work plus
:data:`STARTUP_ALLOWANCE` for the image pull and Argo's ``init`` container), so a short step cannot fail
because its pod waited for a node; a step that must also bound that wait passes ``pending``, which sets
``timeout`` to the sum of the three instead.

Pods (``workflow/controller/workflowpod.go``, ``newExecContainer``): the workflow's ``securityContext``
becomes the pod's, so ``runAsNonRoot``, the user and group and the seccomp profile reach Argo's ``init``
and ``wait`` containers too; their container ``securityContext`` is the controller's
``executor.securityContext`` (none by default), which Pod Security ``restricted`` needs to drop every
capability and forbid privilege escalation (the README's prerequisites say what to set). The root
filesystem stays writable: steps write under ``/tmp`` (``$DSX_OUTPUT_DIR``) and Argo mounts no volume
there for the main container; one would need ``volumes``, which the local runner refuses.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from typing import Any

from hera.workflows import Parameter, Resources, RetryStrategy, Script, Task, WorkflowTemplate
from hera.workflows.models import (
    Backoff,
    Capabilities,
    PodGC,
    PodSecurityContext,
    SeccompProfile,
    SecurityContext,
    TTLStrategy,
    ValueFrom,
)

from steps.cluster import vocabulary as vocab
from steps.durations import parse_duration
from steps.errors import InputError
from steps.outputs import PARAMS

__all__ = [
    "DEFAULT_IMAGE",
    "DESCRIPTION_ANNOTATION",
    "GPU_IMAGE",
    "ITEM",
    "OUTPUT_DIR",
    "PART_OF",
    "POD_GC",
    "RANK_POD",
    "RANK_SERVICE_ACCOUNT",
    "RUN_AS",
    "SERVICE_ACCOUNTS",
    "STARTUP_ALLOWANCE",
    "TTL_STRATEGY",
    "WORKFLOW_NAME",
    "WORKFLOW_NAMESPACE",
    "WORKFLOW_UID",
    "container_security_context",
    "item_field",
    "param",
    "param_outputs",
    "pod_security_context",
    "rank_env",
    "retry_on_error",
    "service_account",
    "step",
    "workflow_spec",
    "workflow_template",
]

DEFAULT_IMAGE = "ghcr.io/dsx-dev/dsx:0.1.0"
"""The control image (Python and dsx, no CUDA) of every dsx step; the chart replaces it with
``image.repository:image.tag``."""

GPU_IMAGE = "ghcr.io/dsx-dev/dsx-gpu:0.1.0"
"""The GPU image (CUDA PyTorch with NCCL, torchrun, nccl-tests, dsx) of the rank pods of group tests;
steps that launch them read it from ``DSX_GPU_IMAGE``; the chart replaces it with ``gpuImage``."""

RANK_SERVICE_ACCOUNT = "dsx-ranks"
"""Service account of the rank pods (``DSX_RANK_SERVICE_ACCOUNT``); the chart replaces it with
``serviceAccounts.names.ranks``."""

RANK_POD = "{}"
"""The rank pod profile as JSON (``DSX_RANK_POD``: fabric resources, NCCL env, annotations, tolerations,
priority class, ``/dev/shm`` size, capabilities, host network, node selector, pull secrets); the chart
replaces it with ``rankPods`` rendered as JSON."""

SERVICE_ACCOUNTS = {
    "bisect": vocab.WORKFLOW_BISECT,
    "certify": vocab.WORKFLOW_CERTIFY,
    "recipe": vocab.WORKFLOW_RECIPE,
    "bundle": vocab.WORKFLOW_BUNDLE,
    "drift": vocab.WORKFLOW_DRIFT,
    "ranks": RANK_SERVICE_ACCOUNT,
    "remediate": vocab.WORKFLOW_REMEDIATE,
    "goodput": vocab.WORKFLOW_GOODPUT,
}
"""The service account of each workflow (named like the workflow) and of the rank pods. The chart maps
each compiled name ``dsx-KEY`` to ``serviceAccounts.names.KEY`` and gives each account its own RBAC."""

RUN_AS = 65532
"""User and group of every dsx pod (both images run as this uid/gid)."""

DESCRIPTION_ANNOTATION = "workflows.argoproj.io/description"
PART_OF = {"app.kubernetes.io/part-of": "dsx"}

OUTPUT_DIR = "/tmp/dsx-out"
"""Where a step writes its evidence files in a pod (``DSX_OUTPUT_DIR``); output artifacts live under it."""

STARTUP_ALLOWANCE = "5m"
"""Added to a step's work in ``activeDeadlineSeconds``: the kubelet's clock starts before it pulls the
image and runs Argo's ``init`` container."""

POD_GC = PodGC(strategy="OnPodSuccess", delete_delay_duration="10m")
"""Pods of steps that succeeded go 10 minutes after they end (their result is in the Workflow by then).
Pods of failed steps stay, with their logs, until the Workflow itself is deleted (:data:`TTL_STRATEGY`):
without an artifact repository Argo archives no logs, and a failed step's log is the evidence."""

TTL_STRATEGY = TTLStrategy(seconds_after_success=3 * 86400, seconds_after_failure=7 * 86400)
"""Finished Workflows (with the pods they still own) are deleted 3 days after success, 7 after failure."""

WORKFLOW_NAME = "{{workflow.name}}"
WORKFLOW_UID = "{{workflow.uid}}"
WORKFLOW_NAMESPACE = "{{workflow.namespace}}"
ITEM = "{{item}}"
"""Argo variables Hera 7 has no accessor for, written once. Everything else a template refers to goes
through Hera, which raises at compile time when the name is not declared: a workflow parameter as
``wt.get_parameter(name)``, a task's output parameter as ``task.get_parameter(name)``, its result as
``task.result``. (Hera fills ``{{item}}`` in by itself only for a step whose one parameter without a
default comes from the loop, so a step with two, like a check given the item and the run, names it.)"""


def item_field(name: str) -> str:
    """A field of a fan-out's item (``{{item.NAME}}``; a list or object field is passed as JSON)."""
    return f"{{{{item.{name}}}}}"


_RETRY_BACKOFF = Backoff(duration="15s", factor=2, cap="2m")


def pod_security_context() -> PodSecurityContext:
    """The pod-level part of Pod Security ``restricted``, applied to every pod of a workflow."""
    return PodSecurityContext(
        run_as_non_root=True,
        run_as_user=RUN_AS,
        run_as_group=RUN_AS,
        fs_group=RUN_AS,
        seccomp_profile=SeccompProfile(type="RuntimeDefault"),
    )


def container_security_context() -> SecurityContext:
    """The container-level part of Pod Security ``restricted``, on every step container."""
    return SecurityContext(
        allow_privilege_escalation=False,
        privileged=False,
        run_as_non_root=True,
        capabilities=Capabilities(drop=["ALL"]),
        seccomp_profile=SeccompProfile(type="RuntimeDefault"),
    )


def retry_on_error(limit: int) -> RetryStrategy:
    """Retry ``limit`` times what the infrastructure broke (``OnError``), never a failed step."""
    return RetryStrategy(limit=limit, retry_policy="OnError", backoff=_RETRY_BACKOFF)


def service_account(workflow: str) -> str:
    """The service account a workflow runs as: the one named like it (``dsx-certify`` for ``dsx-certify``)."""
    return workflow


def rank_env() -> dict[str, str]:
    """The environment of a step that launches rank pods: their image, account and pod profile."""
    return {
        vocab.ENV_GPU_IMAGE: GPU_IMAGE,
        vocab.ENV_RANK_SERVICE_ACCOUNT: RANK_SERVICE_ACCOUNT,
        vocab.ENV_RANK_POD: RANK_POD,
    }


def param(name: str, description: str, default: Any = None, enum: Sequence[str] | None = None) -> Parameter:
    """A workflow parameter as the Argo UI's submit form shows it; without a default it has no value, so
    Argo refuses a submission that does not give one (Hera would write ``None`` as the text ``null``)."""
    fields: dict[str, Any] = {"name": name, "description": description}
    if default is not None:
        fields["value"] = str(default)
    if enum is not None:
        fields["enum"] = list(enum)
    return Parameter(**fields)


def param_outputs(*names: str, default: str | None = None) -> list[Parameter]:
    """Output parameters a step gives, each read from the file
    :func:`steps.outputs.write_params` writes (``$DSX_OUTPUT_DIR/params/NAME``); ``default`` is what a
    parameter is when the step wrote none (``None``: the step always writes it, else the task fails)."""
    return [
        Parameter(name=name, value_from=ValueFrom(path=f"{OUTPUT_DIR}/{PARAMS}/{name}", default=default))
        for name in names
    ]


def _check_annotations(fn: Callable[..., Any]) -> None:
    """Hera reads a step's annotations at compile time and in the pod: they must be real types."""
    signature = inspect.signature(fn)
    annotations = [p.annotation for p in signature.parameters.values()] + [signature.return_annotation]
    if any(isinstance(a, str) for a in annotations):
        raise InputError(
            f"{fn.__module__}.{fn.__qualname__}: annotations are strings; a step module must not use "
            "'from __future__ import annotations' (Hera's runner needs evaluated types)"
        )


def _seconds(value: str, what: str) -> int:
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        raise InputError(f"{what}: {exc}") from None
    if seconds <= 0:
        raise InputError(f"{what}: {value!r} is not a positive duration")
    return math.ceil(seconds)


def _duration(seconds: int) -> str:
    """Seconds as Argo reads a duration, in the largest whole unit."""
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


class StepScript(Script):
    """A step's script template. Called in a DAG, as every dsx template calls it, it makes a Task; Hera
    types the call ``Step | Task | None`` (a Steps context, a Workflow), so this says which, and
    ``a >> b`` and ``a.get_parameter(...)`` type-check. Its YAML is a Script's."""

    def __call__(self, *args: Any, **kwargs: Any) -> Task:
        made = super().__call__(*args, **kwargs)
        if not isinstance(made, Task):
            raise TypeError(f"step {self.name} is called in a DAG in dsx's templates, not in {made!r}")
        return made


def step(
    fn: Callable[..., Any],
    *,
    timeout: str | None = None,
    pending: str | None = None,
    retries: int | None = None,
    outputs: Any = None,
    env: dict[str, str] | None = None,
    cpu: str = "100m",
    memory: str = "256Mi",
    memory_limit: str = "1Gi",
) -> StepScript:
    """A script template running ``fn`` (a function in ``steps/``) through Hera's runner.

    In the pod this is ``python -m hera.workflows.runner -e module:function`` with the template's input
    parameters; the function's return value, serialised as JSON, becomes ``outputs.result``. The
    template is named after the function in kebab case (``node_check``: ``node-check``), and so is the
    task that calls it (Hera's default), so the Argo UI and ``argo get`` show the step's own name and
    no name is written twice.

    Args:
        fn: the step function.
        timeout: how long the step's work may take. Compiled as ``activeDeadlineSeconds`` (the work plus
            :data:`STARTUP_ALLOWANCE`), which the kubelet counts once the pod is on a node: waiting for a
            node never fails the step.
        pending: also bound the wait for a node: sets the template's ``timeout`` to ``pending`` plus the
            allowance plus ``timeout``. Argo then gives the pod what is left of that whole bound, so the
            work is bounded by it rather than by ``timeout`` alone (see the module's notes).
        retries: retries of infrastructure errors (``OnError``, with a backoff); failures are final.
        outputs: the template's outputs (parameters, artifacts).
        env: environment added to ``DSX_OUTPUT_DIR``.
        cpu: the container's CPU request.
        memory: the container's memory request.
        memory_limit: the container's memory limit.

    Raises:
        InputError: a step module with postponed annotations, or a duration that is not one.
    """
    _check_annotations(fn)
    template_name = fn.__name__.replace("_", "-")
    environment = {vocab.ENV_OUTPUT_DIR: OUTPUT_DIR}
    environment.update(env or {})
    deadline: int | None = None
    outer: str | None = None
    if pending is not None and timeout is None:
        raise InputError(f"step {template_name}: 'pending' is the wait before the work; give 'timeout' too")
    if timeout is not None:
        work = _seconds(timeout, f"step {template_name}: timeout")
        startup = _seconds(STARTUP_ALLOWANCE, "STARTUP_ALLOWANCE")
        if pending is None:
            deadline = work + startup
        else:
            outer = _duration(work + startup + _seconds(pending, f"step {template_name}: pending"))
    return StepScript(
        name=template_name,
        source=fn,
        constructor="runner",
        image=DEFAULT_IMAGE,
        command=["python"],
        active_deadline_seconds=deadline,
        timeout=outer,
        retry_strategy=retry_on_error(retries) if retries else None,
        outputs=outputs,
        env=environment,
        resources=Resources(cpu_request=cpu, memory_request=memory, memory_limit=memory_limit),
        security_context=container_security_context(),
        # The end of the step's log (its error) becomes the node's message in the Argo UI.
        termination_message_policy="FallbackToLogsOnError",
    )


def workflow_template(
    name: str,
    description: str,
    entrypoint: str,
    parameters: Sequence[Parameter] = (),
    **kwargs: Any,
) -> WorkflowTemplate:
    """A WorkflowTemplate with dsx's labels, UI description, service account and pod hygiene.

    Its pods run as the workflow's own service account (:func:`service_account`), meet Pod Security
    ``restricted`` at the pod level, are garbage-collected by :data:`POD_GC`, and the Workflows it starts
    are deleted by :data:`TTL_STRATEGY`.
    """
    return WorkflowTemplate(
        name=name,
        entrypoint=entrypoint,
        annotations={DESCRIPTION_ANNOTATION: description},
        labels=dict(PART_OF),
        arguments=list(parameters),
        **{**workflow_spec(name), **kwargs},
    )


def workflow_spec(name: str) -> dict[str, Any]:
    """The spec fields every dsx workflow shares, as Hera keyword arguments (for a CronWorkflow too)."""
    return {
        "service_account_name": service_account(name),
        "security_context": pod_security_context(),
        "pod_gc": POD_GC,
        "ttl_strategy": TTL_STRATEGY,
    }
