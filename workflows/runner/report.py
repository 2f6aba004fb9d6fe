"""Showing a run to people: a live tree of nodes while it runs, the final tree after, like ``argo watch``.

On a terminal the tree is redrawn in place (rich Live); elsewhere each node that changes phase prints
one plain line, so logs stay readable.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterable, Mapping
from typing import IO, Any

from steps.durations import format_duration
from workflows.runner.model import NodeStatus, Phase, Plan, RunResult

__all__ = ["SYMBOLS", "LineReporter", "LiveReporter", "plan_text", "result_text", "tree_rows"]

SYMBOLS = {
    Phase.Succeeded: "✔",
    Phase.Failed: "✖",
    Phase.Error: "⚠",
    Phase.Skipped: "○",
    Phase.Omitted: "○",
    Phase.Running: "●",
    Phase.Pending: "◷",
}
_HIDDEN = {"StepGroup"}


def _roots(nodes: Mapping[str, NodeStatus]) -> list[NodeStatus]:
    return sorted((n for n in nodes.values() if n.parent_id is None), key=lambda n: (n.sort_key, n.name))


def tree_rows(nodes: Mapping[str, NodeStatus]) -> list[tuple[str, str, str, str, str]]:
    """(step, template, phase, duration, message) for every node, depth first, as ``argo get`` lays out."""
    rows: list[tuple[str, str, str, str, str]] = []

    def visit(node: NodeStatus, prefix: str, last: bool, top: bool) -> None:
        children = [nodes[c] for c in list(node.children) if c in nodes]
        if node.type in _HIDDEN and not top:
            for index, child in enumerate(children):
                visit(child, prefix, last and index == len(children) - 1, False)
            return
        branch = "" if top else ("└─" if last else "├─")
        label = f"{prefix}{branch}{SYMBOLS.get(node.phase, '?')} {node.display_name}"
        template = node.template_name or ""
        if node.template_ref:
            template = f"{node.template_ref.get('name')}/{node.template_ref.get('template')}"
        duration = node.duration
        rows.append(
            (
                label,
                template,
                str(node.phase),
                format_duration(duration) if duration is not None else "",
                node.message,
            )
        )
        extension = "" if top else ("  " if last else "│ ")
        for index, child in enumerate(children):
            visit(child, prefix + extension, index == len(children) - 1, False)

    for root in _roots(nodes):
        visit(root, " ", True, True)
    return rows


def _columns(rows: Iterable[tuple[str, ...]], header: tuple[str, ...]) -> list[str]:
    table = [header, *rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header) - 1)]
    lines = []
    for row in table:
        cells = [cell.ljust(widths[i]) for i, cell in enumerate(row[:-1])]
        lines.append("  ".join([*cells, row[-1]]).rstrip())
    return lines


def result_text(result: RunResult) -> str:
    """The final report: name, phase, message, run folder, then the tree of nodes."""
    rows = [
        (step, template, duration, message)
        for step, template, _, duration, message in tree_rows(result.nodes)
    ]
    lines = [
        f"Name:       {result.workflow_name}",
        f"Phase:      {result.phase}",
    ]
    if result.message:
        lines.append(f"Message:    {result.message}")
    if result.signal is not None:
        name = result.to_dict()["stoppedBy"]
        lines.append(f"Stopped by: {name} (exit status {result.exit_code})")
    lines.append(f"Duration:   {format_duration(result.finished_at - result.started_at)}")
    lines.append(f"Run folder: {result.run_dir}")
    lines.append("")
    lines.extend(_columns(rows, ("STEP", "TEMPLATE", "DURATION", "MESSAGE")))
    return "\n".join(lines) + "\n"


def plan_text(plan: Plan) -> str:
    """``--dry-run``: the workflow, its parameters and every template it can reach."""
    lines = [f"Workflow:   {plan.kind} {plan.workflow}", f"Entrypoint: {plan.entrypoint}"]
    if plan.on_exit:
        lines.append(f"On exit:    {plan.on_exit}")
    if plan.approvals:
        lines.append(f"Approvals:  {', '.join(plan.approvals)} (resume with --approve NAME)")
    lines.append("")
    params = [(p["name"], p["value"], p["source"]) for p in plan.parameters]
    lines.extend(_columns(params, ("PARAMETER", "VALUE", "FROM")) if params else ["(no parameters)"])
    lines.append("")
    templates = [(t["name"], t["type"], t["from"], t["runs"]) for t in plan.templates]
    lines.extend(_columns(templates, ("TEMPLATE", "TYPE", "FROM", "RUNS")))
    return "\n".join(lines) + "\n"


class LineReporter:
    """One plain line per node that starts or finishes: for logs and pipes."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        self.stream = stream or sys.stdout
        self.lock = threading.Lock()
        self.start = time.time()
        self.seen: dict[str, Phase] = {}

    def update(self, node: NodeStatus) -> None:
        """Print the node if its phase changed (Pending and group nodes stay quiet)."""
        if node.phase is Phase.Pending or node.type in _HIDDEN:
            return
        with self.lock:
            if self.seen.get(node.id) is node.phase:
                return
            self.seen[node.id] = node.phase
            elapsed = time.time() - self.start
            text = f"{elapsed:7.1f}s  {node.phase!s:<9}  {node.name}"
            if node.phase.fulfilled and node.duration is not None and node.type not in ("Skipped",):
                text += f"  ({format_duration(node.duration)})"
            if node.message and node.phase is not Phase.Running:
                text += f"  {node.message}"
            self.stream.write(text + "\n")
            self.stream.flush()

    def __enter__(self) -> LineReporter:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


class LiveReporter:
    """A tree redrawn in place on a terminal (rich Live), cleared when the run ends."""

    def __init__(self) -> None:
        from rich.console import Console

        self.console = Console()
        self.nodes: dict[str, NodeStatus] = {}
        self.lock = threading.Lock()
        self.live: Any = None

    def update(self, node: NodeStatus) -> None:
        """Remember the node; the display refreshes on its own."""
        with self.lock:
            self.nodes[node.id] = node

    def _render(self) -> Any:
        from rich.table import Table

        with self.lock:
            nodes = dict(self.nodes)
        table = Table(box=None, pad_edge=False, show_edge=False)
        for column, width in (
            ("STEP", None),
            ("TEMPLATE", None),
            ("PHASE", 9),
            ("DURATION", 8),
            ("MESSAGE", None),
        ):
            table.add_column(column, overflow="ellipsis", no_wrap=True, min_width=width)
        rows = tree_rows(nodes)
        height = max(5, self.console.size.height - 4)
        if len(rows) > height:
            rows = rows[:1] + rows[-(height - 1) :]
        for row in rows:
            table.add_row(*row)
        return table

    def __enter__(self) -> LiveReporter:
        from rich.live import Live

        self.live = Live(
            console=self.console, refresh_per_second=4, transient=True, get_renderable=self._render
        )
        self.live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.live is not None:
            self.live.__exit__(*exc)
