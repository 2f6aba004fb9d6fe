"""Verdicts: a collective run, a training smoke run or a launch, judged against the thresholds.

Every verdict names its subject (the node, or the group and its members), the test, the measured
figure, the threshold, the evidence kept and a message that names the rank and node at fault. Every
verdict of the part is made by :func:`verdict`, here: the launchers for how a run ended, the checks for
what rank 0 reported, the certification pipeline for what it could not test.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Protocol

from steps.readiness.models import CollectiveRun, Subject, Verdict, VerdictStatus
from steps.readiness.ranks.diag import DiagResult, DiagTest
from steps.readiness.ranks.smoke import SmokeResult
from steps.readiness.sizes import format_size
from steps.readiness.thresholds import AllReduceThreshold, Scope, Thresholds

__all__ = [
    "DIAG_TEST",
    "MAD_FLOOR",
    "MESSAGE_LIMIT",
    "judge_collective",
    "judge_diag",
    "judge_relative",
    "judge_smoke",
    "only_slow",
    "straggler_verdicts",
    "subject_name",
    "verdict",
]

#: In relative mode the spread is never taken below this fraction of the median, so groups that
#: differ only by noise are not failed when most groups measure exactly alike.
MAD_FLOOR = 0.02
#: The longest message a verdict keeps: verdicts travel in the workflow's one-line results and in the
#: node annotations, where a whole stderr or a scheduler's list of every node would not fit.
MESSAGE_LIMIT = 1000


class _Placed(Protocol):
    """A rank a verdict can name: a launched rank, a sweep's :class:`RankStats`, a smoke run's rank."""

    @property
    def rank(self) -> int: ...
    @property
    def host(self) -> str: ...


class _Skewed(_Placed, Protocol):
    """A rank's record with a skew: a sweep's :class:`RankStats` or a smoke run's rank."""

    @property
    def skew(self) -> float: ...
    @property
    def injected(self) -> str | None: ...


def subject_name(subject: Subject) -> str:
    """How messages name a subject: ``node node-03``, ``group rack-01``."""
    return f"{subject.kind} {subject.name}"


def verdict(
    subject: Subject,
    test: str,
    status: VerdictStatus,
    message: str,
    *,
    measured: float | None = None,
    threshold: float | None = None,
    unit: str | None = None,
    evidence: Sequence[str] = (),
    named: Sequence[_Placed] = (),
    node: str | None = None,
    injected: bool = False,
) -> Verdict:
    """One verdict, its message cut to :data:`MESSAGE_LIMIT` characters.

    Args:
        named: the ranks the verdict is about; when it is exactly one, the verdict names its rank and
            node (a verdict about several ranks names them in its message only).
        node: the node the verdict is about when no rank is (a node that could not be tested).
    """
    one = named[0] if len(named) == 1 else None
    return Verdict(
        subject=subject,
        test=test,
        status=status,
        measured=measured,
        threshold=threshold,
        unit=unit,
        evidence=list(evidence),
        message=message[:MESSAGE_LIMIT],
        rank=one.rank if one is not None else None,
        node=one.host if one is not None else node,
        injected=injected,
    )


def straggler_verdicts(
    subject: Subject,
    test: str,
    ranks: Sequence[_Skewed],
    limit: float,
    evidence: Sequence[str],
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
        verdict(
            subject,
            test,
            "fail",
            f"rank {rank.rank} on node {rank.host} is a straggler"
            f"{f' ({rank.injected})' if rank.injected else ''}: {slow(rank)}",
            measured=rank.skew,
            threshold=limit,
            unit="skew",
            evidence=evidence,
            named=[rank],
            injected=rank.injected is not None,
        )
        for rank in stragglers
    ]
    if not stragglers and ranks:
        top = max(ranks, key=lambda r: (r.skew, -r.rank))
        verdicts.append(
            verdict(
                subject,
                test,
                "pass",
                fine(top),
                measured=top.skew,
                threshold=limit,
                unit="skew",
                evidence=evidence,
            )
        )
    return verdicts


# ----------------------------------------------------------------------------- all-reduce


