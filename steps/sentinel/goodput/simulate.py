"""A fleet's lifetime under each policy: a deterministic discrete-event simulation of one synchronous
training job across a GPU fleet, with faults drawn from a rate table.

The model, in the words a reader checks it against:

- The fleet has ``nodes`` x ``gpus_per_node`` GPUs for ``days``. One synchronous training job runs as
  data-parallel replicas of ``replicaNodes`` nodes each (the table's job; Llama 3 405B ran 16-node
  replicas), as many as ``nodes - spares`` holds. Nodes out of service are replaced from the rest; a
  replica without enough nodes waits, and the job runs on the replicas that are whole (the table's job
  is ``elastic``; a rigid one waits whole until every replica is, then restarts). Nodes in service
  that no replica uses are lost to ``spare`` (the job is whole: an idle spare) or ``short`` (the remnant
  of a replica that waits for its nodes). The job runs on the lowest-numbered nodes in service: a fault
  on one of the others (a spare or a remnant) interrupts nothing, though its node still goes to repair.
- Faults of each class strike as a Poisson process per GPU-hour (the class's count over the table's
  exposure), on a node drawn uniformly; a fault that strikes a node already out of service is dropped.
  Each seed draws the faults once and every policy meets the same ones, so policies differ only by what
  they do about them.
- A fault that fails the job (every class but the slow ones) stops it at once: the work since the last
  checkpoint is lost (``rework``); the whole job waits while the fault is found (``detection``, the
  class's time under the policy) and then restarts (``restart``). A fault during a restart fails the
  restart. The node at fault is out of service from the fault until it is found, repaired and, where the
  policy recertifies, retested (``repair``: its own GPUs only).
- A repair does not fix the fault ``unfixedFraction`` of the time. With recertification the test
  catches it and the node goes back for a second repair, which fixes it; without, the node returns and
  the fault strikes again after a mean of ``recurrenceHours`` in service.
- A slow node interrupts nothing: the job runs at the speed of its slowest node in service (``slow``:
  the GPU-hours of the whole job that the lost speed costs). Only periodic certification with bisection
  finds it; a policy that recertifies also finds it when the node is out for another repair.
- Periodic certification stops the job at a checkpoint for ``certifyMinutes``, sends every slow node it
  finds to repair, and restarts the job (all of it ``certification``). A certification due while the job
  is down waits until it is back.
- The job trains for a checkpoint interval, then saves for ``checkpointSaveSeconds`` (blocking: it trains
  no further while it saves, ``checkpoint``), and the work becomes safe when the save ends; a fault during
  the save loses the interval's work and the save. Over ``checkpointMinutes`` of training and a save of
  S seconds against a mean time between interruptions M, the goodput is best near Young and Daly's
  interval sqrt(2 S M). The certification's stop and the end of the period save at no cost.
- At the end of the period the job checkpoints: work not yet lost is kept.

Every GPU-hour of the period is either useful or lost to one of :data:`LOSS_KINDS`; the report says both,
per kind and per fault class (the certification cost belongs to no fault class).
"""

from __future__ import annotations

import heapq
import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field

from steps.errors import InputError
from steps.models import Frozen
from steps.sentinel.goodput.rates import (
    MIN_CHECKPOINT_MINUTES,
    POLICIES,
    FaultClass,
    FaultRates,
    PerPolicy,
    Policy,
)

__all__ = [
    "FACTORS",
    "FALSE_ALARM",
    "LOSS_KINDS",
    "UNCLASSED",
    "BestSpares",
    "CheckpointSweep",
    "PolicyResult",
    "RunResult",
    "SimulationReport",
    "Spread",
    "SweepPoint",
    "expected_faults",
    "expected_interruptions",
    "simulate",
    "simulate_run",
    "spare_candidates",
    "sweep_checkpoint",
    "sweep_intervals",
    "young_daly_minutes",
]

#: Where lost GPU-hours go, in the order a report lists them.
LOSS_KINDS = (
    "rework",
    "detection",
    "restart",
    "repair",
    "short",
    "spare",
    "slow",
    "checkpoint",
    "certification",
)
#: Google's split of ML goodput (scheduling x runtime x program): the losses each factor counts.
#: Scheduling: the fleet's hours the job was not given (nodes out, idle); runtime: the job's hours that
#: made no kept progress; program: the speed the work ran at.
FACTORS = {
    "scheduling": ("repair", "short", "spare"),
    "runtime": ("rework", "detection", "restart", "checkpoint", "certification"),
    "program": ("slow",),
}
#: Losses that belong to no fault class.
UNCLASSED = ("short", "spare", "checkpoint", "certification")

_ARRIVAL, _RETURN, _SWEEP, _FOUND = 0, 1, 2, 3
_NO_CLASS = -1


