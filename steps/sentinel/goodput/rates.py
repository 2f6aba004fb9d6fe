"""The fault rate table of the goodput simulation (kind ``FaultRates``, data in ``recipes/goodput/``).

A rate table says, per class of fault: how often it strikes (its count over a reference exposure, so
published figures are kept as published), who names the node at fault (the agent, Kubernetes, only the
job's failure, or only bisection), how long each policy takes to find it and to bring the node back.
Everything here is validated when read, and an error names the file and the line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, Self

from pydantic import Field, field_validator, model_validator

from steps.models import Camel, read_model
from steps.yamlio import shipped

__all__ = [
    "MIN_CHECKPOINT_MINUTES",
    "POLICIES",
    "Exposure",
    "FaultClass",
    "FaultRates",
    "JobSettings",
    "PerPolicy",
    "Policies",
    "Policy",
    "PolicySettings",
    "Repairs",
    "SeenBy",
    "default_rates_path",
    "load_rates",
]

Policy = Literal["none", "taint", "remediate", "full"]
#: The shortest checkpoint interval a table or a run may ask for (minutes).
MIN_CHECKPOINT_MINUTES = 0.1
#: The policies compared, each more complete than the one before.
POLICIES: tuple[Policy, ...] = ("none", "taint", "remediate", "full")

SeenBy = Literal["agent", "kubernetes", "job", "bisection"]

FIGURE_MAX = 1e7
"""The largest figure a table may give (ten million minutes is 19 years): beyond it a figure is a typo,
and ``1e300`` would overflow the simulation's arithmetic."""
#: A figure of the table: a finite number (``.inf`` would draw faults without end), at most FIGURE_MAX.
Figure = Annotated[float, Field(allow_inf_nan=False, le=FIGURE_MAX)]


class PerPolicy(Camel):
    """A time for each policy (minutes or hours, as the field holding it says)."""

    none: Figure = Field(ge=0)
    taint: Figure = Field(ge=0)
    remediate: Figure = Field(ge=0)
    full: Figure = Field(ge=0)

    def of(self, policy: Policy) -> float:
        """The time under ``policy``."""
        value: float = getattr(self, policy)
        return value


class Exposure(Camel):
    """The fleet and period a table's counts were observed on."""

    gpus: int = Field(gt=0)
    gpus_per_node: int = Field(gt=0)
    days: Figure = Field(gt=0)

    @property
    def gpu_hours(self) -> float:
        """GPU-hours of the exposure: the denominator of every rate."""
        return self.gpus * self.days * 24.0


class JobSettings(Camel):
    """The synchronous training job: how often it checkpoints, how long a save stops it, what a restart
    costs, and how many nodes one of its data-parallel replicas takes."""

    checkpoint_minutes: Figure = Field(ge=MIN_CHECKPOINT_MINUTES)
    restart_minutes: Figure = Field(ge=0)
    checkpoint_save_seconds: Figure = Field(default=0.0, ge=0, le=86_400)
    replica_nodes: int = Field(default=1, ge=1, le=100_000)
    elastic: bool = Field(
        default=True,
        description="the job trains on the replicas it can fill while one waits for nodes; "
        "a rigid job (false) waits whole until every replica is",
    )


class Repairs(Camel):
    """Repairs that do not fix: without recertification the node returns and fails again."""

    unfixed_fraction: Figure = Field(ge=0, le=1)
    recurrence_hours: Figure = Field(gt=0)


class PolicySettings(Camel):
    """What a policy does beyond the detection and repair times of each class.

    Attributes:
        recertify: a repaired node is tested before it returns (a repair that did not fix is caught).
        recertify_minutes: how long that test keeps the node out.
        certify_every_hours: periodic certification of the whole job with bisection (finds slow nodes),
            at most once an hour.
        certify_minutes: how long the job stands still for it (a restart follows).
        false_alarms_per_1000_node_days: healthy nodes the policy's own checks take out (an agent's
            threshold, a flaky test), per 1,000 node-days.
        false_alarm_hours: how long such a node is out before it is back (triage, or an automated repair
            that finds nothing; recertification is added where the policy recertifies).
    """

    recertify: bool = False
    recertify_minutes: Figure = Field(0.0, ge=0)
    certify_every_hours: Figure | None = Field(None, ge=1)
    certify_minutes: Figure = Field(0.0, ge=0)
    false_alarms_per_1000_node_days: Figure = Field(0.0, ge=0)
    false_alarm_hours: Figure = Field(0.0, ge=0)