def _wrong(run: CollectiveRun) -> int:
    """Wrong elements over every row of the run."""
    table = run.results
    return sum(table.wrong(index) for index in range(len(table)))


def _measured_sizes(run: CollectiveRun) -> set[int]:
    """The sizes at which the run has a bus bandwidth figure."""
    table = run.results
    return {size for index, size in enumerate(table.size) if table.busbw(index) is not None}


def _run_verdict(run: CollectiveRun, subject: Subject, evidence: Sequence[str]) -> Verdict:
    """Whether the run is complete with every result checked (``error`` when it is not)."""
    name = subject_name(subject)
    if run.status == "complete":
        message = f"{name}: all-reduce ran {len(run.results)} sizes with every result checked"
        return verdict(subject, "allreduce-run", "pass", message, evidence=evidence)
    corrupted = run.status == "corrupted"
    detail = "; ".join(run.problems[:3]) or run.status
    return verdict(
        subject,
        "allreduce-data" if corrupted else "allreduce-run",
        "error",
        f"{name}: all-reduce run is {run.status}: {detail}",
        measured=float(_wrong(run)) if corrupted else None,
        threshold=0.0 if corrupted else None,
        unit="wrong elements" if corrupted else None,
        evidence=evidence,
        injected=bool(run.injected),
    )


def _busbw_verdict(
    run: CollectiveRun, subject: Subject, expected: AllReduceThreshold, scope: Scope, evidence: Sequence[str]
) -> Verdict:
    """Bus bandwidth at exactly the threshold's size (``error`` when the run has no figure there)."""
    name, at, injected = subject_name(subject), format_size(expected.size), bool(run.injected)
    test = f"allreduce-busbw@{at}"
    row = run.row_at(expected.size)
    figure = row.busbw() if row is not None else None
    if row is None or figure is None:
        largest = max(run.results.size, default=0)
        why = (
            f"not measured (the run's largest size is {format_size(largest)})"
            if row is None
            else "no figure (the data check failed at that size)"
        )
        message = f"{name}: busbw at {at}: {why}"
        return verdict(
            subject,
            test,
            "error",
            message,
            threshold=expected.bus_bw_gbps,
            unit="GB/s",
            evidence=evidence,
            injected=injected,
        )
    ok = figure >= expected.bus_bw_gbps
    return verdict(
        subject,
        test,
        "pass" if ok else "fail",
        f"{name}: busbw {figure:.2f} GB/s at {at} "
        f"{'meets' if ok else 'is below'} the {scope} threshold {expected.bus_bw_gbps:g} GB/s"
        + (" (a fault was injected)" if injected and not ok else ""),
        measured=round(figure, 3),
        threshold=expected.bus_bw_gbps,
        unit="GB/s",
        evidence=evidence,
        injected=injected and not ok,
    )


def _sweep_stragglers(
    run: CollectiveRun, subject: Subject, thresholds: Thresholds, evidence: Sequence[str]
) -> list[Verdict]:
    """Ranks that spent more time outside the all-reduce than the median rank, over the skew limit."""
    if not run.rank_stats:
        return []
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
            f"{subject_name(subject)}: no straggler among {len(run.rank_stats)} ranks "
            f"(largest skew {top.skew:.2f}, rank {top.rank} on node {top.host}, limit {limit:g})"
        )

    return straggler_verdicts(subject, "allreduce-straggler", run.rank_stats, limit, evidence, slow, fine)


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
    verdicts = [_run_verdict(run, subject, kept)]
    verdicts += [
        _busbw_verdict(run, subject, expected, scope, kept) for expected in thresholds.all_reduce(scope)
    ]
    return verdicts + _sweep_stragglers(run, subject, thresholds, kept)


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
        spread = max(statistics.median(abs(v - median) for v in values), MAD_FLOOR * median)
        limit = median - relative.mad_factor * spread
        for subject, run in entries:
            figure = float(figures[subject.name] or 0.0)
            ok = figure >= limit
            verdicts.append(
                verdict(
                    subject,
                    f"allreduce-relative@{format_size(at)}",
                    "pass" if ok else "fail",
                    f"{subject_name(subject)}: busbw {figure:.2f} GB/s at {format_size(at)} "
                    f"{'within' if ok else 'below'} the median of {len(entries)} groups of {members} "
                    f"({median:.2f} GB/s) minus {relative.mad_factor:g} x MAD ({spread:.2f}): "
                    f"limit {limit:.2f}",
                    measured=round(figure, 3),
                    threshold=round(limit, 3),
                    unit="GB/s",
                    injected=bool(run.injected) and not ok,
                )
            )
    return verdicts


