"""One bisection's bookkeeping: rounds of tests, repeats inside the noise band, the clock and node time.

A round's tests run at once, on disjoint nodes, packed into waves of at most ``free`` nodes (the nodes that
may be under test together); a round lasts as long as its waves. A member of the group is held from the
start until the end of the last test it took part in (no pass clears a node at once, so it is needed until
then); a partner lent from outside is held for its tests. A result within the noise band of its threshold
says little yet: the test is run again, up to ``repeats`` more times, and the median figure counts.

How a counted result reads (:func:`reading`): failed, hung, or slow under its threshold; slow relative to its
peers when its figure lies further below what a healthy group of its shape reaches than the stated share
beyond the noise band; and its ranks that fell behind the run's median rank by as much (stragglers).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Literal

from pydantic import Field

from steps.models import Frozen
from steps.readiness.bisect.models import Fault, GroupResult, GroupTest, TestRun

__all__ = ["Kind", "Reading", "Session", "in_band", "judged", "reading"]

Kind = Literal["group", "split", "pair", "partner"]


class Reading(Frozen):
    """What one counted result says to the search.

    Attributes:
        failed: the test failed, hung, or was slow (under its threshold, or relative to its peers).
        fault: what it showed, when failed.
        relative: slow relative to its peers while above the absolute threshold.
        stragglers: members whose rank fell behind the run's median rank.
        timed: members with a rank figure (those not in ``stragglers`` kept pace).
    """

    failed: bool
    fault: Fault | None = None
    relative: bool = False
    stragglers: list[str] = Field(default_factory=list)
    timed: list[str] = Field(default_factory=list)


def reading(result: GroupResult, noise: float, share: float) -> Reading:
    """Read a counted result (see the module docstring): ``share`` is how far below its peers a figure may
    lie beyond the noise band before it counts as slow."""
    cut = (1.0 - share) * (1.0 - noise)
    stragglers: list[str] = []
    timed: list[str] = []
    if result.ranks:
        middle = statistics.median(result.ranks.values())
        timed = sorted(result.ranks)
        stragglers = sorted(n for n, figure in result.ranks.items() if figure < cut * middle)
    if result.outcome == "hang":
        return Reading(failed=True, fault="hang", stragglers=stragglers, timed=timed)
    if result.outcome == "fail":
        fault: Fault = "slow" if result.figure is not None else "fail"
        return Reading(failed=True, fault=fault, stragglers=stragglers, timed=timed)
    if result.figure is not None and result.expected is not None and result.figure < cut * result.expected:
        return Reading(failed=True, fault="slow-relative", relative=True, stragglers=stragglers, timed=timed)
    return Reading(failed=False, stragglers=stragglers, timed=timed)


def in_band(result: GroupResult, noise: float) -> bool:
    """Whether a figure lies within ``noise`` (a fraction) of its threshold, either side: too close to
    say pass or fail. A failed or hung collective has no figure: its outcome counts at once."""
    if result.figure is None or result.threshold is None or noise <= 0:
        return False
    return abs(result.figure - result.threshold) <= noise * result.threshold


def judged(
    test: GroupTest, members: Sequence[str], noise: float, repeats: int = 2
) -> tuple[GroupResult, list[GroupResult]]:
    """Run one group test, again (up to ``repeats`` more times) while its figure lies in the noise band.

    Every path that bisects (``dsx bisect``, the workflow's steps) judges a test this way, so they reach
    the same verdicts. Returns what counts and every run: with repeats, the median figure against the
    threshold; a repeat that failed or hung outright counts as it is.
    """
    results = [test(list(members))]
    while in_band(results[-1], noise) and len(results) <= repeats:
        results.append(test(list(members)))
    figures = [r.figure for r in results if r.figure is not None]
    counted = results[-1]
    if len(results) > 1 and len(figures) == len(results) and counted.threshold is not None:
        median = statistics.median(figures)
        counted = counted.model_copy(
            update={
                "figure": median,
                "outcome": "pass" if median >= counted.threshold else "fail",
                "reason": f"median of {len(figures)} runs within the noise band: {median:.1f} GB/s "
                f"{'>=' if median >= counted.threshold else '<'} {counted.threshold:.1f} GB/s",
            }
        )
    return counted, results


class Session:
    """The rounds of one bisection of ``members``.

    Args:
        test: the group test.
        members: the group's nodes.
        noise: the measurement noise, as a fraction of a figure (the band around a threshold).
        share: how far below its peers a figure may lie beyond the noise band before it is slow.
        repeats: further runs of a test whose figure fell within the band.
        free: how many nodes may be under test at once (default: the whole group).
    """

    def __init__(
        self,
        test: GroupTest,
        members: Sequence[str],
        *,
        noise: float = 0.0,
        share: float = 0.1,
        repeats: int = 2,
        free: int | None = None,
    ) -> None:
        self.test = test
        self.members = list(members)
        self.noise = noise
        self.share = share
        self.repeats = repeats
        self.free = max(2, free or len(self.members))
        self.held_until: dict[str, float] = {}
        self.runs: list[TestRun] = []
        self.rounds = 0
        self.round_no = 0
        self.clock = 0.0
        self.partner_seconds = 0.0

    def _judged(self, kind: Kind, members: list[str]) -> tuple[GroupResult, Reading, float]:
        """Run one test, again while its figure is within the noise band; what counts and the time."""
        counted, results = judged(self.test, members, self.noise, self.repeats)
        read = reading(counted, self.noise, self.share)
        for attempt, result in enumerate(results, start=1):
            last = attempt == len(results)
            shown = counted if last else result
            self.runs.append(
                TestRun(
                    round=self.round_no,
                    kind=kind,
                    members=list(members),
                    outcome="fail" if last and read.relative else shown.outcome,
                    figure=_round(result.figure),
                    threshold=_round(result.threshold),
                    attempt=attempt,
                    duration_s=_round(result.duration_s) or 0.0,
                    reason=_relative_reason(shown, self.noise, self.share)
                    if last and read.relative
                    else shown.reason,
                    relative=last and read.relative,
                    stragglers=read.stragglers if last else [],
                )
            )
        return counted, read, sum(r.duration_s for r in results)

    def run_round(self, tests: Sequence[tuple[Kind, list[str]]]) -> list[tuple[GroupResult, Reading]]:
        """Run one round of tests on disjoint nodes, in waves within ``free``."""
        self.round_no = self.rounds
        self.rounds += 1
        results: list[tuple[GroupResult, Reading]] = []
        inside = set(self.members)
        wave_start, wave_nodes, wave_end = self.clock, 0, self.clock
        for kind, members in tests:
            if wave_nodes and wave_nodes + len(members) > self.free:
                wave_start, wave_nodes = wave_end, 0
            result, read, duration = self._judged(kind, members)
            wave_nodes += len(members)
            wave_end = max(wave_end, wave_start + duration)
            for node in members:
                if node in inside:
                    self.held_until[node] = max(self.held_until.get(node, 0.0), wave_start + duration)
                else:
                    self.partner_seconds += duration
            results.append((result, read))
        self.clock = wave_end
        return results

    def node_seconds(self) -> float:
        """Node time held so far: members until the end of their last test, lent partners for theirs."""
        return sum(self.held_until.values()) + self.partner_seconds


def _relative_reason(result: GroupResult, noise: float, share: float) -> str:
    expected = result.expected or 0.0
    return (
        f"busbw {result.figure or 0.0:.1f} GB/s is slow relative to its peers: under "
        f"{(1.0 - share) * (1.0 - noise) * expected:.1f} GB/s ({share:.0%} below a healthy group's "
        f"{expected:.1f} GB/s, beyond the {noise:.0%} noise band)"
    )


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