@dataclass(frozen=True, slots=True)
class _Fault:
    """A fault drawn for a seed: when, which class, which node, whether its first repair fails, when it
    strikes again if so, and a number in [0, 1) that says whether recertification catches it."""

    time: float
    cls: int
    node: int
    unfixed: bool
    recur_after: float
    chance: float = 1.0


@dataclass(slots=True)
class _Slow:
    speed: float
    cls: int
    fault: _Fault


class Spread(Frozen):
    """A figure over several seeds: mean, sample standard deviation, least and greatest."""

    mean: float
    stdev: float
    min: float
    max: float

    @classmethod
    def of(cls, values: list[float], digits: int = 6) -> Spread:
        """The spread of ``values`` (one or more)."""
        stdev = statistics.stdev(values) if len(values) > 1 else 0.0
        return cls(
            mean=round(statistics.fmean(values), digits),
            stdev=round(stdev, digits),
            min=round(min(values), digits),
            max=round(max(values), digits),
        )


class RunResult(Frozen):
    """One policy over one seed.

    Attributes:
        goodput: useful GPU-hours over the fleet's GPU-hours (a slow node's lost speed counts as lost).
        effective_training_time: the fraction of the period the job trained and kept the work, as the
            Llama 3 paper measures it (time at a slow node's speed counts as training time).
        interruptions: faults that failed the job or its restart.
        restarts: times the job came back (after faults and after periodic certification).
        slow_nodes_found: slow nodes sent to repair.
        faults: faults that struck a node in service, per class (recurrences included).
        nodes_out: nodes out of service for repair, on average over the period (by Little's law, the
            rate of repairs times their length).
        factors: goodput as the product of :data:`FACTORS`: scheduling (the share of the fleet's
            GPU-hours the job held), runtime (the share of those it made kept progress in) and program
            (the speed of that progress); their product is ``goodput``.
    """

    seed: int
    goodput: float
    effective_training_time: float
    interruptions: int
    restarts: int
    slow_nodes_found: int
    useful_gpu_hours: float
    lost_gpu_hours: dict[str, float]
    lost_by_class: dict[str, float]
    faults: dict[str, int]
    nodes_out: float
    factors: dict[str, float]


class BestSpares(Frozen):
    """The spare count, of those tried, at which a policy's mean goodput is highest (the fewest on a tie)."""

    spares: int
    goodput: Spread


class PolicyResult(Frozen):
    """One policy over every seed: spreads, mean GPU-hours lost per kind and per class, and each run."""

    policy: Policy
    goodput: Spread
    effective_training_time: Spread
    interruptions: Spread
    restarts: Spread
    slow_nodes_found: Spread
    nodes_out: Spread
    factors: dict[str, Spread]
    best_spares: BestSpares | None = Field(
        default=None, description="the spare count of the highest mean goodput, when asked for"
    )
    useful_gpu_hours: float
    lost_gpu_hours: dict[str, float]
    lost_by_class: dict[str, float]
    runs: list[RunResult]


class SimulationReport(Frozen):
    """The policies side by side on one fleet."""

    rates: str
    source: str
    nodes: int
    gpus_per_node: int
    days: float
    seeds: list[int]
    checkpoint_minutes: float
    restart_minutes: float
    checkpoint_save_seconds: float
    spares: int
    replica_nodes: int
    job_nodes: int
    elastic: bool
    gpu_hours: float
    expected_interruptions: float
    expected_slow_nodes: float
    policies: list[PolicyResult]


def expected_faults(rates: FaultRates, nodes: int, gpus_per_node: int, days: float) -> dict[str, float]:
    """Faults of each class the table expects on this fleet over ``days`` (before any recurrence)."""
    gpu_hours = nodes * gpus_per_node * days * 24.0
    return {fault.name: rates.per_gpu_hour(fault) * gpu_hours for fault in rates.classes}


#: The class a policy's false alarms are booked to (:func:`_with_false_alarms`).
FALSE_ALARM = "false-alarm"


def _with_false_alarms(rates: FaultRates) -> FaultRates:
    """``rates`` with a class for the policies' false alarms, when any policy has them: a healthy node
    taken out by the agent (found at once), out for the policy's ``falseAlarmHours``; drawn by
    :func:`_draw` at each policy's own rate, not from the class's count.

    Raises:
        InputError: the table already has a class of that name.
    """
    policies = [rates.policies.of(p) for p in POLICIES]
    if not any(p.false_alarms_per_1000_node_days for p in policies):
        return rates
    if any(c.name == FALSE_ALARM for c in rates.classes):
        raise InputError(f"the rate table's class {FALSE_ALARM!r} is the name of the policies' false alarms")
    alarm = FaultClass(
        name=FALSE_ALARM,
        title="A healthy node taken out (a false alarm)",
        category="False alarm",
        count=0,
        seen_by="agent",
        at_fault="node",
        detect_minutes=PerPolicy(**dict.fromkeys(POLICIES, 0.0)),
        repair_hours=PerPolicy(**{p: rates.policies.of(p).false_alarm_hours for p in POLICIES}),
    )
    return rates.model_copy(update={"classes": [*rates.classes, alarm]})


