"""A model of the scale-out fabric: what a group test of some nodes would measure, with no processes.

Bisecting a failing group of thousands of nodes takes hundreds of group tests; the simulated fleet answers
them from this model instead of launching ranks. A test is a ring all-reduce among the members, one rank per
node. The message is ``bytes_per_node`` times the group's size, capped at ``max_message_bytes`` as a real
test's buffers are (nccl-tests' ``-e``: a few GiB per GPU, not 64 MiB times 4,096); past the cap each ring
step moves less, the per-step latency weighs more, and a large group's figure hides a node a little slow
(its ranks' own timings still show it). A ring of ``n`` members takes ``2(n-1)`` steps, each moving the
message's ``n``-th part over the slowest member's links (the ring waits for its slowest link) plus a per-step
latency, after a fixed per-collective overhead; its bus bandwidth is what nccl-tests reports
(``algbw * 2(n-1)/n``). Small groups pay the fixed overhead over fewer steps, so the bandwidth a healthy group
reaches depends on its size: the threshold of a test is a fraction of what a healthy group of that size
reaches.

What a node's NICs do comes from the health seam (:class:`~steps.cluster.health.NodeReport`): what its rails
give a ring (:attr:`~steps.cluster.health.NodeReport.ring_gbps`: one slow rail caps them all), the
probability that a collective through them fails (``flaky-nic``), whether it never completes (``hang``).
A faulty leaf switch (:class:`SwitchFault`) touches every node under it at once: a test holding any of them
runs their links at the switch's share of their rate, fails with the switch's rate (one draw per test, not
per node) or hangs. A GPU's compute (``compute_share``) never shows here: an all-reduce moves data and does
no arithmetic worth timing, so a compute straggler passes every fabric test and is seen in a training run's
step time only. Measurements carry multiplicative noise: every figure is scaled by a factor drawn uniformly
from ``[1 - noise, 1 + noise]``, and a share ``spurious`` of the tests no fault touches fail outright or are
slowed by congestion (the heavy tail of a real fabric's noise). Draws come from one generator seeded by
``seed``, so the same tests in the same order give the same figures.

A cluster port that can answer this way is a :class:`FabricSource` (the simulated fleet is one);
:func:`fabric_model` gives ``None`` for any other port.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from steps.cluster.health import NodeReport, health_source
from steps.errors import InputError

__all__ = ["FabricModel", "FabricSettings", "FabricSource", "GroupMeasurement", "SwitchFault", "fabric_model"]

_MIB = 1 << 20
_GIB = 1 << 30


class SwitchFault(BaseModel):
    """A faulty leaf switch and the nodes under it.

    Attributes:
        leaf: the switch's name (the rack it serves: ``rack-03``).
        nodes: the nodes cabled to it.
        speed: the share of their links' rate it forwards at (1: full rate).
        failure_rate: the probability that a test holding any node under it fails.
        hangs: whether a test holding any node under it never completes.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    leaf: str
    nodes: tuple[str, ...]
    speed: float = Field(1.0, gt=0.0, le=1.0)
    failure_rate: float = Field(0.0, ge=0.0, le=1.0)
    hangs: bool = False


