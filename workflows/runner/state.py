"""The run state: what every part of the engine reads, in one object per run.

Argo's controller keeps one ``wfOperationCtx`` per workflow operation (``workflow/controller/operator.go``):
the workflow, its spec, its node status, its global scope, its parallelism counters. ``RunState`` is that
context for a local run, shared by the engine's modules (scope, nodes, templates, pods, resources, dag,
steps), each a set of functions over it. Its fields are public on purpose: the modules agree on this one
object, and none reaches into another's private attributes. Mutable fields that several threads touch
(``nodes``, ``folders``, ``processes``, a node's phase) change only under ``lock``.

Also here: where a template invocation sits (:class:`Ctx`), a task or step while its template runs
(:class:`Member`), and the stop that every waiting part watches (:class:`Stopped`).
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from workflows.runner.executor import Launcher
from workflows.runner.library import Library, TemplateScope
from workflows.runner.model import NodeStatus, RunOptions

__all__ = ["Ctx", "Execute", "Member", "RunState", "Shutdown", "Stopped", "stronger"]

Shutdown = Literal["Stop", "Terminate"]
"""Argo's shutdown strategies: ``Terminate`` (``argo terminate``) kills running steps and skips the exit
handler; ``Stop`` (``argo stop``) kills running steps too, then runs the exit handler."""


def stronger(current: Shutdown | None, asked: Shutdown) -> Shutdown:
    """The strategy a run stops with once ``asked`` comes after ``current``: a ``Terminate`` overrides a
    ``Stop``, never the other way round."""
    return "Terminate" if "Terminate" in (current, asked) else asked


class Stopped(Exception):
    """The run is being stopped: whatever waits gives up, and its node ends Failed with the run's
    ``stopped_message``."""


@dataclass
class Ctx:
    """Where a template invocation sits: its boundary, parent, depth and how it is shown."""

    boundary_id: str | None
    parent_id: str | None
    depth: int
    display: str
    sort_key: tuple[Any, ...] = ()
    step_name: str | None = None
    local: dict[str, str] = field(default_factory=dict)
    deadline: float | None = None


@dataclass
class Member:
    """A task of a DAG or a step of a steps template, while its template runs."""

    name: str
    holder: dict[str, Any]
    order: int
    node: NodeStatus | None = None
    items: list[NodeStatus] | None = None
    started: bool = False
    done: bool = False


class Execute(Protocol):
    """Invoke a template as a node (Argo's executeTemplate): what a steps or DAG template, or an exit
    handler, calls for each member. The run state carries it (:attr:`RunState.execute`), so they reach
    :func:`workflows.runner.templates.execute` without importing the module that dispatches to them."""

    def __call__(
        self,
        state: RunState,
        name: str,
        holder: Mapping[str, Any],
        scope: TemplateScope,
        args: Mapping[str, str],
        ctx: Ctx,
    ) -> NodeStatus: ...


def _sys_path() -> list[str]:
    """Where steps import from: the working folder, then this checkout (so ``steps`` resolves)."""
    roots = [os.getcwd(), str(Path(__file__).resolve().parents[2])]
    return list(dict.fromkeys(roots))


@dataclass(eq=False)
class RunState:
    """One run: the workflow, its options and run folder, the node tree, the clock, the lock, the stop.

    Attributes:
        library: the workflow and the templates it may reference.
        options: how the run was asked for (``dsx run``'s flags).
        run_dir: the run folder; every node's files live below it.
        workflow: the workflow's name (``workflow.name``), the root node's name.
        parameters: the workflow's parameter values.
        cluster_spec: the cluster steps talk to (``DSX_CLUSTER``), None for the default.
        launcher: starts step processes (forked from a preloaded server where it can).
        execute: invokes a template as a node (:class:`Execute`).
        spec: the workflow's spec.
        created: when the run started (``workflow.creationTimestamp``), seconds since the epoch.
        uid: the workflow's uid.
        lock: guards the node tree and every set below.
        nodes: every node so far, by ID.
        stop: set when the run is stopped (SIGINT, SIGTERM, a caller's stop): nothing new starts, waits
            end; cleared again for a ``Stop``'s exit handler.
        shutdown: how the run was stopped (None while it was not).
        globals: the global scope (``workflow.*``).
        workflow_slots: ``spec.parallelism``, counted over pods.
        boundary_slots: a dag or steps node's ``parallelism``, by node ID.
        boundary_templates: a dag or steps node's prefix and template as JSON (Argo's includeScriptOutput).
        folders: node folder names taken so far.
        processes: step processes running now, killed when the run stops.
        sys_path: where steps import from.
        port: the cluster adapter, connected on first use (under ``port_lock``).
    """

    library: Library
    options: RunOptions
    run_dir: Path
    workflow: str
    parameters: dict[str, str]
    cluster_spec: str | None
    launcher: Launcher
    execute: Execute
    spec: dict[str, Any]
    created: float = field(default_factory=time.time)
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))
    lock: threading.RLock = field(default_factory=threading.RLock)
    nodes: dict[str, NodeStatus] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)
    shutdown: Shutdown | None = None
    globals: dict[str, str] = field(default_factory=dict)
    workflow_slots: threading.BoundedSemaphore | None = field(init=False, default=None)
    boundary_slots: dict[str, threading.BoundedSemaphore] = field(default_factory=dict)
    boundary_templates: dict[str, tuple[str, str]] = field(default_factory=dict)
    folders: set[str] = field(default_factory=set)
    processes: set[Any] = field(default_factory=set)
    sys_path: list[str] = field(default_factory=_sys_path)
    port: Any = None
    port_lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def stopped_message(self) -> str:
        """Argo's message for what the run's stop ended: "Stopped with strategy 'Stop'" or '...Terminate'."""
        return f"Stopped with strategy '{self.shutdown or 'Terminate'}'"

    def __post_init__(self) -> None:
        parallelism = self.spec.get("parallelism")
        if parallelism:
            self.workflow_slots = threading.BoundedSemaphore(int(parallelism))