def _false_alarms(
    rates: FaultRates, policy: Policy, nodes: int, hours: float, seed: int, cls: int
) -> list[_Fault]:
    """The policy's false alarms: one stream at the highest policy's rate, each alarm kept by a policy
    with the chance of its own rate over that one, so every policy meets the same alarms, thinned."""
    rates_of = {p: rates.policies.of(p).false_alarms_per_1000_node_days for p in POLICIES}
    top = max(rates_of.values())
    rng = random.Random(f"dsx-goodput/{seed}/{FALSE_ALARM}")
    per_hour = top / 1000 / 24 * nodes
    alarms: list[_Fault] = []
    clock = 0.0
    while per_hour > 0:
        clock += rng.expovariate(per_hour)
        if clock >= hours:
            break
        node, keep = rng.randrange(nodes), rng.random()
        if keep < rates_of[policy] / top:
            alarms.append(_Fault(clock, cls, node, False, 0.0))
    return alarms


def expected_interruptions(rates: FaultRates, nodes: int, gpus_per_node: int, days: float) -> float:
    """Faults that interrupt the job (every class but the slow ones) the table expects over ``days``."""
    expected = expected_faults(rates, nodes, gpus_per_node, days)
    return sum(expected[c.name] for c in rates.classes if not c.slow)


def _draw(
    rates: FaultRates, nodes: int, gpus_per_node: int, hours: float, seed: int, policy: Policy
) -> list[_Fault]:
    """The faults of one seed, every class from its own stream (adding a class leaves the others as
    they were), and the policy's false alarms, in time order."""
    faults: list[_Fault] = []
    for index, fault in enumerate(rates.classes):
        per_hour = rates.per_gpu_hour(fault) * nodes * gpus_per_node
        if per_hour <= 0:
            continue
        rng = random.Random(f"dsx-goodput/{seed}/{fault.name}")
        later = random.Random(f"dsx-goodput/{seed}/{fault.name}/later")  # its own stream: rng's draws stay
        clock = 0.0
        while True:
            clock += rng.expovariate(per_hour)
            if clock >= hours:
                break
            node = rng.randrange(nodes)
            unfixed = rng.random() < rates.repairs.unfixed_fraction
            recur = rng.expovariate(1.0 / rates.repairs.recurrence_hours)
            faults.append(_Fault(clock, index, node, unfixed, recur, later.random()))
    names = [fault.name for fault in rates.classes]
    if FALSE_ALARM in names:
        faults += _false_alarms(rates, policy, nodes, hours, seed, names.index(FALSE_ALARM))
    faults.sort(key=lambda f: (f.time, f.cls, f.node))
    return faults