class FabricSettings(BaseModel):
    """How the fabric behaves and how a group test is run on it.

    Attributes:
        noise: measurement noise: each figure is scaled by a factor drawn uniformly from
            ``[1 - noise, 1 + noise]``.
        seed: seeds every random draw (noise, flaky links).
        latency_us: latency of one ring step, in microseconds.
        overhead_us: fixed cost of one collective (kernel launch, synchronisation), in microseconds.
        bytes_per_node: bytes of the all-reduce message per member.
        max_message_bytes: the largest message a test all-reduces (its buffer size).
        iters: all-reduces one test times.
        launch_s: overhead of one test before it measures (pods scheduled, ranks rendezvous).
        hang_grace_s: a test that has not finished this long after it should have is declared hung.
        pass_fraction: a group passes when its bus bandwidth is at least this fraction of what a healthy
            group of its size reaches.
        spurious: the probability that a test no fault touches fails anyway: half of such tests fail
            outright (a transient error), half are slowed by a congestion factor drawn from 0.3 to 0.8 (the
            heavy tail of real fabrics' noise).
        switches: the faulty leaf switches.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    noise: float = Field(0.0, ge=0.0, lt=0.5)
    seed: int = 0
    latency_us: float = Field(5.0, ge=0.0)
    overhead_us: float = Field(20.0, ge=0.0)
    bytes_per_node: int = Field(64 * _MIB, ge=1)
    max_message_bytes: int = Field(8 * _GIB, ge=1)
    iters: int = Field(20, ge=1)
    launch_s: float = Field(30.0, ge=0.0)
    hang_grace_s: float = Field(60.0, gt=0.0)
    pass_fraction: float = Field(0.8, gt=0.0, le=1.0)
    spurious: float = Field(0.0, ge=0.0, lt=1.0)
    switches: tuple[SwitchFault, ...] = ()


class GroupMeasurement(BaseModel):
    """What one group test measured on the model.

    Attributes:
        outcome: ``pass``, ``fail`` (the collective failed, or its bandwidth is under the threshold) or
            ``hang`` (it never completed; the test ended at its timeout).
        figure: bus bandwidth in GB/s (``None`` when the collective failed or hung).
        threshold: the least bus bandwidth a group of this size passes with, in GB/s.
        expected: what a healthy group of this size reaches, in GB/s (what its peers reach).
        ranks: each member's own link throughput as its rank timed it, in GB/s (``None`` when the collective
            failed or hung: nothing was timed).
        duration_s: how long the test held its nodes, launch included.
        reason: one line on what was seen.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    outcome: Literal["pass", "fail", "hang"]
    figure: float | None
    threshold: float
    expected: float | None = None
    ranks: dict[str, float] | None = None
    duration_s: float
    reason: str


@runtime_checkable
class FabricSource(Protocol):
    """A cluster port whose fabric can be modelled (the simulated fleet)."""

    def fabric_settings(self) -> FabricSettings:
        """The fabric's settings (noise, seed, latencies)."""
        ...