class Policies(Camel):
    """The settings of each policy; every policy must be given."""

    none: PolicySettings
    taint: PolicySettings
    remediate: PolicySettings
    full: PolicySettings

    def of(self, policy: Policy) -> PolicySettings:
        """The settings of ``policy``."""
        settings: PolicySettings = getattr(self, policy)
        return settings


class FaultClass(Camel):
    """One class of fault.

    Attributes:
        name: short name, used as a key in reports.
        title: what a person reads.
        category: the source's category (GPU, Host, Network...).
        count: faults over the table's exposure.
        seen_by: who names the node at fault (see the table's header).
        signals: what shows it (XIDs, ECC...), for people.
        at_fault: ``node`` (a node leaves for repair) or ``none`` (software: the job restarts as it was).
        effect: what the fault does to the job: ``fails`` it (the work since the checkpoint is lost),
            ``corrupts`` it (silent data corruption: the job runs on until the fault is found, and every
            step since it struck is thrown away, saved or not), or is ``planned`` (maintenance: the job
            checkpoints, stops and restarts; a fault of no node).
        detect_minutes: per policy, from the fault to the job ready to restart without the node; for a
            slow class, from its onset to its node found without certification (by hand, or by online
            per-rank timing), absent where only periodic certification finds it.
        repair_hours: per policy, how long the node stays out once found.
        speed: for a slow class, the job's speed while the node is in it (0 to 1, exclusive).
        certify_miss: for a slow class, the chance that one periodic certification with bisection
            misses its node (the bisection benchmark's miss rate at its speed).
    """

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    title: str
    category: str
    count: Figure = Field(ge=0)
    seen_by: SeenBy
    signals: str = ""
    at_fault: Literal["node", "none"]
    effect: Literal["fails", "corrupts", "planned"] = "fails"
    detect_minutes: PerPolicy | None = None
    repair_hours: PerPolicy | None = None
    speed: Figure | None = Field(None, gt=0, lt=1)
    certify_miss: Figure = Field(0.0, ge=0, le=1)

    @property
    def slow(self) -> bool:
        """The class slows the job instead of failing it."""
        return self.seen_by == "bisection"

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.slow:
            if self.speed is None:
                raise ValueError("a class seen only by bisection slows the job: give its speed (0 to 1)")
            if self.effect != "fails":
                raise ValueError(
                    "a class seen only by bisection slows the job: its effect is fails (the default)"
                )
            if self.at_fault != "node":
                raise ValueError("a class seen only by bisection is a node's fault: atFault must be node")
        else:
            if self.speed is not None:
                raise ValueError(f"speed is for classes seen only by bisection, not by {self.seen_by}")
            if self.detect_minutes is None:
                raise ValueError("give detectMinutes for every policy")
            if self.certify_miss:
                raise ValueError("certifyMiss is for classes seen only by bisection")
        if self.at_fault == "node" and self.repair_hours is None:
            raise ValueError("a node's fault needs repairHours for every policy")
        if self.at_fault == "none":
            if self.repair_hours is not None:
                raise ValueError("a fault of no node has nothing to repair: remove repairHours")
            if self.seen_by != "job":
                raise ValueError(f"a fault of no node cannot be seen by {self.seen_by}: seenBy must be job")
        elif self.effect == "planned":
            raise ValueError("planned maintenance is a fault of no node: atFault must be none")
        return self


class FaultRates(Camel):
    """A rate table: where its figures come from, the job, the policies and the fault classes."""

    api_version: Literal["dsx.dev/v1alpha1"]
    kind: Literal["FaultRates"]
    name: str
    source: str
    exposure: Exposure
    job: JobSettings
    repairs: Repairs
    policies: Policies
    classes: list[FaultClass] = Field(min_length=1)

    @field_validator("classes")
    @classmethod
    def _unique(cls, classes: list[FaultClass]) -> list[FaultClass]:
        seen: set[str] = set()
        for fault in classes:
            if fault.name in seen:
                raise ValueError(f"class {fault.name!r} is listed twice")
            seen.add(fault.name)
        return classes

    def per_gpu_hour(self, fault: FaultClass) -> float:
        """The rate of ``fault`` per GPU-hour."""
        return fault.count / self.exposure.gpu_hours


def default_rates_path() -> Path:
    """``recipes/goodput/fault-rates.yaml`` as shipped in the ``recipes`` package."""
    return shipped("goodput", "fault-rates.yaml")


def load_rates(path: Path | None = None) -> FaultRates:
    """Read a rate table (default: the shipped one, from the Llama 3 405B run).

    Raises:
        InputError: the file is missing, not YAML, or does not fit ``FaultRates`` (file and line named).
    """
    return read_model(path or default_rates_path(), FaultRates, what="FaultRates")