@dataclass
class _Run:
    """The state of one run: the clock, the job, the nodes out of service and the books."""

    rates: FaultRates
    policy: Policy
    nodes: int
    gpus: int
    hours: float
    checkpoint_h: float
    restart_h: float
    save_h: float = 0.0
    replica: int = 1
    spares: int = 0
    elastic: bool = True
    waiting: bool = False
    """A rigid job without the nodes to run, waiting for them."""
    now: float = 0.0
    out: set[int] = field(default_factory=set)
    slow: dict[int, _Slow] = field(default_factory=dict)
    detect_until: float = 0.0
    resume_at: float = 0.0
    down_kind: str = "detection"
    restart_kind: str = "restart"
    down_cls: int = _NO_CLASS
    run_start: float = 0.0
    train_until: float = 0.0
    """When the running job's current interval of training ends and its save begins."""
    saving: bool = False
    unsaved_gpuh: float = 0.0
    unsaved_h: float = 0.0
    useful: float = 0.0
    trained_h: float = 0.0
    interruptions: int = 0
    restarts: int = 0
    slow_found: int = 0
    events: list[tuple[float, int, int, int, _Fault | None]] = field(default_factory=list)
    seq: int = 0
    lost: dict[str, float] = field(default_factory=dict)
    by_class: list[float] = field(default_factory=list)
    struck: list[int] = field(default_factory=list)
    recurring: dict[int, _Fault] = field(default_factory=dict)
    """Nodes out for a repair that will not fix their fault, and that fault."""
    corrupt_since: tuple[float, float] | None = None
    """Useful GPU-hours and training hours when silent data corruption began, until it is found."""
    sweeps: random.Random = field(default_factory=lambda: random.Random(0))
    """Whether a periodic certification misses a slow node: seeded per run."""

    def __post_init__(self) -> None:
        self.lost = dict.fromkeys(LOSS_KINDS, 0.0)
        self.train_until = self.checkpoint_h
        self.by_class = [0.0] * len(self.rates.classes)
        self.struck = [0] * len(self.rates.classes)

    # -- the books ------------------------------------------------------------------------------

    def _book(self, kind: str, cls: int, gpu_hours: float) -> None:
        self.lost[kind] += gpu_hours
        if cls != _NO_CLASS:
            self.by_class[cls] += gpu_hours

    def _size(self) -> int:
        """Nodes of the whole job: as many replicas as ``nodes - spares`` holds."""
        return (self.nodes - self.spares) // self.replica * self.replica

    def _used(self) -> int:
        """Nodes the job runs on now: the whole job when enough nodes are in service; else an elastic
        job its whole replicas, a rigid one none."""
        in_service = self.nodes - len(self.out)
        if in_service >= self._size():
            return self._size()
        return in_service // self.replica * self.replica if self.elastic else 0

    def _book_idle(self, used: int, span: float) -> None:
        """Nodes in service that no replica uses, over ``span`` hours: spares, or nodes waiting for a
        replica (or, for a rigid job, the job) to be whole."""
        idle = self.nodes - len(self.out) - used
        if idle:
            self._book("spare" if used == self._size() else "short", _NO_CLASS, self.gpus * idle * span)

    def _in_job(self, node: int) -> bool:
        """Whether ``node`` (in service) is one the job runs on: the lowest-numbered nodes in service."""
        below = sum(1 for other in self.out if other < node)
        return node - below < self._used()

    def _speed(self) -> tuple[float, int]:
        speed, cls = 1.0, _NO_CLASS
        for node, slow in self.slow.items():
            if node not in self.out and slow.speed < speed:
                speed, cls = slow.speed, slow.cls
        return speed, cls

    def advance(self, until: float) -> None:
        """Book every GPU-hour from the clock to ``until``; the state is constant in between, but for
        the job coming back and its checkpoints, which are followed here."""
        while self.now < until:
            used = self._used()
            in_gpus = self.gpus * used
            if self.now < self.resume_at:
                if self.now < self.detect_until:
                    end, kind = min(until, self.detect_until), self.down_kind
                else:
                    end, kind = min(until, self.resume_at), self.restart_kind
                self._book(kind, self.down_cls, in_gpus * (end - self.now))
                self._book_idle(used, end - self.now)
                self.now = end
                if self.now >= self.resume_at:
                    self.run_start = self.resume_at
                    self.train_until, self.saving = self.run_start + self.checkpoint_h, False
                    self.restarts += 1
                continue
            if self.saving:
                end = min(until, self.train_until + self.save_h)
                self._book("checkpoint", _NO_CLASS, in_gpus * (end - self.now))
                self._book_idle(used, end - self.now)
                self.now = end
                if self.now >= self.train_until + self.save_h:
                    self._save()
                    self.train_until, self.saving = self.now + self.checkpoint_h, False
                continue
            if not used:  # a rigid job short of nodes waits for them, then restarts
                self._save()
                self.waiting = True
                self._book_idle(used, until - self.now)
                self.now = until
                continue
            if self.waiting:
                self.waiting = False
                self._stop(0.0, "short", "short", _NO_CLASS)
                continue
            end = min(until, self.train_until)
            speed, slow_cls = self._speed()
            self._book("slow", slow_cls, (1.0 - speed) * in_gpus * (end - self.now))
            self._book_idle(used, end - self.now)
            self.unsaved_gpuh += speed * in_gpus * (end - self.now)
            self.unsaved_h += end - self.now
            self.now = end
            if self.now >= self.train_until:
                if self.save_h > 0:
                    self.saving = True
                else:
                    self._save()
                    self.train_until = self.now + self.checkpoint_h

    def _save(self) -> None:
        self.useful += self.unsaved_gpuh
        self.trained_h += self.unsaved_h
        self.unsaved_gpuh = self.unsaved_h = 0.0

    # -- events ---------------------------------------------------------------------------------

    def push(self, time: float, kind: int, node: int, fault: _Fault | None = None) -> None:
        if time < self.hours:
            heapq.heappush(self.events, (time, self.seq, kind, node, fault))
            self.seq += 1

    def _stop(self, duration_h: float, kind: str, restart_kind: str, cls: int) -> None:
        """The job stands still for ``duration_h``, then restarts. Stopped while it runs or restarts (the
        restart fails), it starts over; stopped while it already stands still, it waits the longer."""
        until = self.now + duration_h
        if self.now < self.detect_until and until <= self.detect_until:
            return
        self.detect_until, self.resume_at = until, until + self.restart_h
        self.down_kind, self.restart_kind, self.down_cls = kind, restart_kind, cls

    def _caught(self, fault: _Fault) -> bool:
        """Whether recertification catches a repair that did not fix ``fault``: the fault must strike
        again during the test, 1 - exp(-test / recurrence)."""
        settings = self.rates.policies.of(self.policy)
        if not settings.recertify:
            return False
        test_h = settings.recertify_minutes / 60.0
        return fault.chance < -math.expm1(-test_h / self.rates.repairs.recurrence_hours)

    def _send_to_repair(self, fault: _Fault, found_after_h: float) -> None:
        """The node at fault leaves service now, for ``found_after_h`` and its repairs. A repair that did
        not fix: recertification that catches it sends the node back for a second repair, which fixes
        it; otherwise the node returns and the fault strikes again."""
        node, cls = fault.node, fault.cls
        settings = self.rates.policies.of(self.policy)
        kind = self.rates.classes[cls]
        assert kind.repair_hours is not None  # a node's fault always has repair hours (validated)
        cycle = kind.repair_hours.of(self.policy)
        if settings.recertify:
            cycle += settings.recertify_minutes / 60.0
        caught = fault.unfixed and self._caught(fault)
        away = found_after_h + cycle * (2 if caught else 1)
        if fault.unfixed and not caught:
            self.recurring[node] = fault
        slow = self.slow.get(node)
        if slow is not None and settings.recertify and cls != slow.cls:
            # recertification finds the node's slowness too: it is repaired in the same visit
            slow_fault = self.rates.classes[slow.cls]
            assert slow_fault.repair_hours is not None
            away += slow_fault.repair_hours.of(self.policy)
            del self.slow[node]
            self.slow_found += 1
        self.out.add(node)
        self._book("repair", cls, self.gpus * (min(self.now + away, self.hours) - self.now))
        self.push(self.now + away, _RETURN, node)

    def strike(self, fault: _Fault) -> None:
        """A fault strikes a node (after :meth:`advance` to its time)."""
        if fault.node in self.out:
            return
        kind = self.rates.classes[fault.cls]
        if kind.slow:
            if fault.node not in self.slow:
                assert kind.speed is not None
                self.slow[fault.node] = _Slow(kind.speed, fault.cls, fault)
                self.struck[fault.cls] += 1
                if kind.detect_minutes is not None:
                    self.push(
                        self.now + kind.detect_minutes.of(self.policy) / 60.0, _FOUND, fault.node, fault
                    )
            return
        self.struck[fault.cls] += 1
        assert kind.detect_minutes is not None
        found_after = kind.detect_minutes.of(self.policy) / 60.0
        running = self.now >= self.resume_at
        if self._in_job(fault.node):  # a spare or a waiting remnant fails nothing
            self.interruptions += 1
            if kind.effect == "corrupts" and running:
                # the job runs on, computing garbage, until the corruption is found
                if self.corrupt_since is None:
                    self.corrupt_since = (self.useful, self.trained_h)
                self.push(self.now + found_after, _FOUND, fault.node, fault)
                return
            if kind.effect == "planned" and running:
                self._save()  # planned: the job checkpoints before it stops
            elif running:  # what it did since the checkpoint is lost
                self._book("rework", fault.cls, self.unsaved_gpuh)
                self.unsaved_gpuh = self.unsaved_h = 0.0
            self._stop(found_after, "detection", "restart", fault.cls)
        if kind.at_fault == "node":
            self._send_to_repair(fault, found_after)

    def found(self, fault: _Fault) -> None:
        """A fault that let the job run on is found: a slow node by hand (or online timing), or silent
        data corruption. The job restarts without the node; for corruption, every step since it began
        is thrown away, checkpoints included."""
        kind = self.rates.classes[fault.cls]
        if kind.slow:
            slow = self.slow.get(fault.node)
            if slow is None or slow.fault is not fault or fault.node in self.out:
                return  # found and repaired already, by a certification or a recertification
            del self.slow[fault.node]
            self.slow_found += 1
            if self.now >= self.resume_at:
                self._save()  # the job is restarted without the node at a checkpoint
            self._stop(0.0, "detection", "restart", fault.cls)
            self._send_to_repair(fault, 0.0)
            return
        if self.corrupt_since is not None:
            useful, trained = self.corrupt_since
            self._book("rework", fault.cls, self.useful - useful + self.unsaved_gpuh)
            self.useful, self.trained_h = useful, trained
            self.unsaved_gpuh = self.unsaved_h = 0.0
            self.corrupt_since = None
        self._stop(0.0, "detection", "restart", fault.cls)
        if kind.at_fault == "node" and fault.node not in self.out:
            self._send_to_repair(fault, 0.0)

    def come_back(self, node: int) -> None:
        """A repaired node returns to service; a fault its repair did not fix will strike again."""
        self.out.discard(node)
        again = self.recurring.pop(node, None)
        if again is not None:
            recurrence = _Fault(
                self.now + again.recur_after, again.cls, node, False, again.recur_after, again.chance
            )
            self.push(recurrence.time, _ARRIVAL, node, recurrence)

    def certify(self) -> None:
        """Periodic certification with bisection: the job stops at a checkpoint, every slow node in
        service that the bisection does not miss goes to repair, the job restarts."""
        settings = self.rates.policies.of(self.policy)
        if self.now < self.resume_at:  # the job is down: certify when it is back
            self.push(self.resume_at, _SWEEP, -1)
            return
        self._save()
        self._stop(settings.certify_minutes / 60.0, "certification", "certification", _NO_CLASS)
        for node in sorted(self.slow):
            if node in self.out:
                continue
            slow = self.slow[node]
            if self.sweeps.random() < self.rates.classes[slow.cls].certify_miss:
                continue
            self.slow_found += 1
            del self.slow[node]
            self._send_to_repair(slow.fault, 0.0)


