"""PNG plots of the evidence: busbw against message size per group, step time per rank.

Drawn with :mod:`steps.figures`: matplotlib's Agg canvas, no timestamps or version in the files (the same
data gives the same bytes).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from steps.figures import new_figure, save_png
from steps.readiness.models import CollectiveRun, Subject
from steps.readiness.ranks.smoke import SmokeResult
from steps.readiness.sizes import format_size
from steps.readiness.thresholds import Thresholds

__all__ = ["plot_busbw", "plot_step_times"]


def plot_busbw(runs: Sequence[tuple[Subject, CollectiveRun]], limits: Thresholds, path: Path) -> Path:
    """busbw against message size, one line per group, with each all-reduce threshold as a dashed line."""
    lines: dict[str, list[tuple[int, float]]] = {}
    for subject, run in runs:
        for row in run.rows:
            busbw = row.busbw()
            if busbw is not None:
                lines.setdefault(subject.name, []).append((row.size, busbw))
    figure = new_figure(figsize=(8, 4.5))
    axes = figure.subplots()
    for group, points in sorted(lines.items()):
        sizes, values = zip(*sorted(points), strict=True)
        axes.plot(sizes, values, marker="o", label=group)
    for threshold in limits.all_reduce("node") + limits.all_reduce("multi-node"):
        axes.axhline(threshold.bus_bw_gbps, linestyle="--", color="grey", linewidth=1)
        axes.annotate(
            f"{threshold.scope} threshold {threshold.bus_bw_gbps:g} GB/s at {format_size(threshold.size)}",
            (0.01, threshold.bus_bw_gbps),
            xycoords=("axes fraction", "data"),
            fontsize=7,
            va="bottom",
        )
    axes.set_xscale("log", base=2)
    axes.set_xlabel("message size (bytes)")
    axes.set_ylabel("bus bandwidth (GB/s)")
    axes.set_title("all-reduce bus bandwidth")
    axes.grid(True, which="major", alpha=0.3)
    if lines:
        axes.legend(fontsize=8)
    return save_png(figure, path)


def plot_step_times(runs: Sequence[tuple[Subject, SmokeResult]], path: Path) -> Path:
    """Step time per rank over the training smoke run(s), stragglers' injected faults in the legend."""
    lines: dict[str, list[tuple[int, float]]] = {}
    for subject, result in runs:
        for rank in result.ranks:
            label = f"{subject.name} rank {rank.rank} ({rank.host})" + (" injected" if rank.injected else "")
            lines.setdefault(label, []).extend((step, s * 1000) for step, s in enumerate(rank.step_s))
    figure = new_figure(figsize=(8, 4.5))
    axes = figure.subplots()
    for label, points in sorted(lines.items()):
        if points:
            steps, milliseconds = zip(*points, strict=True)
            axes.plot(steps, milliseconds, marker=".", label=label)
    axes.set_xlabel("step")
    axes.set_ylabel("step time (ms)")
    axes.set_title("training smoke run: step time per rank")
    axes.grid(True, alpha=0.3)
    if any(lines.values()):
        axes.legend(fontsize=7)
    return save_png(figure, path)
