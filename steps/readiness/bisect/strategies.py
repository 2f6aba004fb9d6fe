"""The search that narrows a group down to its faulty nodes, every result taken as evidence.

Group testing: a group test fails when a member is faulty (a ring all-reduce is as fast as its slowest
member, and fails or hangs with any member's links), but no result is certain: a faulty link fails only some
tests, a healthy test sometimes fails, noise blurs a figure. Each result updates the posterior of
:mod:`~steps.readiness.bisect.evidence`; each round's tests are chosen from it; the search stops on a stated
confidence.

- **Screening.** While a fault is less likely than not (at the start, and after each accusation), the nodes
  left in service are tested together (in parts of at most ``free``). The group is called healthy only after
  every node left took part in ``ceil(ln delta / ln(1 - p_min))`` passing tests (21 at ``p_min`` 0.2) since
  the last failed test that held it (a hard accused node's aside), and the last of them held them all: a
  fault of intermittence ``p_min`` would have shown with ``1 - delta``. Passes before a failure are not
  counted: the failure may have been the node's own, though an accused node in it seemed to explain it.
- **Narrowing.** Otherwise the nodes that carry the fault's probability (likeliest first, until all but a
  hundredth of it) are tested in parts. ``halving``: two parts of equal probability, both at once (a part
  of one node is tested beside the node likeliest to be good). ``pairs``: every such node in a pair, at once
  (fewest rounds). ``auto``: halving, whose two tests a round tell the most per test when results are
  uncertain. Both halves passing after their parent failed moves little probability: they are tested again.
- **Stopping.** A node is accused when its probability reaches ``1 - alpha``, in the model of one fault at a
  time and in the model of independent faults alike (a healthy node that failed beside two faulty ones is
  not accused: it is tested again); the failed tests it explains
  drop out and the search looks for another. The run ends when the probability that a fault is left is
  under ``alpha`` and the screening is done, or at the test budget, or when no test could tell the
  likeliest nodes apart: the nodes left between ``alpha`` and ``1 - alpha`` are ``unresolved``, each with
  its probability and the tests still needed.
- **Slow relative to peers.** A figure further below what a healthy group of its shape reaches than
  ``share`` beyond the noise band fails the test even above the absolute threshold, and per-rank figures,
  where a test gives them, name a straggler's rank within one run (the speed channel of the evidence).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from steps.errors import InputError
from steps.readiness.bisect.evidence import ALPHA, DELTA, P_MIN, SPURIOUS, Evidence, caught, screening_runs
from steps.readiness.bisect.models import (
    STRATEGIES,
    BisectResult,
    Fault,
    GroupResult,
    GroupTest,
    Strategy,
    Suspect,
    TestRun,
    Unresolved,
)
from steps.readiness.bisect.session import Kind, Reading, Session, reading

__all__ = ["Search", "bisect", "chunks", "halves"]

_REGION = 0.99
"""Narrowing tests the likeliest nodes that together hold this share of the fault's probability."""


_EVEN = 0.5 - 1e-9
"""A fault as likely as not (the prior, up to rounding): screen rather than narrow."""