def simulate_run(
    rates: FaultRates,
    policy: Policy,
    *,
    nodes: int,
    gpus_per_node: int,
    days: float,
    seed: int,
    checkpoint_minutes: float | None = None,
    restart_minutes: float | None = None,
    checkpoint_save_seconds: float | None = None,
    spares: int = 0,
    replica_nodes: int | None = None,
) -> RunResult:
    """One policy over one seed (see the module's description of the model).

    Raises:
        InputError: the fleet less its spares holds no replica.
    """
    hours = days * 24.0
    replica = _replica(rates, nodes, spares, replica_nodes)
    rates = _with_false_alarms(rates)
    run = _Run(
        rates=rates,
        policy=policy,
        nodes=nodes,
        gpus=gpus_per_node,
        hours=hours,
        checkpoint_h=(checkpoint_minutes or rates.job.checkpoint_minutes) / 60.0,
        restart_h=(rates.job.restart_minutes if restart_minutes is None else restart_minutes) / 60.0,
        save_h=_save_seconds(rates, checkpoint_save_seconds) / 3600.0,
        replica=replica,
        spares=spares,
        elastic=rates.job.elastic,
        sweeps=random.Random(f"dsx-goodput/{seed}/sweeps"),
    )
    for drawn in _draw(rates, nodes, gpus_per_node, hours, seed, policy):
        run.push(drawn.time, _ARRIVAL, drawn.node, drawn)
    every = rates.policies.of(policy).certify_every_hours
    if every is not None:
        for k in range(1, math.ceil(hours / every)):
            run.push(k * every, _SWEEP, -1)
    while run.events:
        time, _, kind, node, fault = heapq.heappop(run.events)
        run.advance(time)
        if kind == _ARRIVAL:
            assert fault is not None
            run.strike(fault)
        elif kind == _RETURN:
            run.come_back(node)
        elif kind == _FOUND:
            assert fault is not None
            run.found(fault)
        else:
            run.certify()
    run.advance(hours)
    run._save()
    total = nodes * gpus_per_node * hours
    names = [fault.name for fault in rates.classes]
    return RunResult(
        seed=seed,
        goodput=round(run.useful / total, 6),
        effective_training_time=round(run.trained_h / hours, 6),
        interruptions=run.interruptions,
        restarts=run.restarts,
        slow_nodes_found=run.slow_found,
        useful_gpu_hours=round(run.useful, 3),
        lost_gpu_hours={kind: round(value, 3) for kind, value in run.lost.items()},
        lost_by_class={name: round(value, 3) for name, value in zip(names, run.by_class, strict=True)},
        faults=dict(zip(names, run.struck, strict=True)),
        nodes_out=round(run.lost["repair"] / (gpus_per_node * hours), 3),
        factors=_factors(total, run.lost),
    )


