"""Fault history: what a fault's repetition means, read from ``recipes/faults/history.yaml``.

Two kinds of rule, both data (a cluster replaces them with the ``history`` of its overrides file, where
the reader is given it: the agent is, ``dsx-remediate``'s pods are not):

- **XID rules** (:class:`XidRule`): an XID harmless once (NVIDIA's catalogue buckets 13, 31 and 43 as
  application errors or nothing to act on) seen on one GPU ``count`` times within ``withinMinutes`` escalates
  that GPU's reading to the rule's severity and action. :class:`XidHistory` counts the kernel log's lines
  of each XID per GPU over time, from the counts :class:`~steps.sentinel.kernel_log.KernelLog` keeps.
- **Port rules** (:class:`NicRule`): a fabric port whose error counter (its link going down, above all)
  grows by ``count`` within ``withinMinutes`` escalates that port's faulty reading to the rule's severity
  and action: the catalogue's ``link-downed-rate`` makes a port that flaps twice an hour degraded, this
  rule one that flaps on fatal. The counters' history is the agent's
  (:class:`~steps.sentinel.rates.CounterRates`, kept across restarts in its state file).
- **The lemon rule** (:class:`LemonRule`): a node returned to service by ``count`` remediations within
  ``withinDays`` days is escalated for replacement instead of being repaired again (applied by
  ``dsx-remediate``'s guard, :func:`steps.sentinel.remediate.guard`, which reads the ledger).
"""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from steps.models import Camel, Frozen, read_model
from steps.sentinel.events import Action, HealthEvent, Severity, severity_rank
from steps.sentinel.rates import CounterRates

__all__ = [
    "FaultHistory",
    "LemonRule",
    "NicRule",
    "NodeHistory",
    "PortCount",
    "Returned",
    "XidCount",
    "XidHistory",
    "XidRule",
    "load_history",
    "port_counts",
]


class XidRule(Camel):
    """XIDs ``codes`` on one GPU ``count`` times within ``within_minutes``: the reading becomes ``severity``
    with ``action``."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    codes: list[int] = Field(min_length=1)
    count: int = Field(ge=2)
    within_minutes: float = Field(gt=0, le=7 * 24 * 60, allow_inf_nan=False)
    severity: Severity
    action: Action


NicCounter = Literal["link_downed", "symbol_errors", "buffer_overruns"]
"""The port counters a rule may count (:class:`~steps.cluster.health.NicReport` fields)."""


class NicRule(Camel):
    """A port's ``counter`` grown by ``count`` within ``within_minutes``: its faulty reading becomes
    ``severity`` with ``action``."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    counter: NicCounter
    count: int = Field(ge=1)
    within_minutes: float = Field(gt=0, le=24 * 60, allow_inf_nan=False)
    severity: Severity
    action: Action

    def escalate(self, event: HealthEvent, grown: int | None) -> HealthEvent:
        """``event`` (a faulty reading of the port) as this rule makes it when the counter grew by
        ``grown`` within its window, or as it is."""
        if event.check != "nic" or event.healthy or grown is None or grown < self.count:
            return event
        if severity_rank(self.severity) <= severity_rank(event.severity):
            return event
        why = f"{grown} times within {self.within_minutes:g} min: history rule {self.name}"
        return event.model_copy(
            update={"severity": self.severity, "action": self.action, "message": f"{event.message} ({why})"}
        )


class LemonRule(Camel):
    """A node returned to service by ``count`` remediations within ``within_days`` days is replaced."""

    count: int = Field(ge=1)
    within_days: float = Field(gt=0, le=366, allow_inf_nan=False)


class FaultHistory(Camel):
    """The history rules (kind ``FaultHistory``)."""

    api_version: Literal["dsx.dev/v1alpha1"] = "dsx.dev/v1alpha1"
    kind: Literal["FaultHistory"] = "FaultHistory"
    xid: list[XidRule] = Field(default_factory=list)
    nic: list[NicRule] = Field(default_factory=list)
    lemon: LemonRule | None = None

    @model_validator(mode="after")
    def _unique(self) -> FaultHistory:
        for kind, rules in (("XID", self.xid), ("port", self.nic)):
            names = [rule.name for rule in rules]
            twice = sorted({name for name in names if names.count(name) > 1})
            if twice:
                raise ValueError(f"{kind} rule {twice[0]!r} is listed twice")
        return self


def load_history(path: Path) -> FaultHistory:
    """Read a history file.

    Raises:
        InputError: the file is missing, not YAML, or not a FaultHistory (file and line named).
    """
    return read_model(path, FaultHistory, what="FaultHistory")


class XidCount(Frozen):
    """What a rule sees of one GPU's XID now: its lines within the rule's window against its count."""

    pci: str
    code: int
    rule: str
    within_minutes: float
    lines: int
    count: int
    fired: bool


class PortCount(Frozen):
    """What a port rule sees of one port now: its counter's growth within the rule's window."""

    port: str
    counter: str
    rule: str
    within_minutes: float
    grown: int
    count: int
    fired: bool


def port_counts(rules: Sequence[NicRule], rates: CounterRates, now: float) -> list[PortCount]:
    """For every port counter the agent keeps and every rule that counts it: its growth within the
    rule's window at ``now`` and whether the rule fires."""
    rows: list[PortCount] = []
    for port, counter in sorted(k for k in rates.counters() if len(k) == 2):  # (port, field) or (GPU, name)
        for rule in (r for r in rules if r.counter == counter):
            grown = rates.growth((port, counter), rule.within_minutes * 60, now) or 0
            rows.append(
                PortCount(
                    port=port,
                    counter=counter,
                    rule=rule.name,
                    within_minutes=rule.within_minutes,
                    grown=grown,
                    count=rule.count,
                    fired=grown >= rule.count,
                )
            )
    return rows


