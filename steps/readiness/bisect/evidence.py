"""What a bisection believes about its nodes: a posterior per node, updated by every test as evidence.

No test result is certain. A faulty node fails a test that holds it with an unknown probability ``P`` (its
intermittence), somewhere in a stated range (default 0.2 to 1: a link that drops one collective in five, up to
one that always fails); a healthy test fails anyway with the spurious-failure rate ``q``. So a failed test is
strong evidence against its members (likelihood ratio about ``P/q``), a pass is weak evidence for them
(``1-P``), and a pass never clears a node at once.

Two channels, kept apart because a fault shows in one or the other:

- **failures** (a failed, hung or slow group test): hypotheses "node ``i`` is faulty with intermittence ``P``"
  for every candidate node and every ``P`` on a grid over the range, and ``H0``, "no fault among the
  candidates", each ``P`` equally likely a priori and ``H0`` as likely as a fault. One fault is sought at a
  time: once a node is accused it leaves the candidates, and a failed test that held it counts against the
  others in it only as far as the accused node, at its own estimated intermittence, leaves it unexplained (a
  hard fault explains it all; one failing a fifth of its tests, little); its passes still count, and the
  search looks for another (the prior starts again). When two
  disjoint tests fail at once, two faults are there: the search follows one (its *focus*, the smaller failing
  test) and sets aside the failures outside it until that one is found.
- **speed** (per-rank timings, where a test gives them): each node on its own is slow with ``P`` (its rank
  falls below its peers in a share ``P`` of runs) or healthy (a rank falls there with rate ``q``).

The probability of a node is its marginal over ``P``; the search accuses a node at ``1 - alpha`` and calls the
group clear when what is left of the fault mass is under ``alpha``.

One fault at a time overstates a node's guilt when others are faulty too: a healthy node that failed once
beside a faulty member of a split and once beside a faulty partner (that happened to pass its earlier tests)
looks, to that model, like the one fault. So before an accusation the search asks a second model that lets
every node be faulty on its own (:meth:`Evidence.independent`, each node faulty a priori with
:data:`INDEPENDENT_PRIOR`): a failed test then blames a member only as far as the others in it, as likely
faulty as their own tests make them, leave it unexplained. Its marginals come from a mean-field fixed point
(each node's probability given the others', a few damped rounds), the approximation belief propagation makes
for noisy group testing. A node is accused only when both models put it at ``1 - alpha``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

__all__ = ["ALPHA", "DELTA", "INDEPENDENT_PRIOR", "P_MIN", "SPURIOUS", "Evidence", "caught", "screening_runs"]

ALPHA = 0.01
"""Accuse a node at probability ``1 - ALPHA``, clear it under ``ALPHA``."""
DELTA = 0.01
"""A screening misses a fault of the least intermittence with at most this probability."""
P_MIN = 0.2
"""The least intermittence reckoned with: a faulty node fails at least this share of the tests holding it."""
SPURIOUS = 0.005
"""The rate at which a healthy test fails anyway."""

INDEPENDENT_PRIOR = 0.01
"""In the model of independent faults, the prior probability that a node is faulty."""

_GRID = 9
_ROUNDS = 8
_TINY = 1e-12


def screening_runs(p_min: float, delta: float) -> int:
    """How many passes a group needs to have seen a fault of intermittence ``p_min`` or more with probability
    ``1 - delta``: ``ceil(ln delta / ln(1 - p_min))`` (21 at 0.2, 7 at 0.5, 2 at 0.9, with delta 0.01)."""
    if p_min >= 1.0:
        return 1
    return max(1, math.ceil(math.log(delta) / math.log(1.0 - p_min) - 1e-9))


def caught(passes: int, delta: float) -> float:
    """The least intermittence ``P`` that ``passes`` passes would have caught with probability ``1 - delta``
    (1.0 with no pass: nothing was seen)."""
    if passes <= 0:
        return 1.0
    return float(1.0 - delta ** (1.0 / passes))


def _logsumexp(values: np.ndarray, axis: int | None = None) -> np.ndarray:
    top = np.max(values, axis=axis, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    summed = np.log(np.sum(np.exp(values - top), axis=axis, keepdims=True)) + top
    return np.asarray(np.squeeze(summed, axis=axis) if axis is not None else summed.reshape(()))


class Evidence:
    """The posterior of one bisection (see the module docstring).

    Args:
        nodes: the candidate nodes (a node outside them, a lent partner, is taken as healthy).
        p_min: the least intermittence the search reckons with.
        p_max: the most (1: a fault that always shows).
        spurious: the rate at which a healthy test fails anyway (and a healthy rank looks slow).
        prior: the prior probability that a fault is there at all (``1 - P(H0)``).
    """

    def __init__(
        self,
        nodes: Sequence[str],
        *,
        p_min: float = 0.2,
        p_max: float = 1.0,
        spurious: float = 0.005,
        prior: float = 0.5,
    ) -> None:
        self.nodes = list(nodes)
        self.index = {n: i for i, n in enumerate(self.nodes)}
        self.p = np.linspace(p_min, p_max, _GRID) if p_max > p_min else np.array([p_max])
        self.q = max(spurious, 1e-6)
        self.prior = prior
        self._fail = np.log(1.0 - (1.0 - self.q) * (1.0 - self.p)) - math.log(self.q)
        self._pass = np.log(np.maximum(1.0 - self.p, _TINY))
        self._flag = np.log(self.p / self.q)
        self._steady = np.log(np.maximum(1.0 - self.p, _TINY) / (1.0 - self.q))
        size = (len(self.nodes), len(self.p))
        self.failures = np.zeros(size)
        self.speed = np.zeros(size)
        self.timed = False
        self.accused: set[int] = set()
        self.intermittence: dict[int, float] = {}
        self.focus: np.ndarray | None = None
        self.tests: list[tuple[np.ndarray, bool]] = []
        self.passes = np.zeros(len(self.nodes), dtype=int)

    def _members(self, members: Iterable[str]) -> np.ndarray:
        return np.array([self.index[m] for m in members if m in self.index], dtype=int)

    def _apply(self, held: np.ndarray, failed: bool) -> None:
        if failed and self.focus is not None and not self.focus[held].any():
            return  # another fault's: set aside until the one in focus is found
        if not failed:
            self.failures[held] += self._pass
            return
        explained = 1.0
        for i in held:
            explained *= 1.0 - self.intermittence.get(int(i), 0.0)
        if explained >= 1.0:
            self.failures[held] += self._fail
            return
        # the accused members fail it with 1 - explained: the others are blamed only for the rest
        base = 1.0 - (1.0 - self.q) * explained
        if base >= 1.0 - _TINY:
            return
        others = np.array([i for i in held if int(i) not in self.accused], dtype=int)
        delta = np.log(1.0 - (1.0 - base) * (1.0 - self.p)) - math.log(base)
        self.failures[others] += delta

    def _replay(self) -> None:
        self.failures[:] = 0.0
        for held, failed in self.tests:
            self._apply(held, failed)

    def set_focus(self, members: Sequence[str] | None) -> None:
        """Seek the fault among ``members`` (``None``: among every candidate)."""
        if members is None:
            if self.focus is None:
                return
            self.focus = None
        else:
            self.focus = np.zeros(len(self.nodes), dtype=bool)
            self.focus[self._members(members)] = True
        self._replay()

    def observe(self, members: Sequence[str], failed: bool) -> None:
        """A group test of ``members`` failed (or hung, or was slow) or passed."""
        held = self._members(members)
        self.tests.append((held, failed))
        if not failed:
            self.passes[held] += 1
        self._apply(held, failed)

    def observe_ranks(self, slow: Iterable[str], steady: Iterable[str]) -> None:
        """Per-rank timings of one test: the nodes whose rank fell below its peers, and the others."""
        self.timed = True
        self.speed[self._members(slow)] += self._flag
        self.speed[self._members(steady)] += self._steady

    def accuse(self, node: str) -> None:
        """Take ``node`` out of the candidates: the failed tests that held it are explained by it."""
        i = self.index[node]
        weights = self.failures[i] - np.max(self.failures[i])
        self.intermittence[i] = float(np.sum(np.exp(weights) * self.p) / np.sum(np.exp(weights)))
        self.accused.add(i)
        self.focus = None
        self._replay()

    def candidates(self) -> np.ndarray:
        """Indexes of the nodes not accused."""
        return np.array([i for i in range(len(self.nodes)) if i not in self.accused], dtype=int)

    def doubt(self) -> np.ndarray:
        """How much each node is in doubt: over the failed tests that held it and that no accused node
        explains, the sum of one over their size (a failed pair weighs half, the whole group's failure
        next to nothing)."""
        found = np.zeros(len(self.nodes))
        for held, failed in self.tests:
            if failed and not any(self.intermittence.get(int(i), 0.0) >= 0.99 for i in held):
                found[held] += 1.0 / len(held)
        return found

    def passes_since_failure(self) -> np.ndarray:
        """Per node, the passing tests it took part in since the last failed test that held it (a failure a
        hard accused node explains aside): what its screening counts, since a pass before a failure no
        node explains for certain says nothing about whether the failure was its own."""
        found = np.zeros(len(self.nodes), dtype=int)
        for held, failed in self.tests:
            if not failed:
                found[held] += 1
            elif not any(self.intermittence.get(int(i), 0.0) >= 0.99 for i in held):
                found[held] = 0
        return found

    def corroborated(self, node: str) -> bool:
        """Whether the failed tests that hold ``node`` (and no accused node) blame it beyond any one other
        node (the others they hold have no node in common, so no single partner explains them all), and one
        of them held beside it only nodes that have passed a test (no other fault there that never passes)."""
        i = self.index[node]
        others: set[int] | None = None
        vouched = False
        for held, failed in self.tests:
            if failed and i in held and not any(int(j) in self.accused for j in held):
                rest = {int(j) for j in held} - {i}
                others = rest if others is None else others & rest
                vouched = vouched or all(self.passes[j] > 0 for j in rest)
        return others is not None and not others and vouched

    def independent(self, prior: float = INDEPENDENT_PRIOR) -> np.ndarray:
        """Each node's probability of being faulty when every node may be, independently (see the module
        docstring); accused nodes count as faulty at their estimated intermittence."""
        size = len(self.nodes)
        p = self.p
        chance = np.full(size, prior)
        shown = np.full(size, float(np.mean(p)))  # a faulty node's expected intermittence
        known = np.array(sorted(self.accused), dtype=int)
        known_p = np.array([self.intermittence[int(i)] for i in known])
        chance[known], shown[known] = 1.0, known_p
        prior_odds = math.log(prior / (1.0 - prior))
        # What the passes say does not change from round to round: a faulty node passed each of them.
        from_passes = self.passes[:, None] * self._pass[None, :]
        for _ in range(_ROUNDS):
            ratio = from_passes.copy()
            quiet = np.log(np.maximum(1.0 - chance * shown, _TINY))  # log P(this node fails no test)
            for held, failed in self.tests:
                if not failed:
                    continue
                others = np.exp(np.sum(quiet[held]) - quiet[held])  # P(the others in it fail nothing)
                healthy = 1.0 - (1.0 - self.q) * others
                faulty = 1.0 - (1.0 - self.q) * others[:, None] * (1.0 - p[None, :])
                ratio[held] += np.log(faulty) - np.log(healthy)[:, None]
            top = np.max(ratio, axis=1, keepdims=True)
            weights = np.exp(ratio - top)
            odds = prior_odds + np.log(np.mean(weights, axis=1)) + top[:, 0]
            fresh = 1.0 / (1.0 + np.exp(-odds))
            fresh_p = np.sum(weights * p[None, :], axis=1) / np.sum(weights, axis=1)
            fresh[known], fresh_p[known] = 1.0, known_p
            chance, shown = (chance + fresh) / 2.0, fresh_p  # damped: a plain update can oscillate
        return np.asarray(chance)

    def sought(self) -> np.ndarray:
        """Indexes of the candidates the fault is sought among (the focus, if any)."""
        left = self.candidates()
        return left[self.focus[left]] if self.focus is not None else left

    def fault(self) -> tuple[np.ndarray, float]:
        """The failure channel: each node's probability of being the (next) faulty one, and of ``H0``."""
        marginal = np.zeros(len(self.nodes))
        left = self.sought()
        if not len(left):
            return marginal, 1.0
        weights = math.log(self.prior / (len(left) * len(self.p))) + self.failures[left]
        per_node = _logsumexp(weights, axis=1)
        h0 = math.log(1.0 - self.prior)
        total = float(np.logaddexp(h0, _logsumexp(per_node)))
        marginal[left] = np.exp(per_node - total)
        return marginal, math.exp(h0 - total)

    def slow(self) -> np.ndarray:
        """The speed channel: each node's probability of being slow beside its peers (0 without timings)."""
        if not self.timed:
            return np.zeros(len(self.nodes))
        prior = self.prior / max(1, len(self.nodes))
        odds = math.log(prior / (1.0 - prior)) + _logsumexp(self.speed - math.log(len(self.p)), axis=1)
        result = 1.0 / (1.0 + np.exp(-odds))
        result[list(self.accused)] = 0.0
        return np.asarray(result)

    def tests_to_clear(self, node: str, alpha: float) -> int:
        """Passing tests holding ``node`` that would bring it under ``alpha`` if its fault were the least
        intermittent reckoned with (fewer failing ones would accuse it)."""
        marginal, _ = self.fault()
        i = self.index[node]
        probability = max(float(marginal[i]), float(self.slow()[i]))
        if probability < alpha:
            return 0
        odds = probability / max(1.0 - probability, _TINY)
        wanted = alpha / (1.0 - alpha)
        return max(1, math.ceil(math.log(odds / wanted) / -math.log(max(1.0 - float(self.p[0]), _TINY))))