def _factors(total: float, lost: dict[str, float]) -> dict[str, float]:
    """Scheduling, runtime and program goodput (:data:`FACTORS`) from the GPU-hours lost by kind."""
    factors: dict[str, float] = {}
    left = total
    for factor, kinds in FACTORS.items():
        kept = left - sum(lost[kind] for kind in kinds)
        factors[factor] = round(kept / left, 6) if left > 0 else 0.0
        left = kept
    return factors


def spare_candidates(nodes: int, replica_nodes: int) -> list[int]:
    """Spare counts worth trying: what the whole replicas leave over, then 1, 2, 4... replicas more, up to
    a quarter of the fleet and keeping a replica (a count between two of these leaves the job as the
    smaller does)."""
    left = nodes % replica_nodes
    candidates = [left]
    more = 1
    while left + more * replica_nodes <= nodes // 4 and nodes - left - more * replica_nodes >= replica_nodes:
        candidates.append(left + more * replica_nodes)
        more *= 2
    return candidates


def young_daly_minutes(save_seconds: float, hours_between_interruptions: float) -> float:
    """Young's and Daly's best checkpoint interval, sqrt(2 S M), in minutes, for a save of ``save_seconds``
    against a mean time between interruptions of ``hours_between_interruptions`` (J. W. Young, CACM 1974;
    J. T. Daly, FGCS 2006, its first-order term)."""
    return math.sqrt(2.0 * save_seconds * hours_between_interruptions * 3600.0) / 60.0