class Returned(Frozen):
    """A remediation that returned the node to service: when, and which workflow."""

    at: str
    workflow: str


class NodeHistory(Frozen):
    """What the history rules see of one node now (``dsx sentinel history``).

    Attributes:
        state_file: the agent's state file read for the XID counts (``""``: none of this boot).
        xid: per GPU, code and rule, its lines within the rule's window.
        ports: per fabric port, counter and port rule, the counter's growth within the rule's window.
        returned: the remediations that returned the node to service within the lemon rule's window.
        lemon: the lemon rule in force (``None``: none).
        lemon_fired: whether the next remediation would be escalated for replacement instead.
    """

    node: str
    boot_id: str
    state_file: str
    xid: list[XidCount]
    ports: list[PortCount] = Field(default_factory=list)
    returned: list[Returned]
    lemon: LemonRule | None
    lemon_fired: bool


class XidHistory:
    """What the agent remembers of each GPU's XID lines: for each ``(PCI address, code)`` a rule counts,
    the count of lines so far at each pass that changed it, back to the longest window.

    Counting starts at the agent's first pass in this boot (a restarted agent takes over the count
    through its state file, :meth:`snapshot`): lines counted then were written before it watched and
    never escalate; a GPU and code first counted at a later pass had none before it.
    """

    def __init__(self, rules: Sequence[XidRule]) -> None:
        self.rules = list(rules)
        self._span_s = max((rule.within_minutes for rule in self.rules), default=0.0) * 60
        self._codes = {code for rule in self.rules for code in rule.codes}
        self._seen: dict[tuple[str, int], collections.deque[tuple[float, int]]] = {}
        self._started: float | None = None
        """The first pass (constant, so that the state file changes only when a count does)."""

    def observe(self, counts: Mapping[tuple[str, str, int], tuple[int, float, float]], now: float) -> None:
        """Take in the kernel log's counts (``(kind, pci, code) -> (lines, first, last)``) at ``now``."""
        first_pass = self._started is None
        if self._started is None:
            self._started = now
        for (kind, pci, code), (lines, _first, _last) in counts.items():
            if kind != "xid" or code not in self._codes:
                continue
            seen = self._seen.get((pci, code))
            if seen is None:
                seen = self._seen[(pci, code)] = collections.deque()
                if not first_pass:  # counted since the first pass, none before: none then
                    seen.append((self._started, 0))
            if not seen or seen[-1][1] != lines:
                seen.append((now, lines))
            while len(seen) > 1 and seen[1][0] <= now - self._span_s:
                seen.popleft()  # the first observation at or before the longest window's start stays

    def lines_within(self, pci: str, code: int, seconds: float, now: float) -> int:
        """Lines of XID ``code`` on the GPU at ``pci`` counted within the last ``seconds``."""
        seen = self._seen.get((pci, code))
        if not seen:
            return 0
        start = now - seconds
        base = seen[0][1]
        for at, lines in seen:
            if at > start:
                break
            base = lines
        return seen[-1][1] - base

    def fired(self, pci: str, code: int, now: float) -> tuple[XidRule, int] | None:
        """The first rule the GPU's lines of ``code`` meet, with their count in its window."""
        for rule in self.rules:
            if code in rule.codes:
                lines = self.lines_within(pci, code, rule.within_minutes * 60, now)
                if lines >= rule.count:
                    return rule, lines
        return None

    def escalate(self, event: HealthEvent, pci: str | None, now: float) -> HealthEvent:
        """``event`` (an XID reading of the GPU at ``pci``) as a rule it meets makes it, or as it is."""
        if event.check != "xid" or event.healthy or pci is None or not event.code.isdigit():
            return event
        found = self.fired(pci, int(event.code), now)
        if found is None:
            return event
        rule, lines = found
        if severity_rank(rule.severity) <= severity_rank(event.severity):
            return event
        why = f"{lines} times within {rule.within_minutes:g} min: history rule {rule.name}"
        return event.model_copy(
            update={"severity": rule.severity, "action": rule.action, "message": f"{event.message} ({why})"}
        )

    def counts(self, now: float) -> list[XidCount]:
        """For every GPU and code counted and every rule that counts it: its lines within the rule's
        window at ``now`` and whether the rule fires."""
        rows: list[XidCount] = []
        for pci, code in sorted(self._seen):
            for rule in self.rules:
                if code in rule.codes:
                    lines = self.lines_within(pci, code, rule.within_minutes * 60, now)
                    rows.append(
                        XidCount(
                            pci=pci,
                            code=code,
                            rule=rule.name,
                            within_minutes=rule.within_minutes,
                            lines=lines,
                            count=rule.count,
                            fired=lines >= rule.count,
                        )
                    )
        return rows

    def snapshot(self) -> dict[str, Any]:
        """What a restarted agent of the same boot needs to go on counting, as JSON-ready data."""
        return {
            "started": self._started,
            "seen": [
                [pci, code, [list(o) for o in seen]] for (pci, code), seen in sorted(self._seen.items())
            ],
        }

    def restore(self, data: Mapping[str, Any]) -> None:
        """Take over a :meth:`snapshot` of the same boot.

        Raises:
            ValueError: ``data`` is not such a snapshot.
        """
        try:
            started = data.get("started")
            seen = {
                (str(pci), int(code)): collections.deque(
                    (float(at), int(lines)) for at, lines in observations
                )
                for pci, code, observations in data.get("seen", [])
            }
        except (TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"not an XID history snapshot: {exc}") from None
        self._started = float(started) if started is not None else None
        self._seen = seen
