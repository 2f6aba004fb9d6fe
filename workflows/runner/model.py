"""What the local runner takes and gives: run options, node status, the run result and the plan."""

from __future__ import annotations

import datetime as dt
import enum
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "NodeStatus",
    "Phase",
    "Plan",
    "RunOptions",
    "RunResult",
    "timestamp",
]


class Phase(enum.StrEnum):
    """Node and workflow phases, as Argo names them."""

    Pending = "Pending"
    Running = "Running"
    Succeeded = "Succeeded"
    Failed = "Failed"
    Error = "Error"
    Skipped = "Skipped"
    Omitted = "Omitted"

    @property
    def fulfilled(self) -> bool:
        """The node will not change any more."""
        return self not in (Phase.Pending, Phase.Running)

    @property
    def failed_or_error(self) -> bool:
        """Failed or Error."""
        return self in (Phase.Failed, Phase.Error)


def timestamp(seconds: float | None) -> str | None:
    """RFC 3339 UTC time with seconds, as Argo writes ``startedAt`` / ``finishedAt``."""
    if seconds is None:
        return None
    return dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _signal_name(number: int) -> str:
    import signal

    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


@dataclass
class NodeStatus:
    """One node of the run: a template invocation, a retry attempt, a group, a skipped task."""

    id: str
    name: str
    display_name: str
    type: str
    phase: Phase
    template_name: str | None = None
    template_ref: dict[str, str] | None = None
    boundary_id: str | None = None
    parent_id: str | None = None
    message: str = ""
    started_at: float | None = None
    finished_at: float | None = None
    inputs: dict[str, Any] = field(default_factory=dict)
    outputs: dict[str, Any] = field(default_factory=dict)
    children: list[str] = field(default_factory=list)
    folder: str | None = None
    pod_name: str | None = None
    sort_key: tuple[Any, ...] = ()
    step_name: str | None = None

    @property
    def duration(self) -> float | None:
        """Seconds from start to finish (to now while it runs); None before it starts."""
        if self.started_at is None:
            return None
        import time

        end = self.finished_at if self.finished_at is not None else time.time()
        return max(0.0, end - self.started_at)

    def to_dict(self) -> dict[str, Any]:
        """The node as Argo's NodeStatus fields (camelCase), plus the node's folder in the run folder."""
        data: dict[str, Any] = {
            "id": self.id,
            "name": self.name,
            "displayName": self.display_name,
            "type": self.type,
            "phase": str(self.phase),
            "message": self.message,
            "startedAt": timestamp(self.started_at),
            "finishedAt": timestamp(self.finished_at),
            "templateName": self.template_name,
            "templateRef": self.template_ref,
            "boundaryID": self.boundary_id,
            "parentID": self.parent_id,
            "children": list(self.children),
            "inputs": self.inputs,
            "outputs": self.outputs,
            "folder": self.folder,
            "podName": self.pod_name,
        }
        return {k: v for k, v in data.items() if v not in (None, "", [], {})}


Reporter = Callable[[NodeStatus], None]


@dataclass(frozen=True)
class TrustedSteps:
    """dsx's own steps, as its compiled templates run them: the ``module:function`` entries Hera's runner is
    started with and every environment name those templates set. A local run forks these; any other
    container or script template is a host command (:mod:`workflows.runner.host`). The runner reads
    only YAML, so the caller hands them in (the CLI: ``workflows.compiler.trusted_steps()``); the
    default trusts nothing."""

    entries: frozenset[str] = frozenset()
    env: frozenset[str] = frozenset()


NOTHING_TRUSTED = TrustedSteps()
"""No step is dsx's: every container and script template is a host command."""