def _replica(rates: FaultRates, nodes: int, spares: int, given: int | None) -> int:
    """The replica's nodes (``given``, else the table's), checked against the fleet less its spares."""
    replica = rates.job.replica_nodes if given is None else given
    if replica < 1 or spares < 0 or (nodes - spares) // replica < 1:
        raise InputError(
            f"{nodes} nodes less {spares} spares hold no replica of {replica} nodes: "
            f"give more nodes, fewer spares or smaller replicas"
        )
    return replica


def _save_seconds(rates: FaultRates, given: float | None) -> float:
    return rates.job.checkpoint_save_seconds if given is None else given


def _mean(values: list[float]) -> float:
    return round(statistics.fmean(values), 3)


def _policy_result(
    policy: Policy, runs: list[RunResult], best: BestSpares | None, booked: FaultRates
) -> PolicyResult:
    """One policy's runs over the seeds, summed up: each figure's spread, the losses' means."""
    return PolicyResult(
        policy=policy,
        goodput=Spread.of([r.goodput for r in runs]),
        effective_training_time=Spread.of([r.effective_training_time for r in runs]),
        interruptions=Spread.of([float(r.interruptions) for r in runs], 3),
        restarts=Spread.of([float(r.restarts) for r in runs], 3),
        slow_nodes_found=Spread.of([float(r.slow_nodes_found) for r in runs], 3),
        nodes_out=Spread.of([r.nodes_out for r in runs], 3),
        factors={f: Spread.of([r.factors[f] for r in runs]) for f in FACTORS},
        best_spares=best,
        useful_gpu_hours=_mean([r.useful_gpu_hours for r in runs]),
        lost_gpu_hours={k: _mean([r.lost_gpu_hours[k] for r in runs]) for k in LOSS_KINDS},
        lost_by_class={c.name: _mean([r.lost_by_class[c.name] for r in runs]) for c in booked.classes},
        runs=runs,
    )


def simulate(
    rates: FaultRates,
    *,
    nodes: int,
    gpus_per_node: int,
    days: float,
    seed: int = 0,
    seeds: int = 1,
    checkpoint_minutes: float | None = None,
    restart_minutes: float | None = None,
    checkpoint_save_seconds: float | None = None,
    spares: int = 0,
    replica_nodes: int | None = None,
    spare_counts: Sequence[int] = (),
    label: str = "",
) -> SimulationReport:
    """Every policy over seeds ``seed`` .. ``seed + seeds - 1``, side by side.

    Args:
        rates: the rate table.
        nodes: nodes in the fleet.
        gpus_per_node: GPUs per node.
        days: the period.
        seed: the first seed.
        seeds: how many seeds (each its own draw of faults, met by every policy).
        checkpoint_minutes: the job's checkpoint interval (default: the table's).
        restart_minutes: the job's restart cost (default: the table's).
        checkpoint_save_seconds: how long a checkpoint's save stops the job (default: the table's).
        spares: nodes the job leaves for replacements.
        replica_nodes: nodes of one data-parallel replica (default: the table's).
        spare_counts: spare counts to try for each policy's best (:func:`spare_candidates`).
        label: how the report names the table (its file).

    Raises:
        InputError: the fleet less its spares holds no replica.
    """
    seed_list = list(range(seed, seed + seeds))
    replica = _replica(rates, nodes, spares, replica_nodes)
    booked = _with_false_alarms(rates)  # the classes losses are booked to
    job: dict[str, Any] = {
        "nodes": nodes,
        "gpus_per_node": gpus_per_node,
        "days": days,
        "checkpoint_minutes": checkpoint_minutes,
        "restart_minutes": restart_minutes,
        "checkpoint_save_seconds": checkpoint_save_seconds,
        "replica_nodes": replica,
    }

    def runs_of(policy: Policy, spare_nodes: int) -> list[RunResult]:
        return [simulate_run(rates, policy, seed=s, spares=spare_nodes, **job) for s in seed_list]

    def best_of(policy: Policy) -> BestSpares | None:
        tried = {n: Spread.of([r.goodput for r in runs_of(policy, n)]) for n in spare_counts}
        chosen = max(tried, key=lambda n: (tried[n].mean, -n)) if tried else None
        return BestSpares(spares=chosen, goodput=tried[chosen]) if chosen is not None else None

    results = [_policy_result(p, runs_of(p, spares), best_of(p), booked) for p in POLICIES]
    expected = expected_faults(rates, nodes, gpus_per_node, days)
    slow = {c.name for c in rates.classes if c.slow}
    return SimulationReport(
        rates=label or rates.name,
        source=rates.source,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        days=days,
        seeds=seed_list,
        checkpoint_minutes=checkpoint_minutes or rates.job.checkpoint_minutes,
        restart_minutes=rates.job.restart_minutes if restart_minutes is None else restart_minutes,
        checkpoint_save_seconds=_save_seconds(rates, checkpoint_save_seconds),
        spares=spares,
        replica_nodes=replica,
        job_nodes=(nodes - spares) // replica * replica,
        elastic=rates.job.elastic,
        gpu_hours=nodes * gpus_per_node * days * 24.0,
        expected_interruptions=round(expected_interruptions(rates, nodes, gpus_per_node, days), 3),
        expected_slow_nodes=round(sum(v for name, v in expected.items() if name in slow), 3),
        policies=results,
    )


