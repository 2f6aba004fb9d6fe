"""One bisection's bookkeeping: rounds of tests, repeats inside the noise band, the clock and node time.

A round's tests run at once, on disjoint nodes, packed into waves of at most ``free`` nodes (the nodes that
may be under test together); a round lasts as long as its waves. A member of the group is held from the
start until a test it took part in passes (it is cleared, and known good from then on) or until the end; a
partner lent to a test is held for that test. A result within the noise band of its threshold says
nothing yet: the test is run again, up to ``repeats`` more times, and the median figure counts.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Literal

from steps.readiness.bisect.models import GroupResult, GroupTest, TestRun

__all__ = ["Kind", "Session", "in_band", "judged"]

Kind = Literal["group", "split", "pair", "partner"]


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
        repeats: further runs of a test whose figure fell within the band.
        free: how many nodes may be under test at once (default: the whole group).
        partners: nodes outside the group known to be good, lent as partners.
    """

    def __init__(
        self,
        test: GroupTest,
        members: Sequence[str],
        *,
        noise: float = 0.0,
        repeats: int = 2,
        free: int | None = None,
        partners: Sequence[str] = (),
    ) -> None:
        self.test = test
        self.members = list(members)
        self.noise = noise
        self.repeats = repeats
        self.free = max(2, free or len(self.members))
        self.outside = [p for p in partners if p not in set(self.members)]
        self.cleared: dict[str, float] = {}
        self.runs: list[TestRun] = []
        self.rounds = 0
        self.round_no = 0
        self.clock = 0.0
        self.partner_seconds = 0.0

    def known_good(self, busy: set[str]) -> list[str]:
        """Nodes that may partner a suspect now: members cleared so far, then the lent ones; none busy."""
        return [n for n in (*sorted(self.cleared), *self.outside) if n not in busy]

    def _judged(self, kind: Kind, members: list[str]) -> tuple[GroupResult, float]:
        """Run one test, again while its figure is within the noise band; what counts and the time."""
        counted, results = judged(self.test, members, self.noise, self.repeats)
        for attempt, result in enumerate(results, start=1):
            last = attempt == len(results)
            self.runs.append(
                TestRun(
                    round=self.round_no,
                    kind=kind,
                    members=list(members),
                    outcome=(counted if last else result).outcome,
                    figure=_round(result.figure),
                    threshold=_round(result.threshold),
                    attempt=attempt,
                    duration_s=_round(result.duration_s) or 0.0,
                    reason=(counted if last else result).reason,
                )
            )
        return counted, sum(r.duration_s for r in results)

    def run_round(self, tests: Sequence[tuple[Kind, list[str]]], *, first: bool = False) -> list[GroupResult]:
        """Run one round of tests on disjoint nodes, in waves within ``free``; clear who passed."""
        self.round_no = 0 if first else self.round_no + 1
        self.rounds += 1
        results: list[GroupResult] = []
        wave_start, wave_nodes, wave_end = self.clock, 0, self.clock
        for kind, members in tests:
            if wave_nodes and wave_nodes + len(members) > self.free:
                wave_start, wave_nodes = wave_end, 0
            result, duration = self._judged(kind, members)
            wave_nodes += len(members)
            wave_end = max(wave_end, wave_start + duration)
            if kind == "partner":
                self.partner_seconds += duration
            if result.outcome == "pass":
                for node in members[:-1] if kind == "partner" else members:
                    self.cleared.setdefault(node, wave_start + duration)
            results.append(result)
        self.clock = wave_end
        return results

    def node_seconds(self) -> float:
        """Node time held so far: members until cleared (or now), partners for their tests."""
        return sum(self.cleared.get(m, self.clock) for m in self.members) + self.partner_seconds


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