class FabricModel:
    """Group tests answered from the model (see the module docstring).

    Args:
        reports: what each node's NICs report, by node name.
        settings: the fabric's behaviour.
    """

    def __init__(self, reports: Mapping[str, NodeReport], settings: FabricSettings | None = None) -> None:
        self.reports = dict(reports)
        self.settings = settings or FabricSettings()
        self._random = random.Random(self.settings.seed)
        self._extra = random.Random(f"{self.settings.seed}-ranks")  # ranks and spurious draws, kept apart
        self._under: dict[str, list[SwitchFault]] = {}
        for switch in self.settings.switches:
            for node in switch.nodes:
                self._under.setdefault(node, []).append(switch)

    def message(self, size: int) -> int:
        """The bytes a test of ``size`` members all-reduces: ``bytes_per_node`` each, up to the cap."""
        return min(self.settings.bytes_per_node * size, self.settings.max_message_bytes)

    def _step_s(self, size: int, gbps: float) -> float:
        """One ring step: latency plus the message's ``size``-th part over links of ``gbps`` Gbit/s."""
        s = self.settings
        return s.latency_us * 1e-6 + self.message(size) / size / (max(gbps, 1e-9) * 1e9 / 8)

    def _collective_s(self, size: int, gbps: float) -> float:
        return self.settings.overhead_us * 1e-6 + 2 * (size - 1) * self._step_s(size, gbps)

    def busbw(self, size: int, gbps: float) -> float:
        """Bus bandwidth (GB/s) of a ring all-reduce among ``size`` members whose slowest links give
        ``gbps``, without noise."""
        return self.message(size) / self._collective_s(size, gbps) * 2 * (size - 1) / size / 1e9

    def threshold(self, size: int, nominal_gbps: float) -> float:
        """The least bus bandwidth (GB/s) a group of ``size`` passes with: a fraction of what a healthy
        group of that size reaches."""
        return self.settings.pass_fraction * self.busbw(size, nominal_gbps)

    def healthy_s(self, members: Sequence[str]) -> float:
        """How long a test of ``members`` takes when every member is healthy, launch included."""
        nominal = min(self.reports[m].nominal_link_gbps for m in members)
        return self.settings.launch_s + self.settings.iters * self._collective_s(len(members), nominal)

    def allreduce(self, members: Sequence[str]) -> GroupMeasurement:
        """Run one group test among ``members`` on the model.

        Raises:
            InputError: fewer than two members (a single node's test never crosses its NICs), a member
                is named twice, or the model knows no such node.
        """
        if len(members) < 2 or len(set(members)) != len(members):
            raise InputError(f"a fabric test needs two or more distinct nodes, got {list(members)}")
        missing = [m for m in members if m not in self.reports]
        if missing:
            raise InputError(f"the fabric model knows no node {missing[0]!r}")
        s, reports = self.settings, [self.reports[m] for m in members]
        size = len(members)
        nominal = min(r.nominal_link_gbps for r in reports)
        switches = list(dict.fromkeys(w for m in members for w in self._under.get(m, [])))
        speeds = {r.node: r.ring_gbps for r in reports}
        for switch in switches:
            for node in set(switch.nodes) & speeds.keys():
                speeds[node] *= switch.speed
        slowest = min(speeds.values())
        threshold = self.threshold(size, nominal)
        measure_s = self.healthy_s(members) - s.launch_s
        failed = [
            r.node for r in reports if r.link_failure_rate > 0 and self._random.random() < r.link_failure_rate
        ]
        failed += [
            f"leaf {w.leaf}"
            for w in switches
            if w.failure_rate > 0 and self._random.random() < w.failure_rate
        ]
        failed += [node for node, gbps in speeds.items() if gbps <= 0]  # no rail up
        factor = 1.0 + self._random.uniform(-s.noise, s.noise) if s.noise else 1.0
        hung = [r.node for r in reports if r.link_hangs] + [f"leaf {w.leaf}" for w in switches if w.hangs]
        expected = self.busbw(size, nominal)
        spurious = not hung and not failed and s.spurious > 0 and self._extra.random() < s.spurious
        broken = None
        if hung:
            timeout = s.launch_s + 2 * measure_s + s.hang_grace_s
            reason = f"the all-reduce did not complete within {timeout - s.launch_s:.0f}s"
            broken = ("hang", timeout, reason)
        elif failed:
            broken = ("fail", s.launch_s + measure_s / 2, "the all-reduce failed (a link dropped out)")
        elif spurious and self._extra.random() < 0.5:
            broken = ("fail", s.launch_s + measure_s / 2, "the all-reduce failed (a transient error)")
        if broken is not None:
            outcome, duration_s, reason = broken
            return GroupMeasurement(
                outcome="hang" if outcome == "hang" else "fail",
                figure=None,
                threshold=threshold,
                expected=expected,
                duration_s=duration_s,
                reason=reason,
            )
        congestion = self._extra.uniform(0.3, 0.8) if spurious else 1.0
        factor *= congestion
        figure = self.busbw(size, slowest) * factor
        # a figure measured high is a collective timed short: the time is the figure's noise inverted
        duration = s.launch_s + s.iters * self._collective_s(size, slowest) / factor
        ok = figure >= threshold
        ranks = {
            r.node: speeds[r.node] / 8 * (1.0 + self._extra.uniform(-s.noise, s.noise) if s.noise else 1.0)
            for r in reports
        }
        return GroupMeasurement(
            outcome="pass" if ok else "fail",
            figure=figure,
            threshold=threshold,
            expected=expected,
            ranks=ranks,
            duration_s=duration,
            reason=f"busbw {figure:.1f} GB/s {'>=' if ok else '<'} {threshold:.1f} GB/s for {size} nodes",
        )


def fabric_model(port: object, nodes: Sequence[str]) -> FabricModel | None:
    """The fabric model of ``nodes`` behind a cluster port, or ``None`` when the port has none.

    Raises:
        NotFoundError: a node is not in the fleet.
    """
    source = health_source(port)
    if source is None or not isinstance(port, FabricSource):
        return None
    return FabricModel({n: source.node_report(n) for n in nodes}, port.fabric_settings())