@dataclass
class RunOptions:
    """How to run: where the run folder goes, what to approve, which cluster, how to report progress."""

    out_dir: Path | None = None
    """The run folder; default ``./dsx-runs/<workflow>-<YYYYmmdd-HHMMSS>-<short-id>``."""
    approve: Sequence[str] = ()
    """Suspend steps to resume at once, by task/step name or template name."""
    cluster: str | None = None
    """Cluster spec passed to every step as ``DSX_CLUSTER`` (``sim:...``, a kubeconfig context...)."""
    kubeconfig: str | None = None
    context: str | None = None
    entrypoint: str | None = None
    """Run this template instead of the workflow's entrypoint."""
    workflow_name: str | None = None
    """The run's workflow name; default ``<template>-<5 characters>`` like Argo's generateName."""
    namespace: str | None = None
    python: str = sys.executable
    env: Mapping[str, str] = field(default_factory=dict)
    """Extra environment variables for every step."""
    on_update: Reporter | None = None
    """Called (from any thread) whenever a node is created or changes phase."""
    poll_interval: float = 0.5
    """Seconds between two checks of a resource template's conditions."""
    artifact_repository: str = "local"
    """``local``: output artifacts are kept in the run folder, standing for a configured repository;
    ``none``: play a cluster without one, where a step that saves an artifact ends Error as in Argo."""
    allow_host_commands: bool = False
    """Run container and script templates that are not dsx's own steps as processes of this machine,
    as this user, their images ignored. Without it such a workflow is refused before it starts."""
    trusted: TrustedSteps = field(default_factory=TrustedSteps)
    """dsx's own steps (see :class:`TrustedSteps`); every other template is a host command."""


@dataclass
class RunResult:
    """How the run ended: Argo's phase and message, every node, and where the run folder is."""

    phase: Phase
    message: str
    workflow_name: str
    run_dir: Path
    nodes: dict[str, NodeStatus]
    parameters: dict[str, str]
    started_at: float
    finished_at: float
    root_id: str
    warnings: list[str] = field(default_factory=list)
    """What worked here but would fail on a cluster as Argo is installed by default."""
    signal: int | None = None
    """The signal (SIGINT 2, SIGTERM 15) that stopped the run; None when it ran to its end."""

    @property
    def succeeded(self) -> bool:
        """The workflow Succeeded."""
        return self.phase is Phase.Succeeded

    @property
    def exit_code(self) -> int:
        """What ``dsx run --local`` exits with: 0 Succeeded, 1 Failed or Error, 128 + the signal that
        stopped the run (130 for SIGINT, 143 for SIGTERM), as a shell reports a process it killed."""
        if self.signal is not None:
            return 128 + self.signal
        return 0 if self.succeeded else 1

    @property
    def outputs(self) -> dict[str, Any]:
        """The entry node's outputs."""
        root = self.nodes.get(self.root_id)
        return dict(root.outputs) if root is not None else {}

    def node(self, display_name: str) -> NodeStatus:
        """The first node (in creation order) with this display name; KeyError when there is none."""
        for node in self.nodes.values():
            if node.display_name == display_name:
                return node
        raise KeyError(display_name)

    def to_dict(self) -> dict[str, Any]:
        """Phase, message, nodes, outputs and run folder, for ``-o json`` and ``workflow.json``."""
        return {
            "name": self.workflow_name,
            "phase": str(self.phase),
            "message": self.message,
            "startedAt": timestamp(self.started_at),
            "finishedAt": timestamp(self.finished_at),
            "parameters": dict(self.parameters),
            "outputs": self.outputs,
            "runDir": str(self.run_dir),
            "nodes": {node_id: node.to_dict() for node_id, node in sorted(self.nodes.items())},
            **({"warnings": list(self.warnings)} if self.warnings else {}),
            **({"stoppedBy": _signal_name(self.signal)} if self.signal is not None else {}),
        }


@dataclass
class Plan:
    """What ``--dry-run`` shows: the workflow, its parameters and every template the run can reach."""

    workflow: str
    kind: str
    entrypoint: str
    on_exit: str | None
    parameters: list[dict[str, Any]]
    templates: list[dict[str, Any]]
    approvals: list[str]

    def to_dict(self) -> dict[str, Any]:
        """Plain data for ``-o json|yaml``."""
        return {
            "workflow": self.workflow,
            "kind": self.kind,
            "entrypoint": self.entrypoint,
            "onExit": self.on_exit,
            "parameters": self.parameters,
            "templates": self.templates,
            "approvals": self.approvals,
        }
