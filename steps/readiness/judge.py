"""Verdicts: a collective run, a training smoke run or a launch, judged against the thresholds.

Every verdict names its subject (the node, or the group and its members), the test, the measured
figure, the threshold, the evidence kept and a message that names the rank and node at fault.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Protocol

from steps.readiness.launch import LaunchResult, stderr_tail
from steps.readiness.models import CollectiveRun, Subject, Verdict
from steps.readiness.sizes import format_size
from steps.readiness.thresholds import Scope, Thresholds

__all__ = ["MAD_FLOOR", "judge_collective", "judge_launch", "judge_relative", "straggler_verdicts"]

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


class _Skewed(Protocol):
    """A rank's record with a skew: a sweep's :class:`RankStats` or a smoke run's rank."""

    @property
    def rank(self) -> int: ...
    @property
    def host(self) -> str: ...
    @property
    def skew(self) -> float: ...
    @property
    def injected(self) -> str | None: ...


def straggler_verdicts(
    subject: Subject,
    test: str,
    ranks: Sequence[_Skewed],
    limit: float,
    evidence: list[str],
    slow: Callable[[_Skewed], str],
    fine: Callable[[_Skewed], str],
) -> list[Verdict]:
    """One failing verdict per rank whose skew is over ``limit`` (the most skewed first), else one passing.

    Args:
        slow: what a straggler did, after ``rank R on node N is a straggler (injection):``.
        fine: the whole message of the passing verdict, given the most skewed rank.
    """
    stragglers = sorted((r for r in ranks if r.skew > limit), key=lambda r: (-r.skew, r.rank))
    verdicts = [
        Verdict(
            subject=subject,
            test=test,
            status="fail",
            measured=rank.skew,
            threshold=limit,
            unit="skew",
            evidence=evidence,
            message=(
                f"rank {rank.rank} on node {rank.host} is a straggler"
                f"{f' ({rank.injected})' if rank.injected else ''}: {slow(rank)}"
            ),
            rank=rank.rank,
            node=rank.host,
            injected=rank.injected is not None,
        )
        for rank in stragglers
    ]
    if not stragglers and ranks:
        top = max(ranks, key=lambda r: (r.skew, -r.rank))
        verdicts.append(
            Verdict(
                subject=subject,
                test=test,
                status="pass",
                measured=top.skew,
                threshold=limit,
                unit="skew",
                evidence=evidence,
                message=fine(top),
            )
        )
    return verdicts


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
        median_outside = statistics.median(stats.outside_s for stats in run.rank_stats)
        by_rank = {stats.rank: stats for stats in run.rank_stats}

        def slow(stats: _Skewed) -> str:
            outside = by_rank[stats.rank].outside_s
            return (
                f"{outside:.3f} s outside all-reduce against a median rank's "
                f"{median_outside:.3f} s, skew {stats.skew:.2f} > {limit:g}"
            )

        def fine(top: _Skewed) -> str:
            return (
                f"{name}: no straggler among {len(run.rank_stats)} ranks "
                f"(largest skew {top.skew:.2f}, rank {top.rank} on node {top.host}, limit {limit:g})"
            )

        verdicts += straggler_verdicts(
            subject, "allreduce-straggler", run.rank_stats, limit, kept, slow, fine
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