# ----------------------------------------------------------------------------- training smoke run


def _finite_verdict(result: SmokeResult, subject: Subject, evidence: Sequence[str]) -> Verdict:
    """Every rank's loss finite, else an ``error`` naming the first step and the ranks that saw it."""
    name = subject_name(subject)
    bad = [r for r in result.ranks if r.first_nonfinite_step is not None]
    if not bad:
        message = f"{name}: every loss on all {result.world_size} ranks is finite"
        return verdict(subject, "smoke-finite", "pass", message, evidence=evidence)
    first = min(r.first_nonfinite_step or 0 for r in bad)
    culprits = [r for r in bad if r.first_nonfinite_step == first]
    who = ", ".join(
        f"rank {r.rank} on node {r.host}" + (f" ({r.injected})" if r.injected else "") for r in culprits
    )
    return verdict(
        subject,
        "smoke-finite",
        "error",
        f"{name}: loss became NaN or Inf at step {first} on {who}; {len(bad)} ranks affected",
        measured=float(first),
        unit="step",
        evidence=evidence,
        named=culprits,
        injected=any(r.injected for r in culprits),
    )


def _loss_verdicts(
    result: SmokeResult, subject: Subject, min_loss_drop: float, evidence: Sequence[str]
) -> list[Verdict]:
    """The loss fell by at least ``min_loss_drop`` of its first value (no verdict without both losses)."""
    if result.initial_loss is None or result.final_loss is None:
        return []
    limit = result.initial_loss * (1 - min_loss_drop)
    ok = result.final_loss <= limit
    message = (
        f"{subject_name(subject)}: loss fell from {result.initial_loss:.4f} to {result.final_loss:.4f} over "
        f"{result.steps} steps" + ("" if ok else f", not below {limit:.4f}")
    )
    return [
        verdict(
            subject,
            "smoke-loss",
            "pass" if ok else "fail",
            message,
            measured=result.final_loss,
            threshold=round(limit, 6),
            unit="loss",
            evidence=evidence,
        )
    ]


def _smoke_stragglers(
    result: SmokeResult, subject: Subject, thresholds: Thresholds, evidence: Sequence[str]
) -> list[Verdict]:
    """Ranks whose own work per step exceeds the median rank's by more than the skew limit."""
    limit = thresholds.training.straggler_skew
    median_own = statistics.median(r.median_own_s for r in result.ranks)
    by_rank = {r.rank: r for r in result.ranks}

    def slow(rank: _Skewed) -> str:
        record = by_rank[rank.rank]
        return (
            f"{record.median_own_s * 1000:.1f} ms "
            f"of its own work per step against {median_own * 1000:.1f} ms for the median rank, "
            f"skew {record.skew:.2f} of a {result.median_step_s * 1000:.1f} ms step > {limit:g}"
        )

    def fine(top: _Skewed) -> str:
        name = subject_name(subject)
        return f"{name}: no straggler among {result.world_size} ranks (largest skew {top.skew:.2f})"

    return straggler_verdicts(subject, "smoke-straggler", result.ranks, limit, evidence, slow, fine)


def _mfu_verdicts(
    result: SmokeResult, subject: Subject, thresholds: Thresholds, evidence: Sequence[str]
) -> list[Verdict]:
    """MFU against the recipe's floor, on GPU runs with a peak (no verdict otherwise)."""
    training = thresholds.training
    if result.mfu is None or training.min_mfu is None:
        return []
    ok = result.mfu >= training.min_mfu
    message = (
        f"{subject_name(subject)}: {result.tflops_per_gpu:g} TFLOP/s per GPU is MFU {result.mfu:.3f} of the "
        f"{training.peak_tflops:g} TFLOP/s peak, {'meeting' if ok else 'below'} {training.min_mfu:g}"
    )
    return [
        verdict(
            subject,
            "smoke-mfu",
            "pass" if ok else "fail",
            message,
            measured=result.mfu,
            threshold=training.min_mfu,
            unit="MFU",
            evidence=evidence,
        )
    ]


