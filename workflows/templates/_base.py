"""Conventions every dsx workflow definition follows.

Image, namespace and service account are chart values: the compiled YAML carries the defaults below and
the Helm chart rewrites them from ``values.yaml`` when it installs the files (``charts/dsx/templates``).
Every WorkflowTemplate explains itself in the Argo UI: a description annotation, a description on every
parameter and an ``enum`` where the values are fixed.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

from hera.workflows import Parameter, RetryStrategy, Script, WorkflowTemplate

from steps.errors import InputError

__all__ = [
    "DEFAULT_IMAGE",
    "DESCRIPTION_ANNOTATION",
    "GPU_IMAGE",
    "OUTPUT_DIR",
    "PART_OF",
    "RANK_SERVICE_ACCOUNT",
    "SERVICE_ACCOUNT",
    "param",
    "step",
    "workflow_template",
]

DEFAULT_IMAGE = "ghcr.io/dsx-dev/dsx:0.1.0"
"""The control image (Python and dsx, no CUDA) of every dsx step; the chart replaces it with
``image.repository:image.tag``."""

GPU_IMAGE = "ghcr.io/dsx-dev/dsx-gpu:0.1.0"
"""The GPU image (CUDA PyTorch with NCCL, torchrun, nccl-tests, dsx) of the rank pods of group tests;
steps that launch them read it from ``DSX_GPU_IMAGE``; the chart replaces it with ``gpuImage``."""

RANK_SERVICE_ACCOUNT = "dsx-ranks"
"""Service account of the rank pods (``DSX_RANK_SERVICE_ACCOUNT``); the chart replaces it."""

SERVICE_ACCOUNT = "dsx-workflow"
"""Service account the workflow pods run as; the chart replaces it with ``serviceAccount.name``."""

DESCRIPTION_ANNOTATION = "workflows.argoproj.io/description"
PART_OF = {"app.kubernetes.io/part-of": "dsx"}

OUTPUT_DIR = "/tmp/dsx-out"
"""Where a step writes its evidence files in a pod (``DSX_OUTPUT_DIR``); output artifacts live under it."""


def param(name: str, description: str, default: Any = None, enum: Sequence[str] | None = None) -> Parameter:
    """A workflow parameter as the Argo UI's submit form shows it."""
    value = None if default is None else str(default)
    return Parameter(
        name=name, description=description, value=value, enum=list(enum) if enum is not None else None
    )


def _check_annotations(fn: Callable[..., Any]) -> None:
    """Hera reads a step's annotations at compile time and in the pod: they must be real types."""
    signature = inspect.signature(fn)
    annotations = [p.annotation for p in signature.parameters.values()] + [signature.return_annotation]
    if any(isinstance(a, str) for a in annotations):
        raise InputError(
            f"{fn.__module__}.{fn.__qualname__}: annotations are strings; a step module must not use "
            "'from __future__ import annotations' (Hera's runner needs evaluated types)"
        )


def step(
    fn: Callable[..., Any],
    *,
    name: str | None = None,
    timeout: str | None = None,
    retries: int | None = None,
    outputs: Any = None,
    env: dict[str, str] | None = None,
) -> Script:
    """A script template running ``fn`` (a function in ``steps/``) through Hera's runner.

    In the pod this is ``python -m hera.workflows.runner -e module:function`` with the template's input
    parameters; the function's return value, serialised as JSON, becomes ``outputs.result``.
    """
    _check_annotations(fn)
    environment = {"DSX_OUTPUT_DIR": OUTPUT_DIR}
    environment.update(env or {})
    return Script(
        name=name or fn.__name__.replace("_", "-"),
        source=fn,
        constructor="runner",
        image=DEFAULT_IMAGE,
        command=["python"],
        timeout=timeout,
        retry_strategy=RetryStrategy(limit=retries) if retries else None,
        outputs=outputs,
        env=environment,
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
    """A WorkflowTemplate with dsx's labels, UI description and service account."""
    return WorkflowTemplate(
        name=name,
        entrypoint=entrypoint,
        annotations={DESCRIPTION_ANNOTATION: description},
        labels=dict(PART_OF),
        service_account_name=SERVICE_ACCOUNT,
        arguments=list(parameters),
        **kwargs,
    )
