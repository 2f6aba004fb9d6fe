"""The strategies that narrow a failing group down to its faulty nodes.

Group testing: a group test fails when any member is faulty (a ring all-reduce is as fast as its slowest
member, and fails or hangs with any member's links). Every strategy ends the same way: a member left in a
failing group of two or three is tested beside a node known to be good (one cleared by a passing test, or
one lent from outside the group), because a single node's own test never crosses its NICs. That test names
the member (its outcome gives the fault: slow, fail or hang) or clears it.

- ``halving``: split a failing group in two, test both halves at once, recurse into each half that fails.
  Tests grow as ``k log2(N)`` for ``k`` faulty nodes of ``N``; rounds as ``log2(N)``.
- ``pairs``: test disjoint pairs of members in one round (an odd member makes the last a three), then each
  member of a failing pair beside a known-good node (as Google's cluster health scanner does). ``N/2`` tests
  in two rounds, each node under test once.
- ``auto``: plays both strategies on a stand-in for the group (one faulty member, every test as long as the
  group's own test, within the nodes free) and runs the one that holds the fewer node-seconds.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Literal

from steps.errors import InputError
from steps.readiness.bisect.models import (
    STRATEGIES,
    BisectResult,
    Fault,
    GroupResult,
    GroupTest,
    Strategy,
    Suspect,
    TestRun,
)
from steps.readiness.bisect.session import Kind, Session

__all__ = ["bisect", "choose", "halves"]

_Split = Callable[[list[str], bool], list[list[str]] | None]


def _halves(group: list[str], root: bool) -> list[list[str]] | None:
    """Halving's split: two halves, while both keep two members or more."""
    if len(group) < 4:
        return None
    middle = len(group) // 2
    return [group[:middle], group[middle:]]


def halves(group: Sequence[str]) -> list[list[str]] | None:
    """The two halves halving tests next when ``group`` fails (``None``: too small to split, so its
    members are each confirmed beside a known-good partner)."""
    return _halves(list(group), False)


def _pairs(group: list[str], root: bool) -> list[list[str]] | None:
    """Pairs' split: the whole group into disjoint pairs (an odd member joins the last), once."""
    if not root or len(group) < 4:
        return None
    chunks = [group[i : i + 2] for i in range(0, len(group) - len(group) % 2, 2)]
    if len(group) % 2:
        chunks[-1].append(group[-1])
    return chunks


def _across(nodes: list[str]) -> list[list[str]]:
    """Disjoint pairs of the i-th node with the one half the list further on (an odd last one is left)."""
    half = (len(nodes) + 1) // 2
    return [[nodes[i], nodes[i + half]] for i in range(len(nodes) - half)]


def _fault(result: GroupResult) -> Fault:
    if result.outcome == "hang":
        return "hang"
    return "slow" if result.figure is not None else "fail"


def _narrow(session: Session, root: list[str], split: _Split) -> dict[str, Suspect]:
    """Split failing groups and test members beside known-good partners, round after round."""
    failing: list[tuple[list[str], bool]] = [(root, True)]
    waiting: list[tuple[str, GroupResult | None]] = []
    suspects: dict[str, Suspect] = {}
    repaired = False
    while failing or waiting:
        tests: list[tuple[Kind, list[str]]] = []
        for group, is_root in failing:
            parts = split(group, is_root)
            if parts is None:
                waiting += [(m, None) for m in group]
            else:
                tests += [("pair" if split is _pairs else "split", part) for part in parts]
        failing = []
        busy = {n for _, members in tests for n in members} | {m for m, _ in waiting}
        pool = session.known_good(busy)
        partnered = [(m, pool.pop(0)) for m, _ in waiting[: len(pool)]]
        waiting = waiting[len(partnered) :]
        tests += [("partner", [m, p]) for m, p in partnered]
        if not tests and not repaired and len(waiting) >= 3:
            repaired = True  # no node is known good yet: pair the waiting members across their groups
            tests = [("pair", pair) for pair in _across([m for m, _ in waiting])]
            waiting = [(m, r) for m, r in waiting if not any(m in pair for _, pair in tests)]
        if not tests:
            break
        for (kind, members), result in zip(tests, session.run_round(tests), strict=True):
            if kind == "partner" and result.outcome != "pass":
                suspects[members[0]] = Suspect(
                    node=members[0], fault=_fault(result), confidence=1.0, confirmed_with=members[1]
                )
            elif kind != "partner" and result.outcome != "pass":
                failing.append((members, False))
    last = _last_failures(session.runs)
    for member, _ in waiting:  # no known-good node to partner it: named from its failing group, unconfirmed
        suspects[member] = Suspect(node=member, fault=_fault(last.get(member, _UNKNOWN)), confidence=0.5)
    return {n: s.model_copy(update={"confidence": _confidence(s, session.runs)}) for n, s in suspects.items()}


_UNKNOWN = GroupResult(outcome="fail")


def _last_failures(runs: list[TestRun]) -> dict[str, GroupResult]:
    found: dict[str, GroupResult] = {}
    for run in runs:
        if run.outcome != "pass":
            for member in run.members:
                found[member] = GroupResult(outcome=run.outcome, figure=run.figure)
    return found


def _confidence(suspect: Suspect, runs: list[TestRun]) -> float:
    """The share of counted tests holding the node that failed; halved when unconfirmed."""
    counted = [r for r in runs if suspect.node in r.members and _counted(r, runs)]
    failed = sum(r.outcome != "pass" for r in counted)
    share = failed / len(counted) if counted else 1.0
    return round(share * (1.0 if suspect.confirmed_with else 0.5), 3)


def _counted(run: TestRun, runs: list[TestRun]) -> bool:
    """Whether a run is the one that counted for its test (the last attempt)."""
    index = runs.index(run)
    following = runs[index + 1] if index + 1 < len(runs) else None
    return following is None or following.members != run.members or following.attempt == 1