def judge_smoke(
    result: SmokeResult,
    subject: Subject,
    thresholds: Thresholds,
    min_loss_drop: float,
    evidence: Sequence[str] = (),
) -> list[Verdict]:
    """Verdicts of a smoke run: finite losses on every rank, falling loss, stragglers, MFU on GPU."""
    return [
        _finite_verdict(result, subject, evidence),
        *_loss_verdicts(result, subject, min_loss_drop, evidence),
        *_smoke_stragglers(result, subject, thresholds, evidence),
        *_mfu_verdicts(result, subject, thresholds, evidence),
    ]


#: The tests whose failure says the group was slow (too little bandwidth, or a rank that keeps the
#: others waiting), as opposed to broken (a failed run, wrong data, a rank that died).
SLOW_TESTS = ("allreduce-busbw", "allreduce-straggler")


def only_slow(verdicts: Sequence[Verdict]) -> bool:
    """Whether every failing verdict is about speed (:data:`SLOW_TESTS`): a bisection then calls the node
    it names slow, else failing."""
    failing = [v for v in verdicts if v.status != "pass"]
    return bool(failing) and all(v.test.split("@")[0] in SLOW_TESTS for v in failing)


#: The test name of DCGM's diagnostics in verdicts.
DIAG_TEST = "dcgm-diag"


def _failed_on(test: DiagTest) -> str:
    """A failed diagnostic test's words: the GPUs it failed and what DCGM said of each."""
    parts = []
    for entity in test.entities:
        if entity.status != "Fail":
            continue
        said = "; ".join(entity.warnings) or "no warning given"
        parts.append(f"{entity.group} {entity.id}: {said}")
    if not parts:  # a failure DCGM gives for the test as a whole
        parts.append("; ".join(test.warnings) or "no warning given")
    return f"{test.name} failed ({' | '.join(parts)})"


def judge_diag(result: DiagResult, subject: Subject, evidence: Sequence[str] = ()) -> list[Verdict]:
    """Verdicts of DCGM's diagnostics on a node.

    DCGM absent passes and says so (no dcgmi on the image, no host engine): the report shows that no
    diagnostic ran. A diagnostic that could not run, or said nothing readable, is an ``error``; each test
    DCGM failed is a ``fail`` naming the GPUs and DCGM's words; tests that only warned pass, their
    warnings in the message.
    """
    name = subject_name(subject)
    if not result.present:
        message = f"{name}: no DCGM diagnostics ran: {result.reason} (DCGM absent is not a failure)"
        return [verdict(subject, DIAG_TEST, "pass", message, evidence=evidence, node=result.node)]
    ran = f"dcgmi diag -r {result.run}"
    if result.error is not None:
        message = f"{name}: {ran} could not give a verdict: {result.error}"
        return [verdict(subject, DIAG_TEST, "error", message, evidence=evidence, node=result.node)]
    failed = [t for t in result.tests if t.status == "Fail"]
    if failed:
        return [
            verdict(
                subject,
                DIAG_TEST,
                "fail",
                f"{name}: {ran}: {_failed_on(t)}",
                evidence=evidence,
                node=result.node,
            )
            for t in failed
        ]
    passed = ", ".join(f"{t.name} {t.status.lower()}" for t in result.tests)
    warned = [w for t in result.tests if t.status == "Warn" for w in (t.warnings or ["warned"])]
    version = f" (DCGM {result.version})" if result.version else ""
    message = f"{name}: {ran}{version}: {passed}" + (f"; warnings: {'; '.join(warned)}" if warned else "")
    return [verdict(subject, DIAG_TEST, "pass", message, evidence=evidence, node=result.node)]
