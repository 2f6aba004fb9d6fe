"""The quarantine policy: what dsx does about a health event, and the circuit breaker that stops it.

Rules map a health event to one of three decisions, first match wins:

- ``observe``: nothing on the node beyond what the agent already wrote (condition, Event, metric);
- ``taint``: the ``dsx.dev/unhealthy:NoSchedule`` taint only (no new work lands; running work stays);
- ``remediate``: cordon, drain, repair, recertify (``dsx-remediate``).

A rule matches on ``check``, ``severity`` and ``action`` (``*`` for any). The default rules remediate a
fatal fault whose repair needs the machine (``reset-gpu``, ``reboot``, ``replace``, ``contact-support``),
taint any other fatal fault, and observe the rest, as NVSentinel's defaults do. A healthy reading is
always ``observe``.

Every decision is refused (``observe``, with the reason) when the node opts out with
``dsx.dev/managed=false``, and a ``remediate`` decision is refused while the circuit breaker is open.

The breaker (:class:`Breaker`) refuses to quarantine more than ``max_share`` of the GPU nodes within a
sliding window of ``window_s`` seconds: a fleet-wide cause (a bad driver roll-out, a switch down) must not
drain the whole cluster. Its state is the ConfigMap ``dsx-quarantine-breaker`` in dsx's namespace, written
with optimistic concurrency, with the keys:

- ``state``: ``closed`` or ``open``;
- ``admitted``: JSON ``{node: RFC 3339 time}``, the nodes quarantined within the window;
- ``tripped-at``, ``tripped-reason``: when and why it opened;
- ``reset-at``, ``reset-by``: the last reset.

Once open it stays open until a person resets it (``dsx sentinel breaker reset``): a breaker that closed
by itself would resume the very drain it stopped. An admission whose remediation could not be recorded (the
guard's ``requested`` ledger entry failed) is withdrawn (:meth:`Breaker.withdraw`): a slot in the window
stands for a remediation under way, so failing writes never fill the window and open the breaker.

In dry-run mode (:attr:`QuarantinePolicy.dry_run`) the decision is made, returned and recorded, and
nothing is written to the node or the breaker.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Callable, Sequence
from typing import Literal

from pydantic import Field, ValidationError

from steps.cluster import changes
from steps.cluster.port import ClusterPort, Node
from steps.errors import InputError
from steps.models import Frozen, input_error
from steps.sentinel.events import HealthEvent

__all__ = [
    "BREAKER_CONFIGMAP",
    "DEFAULT_RULES",
    "Breaker",
    "BreakerSettings",
    "BreakerStatus",
    "Decision",
    "QuarantineDecision",
    "QuarantinePolicy",
    "Rule",
    "decide",
]

BREAKER_CONFIGMAP = "dsx-quarantine-breaker"

Decision = Literal["observe", "taint", "remediate"]
_DECISIONS: dict[str, int] = {"observe": 0, "taint": 1, "remediate": 2}


class Rule(Frozen):
    """One rule: events of this check, severity and action (``*``: any) get ``decision``."""

    check: str = "*"
    severity: str = "*"
    action: str = "*"
    decision: Decision

    def matches(self, event: HealthEvent) -> bool:
        """Whether the rule covers the event."""
        return all(
            want in ("*", have)
            for want, have in (
                (self.check, event.check),
                (self.severity, event.severity),
                (self.action, event.action),
            )
        )


DEFAULT_RULES: tuple[Rule, ...] = (
    *(Rule(severity="fatal", action=a, decision="remediate") for a in ("reset-gpu", "reboot", "replace")),
    Rule(severity="fatal", action="contact-support", decision="remediate"),
    Rule(severity="fatal", decision="taint"),
    Rule(decision="observe"),
)


CLOCK_SKEW_S = 300.0
"""How far ahead of this clock an admission may be stamped (the pods' clocks differ) before it is refused."""


class BreakerSettings(Frozen):
    """How much of the fleet the breaker lets remediation take.

    Attributes:
        max_share: the largest share of GPU nodes quarantined within the window (at least one node is
            always allowed, so a small fleet can still remediate one node).
        window_s: the sliding window, in seconds.
    """

    max_share: float = Field(0.1, gt=0, le=1)
    window_s: float = Field(3600, gt=0)

    def limit(self, gpu_nodes: int) -> int:
        """Nodes the window may hold for a fleet of ``gpu_nodes``."""
        return max(1, math.floor(self.max_share * gpu_nodes))


class QuarantinePolicy(Frozen):
    """The rules, the breaker settings and the dry-run switch."""

    rules: tuple[Rule, ...] = DEFAULT_RULES
    breaker: BreakerSettings = Field(default_factory=BreakerSettings)
    dry_run: bool = False

    @classmethod
    def from_data(cls, data: object, name: str = "quarantine policy") -> QuarantinePolicy:
        """A policy from parsed YAML or JSON; ``InputError`` naming the field when it is malformed."""
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise input_error(exc, name) from None


class QuarantineDecision(Frozen):
    """What the policy decided for one event on one node, and why."""

    node: str
    check: str
    decision: Decision
    reason: str
    dry_run: bool = False


def decide(
    event: HealthEvent, node: Node, policy: QuarantinePolicy, breaker_open: bool = False
) -> QuarantineDecision:
    """The decision for ``event`` on ``node``: the first matching rule, then the opt-out and the breaker.

    ``breaker_open`` turns a ``remediate`` into ``taint`` (the node still gets no new work) with the
    reason saying so. Pure: it reads nothing and writes nothing, so it can be called 1,000s of times a second.
    """

    def made(decision: Decision, reason: str) -> QuarantineDecision:
        return QuarantineDecision(
            node=node.name, check=event.check, decision=decision, reason=reason, dry_run=policy.dry_run
        )

    if event.healthy:
        return made("observe", "a healthy reading")
    if not node.managed:
        return made("observe", f"{node.name} opts out (dsx.dev/managed=false)")
    rule = next((r for r in policy.rules if r.matches(event)), None)
    if rule is None:
        return made("observe", "no rule matches")
    why = f"rule check={rule.check} severity={rule.severity} action={rule.action}"
    if rule.decision == "remediate" and breaker_open:
        return made("taint", f"{why} asks to remediate, but the circuit breaker is open")
    return made(rule.decision, why)


class BreakerStatus(Frozen):
    """The breaker as stored: open or closed, the nodes in the window, the last trip and reset."""

    state: Literal["open", "closed"] = "closed"
    admitted: dict[str, str] = Field(default_factory=dict)
    tripped_at: str = ""
    tripped_reason: str = ""
    reset_at: str = ""
    reset_by: str = ""

    @classmethod
    def from_data(cls, data: dict[str, str]) -> BreakerStatus:
        """Read the ConfigMap's data; ``InputError`` naming the ConfigMap when it was edited into nonsense."""
        try:
            admitted = json.loads(data.get("admitted") or "{}")
            status = cls(
                state="open" if data.get("state") == "open" else "closed",
                admitted={str(k): str(v) for k, v in dict(admitted).items()},
                tripped_at=data.get("tripped-at", ""),
                tripped_reason=data.get("tripped-reason", ""),
                reset_at=data.get("reset-at", ""),
                reset_by=data.get("reset-by", ""),
            )
        except (ValueError, TypeError) as exc:
            raise InputError(
                f"ConfigMap {BREAKER_CONFIGMAP}: key 'admitted' is not a JSON object ({exc})"
            ) from None
        for node, at in status.admitted.items():
            try:
                changes.parse_time(at)
            except (TypeError, ValueError):
                raise InputError(
                    f"ConfigMap {BREAKER_CONFIGMAP}: key 'admitted': node {node} admitted at {at!r}, not an "
                    "RFC 3339 time; correct it, or reset the breaker (dsx sentinel breaker reset)"
                ) from None
        return status

    def to_data(self) -> dict[str, str]:
        """The ConfigMap's data (sorted keys, so a write that changes nothing is not a write)."""
        data = {"state": self.state, "admitted": json.dumps(dict(sorted(self.admitted.items())))}
        for key, value in (
            ("tripped-at", self.tripped_at),
            ("tripped-reason", self.tripped_reason),
            ("reset-at", self.reset_at),
            ("reset-by", self.reset_by),
        ):
            if value:
                data[key] = value
        return data


class Breaker:
    """The circuit breaker over the port's state ConfigMap (see the module docstring).

    Args:
        port: the cluster.
        settings: share and window.
        clock: the current time (tests pass their own).
    """

    def __init__(
        self,
        port: ClusterPort,
        settings: BreakerSettings | None = None,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        self.port = port
        self.settings = settings or BreakerSettings()
        self.clock = clock

    def status(self) -> BreakerStatus:
        """The breaker as stored now."""
        return BreakerStatus.from_data(self.port.get_state(BREAKER_CONFIGMAP))

    def _windowed(self, status: BreakerStatus, now: dt.datetime) -> dict[str, str]:
        horizon = now - dt.timedelta(seconds=self.settings.window_s)
        for node, at in status.admitted.items():
            if changes.parse_time(at) > now + dt.timedelta(seconds=CLOCK_SKEW_S):
                raise InputError(
                    f"ConfigMap {BREAKER_CONFIGMAP}: key 'admitted': node {node} admitted at {at}, in the "
                    "future (it would never leave the window); correct it, or reset the breaker (dsx "
                    "sentinel breaker reset)"
                )
        return {n: at for n, at in status.admitted.items() if changes.parse_time(at) > horizon}

    def admit(self, node: str, gpu_nodes: int) -> tuple[bool, str]:
        """Ask to quarantine ``node`` in a fleet of ``gpu_nodes``: ``(True, why)`` when admitted.

        A node already in the window is admitted again (a resubmitted remediation is not a second
        node). A node that would take the window past the limit trips the breaker: it opens, is
        recorded with the time and the reason, and stays open until :meth:`reset`.
        """
        now = self.clock()
        verdict: list[tuple[bool, str]] = []

        def change(data: dict[str, str]) -> dict[str, str]:
            verdict.clear()
            status = BreakerStatus.from_data(data)
            window = self._windowed(status, now)
            limit = self.settings.limit(gpu_nodes)
            if status.state == "open":
                verdict.append(
                    (False, f"the circuit breaker is open since {status.tripped_at}: {status.tripped_reason}")
                )
                return status.model_copy(update={"admitted": window}).to_data()
            if node in window:
                verdict.append((True, f"{node} is already in the breaker's window"))
                return status.model_copy(update={"admitted": window}).to_data()
            if len(window) + 1 > limit:
                reason = (
                    f"{len(window) + 1} nodes to quarantine within {self.settings.window_s:g}s "
                    f"(limit {limit} of {gpu_nodes} GPU nodes, {self.settings.max_share:.0%}); {node} refused"
                )
                verdict.append((False, f"the circuit breaker tripped: {reason}"))
                return status.model_copy(
                    update={
                        "state": "open",
                        "admitted": window,
                        "tripped_at": changes.format_time(now),
                        "tripped_reason": reason,
                    }
                ).to_data()
            window[node] = changes.format_time(now)
            verdict.append((True, f"{node} admitted ({len(window)} of {limit} in the window)"))
            return status.model_copy(update={"admitted": window}).to_data()

        self.port.update_state(BREAKER_CONFIGMAP, change)
        return verdict[0]

    def withdraw(self, node: str, since: dt.datetime) -> bool:
        """Take back ``node``'s admission if it was made at or after ``since`` (the time the caller asked
        :meth:`admit`, which records it to the second); ``True`` if one was taken back.

        The guard withdraws when it cannot write the remediation's ``requested`` entry (the ledger
        refused, the API went away): no remediation holds that slot, and the workflow's retry asks again.
        An earlier admission of the node (a resubmitted remediation admitted before ``since``) stays.
        """
        floor = since.replace(microsecond=0)
        taken: list[bool] = []

        def change(data: dict[str, str]) -> dict[str, str]:
            taken.clear()
            status = BreakerStatus.from_data(data)
            at = status.admitted.get(node)
            if at is None or changes.parse_time(at) < floor:
                return data
            taken.append(True)
            window = {n: t for n, t in status.admitted.items() if n != node}
            return status.model_copy(update={"admitted": window}).to_data()

        self.port.update_state(BREAKER_CONFIGMAP, change)
        return bool(taken)

    def reset(self, by: str) -> BreakerStatus:
        """Close the breaker and empty its window, recording who reset it and when."""
        now = changes.format_time(self.clock())

        def change(data: dict[str, str]) -> dict[str, str]:
            return BreakerStatus(reset_at=now, reset_by=by).to_data()

        return BreakerStatus.from_data(self.port.update_state(BREAKER_CONFIGMAP, change))


def strongest(decisions: Sequence[QuarantineDecision]) -> QuarantineDecision | None:
    """The most far-reaching of several decisions (remediate over taint over observe), first on a tie."""
    return max(decisions, key=lambda d: _DECISIONS[d.decision], default=None)
