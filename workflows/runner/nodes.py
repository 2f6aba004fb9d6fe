"""The node tree: creating nodes, moving them through their phases, their folders and parallelism.

Mirrors the node bookkeeping of ``workflow/controller/operator.go``: ``initializeNode`` (a node's ID,
names, boundary and parent, its template), ``markNodePhase`` (phase, message, finish time) and
``checkParallelism`` (a boundary's ``parallelism`` and the workflow's, counted over pods). Every change
goes through here, under the run's lock, and is reported to ``options.on_update`` (the live display).
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from workflows.runner.model import NodeStatus, Phase
from workflows.runner.names import fnv32a, node_id
from workflows.runner.state import Ctx, RunState, Stopped

__all__ = ["error_node", "finish", "folder", "new_node", "notify", "running", "set_message", "slot"]


def notify(state: RunState, node: NodeStatus) -> None:
    """Tell the caller's ``on_update`` that a node changed; a failing display never stops the run."""
    if state.options.on_update is not None:
        with contextlib.suppress(Exception):
            state.options.on_update(node)


def new_node(
    state: RunState,
    name: str,
    ctx: Ctx,
    node_type: str,
    phase: Phase,
    template: Mapping[str, Any] | None = None,
    holder: Mapping[str, Any] | None = None,
    message: str = "",
    display: str | None = None,
) -> NodeStatus:
    """A node in the tree under ``ctx.parent_id`` (children kept in their display order)."""
    template_name = (template or {}).get("name")
    ref = dict((holder or {}).get("templateRef") or {}) or None
    if template_name is None and holder is not None:
        template_name = holder.get("template") or (ref or {}).get("template")
    now = time.time()
    node = NodeStatus(
        id=node_id(state.workflow, name),
        name=name,
        display_name=display if display is not None else ctx.display,
        type=node_type,
        phase=phase,
        template_name=template_name,
        template_ref={k: str(v) for k, v in ref.items()} if ref else None,
        boundary_id=ctx.boundary_id,
        parent_id=ctx.parent_id,
        message=message,
        started_at=now,
        finished_at=now if phase.fulfilled else None,
        sort_key=ctx.sort_key,
        step_name=ctx.step_name,
    )
    with state.lock:
        state.nodes[node.id] = node
        if ctx.parent_id is not None and ctx.parent_id in state.nodes:
            parent = state.nodes[ctx.parent_id]
            parent.children.append(node.id)
            parent.children.sort(
                key=lambda child: state.nodes[child].sort_key if child in state.nodes else ()
            )
    notify(state, node)
    return node


def finish(state: RunState, node: NodeStatus, phase: Phase, message: str | None = None) -> NodeStatus:
    """Set a node's phase (and message); a fulfilled phase stamps its finish time."""
    with state.lock:
        node.phase = phase
        if message is not None:
            node.message = message
        if phase.fulfilled:
            node.finished_at = time.time()
    notify(state, node)
    return node


def running(state: RunState, node: NodeStatus, message: str | None = None) -> None:
    """Mark a node Running from now (it held its place under parallelism until then)."""
    with state.lock:
        node.phase = Phase.Running
        node.started_at = time.time()
        if message is not None:
            node.message = message
    notify(state, node)


def set_message(state: RunState, node: NodeStatus, message: str) -> None:
    """Change a running node's message (a backoff, a suspend's duration) and show it."""
    with state.lock:
        node.message = message
    notify(state, node)


def error_node(
    state: RunState, name: str, ctx: Ctx, message: str, holder: Mapping[str, Any] | None = None
) -> NodeStatus:
    """A node that ends Error before its template runs (bad reference, depth, input): Argo's type Skipped."""
    return new_node(state, name, ctx, "Skipped", Phase.Error, holder=holder, message=message)


def folder(state: RunState, node: NodeStatus) -> Path:
    """The node's own folder in the run folder (``nodes/<name>``), created with ``artifacts/``."""
    short = node.name[len(state.workflow) :].lstrip(".") or "root"
    safe = re.sub(r"[^A-Za-z0-9._()\[\]:,=-]", "_", short)
    if len(safe) > 120:
        safe = f"{safe[:100]}-{fnv32a(node.name)}"
    with state.lock:
        base = safe
        count = 1
        while safe in state.folders:
            count += 1
            safe = f"{base}-{count}"
        state.folders.add(safe)
    path = state.run_dir / "nodes" / safe
    (path / "artifacts").mkdir(parents=True, exist_ok=True)
    node.folder = str(path.relative_to(state.run_dir))
    return path


@contextlib.contextmanager
def slot(state: RunState, ctx: Ctx, pod: bool) -> Iterator[None]:
    """Hold a place under the boundary's and (for pods) the workflow's ``parallelism``.

    Raises:
        Stopped: the run stopped while the node waited for its place.
    """
    semaphores = []
    if ctx.boundary_id is not None and ctx.boundary_id in state.boundary_slots:
        semaphores.append(state.boundary_slots[ctx.boundary_id])
    if pod and state.workflow_slots is not None:
        semaphores.append(state.workflow_slots)
    held: list[threading.BoundedSemaphore] = []
    try:
        for semaphore in semaphores:
            while not semaphore.acquire(timeout=0.2):
                if state.stop.is_set():
                    raise Stopped
            held.append(semaphore)
        if state.stop.is_set():
            raise Stopped
        yield
    finally:
        for semaphore in reversed(held):
            semaphore.release()