def chunks(nodes: Sequence[str], free: int) -> list[list[str]]:
    """``nodes`` in parts of at most ``free`` (balanced; a part of one joins its neighbour)."""
    nodes = list(nodes)
    if len(nodes) <= free:
        return [nodes]
    count = -(-len(nodes) // free)
    size, extra = divmod(len(nodes), count)
    parts, start = [], 0
    for index in range(count):
        end = start + size + (1 if index < extra else 0)
        parts.append(nodes[start:end])
        start = end
    return parts


def halves(group: Sequence[str]) -> list[list[str]] | None:
    """The two halves of a failing group of four or more (``None``: too small to split)."""
    if len(group) < 4:
        return None
    middle = len(group) // 2
    return [list(group[:middle]), list(group[middle:])]


class Search:
    """One search over ``members`` (see the module docstring); :func:`bisect` runs it to the end.

    The workflow's steps drive the same object one test at a time: :meth:`observe` a result, :meth:`step`
    to accuse and to learn what to test next.
    """

    def __init__(
        self,
        members: Sequence[str],
        *,
        strategy: Strategy = "auto",
        free: int | None = None,
        partners: Sequence[str] = (),
        alpha: float = ALPHA,
        delta: float = DELTA,
        p_min: float = P_MIN,
        p_max: float = 1.0,
        spurious: float = SPURIOUS,
        budget: int = 600,
        on_accuse: Callable[[Suspect], None] | None = None,
    ) -> None:
        self.on_accuse = on_accuse
        self.members = list(members)
        self.strategy = strategy
        self.free = max(2, free or len(self.members))
        self.outside = [p for p in partners if p not in set(self.members)]
        self.alpha, self.delta, self.budget = alpha, delta, budget
        self.evidence = Evidence(self.members, p_min=p_min, p_max=p_max, spurious=spurious)
        self.needed = screening_runs(p_min, delta)
        self.suspects: dict[str, Suspect] = {}
        self.failures: dict[str, list[tuple[int, int, Fault, str | None]]] = {}
        self.screened = False
        self.stuck = False
        self.observed = 0
        self._rest: list[list[str]] = []
        self._seen = 0  # results observed, the caller's own included (their order)

    def in_service(self) -> list[str]:
        """The members not accused."""
        return [m for m in self.members if m not in self.suspects]

    def observe(self, members: Sequence[str], read: Reading) -> None:
        """One counted result of a test of ``members``, as :func:`~steps.readiness.bisect.session.reading`
        reads it."""
        self.observed += 1
        self._seen += 1
        self.evidence.observe(members, read.failed)
        if read.timed:
            slow = set(read.stragglers)
            self.evidence.observe_ranks(
                [n for n in read.timed if n in slow], [n for n in read.timed if n not in slow]
            )
        if read.failed and read.fault is not None:
            partner = members[-1] if len(members) == 2 else None
            for node in members:
                other = partner if partner != node else members[0]
                self.failures.setdefault(node, []).append((len(members), self._seen, read.fault, other))
        # a straggler's fault: under the threshold, or only behind its peers
        behind: Fault = "slow" if read.fault == "slow" else "slow-relative"
        for node in read.stragglers:
            self.failures.setdefault(node, []).append((1, self._seen, behind, None))

    def _fault(self, node: str) -> tuple[Fault, str | None]:
        seen = self.failures.get(node, [])
        if not seen:
            return "slow-relative", None
        _, _, fault, _ = min(seen, key=lambda f: (f[0], -f[1]))
        pairs = [f for f in seen if f[0] == 2]
        partner = max(pairs, key=lambda f: f[1])[3] if pairs else None
        return fault, partner

    def _accuse(self) -> bool:
        """Accuse every node whose probability reached ``1 - alpha``; whether one was."""
        found = False
        while True:
            marginal, _ = self.evidence.fault()
            slow = self.evidence.slow()
            top = int(np.argmax(marginal)) if len(marginal) else 0
            fastest = int(np.argmax(slow)) if len(slow) else 0
            if len(marginal) and marginal[top] >= 1.0 - self.alpha and self._corroborated(top):
                index, probability, by_speed = top, float(marginal[top]), False
            elif len(slow) and slow[fastest] >= 1.0 - self.alpha:
                index, probability, by_speed = fastest, float(slow[fastest]), True
            else:
                return found
            node = self.members[index]
            fault, partner = self._fault(node)
            if by_speed and fault != "slow":
                fault = "slow-relative"
            self.suspects[node] = Suspect(
                node=node, fault=fault, probability=round(min(probability, 1.0), 6), confirmed_with=partner
            )
            self.evidence.accuse(node)
            self.screened = False
            if self.on_accuse is not None:
                self.on_accuse(self.suspects[node])
            found = True

    def _corroborated(self, index: int) -> bool:
        """A node is accused only when no single other node explains its failed tests (or no other partner
        is left to tell: the evidence is then as good as it gets), and when faults of the others, each as
        likely as their own tests make it, do not explain them either
        (:meth:`~steps.readiness.bisect.evidence.Evidence.independent`)."""
        node = self.members[index]
        if not self.evidence.corroborated(node) and len(self.evidence.candidates()) + len(self.outside) > 2:
            return False
        return bool(self.evidence.independent()[index] >= 1.0 - self.alpha)

    def fault_left(self) -> float:
        """The probability that a fault is left among the nodes in service (either channel)."""
        _, h0 = self.evidence.fault()
        slow = float(np.sum(self.evidence.slow()))
        return min(1.0, (1.0 - h0) + slow)

    def screening(self) -> int:
        """The fewest passing tests any node left in service took part in since a failed test held it."""
        left = self.evidence.candidates()
        return int(np.min(self.evidence.passes_since_failure()[left])) if len(left) else self.needed

    def done(self) -> bool:
        """Settled: no fault left above ``alpha``, screened enough, and the last screen passed."""
        return self.fault_left() < self.alpha and self.screening() >= self.needed and self.screened

    def _partner(self, used: set[str], bound: float, marginal: np.ndarray) -> str | None:
        """The node likeliest to be good (one that passed a test, least in doubt, least likely faulty),
        not under test this round, below ``bound``; else a lent one."""
        doubt = self.evidence.doubt()
        passes = self.evidence.passes
        order = sorted(
            (int(i) for i in self.evidence.candidates() if self.members[i] not in used),
            key=lambda i: (passes[i] == 0, round(float(doubt[i]), 6), marginal[i], -passes[i], i),
        )
        found = next((i for i in order if float(marginal[i]) <= bound), None)
        if found is not None:
            return self.members[found]
        lent: str | None = next((p for p in self.outside if p not in used), None)
        return lent

    def _screen(self) -> list[tuple[Kind, list[str]]]:
        left = self.in_service()
        if len(left) >= 2:
            return [("group", part) for part in chunks(left, self.free)]
        partner = next(iter(self.outside), None)
        return [("group", [*left, partner])] if left and partner is not None else []

    def _narrow(self) -> list[tuple[Kind, list[str]]]:
        marginal, h0 = self.evidence.fault()
        mass = 1.0 - h0
        order = sorted(self.evidence.candidates(), key=lambda i: (-marginal[i], i))
        region: list[int] = []
        total = 0.0
        for i in order:
            if total >= _REGION * mass and region:
                break
            region.append(int(i))
            total += float(marginal[i])
        if self.strategy == "pairs" and len(region) > 3:
            parts = [region[i : i + 2] for i in range(0, len(region) - len(region) % 2, 2)]
            if len(region) % 2:
                parts[-1].append(region[-1])
        else:
            half, running = 0, 0.0
            while half < len(region) and running < total / 2:
                running += float(marginal[region[half]])
                half += 1
            parts = [region[:half]] if self.strategy == "auto" else [region[:half], region[half:]]
        tests: list[tuple[Kind, list[str]]] = []
        used = {self.members[i] for part in parts for i in part}
        kind: Kind = "pair" if self.strategy == "pairs" else "split"
        for part in parts:
            names = [self.members[i] for i in part]
            if len(names) == 1:
                partner = self._partner(used, float(marginal[part[0]]) / 10, marginal)
                if partner is None:
                    continue
                if partner in self.members and not self.evidence.passes[self.evidence.index[partner]]:
                    # no node has passed yet to vouch for a partner: test the others first, in halves
                    rest = [n for n in self.in_service() if n not in used]
                    if len(rest) >= 2:
                        pieces = chunks(rest, min(self.free, max(2, -(-len(rest) // 2))))
                        tests += [("split", piece) for piece in pieces]
                        self._rest = pieces
                        used.update(rest)
                        continue
                used.add(partner)
                tests.append(("partner", [*names, partner]))
            elif names:
                tests += [(kind, piece) for piece in chunks(names, self.free)]
        return tests

    def step(self) -> list[tuple[Kind, list[str]]]:
        """Accuse who reached ``1 - alpha``; the next round's tests (none: the search is over)."""
        self._accuse()
        if self.done() or self.observed >= self.budget:
            return []
        _, h0 = self.evidence.fault()
        if h0 >= _EVEN and self.evidence.focus is not None:
            self.evidence.set_focus(None)  # the fault in focus looks spurious: seek among them all again
            _, h0 = self.evidence.fault()
        tests = self._screen() if self.fault_left() < self.alpha or h0 >= _EVEN else self._narrow()
        self.stuck = not tests
        return tests

    def ran(self, tests: Sequence[tuple[Kind, list[str]]], reads: Sequence[Reading]) -> None:
        """After a round: follow one fault when two disjoint tests failed; note whether the round was a
        screen of every node left in service that passed."""
        failing = [members for (_, members), r in zip(tests, reads, strict=True) if r.failed]
        apart = [m for m in failing if m in self._rest]  # the others than the likeliest failed too
        if len(failing) >= 2 or apart:  # two faults at least: follow the one in the smaller failing test
            self.evidence.set_focus(min(apart or failing, key=len))
        self._rest = []
        left = set(self.in_service())
        held = {n for _, members in tests for n in members}
        self.screened = (
            left <= held and all(kind == "group" for kind, _ in tests) and not any(r.failed for r in reads)
        )

    def unresolved(self) -> list[Unresolved]:
        """The nodes between ``alpha`` and ``1 - alpha``, likeliest first."""
        marginal, _ = self.evidence.fault()
        slow = self.evidence.slow()
        found = []
        for i in self.evidence.candidates():
            probability = max(float(marginal[i]), float(slow[i]))
            if probability >= self.alpha:
                node = self.members[i]
                found.append(
                    Unresolved(
                        node=node,
                        probability=round(probability, 6),
                        tests_needed=self.evidence.tests_to_clear(node, self.alpha),
                    )
                )
        return sorted(found, key=lambda u: (-u.probability, u.node))


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
    alpha: float = ALPHA,
    delta: float = DELTA,
    p_min: float = P_MIN,
    p_max: float = 1.0,
    spurious: float = SPURIOUS,
    share: float = 0.1,
    budget: int = 600,
    on_accuse: Callable[[Suspect, list[TestRun]], None] | None = None,
) -> BisectResult:
    """Find the faulty members of a group, or screen it healthy, with a stated confidence.

    Args:
        members: the group's nodes (two or more, distinct; or one, screened beside a lent partner).
        test: the group test.
        strategy: ``halving``, ``pairs`` or ``auto``.
        noise: the measurement noise (a fraction): a figure within it of its threshold is run again.
        repeats: the most further runs of such a test.
        free: how many nodes may be under test at once (default: the whole group).
        partners: nodes outside the group taken as good, lent as partners.
        failed: the group's own failing result when it was already tested (it counts as evidence and is
            not tested again: the bisection's counts start after it).
        alpha: accuse at ``1 - alpha``, clear under ``alpha``.
        delta: the screening misses a fault of intermittence ``p_min`` with at most this probability.
        p_min: the least intermittence reckoned with (a faulty node fails at least this share of tests).
        p_max: the most.
        spurious: the rate at which a healthy test fails anyway.
        share: how far below its peers a figure may lie beyond the noise band before it is slow.
        budget: the most tests run.
        on_accuse: called the moment a node is accused, with the runs so far (a workflow labels it then).

    Raises:
        InputError: fewer than two distinct members, an unknown strategy, or a setting out of range.
    """
    nodes = _checked_members(members, partners, strategy, budget)
    _check_settings(alpha=alpha, delta=delta, p_min=p_min, p_max=p_max, spurious=spurious, share=share)
    runs: list[TestRun] = []

    def accused(suspect: Suspect) -> None:
        if on_accuse is not None:
            on_accuse(suspect, runs)

    search = Search(
        nodes,
        on_accuse=accused,
        strategy=strategy,
        free=free,
        partners=partners,
        alpha=alpha,
        delta=delta,
        p_min=p_min,
        p_max=p_max,
        spurious=spurious,
        budget=budget,
    )
    session = Session(test, nodes, noise=noise, share=share, repeats=repeats, free=search.free)
    session.runs = runs
    if failed is not None:
        search.observe(nodes, reading(failed, noise, share))
        search.observed = 0  # the caller's test: the budget counts the bisection's own
    while True:
        tests = search.step()
        if not tests:
            break
        results = session.run_round(tests)
        for (_, members), (_, read) in zip(tests, results, strict=True):
            search.observe(members, read)
        search.observed = len(session.runs)
        search.ran(tests, [read for _, read in results])
    return _result(strategy, nodes, search, session, alpha, delta)


def _checked_members(
    members: Sequence[str], partners: Sequence[str], strategy: str, budget: int
) -> list[str]:
    """The group's nodes, sorted, once the group, strategy and budget are found sound.

    Raises:
        InputError: fewer than two distinct members (one, with no partner lent), an unknown strategy, a
            budget under one test.
    """
    nodes = sorted(set(members))
    lent = [p for p in partners if p not in set(nodes)]
    if len(nodes) + min(1, len(lent)) < 2 or len(nodes) != len(members):
        raise InputError(
            f"bisection needs two or more distinct nodes (or one and a partner), got {len(members)} "
            f"({len(nodes)} distinct)"
        )
    if strategy not in STRATEGIES:
        raise InputError(f"unknown bisection strategy {strategy!r}: choose {', '.join(STRATEGIES)}")
    if budget < 1:
        raise InputError(f"bisection budget {budget}: give at least 1 test")
    return nodes


def _result(
    strategy: Strategy, nodes: list[str], search: Search, session: Session, alpha: float, delta: float
) -> BisectResult:
    """What a finished search found and what it cost."""
    return BisectResult(
        strategy=strategy,
        chosen="pairs" if strategy == "pairs" else "halving",
        nodes=len(nodes),
        suspects=[search.suspects[n] for n in sorted(search.suspects)],
        unresolved=search.unresolved(),
        alpha=alpha,
        fault_left=round(search.fault_left(), 6),
        screening=search.screening(),
        screening_needed=search.needed,
        caught=round(caught(search.screening(), delta), 4),
        runs=session.runs,
        rounds=session.rounds,
        tests=len(session.runs),
        wall_clock_s=round(session.clock, 3),
        node_seconds=round(session.node_seconds(), 3),
    )


def _check_settings(**settings: float) -> None:
    """Refuse settings out of range, naming the setting."""
    for name in ("alpha", "delta", "p_min", "spurious"):
        if not 0.0 < settings[name] < 1.0:
            raise InputError(f"bisection {name.replace('_', '-')} {settings[name]}: give 0 < value < 1")
    if not settings["p_min"] <= settings["p_max"] <= 1.0:
        raise InputError(
            f"bisection p-max {settings['p_max']}: give p-min ({settings['p_min']}) <= value <= 1"
        )
    if not 0.0 <= settings["share"] < 1.0:
        raise InputError(f"bisection share {settings['share']}: give 0 <= value < 1")
