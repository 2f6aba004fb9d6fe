"""The goodput report as a PNG: a timeline of node states (one row a node, a colour a state) above the
GPU-hours lost by cause.

A stretch out of service is drawn at least :data:`MIN_WIDTH` of the period wide, so that a remediation of
minutes still shows on a week. Drawn with :mod:`steps.figures` (matplotlib's Agg canvas), no timestamps or
version in the file: the same report gives the same bytes.
"""

from __future__ import annotations

from pathlib import Path

from steps.cluster import changes
from steps.figures import new_figure, save_png
from steps.sentinel.goodput.ledger_report import STATES, GoodputReport

__all__ = ["MAX_ROWS", "MIN_WIDTH", "plot_report"]

MAX_ROWS = 60
"""Nodes drawn at most: those that lost the most (the report ranks them), the rest named in the title."""

MIN_WIDTH = 0.002
"""The narrowest out-of-service stretch drawn, as a share of the period."""

_COLOURS = {
    "in-service": "#4caf50",
    "quarantined": "#ff9800",
    "draining": "#ffc107",
    "awaiting-repair": "#f44336",
    "recertifying": "#2196f3",
    "escalated": "#6d1b7b",
    "certification-failed": "#795548",
    "bisection-suspect": "#9e9e9e",
}


def plot_report(report: GoodputReport, path: Path) -> Path:
    """Draw ``report`` to ``path`` (PNG)."""
    from matplotlib.patches import Patch

    nodes = report.nodes[:MAX_ROWS]
    start = changes.parse_time(report.since).timestamp()
    rows = max(len(nodes), 1)
    figure = new_figure(figsize=(10, 2.5 + 0.22 * rows + 3))
    timeline, causes = figure.subplots(2, 1, gridspec_kw={"height_ratios": [2 + 0.22 * rows, 3]})
    for row, node in enumerate(nodes):
        for state in STATES:
            least = 0.0 if state == "in-service" else report.period_hours * MIN_WIDTH
            spans = [
                (
                    (changes.parse_time(s.start).timestamp() - start) / 3600,
                    max(
                        least,
                        (changes.parse_time(s.end).timestamp() - changes.parse_time(s.start).timestamp())
                        / 3600,
                    ),
                )
                for s in node.timeline
                if s.state == state
            ]
            if spans:
                timeline.broken_barh(spans, (row - 0.4, 0.8), facecolors=_COLOURS[state])
    timeline.set_yticks(range(len(nodes)), [n.node for n in nodes], fontsize=7)
    timeline.invert_yaxis()
    timeline.set_xlim(0, report.period_hours)
    timeline.set_xlabel(f"hours since {report.since}")
    more = len(report.nodes) - len(nodes)
    timeline.set_title(
        "node states" + (f" (the {len(nodes)} nodes that lost most; {more} more not drawn)" if more else "")
    )
    timeline.legend(
        handles=[Patch(facecolor=_COLOURS[s], label=s) for s in STATES],
        fontsize=7,
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
    )
    lost = report.fleet.lost_by_cause
    names = list(lost)[::-1]
    causes.barh(names, [lost[n] for n in names], color="#f44336")
    causes.set_xlabel("GPU-hours lost")
    causes.set_title(
        f"GPU-hours lost by cause: {report.fleet.lost_gpu_hours:,.2f} of {report.fleet.gpu_hours:,.0f}"
    )
    if not names:
        causes.text(0.5, 0.5, "nothing lost", ha="center", va="center", transform=causes.transAxes)
    return save_png(figure, path)