def _unresolved(session: Session, suspects: dict[str, Suspect]) -> list[list[str]]:
    """The smallest failing groups with no suspect among their members (every one was cleared)."""
    groups = sorted(
        {
            tuple(r.members)
            for r in session.runs
            if r.outcome != "pass" and r.kind != "partner" and _counted(r, session.runs)
        },
        key=lambda g: (len(g), g),
    )
    kept: list[tuple[str, ...]] = []
    for group in groups:
        blameless = not suspects.keys() & set(group) and all(m in session.cleared for m in group)
        if blameless and not any(set(k) <= set(group) for k in kept):
            kept.append(group)
    return [list(g) for g in kept]


def _run(
    members: list[str],
    test: GroupTest,
    strategy: Strategy,
    failed: GroupResult | None,
    free: int | None,
    noise: float = 0.0,
    repeats: int = 2,
    partners: Sequence[str] = (),
    pass_s: float | None = None,
) -> BisectResult:
    session = Session(test, members, noise=noise, repeats=repeats, free=free, partners=partners)
    if failed is None:
        (failed,) = session.run_round([("group", members)], first=True)
    if strategy == "auto":
        chosen = choose(members, failed.duration_s, pass_s or failed.duration_s, free)
    else:
        chosen = strategy
    suspects: dict[str, Suspect] = {}
    if failed.outcome != "pass":
        suspects = _narrow(session, members, _halves if chosen == "halving" else _pairs)
    unresolved = _unresolved(session, suspects)
    if failed.outcome != "pass" and not suspects and not unresolved:
        unresolved = [list(members)]  # the group failed, yet every part of it passed
    return BisectResult(
        strategy=strategy,
        chosen=chosen,
        nodes=len(members),
        suspects=[suspects[n] for n in sorted(suspects)],
        unresolved=unresolved,
        runs=session.runs,
        rounds=session.rounds,
        tests=len(session.runs),
        wall_clock_s=round(session.clock, 3),
        node_seconds=round(session.node_seconds(), 3),
    )


_PRIOR = (1, 2, 3, 4)
"""How many members of a failing group ``auto`` reckons with, each as likely: one to four."""


def _stand_in(
    members: Sequence[str], faulty: int, fail_s: float, pass_s: float
) -> tuple[GroupTest, GroupResult]:
    """A group test of ``members`` with ``faulty`` of them at fault, at places drawn once for the size."""
    bad = set(random.Random(f"{len(members)}-{faulty}").sample(list(members), min(faulty, len(members))))

    def test(nodes: Sequence[str]) -> GroupResult:
        failing = not bad.isdisjoint(nodes)
        return GroupResult(outcome="fail" if failing else "pass", duration_s=fail_s if failing else pass_s)

    return test, test(members)


def choose(
    members: Sequence[str], fail_s: float, pass_s: float, free: int | None = None
) -> Literal["halving", "pairs"]:
    """What ``auto`` runs: the strategy whose node-seconds exceed the better one's the least, on average
    over stand-ins for the group with one to four faulty members.

    Which strategy holds fewer node-seconds turns on how many members are at fault, which is not known
    before bisecting: with every node free, pairs clears the group in one round; with few free, its
    pairs wait in waves while halving's large tests clear half the group at once, unless faults sit in
    both halves. Each stand-in is bisected both ways with the session's own accounting: a test holding a
    faulty member takes ``fail_s`` (as long as the group's failing test: a hang holds its nodes to the
    timeout), any other ``pass_s``; at most ``free`` nodes are under test at once.
    """
    excess = {"halving": 0.0, "pairs": 0.0}
    for faulty in _PRIOR:
        test, failed = _stand_in(members, faulty, fail_s, pass_s)
        cost = {
            strategy: _run(list(members), test, strategy, failed, free).node_seconds
            for strategy in ("halving", "pairs")
        }
        best = min(cost.values()) or 1.0
        for strategy, held in cost.items():
            excess[strategy] += held / best
    return "pairs" if excess["pairs"] < excess["halving"] else "halving"


def bisect(
    members: Sequence[str],
    test: GroupTest,
    strategy: Strategy = "auto",
    *,
    noise: float = 0.0,
    repeats: int = 2,
    free: int | None = None,
    partners: Sequence[str] = (),
    failed: GroupResult | None = None,
    pass_s: float | None = None,
) -> BisectResult:
    """Find the faulty members of a group.

    Args:
        members: the group's nodes (two or more, distinct); tested in sorted order.
        test: the group test.
        strategy: ``halving``, ``pairs`` or ``auto``.
        noise: the measurement noise (a fraction): a figure within it of its threshold is run again.
        repeats: the most further runs of such a test.
        free: how many nodes may be under test at once (default: the whole group).
        partners: nodes outside the group known to be good, lent as partners.
        failed: the group's own failing result when it was already tested (then it is not tested again:
            the bisection's counts start after it).
        pass_s: how long a passing test of the group takes, for ``auto``'s choice (default: as long as
            the group's own test; a hung test says nothing about it).

    Raises:
        InputError: fewer than two distinct members, or an unknown strategy.
    """
    nodes = sorted(set(members))
    if len(nodes) < 2 or len(nodes) != len(members):
        raise InputError(
            f"bisection needs two or more distinct nodes, got {len(members)} ({len(nodes)} distinct)"
        )
    if strategy not in STRATEGIES:
        raise InputError(f"unknown bisection strategy {strategy!r}: choose {', '.join(STRATEGIES)}")
    return _run(
        nodes,
        test,
        strategy,
        failed,
        free,
        noise=noise,
        repeats=repeats,
        partners=list(partners),
        pass_s=pass_s,
    )
