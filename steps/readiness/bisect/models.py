"""What a bisection exchanges: the result of one group test, every test run, the suspects, the result."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

from pydantic import Field

from steps.models import Frozen

__all__ = [
    "STRATEGIES",
    "BisectResult",
    "Fault",
    "GroupResult",
    "GroupTest",
    "Outcome",
    "Strategy",
    "Suspect",
    "TestRun",
]

Outcome = Literal["pass", "fail", "hang"]
Fault = Literal["slow", "fail", "hang"]
Strategy = Literal["halving", "pairs", "auto"]
STRATEGIES: tuple[str, ...] = ("halving", "pairs", "auto")
"""Every strategy, as ``--strategy`` takes it."""


class GroupResult(Frozen):
    """What one test of a group of nodes gave.

    Attributes:
        outcome: ``pass``; ``fail`` (the collective failed, or was slower than ``threshold``); ``hang`` (it
            never completed; the test ended at its own timeout).
        figure: the measured bus bandwidth in GB/s (``None`` when nothing was measured).
        threshold: the least figure a group of this size passes with (the test keys it to the size: a
            group is as fast as its slowest member, and small groups reach less).
        duration_s: how long the test held its nodes, launch included.
        reason: one line on what was seen.
    """

    outcome: Outcome
    figure: float | None = None
    threshold: float | None = None
    duration_s: float = Field(0.0, ge=0.0)
    reason: str = ""


GroupTest = Callable[[Sequence[str]], GroupResult]
"""A group test: the nodes (two or more) in, what their collective gave out."""


class TestRun(Frozen):
    """One test a bisection ran.

    Attributes:
        round: the round it ran in (tests of a round run at once; round 0 is the group's own test).
        kind: ``group`` (the whole group), ``split`` (part of a failing group), ``pair`` (a pair of members)
            or ``partner`` (a member beside a node known to be good: the test that names or clears it).
        members: the nodes tested, the partner last.
        outcome: as the test said, after repeats (see ``attempt``).
        figure: the measured bus bandwidth in GB/s, if any.
        threshold: the threshold the test judged against.
        attempt: 1 for the first run; a result within the noise band of its threshold is run again.
        duration_s: how long it held its nodes.
        reason: what the test said.
    """

    __test__ = False  # not a pytest class

    round: int
    kind: Literal["group", "split", "pair", "partner"]
    members: list[str]
    outcome: Outcome
    figure: float | None = None
    threshold: float | None = None
    attempt: int = 1
    duration_s: float = 0.0
    reason: str = ""


class Suspect(Frozen):
    """A node named at fault.

    Attributes:
        node: the node.
        fault: what its test beside a known-good partner showed: ``slow`` (under the threshold), ``fail``
            (the collective failed) or ``hang``.
        confidence: the share of the tests that held it that failed, halved when no known-good partner
            was found to confirm it (0 to 1).
        confirmed_with: the known-good partner it failed beside (``None``: unconfirmed).
    """

    node: str
    fault: Fault
    confidence: float = Field(ge=0.0, le=1.0)
    confirmed_with: str | None = None


class BisectResult(Frozen):
    """What a bisection found and what it cost.

    Attributes:
        strategy: the strategy asked for.
        chosen: the strategy that ran (``auto`` picks one of the others).
        nodes: how many nodes the group has.
        suspects: the nodes at fault, by name.
        unresolved: failing tests whose members were all cleared later (an intermittent fault, or one
            outside the nodes, such as a switch): the group is not healthy, but no node is to blame.
        runs: every test run, in order.
        rounds: rounds of tests run (a round's tests run at once).
        tests: test runs, repeats included.
        wall_clock_s: simulated or measured time from the first test to the last, tests of a round at
            once.
        node_seconds: node time held for testing: each member from the start until a test clears it (or
            to the end), plus the time partners spent in tests.
    """

    strategy: Strategy
    chosen: Literal["halving", "pairs"]
    nodes: int
    suspects: list[Suspect]
    unresolved: list[list[str]] = Field(default_factory=list)
    runs: list[TestRun]
    rounds: int
    tests: int
    wall_clock_s: float
    node_seconds: float

    @property
    def healthy(self) -> bool:
        """No suspect and nothing unresolved."""
        return not self.suspects and not self.unresolved
