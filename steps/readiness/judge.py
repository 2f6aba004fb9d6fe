"""Verdicts: a collective run, a training smoke run or a launch, judged against the thresholds.

Every verdict names its subject (the node, or the group and its members), the test, the measured
figure, the threshold, the evidence kept and a message that names the rank and node at fault.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence

from steps.readiness.launch import LaunchResult, stderr_tail
from steps.readiness.models import CollectiveRun, Subject, Verdict
from steps.readiness.sizes import format_size
from steps.readiness.thresholds import Scope, Thresholds

__all__ = ["MAD_FLOOR", "judge_collective", "judge_launch", "judge_relative"]

#: In relative mode the spread is never taken below this fraction of the median, so groups that
#: differ only by noise are not failed when most groups measure exactly alike.
MAD_FLOOR = 0.02


def _wrong(run: CollectiveRun) -> int:
    """Wrong elements over every row of the run."""
    table = run.results
    return sum(table.wrong(index) for index in range(len(table)))


def _measured_sizes(run: CollectiveRun) -> set[int]:
    """The sizes at which the run has a bus bandwidth figure."""
    table = run.results
    return {size for index, size in enumerate(table.size) if table.busbw(index) is not None}


def judge_collective(
    run: CollectiveRun,
    subject: Subject,
    thresholds: Thresholds,
    scope: Scope = "node",
    evidence: Sequence[str] = (),
) -> list[Verdict]:
    """Judge one all-reduce run: its completeness and data, busbw at the named sizes, stragglers.

    Bandwidth is judged at each size the thresholds name for ``scope`` (the lower of out-of-place
    and in-place at exactly that size), never on the sweep's average. A size the run did not reach is
    an ``error`` verdict, as is a size whose data check failed.
    """
    kept = list(evidence)
    verdicts: list[Verdict] = []
    injected = bool(run.injected)
    name = f"{subject.kind} {subject.name}"
    if run.status == "complete":
        verdicts.append(
            Verdict(
                subject=subject,
                test="allreduce-run",
                status="pass",
                evidence=kept,
                message=f"{name}: all-reduce ran {len(run.results)} sizes with every result checked",
            )
        )
    else:
        detail = "; ".join(run.problems[:3]) or run.status
        verdicts.append(
            Verdict(
                subject=subject,
                test="allreduce-data" if run.status == "corrupted" else "allreduce-run",
                status="error",
                measured=float(_wrong(run)) if run.status == "corrupted" else None,
                threshold=0.0 if run.status == "corrupted" else None,
                unit="wrong elements" if run.status == "corrupted" else None,
                evidence=kept,
                message=f"{name}: all-reduce run is {run.status}: {detail}",
                injected=injected,
            )
        )
    largest = max(run.results.size, default=0)
    for threshold in thresholds.all_reduce(scope):
        test = f"allreduce-busbw@{format_size(threshold.size)}"
        row = run.row_at(threshold.size)
        figure = row.busbw() if row is not None else None
        if row is None or figure is None:
            why = (
                f"not measured (the run's largest size is {format_size(largest)})"
                if row is None
                else "no figure (the data check failed at that size)"
            )
            verdicts.append(
                Verdict(
                    subject=subject,
                    test=test,
                    status="error",
                    threshold=threshold.bus_bw_gbps,
                    unit="GB/s",
                    evidence=kept,
                    message=f"{name}: busbw at {format_size(threshold.size)}: {why}",
                    injected=injected,
                )
            )
            continue
        ok = figure >= threshold.bus_bw_gbps
        verdicts.append(
            Verdict(
                subject=subject,
                test=test,
                status="pass" if ok else "fail",
                measured=round(figure, 3),
                threshold=threshold.bus_bw_gbps,
                unit="GB/s",
                evidence=kept,
                message=(
                    f"{name}: busbw {figure:.2f} GB/s at {format_size(threshold.size)} "
                    f"{'meets' if ok else 'is below'} the {scope} threshold {threshold.bus_bw_gbps:g} GB/s"
                    + (" (a fault was injected)" if injected and not ok else "")
                ),
                injected=injected and not ok,
            )
        )
    if run.rank_stats:
        limit = thresholds.nccl.straggler_skew
        slow = [stats for stats in run.rank_stats if stats.skew > limit]
        median_outside = statistics.median(stats.outside_s for stats in run.rank_stats)
        for stats in sorted(slow, key=lambda s: (-s.skew, s.rank)):
            label = f" ({stats.injected})" if stats.injected else ""
            verdicts.append(
                Verdict(
                    subject=subject,
                    test="allreduce-straggler",
                    status="fail",
                    measured=stats.skew,
                    threshold=limit,
                    unit="skew",
                    evidence=kept,
                    message=(
                        f"rank {stats.rank} on node {stats.host} is a straggler{label}: "
                        f"{stats.outside_s:.3f} s outside all-reduce against a median rank's "
                        f"{median_outside:.3f} s, skew {stats.skew:.2f} > {limit:g}"
                    ),
                    rank=stats.rank,
                    node=stats.host,
                    injected=stats.injected is not None,
                )
            )
        if not slow:
            top = max(run.rank_stats, key=lambda s: (s.skew, -s.rank))
            verdicts.append(
                Verdict(
                    subject=subject,
                    test="allreduce-straggler",
                    status="pass",
                    measured=top.skew,
                    threshold=limit,
                    unit="skew",
                    evidence=kept,
                    message=(
                        f"{name}: no straggler among {len(run.rank_stats)} ranks "
                        f"(largest skew {top.skew:.2f}, rank {top.rank} on node {top.host}, limit {limit:g})"
                    ),
                )
            )
    return verdicts


def judge_launch(launch: LaunchResult, subject: Subject, test: str, timeout_s: float) -> list[Verdict]:
    """Verdicts for a local run whose ranks did not all exit cleanly: ``hang`` or ``error``.

    A timeout gives ``hang`` naming the ranks that were not inside a collective while others were (or
    all ranks still running, when that cannot tell); a rank that failed gives ``error`` naming the
    rank whose error came first, with its stderr kept as evidence. A clean launch gives no verdict.
    """
    if launch.ok:
        return []
    if launch.timed_out:
        named = [launch.ranks[rank] for rank in launch.hung]
        who = ", ".join(f"rank {r.rank} on node {r.host}" for r in named) or "every rank"
        return [
            Verdict(
                subject=subject,
                test=test,
                status="hang",
                measured=launch.elapsed_s,
                threshold=timeout_s,
                unit="s",
                evidence=[r.stderr for r in launch.ranks],
                message=(
                    f"{subject.kind} {subject.name}: {test} did not finish within {timeout_s:g} s; "
                    f"not answering: {who}; every rank was killed"
                ),
                rank=named[0].rank if len(named) == 1 else None,
                node=named[0].host if len(named) == 1 else None,
            )
        ]
    first = launch.first_failure
    culprit = launch.ranks[first] if first is not None else next(r for r in launch.ranks if r.state != "ok")
    reason = culprit.error or stderr_tail(culprit.stderr) or f"exit status {culprit.returncode}"
    others = [r.rank for r in launch.ranks if r.rank != culprit.rank and r.state != "ok"]
    return [
        Verdict(
            subject=subject,
            test=test,
            status="error",
            evidence=[culprit.stderr] + [r.stderr for r in launch.ranks if r.rank != culprit.rank],
            message=(
                f"rank {culprit.rank} on node {culprit.host} failed (exit {culprit.returncode}): {reason}"
                + (
                    f"; {'rank' if len(others) == 1 else 'ranks'} "
                    f"{', '.join(map(str, others))} stopped after it"
                    if others
                    else ""
                )
            ),
            rank=culprit.rank,
            node=culprit.host,
            injected="injected" in reason.lower(),
        )
    ]


def judge_relative(
    groups: Sequence[tuple[Subject, CollectiveRun]], thresholds: Thresholds, size: int | None = None
) -> list[Verdict]:
    """Relative mode, for clusters with no trusted baseline: groups of equal size in the same run.

    Groups with the same number of members are compared at ``size`` (default: the largest size every
    one of them measured): a group whose busbw is below ``median - madFactor x MAD`` fails. The
    spread is at least :data:`MAD_FLOOR` of the median. Classes with fewer than ``minGroups`` groups
    give no verdict: there is nothing to compare them with.
    """
    relative = thresholds.nccl.relative
    classes: dict[int, list[tuple[Subject, CollectiveRun]]] = defaultdict(list)
    for subject, run in groups:
        classes[len(subject.members) or len(run.ranks)].append((subject, run))
    verdicts: list[Verdict] = []
    for members in sorted(classes):
        entries = classes[members]
        if len(entries) < relative.min_groups:
            continue
        common = set.intersection(*(_measured_sizes(run) for _, run in entries))
        at = size if size is not None else max(common, default=None)
        if at is None or at not in common:
            continue
        figures = {subject.name: run.row_at(at).busbw() for subject, run in entries}  # type: ignore[union-attr]
        values = [float(v) for v in figures.values() if v is not None]
        median = statistics.median(values)
        mad = statistics.median(abs(v - median) for v in values)
        spread = max(mad, MAD_FLOOR * median)
        limit = median - relative.mad_factor * spread
        for subject, run in entries:
            figure = float(figures[subject.name] or 0.0)
            ok = figure >= limit
            verdicts.append(
                Verdict(
                    subject=subject,
                    test=f"allreduce-relative@{format_size(at)}",
                    status="pass" if ok else "fail",
                    measured=round(figure, 3),
                    threshold=round(limit, 3),
                    unit="GB/s",
                    message=(
                        f"{subject.kind} {subject.name}: busbw {figure:.2f} GB/s at {format_size(at)} "
                        f"{'within' if ok else 'below'} the median of {len(entries)} groups of {members} "
                        f"({median:.2f} GB/s) minus {relative.mad_factor:g} x MAD ({spread:.2f}): "
                        f"limit {limit:.2f}"
                    ),
                    injected=bool(run.injected) and not ok,
                )
            )
    return verdicts