class SweepPoint(Frozen):
    """Every policy's goodput at one checkpoint interval."""

    checkpoint_minutes: float
    goodput: dict[str, Spread]


class CheckpointSweep(Frozen):
    """Goodput against the checkpoint interval, beside Young's and Daly's interval.

    Attributes:
        hours_between_interruptions: the table's mean time between interruptions of the job (M).
        young_daly_minutes: sqrt(2 S M).
        best_minutes: per policy, the swept interval of the highest mean goodput.
    """

    rates: str
    nodes: int
    gpus_per_node: int
    days: float
    seeds: list[int]
    restart_minutes: float
    checkpoint_save_seconds: float
    hours_between_interruptions: float
    young_daly_minutes: float
    best_minutes: dict[str, float]
    points: list[SweepPoint]


#: The sweep's intervals: Young's and Daly's times 2^(k/4), k from -8 to 8 (a quarter to four times).
SWEEP_STEPS = range(-8, 9)


def sweep_intervals(young_daly: float) -> list[float]:
    """The intervals a sweep around ``young_daly`` minutes tries, in minutes (at least the table's least)."""
    chosen = {round(max(MIN_CHECKPOINT_MINUTES, young_daly * 2 ** (k / 4)), 2) for k in SWEEP_STEPS}
    return sorted(chosen)


def sweep_checkpoint(
    rates: FaultRates,
    *,
    nodes: int,
    gpus_per_node: int,
    days: float,
    seed: int = 0,
    seeds: int = 1,
    restart_minutes: float | None = None,
    checkpoint_save_seconds: float | None = None,
    spares: int = 0,
    replica_nodes: int | None = None,
    label: str = "",
) -> CheckpointSweep:
    """Every policy's goodput at :func:`sweep_intervals` around Young's and Daly's interval.

    Raises:
        InputError: the save costs nothing or the table expects no interruption: no interval is best.
    """
    save_s = _save_seconds(rates, checkpoint_save_seconds)
    if save_s <= 0:
        raise InputError(
            "a checkpoint sweep needs a save that stops the job: give --checkpoint-save-seconds "
            "(or checkpointSaveSeconds in the rate table); without one the shortest interval is best"
        )
    interruptions = expected_interruptions(rates, nodes, gpus_per_node, days)
    if interruptions <= 0:
        raise InputError("the rate table expects no interruption of the job: no checkpoint interval is best")
    between = days * 24.0 / interruptions
    best_guess = young_daly_minutes(save_s, between)
    points: list[SweepPoint] = []
    report: SimulationReport | None = None
    for minutes in sweep_intervals(best_guess):
        report = simulate(
            rates,
            nodes=nodes,
            gpus_per_node=gpus_per_node,
            days=days,
            seed=seed,
            seeds=seeds,
            checkpoint_minutes=minutes,
            restart_minutes=restart_minutes,
            checkpoint_save_seconds=save_s,
            spares=spares,
            replica_nodes=replica_nodes,
        )
        points.append(
            SweepPoint(checkpoint_minutes=minutes, goodput={p.policy: p.goodput for p in report.policies})
        )
    assert report is not None  # sweep_intervals gives at least one interval
    best = {
        policy: max(points, key=lambda point: point.goodput[policy].mean).checkpoint_minutes
        for policy in POLICIES
    }
    return CheckpointSweep(
        rates=label or rates.name,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        days=days,
        seeds=report.seeds,
        restart_minutes=report.restart_minutes,
        checkpoint_save_seconds=save_s,
        hours_between_interruptions=round(between, 4),
        young_daly_minutes=round(best_guess, 3),
        best_minutes=best,
        points=points,
    )
