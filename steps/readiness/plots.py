"""PNG plots of the evidence: busbw against message size per group, step time per rank.

matplotlib with the Agg backend, no timestamps or version in the files: the same data gives the same
bytes.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

from steps.files import write_bytes
from steps.readiness.models import CollectiveRun, Subject
from steps.readiness.ranks.smoke import SmokeResult
from steps.readiness.sizes import format_size
from steps.readiness.thresholds import Thresholds

__all__ = ["plot_busbw", "plot_step_times"]


def _save(figure: object, path: Path) -> Path:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100, metadata={"Software": None})  # type: ignore[attr-defined]
    import matplotlib.pyplot as plt

    plt.close(figure)  # type: ignore[arg-type]
    return write_bytes(path, buffer.getvalue())


def plot_busbw(runs: Sequence[tuple[Subject, CollectiveRun]], limits: Thresholds, path: Path) -> Path:
    """busbw against message size, one line per group, with each all-reduce threshold as a dashed line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    records = [
        {"group": subject.name, "size": row.size, "busbw": row.busbw()}
        for subject, run in runs
        for row in run.rows
        if row.busbw() is not None
    ]
    frame = pd.DataFrame(records, columns=["group", "size", "busbw"])
    figure, axes = plt.subplots(figsize=(8, 4.5))
    for group, part in frame.groupby("group", sort=True):
        part = part.sort_values("size")
        axes.plot(part["size"], part["busbw"], marker="o", label=str(group))
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
    if not frame.empty:
        axes.legend(fontsize=8)
    figure.tight_layout()
    return _save(figure, path)


def plot_step_times(runs: Sequence[tuple[Subject, SmokeResult]], path: Path) -> Path:
    """Step time per rank over the training smoke run(s), stragglers' injected faults in the legend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    records = [
        {
            "line": f"{subject.name} rank {rank.rank} ({rank.host})" + (" injected" if rank.injected else ""),
            "step": step,
            "ms": seconds * 1000,
        }
        for subject, result in runs
        for rank in result.ranks
        for step, seconds in enumerate(rank.step_s)
    ]
    frame = pd.DataFrame(records, columns=["line", "step", "ms"])
    figure, axes = plt.subplots(figsize=(8, 4.5))
    for line, part in frame.groupby("line", sort=True):
        axes.plot(part["step"], part["ms"], marker=".", label=str(line))
    axes.set_xlabel("step")
    axes.set_ylabel("step time (ms)")
    axes.set_title("training smoke run: step time per rank")
    axes.grid(True, alpha=0.3)
    if not frame.empty:
        axes.legend(fontsize=7)
    figure.tight_layout()
    return _save(figure, path)
