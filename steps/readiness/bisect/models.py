"""What a bisection exchanges: the result of one group test, every test run, the suspects, the result."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
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
    "Unresolved",
]

Outcome = Literal["pass", "fail", "hang"]
Fault = Literal["slow", "slow-relative", "fail", "hang"]
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
        expected: what a healthy group of this shape reaches (same accelerator, same size), in GB/s, when
            the test knows it: a figure further below it than the stated share beyond the noise band is slow
            relative to its peers, even above ``threshold``.
        ranks: per-rank figures of the run (each member's own link throughput, GB/s), when the test gives
            them: a rank below its peers names a straggler within one run.
        duration_s: how long the test held its nodes, launch included.
        reason: one line on what was seen.
    """

    outcome: Outcome
    figure: float | None = None
    threshold: float | None = None
    expected: float | None = None
    ranks: dict[str, float] | None = None
    duration_s: float = Field(0.0, ge=0.0)
    reason: str = ""


GroupTest = Callable[[Sequence[str]], GroupResult]
"""A group test: the nodes (two or more) in, what their collective gave out."""


class TestRun(Frozen):
    """One test a bisection ran.

    Attributes:
        round: the round it ran in (tests of a round run at once; round 0 is the group's own test).
        kind: ``group`` (the whole group, or all of it left in service, in parts within ``free``),
            ``split`` (part of where the fault is likeliest), ``pair`` (a pair of members) or ``partner``
            (one member beside the node likeliest to be good).
        members: the nodes tested, the partner last.
        outcome: as the test said, after repeats (see ``attempt``); ``fail`` also when its figure was slow
            relative to its peers (``relative``).
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
    relative: bool = False
    stragglers: list[str] = Field(default_factory=list)


class Suspect(Frozen):
    """A node accused: its probability of being faulty reached ``1 - alpha``.

    Attributes:
        node: the node.
        fault: what the most telling failed test that held it showed: ``slow`` (under the threshold),
            ``slow-relative`` (above it, but slower than its peers by more than the stated share beyond the
            noise band, or its rank behind theirs), ``fail`` (the collective failed) or ``hang``.
        probability: the posterior probability that it is faulty, when it was accused.
        confirmed_with: the partner of the last failed test that held it and one other node, if any.
    """

    node: str
    fault: Fault
    probability: float = Field(ge=0.0, le=1.0)
    confirmed_with: str | None = None


class Unresolved(Frozen):
    """A node neither accused nor cleared when the search stopped (its budget spent, or no test left that
    could tell it apart from the others).

    Attributes:
        node: the node.
        probability: its posterior probability of being faulty.
        tests_needed: passing tests holding it that would clear it at the least intermittence reckoned with
            (fewer failing ones would accuse it).
    """

    node: str
    probability: float = Field(ge=0.0, le=1.0)
    tests_needed: int = Field(ge=0)


class SharedLeaf(Frozen):
    """Suspects that share a leaf switch: when many nodes of one rack are accused or left in doubt at once,
    the switch above them is the likelier fault (every test through a faulty switch fails or slows, though
    each node's own links are fine).

    Attributes:
        leaf: the rack (its leaf switch).
        accused: the rack's nodes accused.
        unresolved: the rack's nodes left between accused and cleared.
        nodes: how many of the rack's nodes the search tested.
    """

    leaf: str
    accused: list[str]
    unresolved: list[str] = Field(default_factory=list)
    nodes: int = Field(ge=1)


class BisectResult(Frozen):
    """What a bisection found and what it cost.

    Attributes:
        strategy: the strategy asked for.
        chosen: the strategy that ran (``auto`` picks one of the others).
        nodes: how many nodes the group has.
        suspects: the nodes accused, by name.
        unresolved: the nodes left between accused and cleared, likeliest first.
        alpha: a node is accused at probability ``1 - alpha`` and cleared under ``alpha``.
        fault_left: the probability that a fault is left among the nodes in service when the search ended.
        screening: passes of the nodes left in service: the fewest passing tests any of them took part in
            since a failed test held it.
        screening_needed: the passes that see a fault of the least intermittence reckoned with at
            ``1 - delta``.
        caught: the least intermittence ``P`` the screening would have caught with probability
            ``1 - delta``.
        runs: every test run, in order.
        rounds: rounds of tests run (a round's tests run at once).
        tests: test runs, repeats included.
        wall_clock_s: simulated or measured time from the first test to the last, tests of a round at
            once.
        node_seconds: node time held for testing: each member from the start until a test clears it (or
            to the end), plus the time partners spent in tests.
        leaves: racks where at least half the nodes tested are accused or unresolved, two at least (where
            the caller knows the racks): suspect the switch.
    """

    strategy: Strategy
    chosen: Literal["halving", "pairs"]
    nodes: int
    suspects: list[Suspect]
    unresolved: list[Unresolved] = Field(default_factory=list)
    alpha: float = 0.01
    fault_left: float = 0.0
    screening: int = 0
    screening_needed: int = 1
    caught: float = 1.0
    runs: list[TestRun]
    rounds: int
    tests: int
    wall_clock_s: float
    node_seconds: float
    leaves: list[SharedLeaf] = Field(default_factory=list)

    def with_leaves(self, racks: Mapping[str, str]) -> BisectResult:
        """This result with :attr:`leaves` found from each node's rack (``racks``: node -> rack; a node
        without one counts under none)."""
        accused = {s.node for s in self.suspects}
        doubtful = {u.node for u in self.unresolved}
        members: dict[str, list[str]] = {}
        for node in sorted({r for run in self.runs for r in run.members} & racks.keys()):
            members.setdefault(racks[node], []).append(node)
        leaves = [
            SharedLeaf(
                leaf=leaf,
                accused=[n for n in nodes if n in accused],
                unresolved=[n for n in nodes if n in doubtful],
                nodes=len(nodes),
            )
            for leaf, nodes in sorted(members.items())
            if (hit := sum(1 for n in nodes if n in accused or n in doubtful)) >= 2 and 2 * hit >= len(nodes)
        ]
        return self.model_copy(update={"leaves": leaves})

    @property
    def healthy(self) -> bool:
        """No suspect, nothing unresolved, no fault left above ``alpha``, and screened enough."""
        return (
            not self.suspects
            and not self.unresolved
            and self.fault_left < self.alpha
            and self.screening >= self.screening_needed
        )
