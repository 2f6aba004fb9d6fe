"""The node agent: runs the probes, keeps state per (check, entity), and turns changes into node
conditions, Events, metrics and, for a fatal fault, the ``dsx.dev/unhealthy:NoSchedule`` taint.

Rules it keeps:

- A condition per check (``status=True``: a problem), set once and cleared only when every entity of
  the check that was unhealthy has had a healthy reading of that same check. Only ``degraded`` and
  ``fatal`` faults in ``enforce`` mode set conditions; ``observe`` gives Events and metrics only, ``off``
  drops the check.
- Debounce: a reading must hold for ``debounce`` passes in a row before it changes the state, except a
  fatal one, which acts at once.
- The fast path: a fatal fault in ``enforce`` mode taints the node before anything else is written.
- Never an opted-out node: on a node labelled ``dsx.dev/managed=false`` a fatal fault sets its condition,
  Event and metrics as anywhere, and no taint (a Normal Event ``DsxTaintOptedOut`` says so; the label is
  read when the taint would be written).
- Never past the taint budget (:mod:`steps.sentinel.budget`): before it taints, the agent asks the
  fleet-wide budget. Past it (or when the budget answers but cannot be read for good: forbidden, edited into
  nonsense) the taint is withheld: the condition is set as always, a Warning Event
  (``DsxTaintBudgetHeld``, ``DsxTaintBudgetUnreadable``) and ``dsx_sentinel_taint_withheld_total`` say so
  once, and the withheld taint is asked about again every ``budget_retry_s`` seconds, landing once a person
  resets the budget, and dropped if every fatal fault clears first. While the API server is away the taint
  stays queued as any write does; since the budget cannot be asked then, it is never applied without it.
- Writes go through an ordered queue. When the API server is unreachable the queue keeps them and the
  next pass replays them in order; the taint is never dropped. An Event is best-effort: one the API
  refuses while the server answers is dropped, counted in a metric.
- A probe that raises becomes a ``probe`` reading about that probe; the agent never stops for it.
- No probe can hang the agent: each runs on its own thread and gets ``probe_timeout`` seconds. One that
  does not return in time gives a degraded ``probe`` reading (``probe-timeout``; the GPU probe over NVML
  also a degraded ``nvml`` one), the pass goes on with the other probes, and until that call returns no
  second call of the probe is started (each pass says it is still stuck), so threads never pile up.
- XIDs and SXids (``PER_CODE_CHECKS``) are kept per code: each XID on a GPU is its own fault with its
  own Event, a milder one after a worse one is reported too and the worse one stays in force; the
  check's condition carries the worst. A healthy reading of the GPU clears them all.
- A restart on the same boot changes nothing: :meth:`Agent.snapshot` (the faults in force, the writes
  not delivered yet) is kept on the node by :mod:`steps.sentinel.state` and restored, so a restarted
  agent neither reports again what it reported nor loses a queued taint.
- The agent never removes the taint: remediation does, after recertification.
- What its node carries is in its metrics too, for alerts to read (``dsx_sentinel_node_*``): the taint,
  the cordon, ``dsx.dev/state`` and since when, the certification and when it was given, drift. The node is
  read at most every ``node_read_s`` seconds (a pass reads it when that is due) and the taint is counted
  the moment the agent makes it; series carry no ``node`` label, the scrape adds it (the chart's
  ServiceMonitor from the pod's node).
"""

from __future__ import annotations

import collections
import contextlib
import datetime as dt
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from steps.cluster import vocabulary as vocab
from steps.cluster.changes import timestamp_or_zero
from steps.cluster.errors import ApiUnavailableError, ClusterError, ConflictError, NotFoundError
from steps.cluster.node import Node
from steps.cluster.port import ClusterPort
from steps.errors import DsxError, InputError
from steps.sentinel.budget import TaintBudget
from steps.sentinel.catalogue import FaultCatalogue
from steps.sentinel.events import (
    ACTIONS,
    CHECKS,
    PER_CODE_CHECKS,
    HealthEvent,
    condition_message,
    condition_reason,
    severity_rank,
)
from steps.sentinel.probes import Probe

__all__ = [
    "NODE_READ_S",
    "PROBE_TIMEOUT_S",
    "Agent",
    "GuardedProbe",
    "Metrics",
    "PassResult",
    "ProbeTimeoutError",
    "Write",
    "probe_fault",
    "serve",
]

WriteKind = Literal["taint", "condition", "event"]

# Errors a later pass can get past: the server away, or the node changed under a write until its retries ran
# out (409). Such a write stays at the head of the queue; a write refused for good (403, 404, 422) is dropped.
_TRANSIENT = (ApiUnavailableError, ConflictError)

PROBE_TIMEOUT_S = 10.0
"""Seconds a probe may take before the pass goes on without it (``dsx sentinel agent --probe-timeout``)."""


@dataclass
class Write:
    """One write waiting for the API server."""

    kind: WriteKind
    seq: int
    fatal: bool = False
    condition: str = ""
    status: bool = False
    reason: str = ""
    message: str = ""
    event_type: str = "Normal"
    withheld: bool = False
    """A taint the taint budget withheld (it stays queued, asked about again, and blocks no other write)."""


class _OptedOut(Exception):
    """The node opts out (``dsx.dev/managed=false``): observed, never tainted."""


class _Withheld(Exception):
    """A taint the taint budget does not let through: it holds (``budget``), or it could not be read for
    good (``budget-unreadable``)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


_WITHHELD_EVENTS = {"budget": "DsxTaintBudgetHeld", "budget-unreadable": "DsxTaintBudgetUnreadable"}
"""The Warning Event's reason for each reason a taint is withheld."""

BUDGET_RETRY_S = 60.0
"""Seconds between two asks of the taint budget about a taint it withheld."""

NODE_READ_S = 60.0
"""Seconds between two reads of the agent's own node for the ``dsx_sentinel_node_*`` metrics."""

_NO_STATE = "none"
"""The ``state`` and ``certification`` label value of the node metrics when the node has no such label."""


@dataclass
class _State:
    event: HealthEvent | None = None
    """The unhealthy reading in force (``None``: healthy)."""
    streak_bad: int = 0
    streak_good: int = 0


@dataclass
class PassResult:
    """What one pass read and did."""

    events: list[HealthEvent] = field(default_factory=list)
    changed: list[HealthEvent] = field(default_factory=list)
    """Readings that changed the state (set, escalated or cleared)."""
    written: int = 0
    queued: int = 0
    """Writes waiting for the API server."""
    withheld: int = 0
    """Taints the taint budget withholds (not counted in ``queued``)."""
    api_up: bool = True


class Metrics:
    """The agent's Prometheus metrics, in their own registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.unhealthy = Gauge(
            "dsx_sentinel_unhealthy",
            "1 while the check finds a fault on the entity, 0 once a healthy reading cleared it.",
            ["check", "component", "entity", "severity"],
            registry=r,
        )
        self.events = Counter(
            "dsx_sentinel_health_events",
            "State changes of a check on an entity.",
            ["check", "severity", "healthy"],
            registry=r,
        )
        self.probe_errors = Counter(
            "dsx_sentinel_probe_errors", "Probe runs that raised.", ["probe"], registry=r
        )
        self.probe_timeouts = Counter(
            "dsx_sentinel_probe_timeouts",
            "Probe calls that did not return within the probe timeout.",
            ["probe"],
            registry=r,
        )
        self.queue = Gauge("dsx_sentinel_queue_depth", "Writes waiting for the API server.", registry=r)
        self.api_up = Gauge(
            "dsx_sentinel_api_up", "1 when the last write reached the API server.", registry=r
        )
        self.dropped = Counter("dsx_sentinel_dropped_writes", "Writes given up.", ["kind"], registry=r)
        self.taint_withheld = Counter(
            "dsx_sentinel_taint_withheld",
            "Taints for a fatal fault not made: the node opts out (opted-out), the fleet-wide taint budget "
            "holds (budget) or could not be read (budget-unreadable).",
            ["reason"],
            registry=r,
        )
        self.kernel_bad_lines = Gauge(
            "dsx_sentinel_kernel_log_bad_lines",
            "Kernel-log lines naming an Xid that did not parse.",
            registry=r,
        )
        self.pass_seconds = Histogram(
            "dsx_sentinel_pass_seconds",
            "Duration of one pass (probes and writes).",
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5),
            registry=r,
        )
        self.last_pass = Gauge(
            "dsx_sentinel_last_pass_timestamp_seconds", "When the last pass ended.", registry=r
        )
        self._node_metrics(r)

    def _node_metrics(self, r: CollectorRegistry) -> None:
        """The figures of the node itself, as the agent last read it (:meth:`observe_node`)."""
        self.node_read = Gauge(
            "dsx_sentinel_node_read_timestamp_seconds",
            "When the agent last read its node (the dsx_sentinel_node_* figures are as of then).",
            registry=r,
        )
        self.node_tainted = Gauge(
            "dsx_sentinel_node_tainted",
            f"1 while the node carries the sentinel's taint {vocab.TAINT_UNHEALTHY} "
            f"({vocab.TAINT_UNHEALTHY_EFFECT}).",
            registry=r,
        )
        self.node_cordoned = Gauge("dsx_sentinel_node_cordoned", "1 while the node is cordoned.", registry=r)
        self.node_state = Gauge(
            "dsx_sentinel_node_state",
            f"1 for the node's {vocab.LABEL_STATE} label value ({_NO_STATE}: in service), 0 for the others.",
            ["state"],
            registry=r,
        )
        self.node_state_since = Gauge(
            "dsx_sentinel_node_state_since_timestamp_seconds",
            f"When the node entered its {vocab.LABEL_STATE} ({vocab.ANNOTATION_STATE_SINCE}); 0: no state.",
            registry=r,
        )
        self.node_certification = Gauge(
            "dsx_sentinel_node_certification",
            f"1 for the node's {vocab.LABEL_CERTIFICATION} label value ({_NO_STATE}: never certified).",
            ["certification"],
            registry=r,
        )
        self.node_certified_at = Gauge(
            "dsx_sentinel_node_certified_timestamp_seconds",
            f"When the node's certification verdict was written ({vocab.ANNOTATION_CERTIFIED_AT}); 0: none.",
            registry=r,
        )
        self.node_drift = Gauge(
            "dsx_sentinel_node_drift",
            f"1 while the node is labelled {vocab.LABEL_DRIFT}=true (drift from its recipe found).",
            registry=r,
        )

    def observe_node(self, node: Node, at: float) -> None:
        """Count what ``node`` carries, read at ``at`` (Unix time)."""
        self.node_read.set(at)
        self.node_tainted.set(int(node.has_taint(vocab.TAINT_UNHEALTHY, vocab.TAINT_UNHEALTHY_EFFECT)))
        self.node_cordoned.set(int(node.unschedulable))
        state = node.labels.get(vocab.LABEL_STATE) or _NO_STATE
        for value in sorted({_NO_STATE, *vocab.NodeState, state}):
            self.node_state.labels(value).set(int(value == state))
        self.node_state_since.set(
            timestamp_or_zero(node.annotations.get(vocab.ANNOTATION_STATE_SINCE)) if state != _NO_STATE else 0
        )
        verdict = node.labels.get(vocab.LABEL_CERTIFICATION) or _NO_STATE
        for value in sorted({_NO_STATE, *vocab.Certification, verdict}):
            self.node_certification.labels(value).set(int(value == verdict))
        self.node_certified_at.set(timestamp_or_zero(node.annotations.get(vocab.ANNOTATION_CERTIFIED_AT)))
        self.node_drift.set(int(node.labels.get(vocab.LABEL_DRIFT) == "true"))

    def exposition(self) -> bytes:
        """The metrics in Prometheus' text format."""
        return generate_latest(self.registry)


class ProbeTimeoutError(Exception):
    """A probe call that did not return within its timeout (``stuck``: an earlier call still has not)."""

    def __init__(self, name: str, timeout: float, stuck_for: float | None = None) -> None:
        if stuck_for is None:
            text = f"probe {name} did not return within {timeout:g} s"
        else:
            text = f"probe {name} still has not returned ({stuck_for:.0f} s; timeout {timeout:g} s)"
        super().__init__(text)
        self.name, self.timeout, self.stuck = name, timeout, stuck_for is not None


class GuardedProbe:
    """One probe's calls, each on its own daemon thread, waited for at most a timeout. While a call that
    timed out is still running no other starts: the thread it hangs in is the only one it costs."""

    def __init__(self, name: str, fn: Callable[[], list[HealthEvent]]) -> None:
        self.name, self.fn = name, fn
        self._done: threading.Event | None = None
        self._started = 0.0

    @property
    def busy(self) -> bool:
        """Whether a call has not returned yet."""
        return self._done is not None and not self._done.is_set()

    def call(self, timeout: float) -> list[HealthEvent]:
        """The probe's readings.

        Raises:
            ProbeTimeoutError: no answer within ``timeout``, or the previous call still hangs.
            Exception: what the probe raised.
        """
        if self.busy:
            raise ProbeTimeoutError(self.name, timeout, time.monotonic() - self._started)
        done, box = threading.Event(), _Box()

        def run() -> None:
            try:
                box.result = self.fn()
            except BaseException as exc:  # handed to the pass, which turns it into a reading
                box.error = exc
            finally:
                done.set()

        self._done, self._started = done, time.monotonic()
        threading.Thread(target=run, name=f"sentinel-probe-{self.name}", daemon=True).start()
        if not done.wait(timeout):
            raise ProbeTimeoutError(self.name, timeout)
        if box.error is not None:
            raise box.error
        return box.result


def probe_fault(
    catalogue: FaultCatalogue, node: str, name: str, code: str, message: str, now: dt.datetime
) -> HealthEvent:
    """A ``probe`` reading about the probe ``name`` itself (``probe-failed``: it raised;
    ``probe-timeout``: it did not answer in time), with the catalogue's severity and action."""
    rule = catalogue.rule("probe", code)
    return HealthEvent(
        node=node,
        check="probe",
        component="node",
        entity=name,
        code=code,
        severity=rule.severity,
        action=rule.action,
        healthy=False,
        message=message,
        observed_at=now,
    )


@dataclass
class _Box:
    result: list[HealthEvent] = field(default_factory=list)
    error: BaseException | None = None


def _key(event: HealthEvent) -> tuple[str, str, str]:
    """Where the agent keeps an unhealthy reading: per check and entity, and per code for XIDs."""
    return (event.check, event.entity, event.code if event.check in PER_CODE_CHECKS else "")


class Agent:
    """The sentinel of one node.

    Args:
        node: the node's name.
        port: the cluster port conditions, Events and the taint are written through.
        probes: the probes a pass runs, in order.
        catalogue: severities, actions and modes.
        debounce: passes in a row a reading must hold before a non-fatal change takes effect.
        queue_limit: writes kept while the API server is away; beyond it the oldest non-fatal Event goes.
        metrics: where to count (a fresh registry by default).
        clock: the current time (UTC).
        probe_timeout: seconds a probe may take (``None`` or 0: probes run on the pass's own thread,
            unguarded).
        on_timeout: readings to add for a probe that timed out (name, timeout), beyond the ``probe``
            reading (:meth:`steps.sentinel.probes.NodeProbes.timeout_readings`).
        budget: the fleet-wide taint budget asked before every taint (default: the budget over ``port``
            with its default share and window, counting the GPU nodes by listing them).
        budget_retry_s: seconds between two asks of the budget about a taint it withheld.
        node_read_s: seconds between two reads of the node for its metrics (0: every pass).
    """

    def __init__(
        self,
        node: str,
        port: ClusterPort,
        probes: Sequence[Probe],
        catalogue: FaultCatalogue,
        *,
        debounce: int = 1,
        queue_limit: int = 10000,
        metrics: Metrics | None = None,
        clock: Callable[[], dt.datetime] | None = None,
        probe_timeout: float | None = PROBE_TIMEOUT_S,
        on_timeout: Callable[[str, float], list[HealthEvent]] | None = None,
        budget: TaintBudget | None = None,
        budget_retry_s: float = BUDGET_RETRY_S,
        node_read_s: float = NODE_READ_S,
    ) -> None:
        self.node = node
        self.port = port
        self.probes = list(probes)
        self.catalogue = catalogue
        self.debounce = max(1, debounce)
        self.queue_limit = queue_limit
        self.metrics = metrics or Metrics()
        self.clock = clock or (lambda: dt.datetime.now(dt.UTC))
        self.probe_timeout = probe_timeout or None
        self.on_timeout = on_timeout
        self.budget = budget or TaintBudget(port, clock=self.clock)
        self.budget_retry_s = max(0.0, budget_retry_s)
        self.node_read_s = max(0.0, node_read_s)
        self._node_read_at: float | None = None
        """When (monotonic) the node was last read for its metrics."""
        self._budget_retry_at: dt.datetime | None = None
        """When a withheld taint is asked about again (``None``: at the next pass)."""
        self._guards: dict[str, GuardedProbe] = {}
        self.state: dict[tuple[str, str, str], _State] = {}
        """Per check, entity and (for ``PER_CODE_CHECKS``) code; ``""`` for every other check."""
        self.queue: collections.deque[Write] = collections.deque()
        self._seq = 0
        self._seen_checks: set[str] = set()
        self._conditions: dict[str, tuple[bool, str]] | None = None
        self._node_lost = False
        """A write found no node (deleted, or being re-registered): once it is back, what the agent holds
        in force (its conditions, the taint of a fatal fault) is written again."""
        self.last_pass: float | None = None
        self.node_seen: Callable[[Node], None] | None = None
        """Called with the node each time it is read (the node-problem probe reads its conditions there, the
        repair actuator its requests)."""
        self.api_calls = 0
        """Calls to the API server under way: time spent in them is the server's, not the agent's."""

    # ----------------------------------------------------------------- one pass

    def run_probes(self) -> list[HealthEvent]:
        """Every probe once; a probe that raises, or does not return within the probe timeout, gives a
        ``probe`` reading instead of stopping the pass."""
        events: list[HealthEvent] = []
        now = self.clock()
        for name, probe in self.probes:
            try:
                found = self._call(name, probe)
            except ProbeTimeoutError as exc:
                if not exc.stuck:
                    self.metrics.probe_timeouts.labels(name).inc()
                events.append(probe_fault(self.catalogue, self.node, name, "probe-timeout", str(exc), now))
                if self.on_timeout is not None:
                    events.extend(self.on_timeout(name, exc.timeout))
                continue
            except Exception as exc:  # a probe's defect or a failing device must not stop the agent
                self.metrics.probe_errors.labels(name).inc()
                message = f"probe {name} failed: {type(exc).__name__}: {exc}"
                events.append(probe_fault(self.catalogue, self.node, name, "probe-failed", message, now))
                continue
            events.extend(found)
            events.append(
                HealthEvent(
                    node=self.node,
                    check="probe",
                    component="node",
                    entity=name,
                    healthy=True,
                    message=f"probe {name} ran",
                    observed_at=now,
                )
            )
        return events

    def _call(self, name: str, probe: Callable[[], list[HealthEvent]]) -> list[HealthEvent]:
        """One probe's readings, under the probe timeout when there is one."""
        if self.probe_timeout is None:
            return probe()
        guard = self._guards.get(name)
        if guard is None or (guard.fn is not probe and not guard.busy):
            guard = self._guards[name] = GuardedProbe(name, probe)
        return guard.call(self.probe_timeout)

    def run_once(self) -> PassResult:
        """One pass: probes, state, writes (fast path first), then the queue."""
        start = time.perf_counter()
        events = self.run_probes()
        result = self.apply(events)
        self.read_node()
        self.metrics.pass_seconds.observe(time.perf_counter() - start)
        self.last_pass = time.time()
        self.metrics.last_pass.set(self.last_pass)
        return result

    def read_node(self, force: bool = False) -> None:
        """Read the node for its metrics when ``node_read_s`` has passed since the last read (or
        ``force``); a read that fails leaves the figures of the last one, their time saying how old."""
        now = time.monotonic()
        if not force and self._node_read_at is not None and now - self._node_read_at < self.node_read_s:
            return
        try:
            with self._api():
                node = self.port.get_node(self.node)
        except DsxError:
            return
        self._seen_node(node)

    def _seen_node(self, node: Node) -> None:
        self._node_read_at = time.monotonic()
        self.metrics.observe_node(node, time.time())
        if self.node_seen is not None:
            self.node_seen(node)

    def apply(self, events: Sequence[HealthEvent]) -> PassResult:
        """Fold readings into the state and write what changed."""
        result = PassResult(events=list(events))
        touched: set[str] = set()
        fatal_now = False
        for event in events:
            mode = self.catalogue.mode(event.check)
            if mode == "off":
                continue
            self._seen_checks.add(event.check)
            for changed in self._fold(event):
                result.changed.append(changed)
                touched.add(event.check)
                labels = (event.check, event.component, event.entity)
                if changed.healthy:
                    for severity in ("fatal", "degraded", "info"):
                        self.metrics.unhealthy.labels(*labels, severity).set(0)
                else:
                    self.metrics.unhealthy.labels(*labels, changed.severity).set(1)
                self.metrics.events.labels(event.check, changed.severity, str(changed.healthy).lower()).inc()
                if not changed.healthy and changed.severity == "fatal" and mode == "enforce":
                    fatal_now = True
                self._queue_event(changed, mode)
        if self._node_lost and self._node_back():
            self._conditions = None  # read again from the node that came back: what it lacks is written
            fatal_now = fatal_now or self._fatal_in_force()
        if fatal_now:  # every new fatal fault: remediation may have lifted an earlier taint
            self._fast_taint(result)
        elif touched and not self._fatal_in_force():  # a withheld taint no fault asks for any more
            self.queue = collections.deque(w for w in self.queue if not (w.kind == "taint" and w.withheld))
        self._queue_conditions()
        self._flush(result)
        return result

    def _node_back(self) -> bool:
        """Whether the node a write found missing is there again (its loss then forgotten)."""
        try:
            self.port.get_node(self.node)
        except DsxError:
            return False
        self._node_lost = False
        return True

    def _fatal_in_force(self) -> bool:
        """Whether a fatal fault of a check in ``enforce`` mode is in force (one that asks for the taint)."""
        return any(
            s.event is not None
            and s.event.severity == "fatal"
            and self.catalogue.mode(s.event.check) == "enforce"
            for s in self.state.values()
        )

    def _fold(self, event: HealthEvent) -> list[HealthEvent]:
        """The readings that change the state: the unhealthy one set or escalated, or, for a healthy
        one, a clearing reading per fault of its (check, entity) it clears (one per code for XIDs)."""
        if event.healthy:
            if event.check in PER_CODE_CHECKS:
                keys = [k for k in self.state if k[0] == event.check and k[1] == event.entity]
            else:
                keys = [(event.check, event.entity, "")]
            cleared: list[HealthEvent] = []
            for key in keys:
                state = self.state.setdefault(key, _State())
                current = state.event
                state.streak_bad = 0
                if current is None:
                    continue
                state.streak_good += 1
                if state.streak_good < self.debounce:
                    continue
                state.event, state.streak_good = None, 0
                cleared.append(event.model_copy(update={"severity": current.severity, "code": current.code}))
            return cleared
        state = self.state.setdefault(_key(event), _State())
        current = state.event
        state.streak_good = 0
        if current is not None and severity_rank(event.severity) <= severity_rank(current.severity):
            return []  # set once; a fault no worse than the one in force changes nothing
        state.streak_bad += 1
        if event.severity != "fatal" and state.streak_bad < self.debounce:
            return []
        state.event, state.streak_bad = event, 0
        return [event]

    # ----------------------------------------------------------------- writes

    def _next(self) -> int:
        self._seq += 1
        return self._seq

    def _queue_event(self, event: HealthEvent, mode: str) -> None:
        condition = vocab.CONDITION_SENTINEL[event.check]
        if event.healthy:
            reason, kind = f"{condition}Cleared", "Normal"
            message = f"{event.entity}: {event.check} healthy again (was {event.code or 'unhealthy'})"
        else:
            reason = condition
            kind = "Normal" if event.severity == "info" else "Warning"
            message = f"{event.severity}, action {event.action}: {event.message}"
            if mode == "observe":
                message += " (observe only)"
        self._push(
            Write(
                "event",
                self._next(),
                fatal=event.severity == "fatal" and not event.healthy,
                reason=reason,
                message=message,
                event_type=kind,
            )
        )

    def _desired(self, check: str) -> tuple[bool, str, str]:
        """What the check's condition should say: status, reason, message."""
        bad = [
            s.event
            for (c, _, _), s in sorted(self.state.items())
            if c == check and s.event is not None and s.event.severity != "info"
        ]
        if self.catalogue.mode(check) != "enforce" or not bad:
            return False, "NoProblem", f"no {check} problem"
        # the most severe; among equals the strongest repair (ACTIONS runs from none to contact-support)
        worst = max(bad, key=lambda e: (severity_rank(e.severity), ACTIONS.index(e.action)))
        reason = condition_reason(worst.severity, worst.action)
        message = condition_message(bad)
        return True, reason, message

    def _queue_conditions(self) -> None:
        """Queue a condition write for every check whose wanted condition differs from the node's."""
        if self._conditions is None:
            self._conditions = self._read_conditions()
        for check in CHECKS:
            if check not in self._seen_checks:
                continue  # a check that never ran leaves its condition alone
            status, reason, message = self._desired(check)
            if self._conditions.get(check) == (status, message):
                continue
            if check not in self._conditions and not status:
                self._conditions[check] = (status, message)
                continue  # never set on this node: nothing to clear
            self._conditions[check] = (status, message)
            condition = vocab.CONDITION_SENTINEL[check]
            self._push(
                Write(
                    "condition",
                    self._next(),
                    fatal=status and reason.startswith("Fatal"),
                    condition=condition,
                    status=status,
                    reason=reason,
                    message=message,
                )
            )

    def _read_conditions(self) -> dict[str, tuple[bool, str]]:
        """The sentinel conditions the node carries (after a restart or a reboot, those set before)."""
        try:
            with self._api():
                node = self.port.get_node(self.node)
        except DsxError:
            return {}
        found: dict[str, tuple[bool, str]] = {}
        for check, name in vocab.CONDITION_SENTINEL.items():
            cond = node.condition(name)
            if cond is not None:
                found[check] = (cond.status == "True", cond.message)
        return found

    def _push(self, write: Write) -> None:
        self.queue.append(write)
        while len(self.queue) > self.queue_limit:
            drop = next((w for w in self.queue if not w.fatal and w.kind == "event"), None)
            drop = drop or next((w for w in self.queue if not w.fatal), None)
            if drop is None:
                break
            self.queue.remove(drop)
            self.metrics.dropped.labels(drop.kind).inc()
        self.metrics.queue.set(len(self.queue))

    def _fast_taint(self, result: PassResult) -> None:
        """Taint now, ahead of every queued write (a taint queued before, withheld or not, is this one
        now); when it cannot be made yet, the taint heads the queue."""
        earlier = [w for w in self.queue if w.kind == "taint"]
        for old in earlier:
            self.queue.remove(old)
        write = Write("taint", self._next(), fatal=True, withheld=any(w.withheld for w in earlier))
        self._budget_retry_at = None  # a new fatal fault asks the budget again at once
        outcome = self._try_taint(write, result)
        if outcome == "queued":
            print(f"warning: sentinel: taint node/{self.node} queued: API server away", file=sys.stderr)
            self.queue.appendleft(write)
            self.metrics.api_up.set(0)
        elif outcome == "withheld":
            self.queue.appendleft(write)

    def _try_taint(self, write: Write, result: PassResult) -> Literal["done", "queued", "withheld"]:
        """One try of a taint write: ``done`` (made, not needed, or given up), ``queued`` (the API server
        away: it stays at the head of the queue) or ``withheld`` (the budget: it stays, out of the way)."""
        now = self.clock()
        if write.withheld and self._budget_retry_at is not None and now < self._budget_retry_at:
            return "withheld"
        try:
            self._send(write)
        except _TRANSIENT:
            result.api_up = False
            return "queued"
        except _OptedOut:
            print(
                f"sentinel: node/{self.node} opts out ({vocab.LABEL_MANAGED}=false): no taint",
                file=sys.stderr,
            )
            self.metrics.taint_withheld.labels("opted-out").inc()
            message = (
                f"a fatal fault, and no {vocab.TAINT_UNHEALTHY} taint: the node opts out "
                f"({vocab.LABEL_MANAGED}={vocab.MANAGED_FALSE}); dsx observes it and never acts on it"
            )
            self._push(Write("event", self._next(), reason="DsxTaintOptedOut", message=message))
            return "done"
        except _Withheld as exc:
            self._budget_retry_at = now + dt.timedelta(seconds=self.budget_retry_s)
            if not write.withheld:  # said once per withholding, not at every ask
                write.withheld = True
                print(f"warning: sentinel: taint node/{self.node} withheld: {exc}", file=sys.stderr)
                self.metrics.taint_withheld.labels(exc.reason).inc()
                self._push(
                    Write(
                        "event",
                        self._next(),
                        reason=_WITHHELD_EVENTS[exc.reason],
                        message=f"taint withheld: {exc}",
                        event_type="Warning",
                    )
                )
            return "withheld"
        except ClusterError as exc:  # refused for good (forbidden, invalid): retrying cannot help
            print(f"warning: sentinel: taint node/{self.node} failed: {exc}", file=sys.stderr)
            self.metrics.dropped.labels("taint").inc()
            self._node_lost = self._node_lost or isinstance(exc, NotFoundError)
            return "done"
        result.written += 1
        return "done"

    def _taint(self) -> None:
        """Taint the node where it may be: never a node that opts out, never without the taint budget's
        yes (a budget that cannot be read because the API server is away leaves the taint queued, to be
        asked about again), and nothing to write where the taint is already there (no budget slot).

        Raises:
            _OptedOut: the node is labelled ``dsx.dev/managed=false``.
            _Withheld: the budget holds, or refuses to be read for good.
            ApiUnavailableError, ConflictError: try again later.
            ClusterError: the taint was refused for good.
        """
        node = self.port.get_node(self.node)
        self._seen_node(node)
        if not node.managed:
            raise _OptedOut()
        if node.has_taint(vocab.TAINT_UNHEALTHY, vocab.TAINT_UNHEALTHY_EFFECT):
            return
        try:
            admitted, why = self.budget.admit(self.node)
        except _TRANSIENT:
            raise
        except (ClusterError, InputError) as exc:
            raise _Withheld("budget-unreadable", f"the taint budget could not be read: {exc}") from None
        if not admitted:
            raise _Withheld("budget", why)
        self.port.add_taint(self.node, vocab.TAINT_UNHEALTHY, "", vocab.TAINT_UNHEALTHY_EFFECT)
        self.metrics.node_tainted.set(1)

    @contextlib.contextmanager
    def _api(self) -> Iterator[None]:
        """A call to the API server is under way within the block (see :meth:`healthy`)."""
        self.api_calls += 1
        try:
            yield
        finally:
            self.api_calls -= 1

    def _send(self, write: Write) -> None:
        with self._api():
            self._write(write)

    def _write(self, write: Write) -> None:
        """One write. Raises ApiUnavailableError when the API server is away."""
        if write.kind == "taint":
            self._taint()
        elif write.kind == "condition":
            self.port.set_condition(self.node, write.condition, write.status, write.reason, write.message)
        elif not self.port.record_event(self.node, write.reason, write.message, write.event_type):
            # record_event is best-effort and says only False: find out whether the server is there.
            self.port.get_node(self.node)
            self.metrics.dropped.labels("event").inc()

    def _flush(self, result: PassResult) -> None:
        """Write the queue in order; stop at the first write the API server is not there for. A taint the
        budget withholds stays in the queue, at its head, without holding up the writes behind it."""
        withheld: list[Write] = []
        while self.queue:
            write = self.queue.popleft()
            if write.kind == "taint":
                outcome = self._try_taint(write, result)
                if outcome == "queued":
                    self.queue.appendleft(write)
                    break
                if outcome == "withheld":
                    withheld.append(write)
                continue
            try:
                self._send(write)
            except _TRANSIENT:
                self.queue.appendleft(write)
                result.api_up = False
                break
            except ClusterError as exc:  # refused for good (forbidden, invalid): retrying cannot help
                print(f"warning: sentinel: {write.kind} on node/{self.node} dropped: {exc}", file=sys.stderr)
                self.metrics.dropped.labels(write.kind).inc()
                self._node_lost = self._node_lost or isinstance(exc, NotFoundError)
            result.written += 1
        self.queue.extendleft(reversed(withheld))
        self.metrics.api_up.set(1 if result.api_up else 0)
        result.withheld = sum(1 for w in self.queue if w.withheld)
        result.queued = len(self.queue) - result.withheld
        self.metrics.queue.set(result.queued)

    # ----------------------------------------------------------------- loop

    def run(
        self,
        interval: float,
        stop: threading.Event,
        wait: Callable[[float], None] | None = None,
        after: Callable[[], object] | None = None,
    ) -> None:
        """Pass after pass until ``stop`` is set; between passes ``wait`` (an NVML event wait, which
        returns early with an XID) or a plain sleep."""
        while not stop.is_set():
            started = time.monotonic()
            try:
                self.run_once()
                if after is not None:
                    after()
            except Exception as exc:  # the loop itself must survive anything a pass meets
                print(f"warning: sentinel pass failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            left = max(0.0, interval - (time.monotonic() - started))
            if wait is not None:
                try:
                    wait(left)
                except Exception as exc:
                    print(f"warning: sentinel event wait failed: {exc}", file=sys.stderr)
                    stop.wait(left)
            else:
                stop.wait(left)

    def flush_queue(self) -> PassResult:
        """Write what the queue holds, in order, while the API server answers: what an agent told to stop
        does last, so a taint queued during an outage is not left to the next agent's start."""
        result = PassResult()
        self._flush(result)
        return result

    def healthy(self, interval: float) -> bool:
        """Whether the agent is alive: a pass ended within three intervals and the time its probes may
        take when each hangs up to its timeout (or none was due yet), or the pass is waiting on the API
        server (a slow server is no stuck agent: each call is bounded by the client's timeouts and
        retries, and a restart would only lose the pass)."""
        budget = 3 * interval + 5 + (self.probe_timeout or 0.0) * len(self.probes)
        return self.last_pass is None or time.time() - self.last_pass < budget or self.api_calls > 0

    # ----------------------------------------------------------------- restart

    def snapshot(self) -> dict[str, Any]:
        """What a restarted agent of the same boot needs, as JSON-ready data: the faults in force (with
        the streaks of the debounce) and the writes not delivered yet, in order."""
        states = [
            {
                "check": check,
                "entity": entity,
                "code": code,
                "event": s.event.model_dump(mode="json") if s.event is not None else None,
                "streak_bad": s.streak_bad,
                "streak_good": s.streak_good,
            }
            for (check, entity, code), s in sorted(self.state.items())
            if s.event is not None or s.streak_bad or s.streak_good
        ]
        return {"state": states, "queue": [asdict(w) for w in self.queue]}

    def restore(self, data: dict[str, Any]) -> None:
        """Take over a :meth:`snapshot` of this node's agent from the same boot: its faults stay in
        force, with the severity and action the catalogue gives them now (metrics say them again), and
        its undelivered writes head the queue.

        Raises:
            ValueError: ``data`` is not such a snapshot (pydantic's ValidationError included).
        """
        try:
            states = {
                (str(s["check"]), str(s["entity"]), str(s["code"])): _State(
                    event=HealthEvent.model_validate(s["event"]) if s["event"] is not None else None,
                    streak_bad=int(s["streak_bad"]),
                    streak_good=int(s["streak_good"]),
                )
                for s in data["state"]
            }
            queue = [Write(**w) for w in data["queue"]]
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not an agent snapshot: {type(exc).__name__}: {exc}") from None
        for s in states.values():  # the catalogue in force now (overrides may have changed since)
            if s.event is not None:
                try:
                    rule = self.catalogue.rule(s.event.check, s.event.code, s.event.message)
                except KeyError:
                    continue
                s.event = s.event.model_copy(update={"severity": rule.severity, "action": rule.action})
        self.state = states
        self.queue = collections.deque(queue)
        self._seq = max([self._seq, *(w.seq for w in queue)])
        for s in states.values():
            if s.event is not None:
                e = s.event
                self.metrics.unhealthy.labels(e.check, e.component, e.entity, e.severity).set(1)
        self.metrics.queue.set(len(self.queue))


def serve(agent: Agent, host: str, port: int, interval: float) -> ThreadingHTTPServer:
    """Serve ``/metrics`` (Prometheus) and ``/healthz`` for ``agent`` on a daemon thread."""
    return serve_metrics(host, port, agent.metrics.exposition, lambda: agent.healthy(interval))


def serve_metrics(
    host: str,
    port: int,
    exposition: Callable[[], bytes],
    healthy: Callable[[], bool],
    option: str = "--metrics-port",
) -> ThreadingHTTPServer:
    """Serve ``/metrics`` (``exposition()``, Prometheus' text format) and ``/healthz`` (200 while
    ``healthy()``, else 503) on a daemon thread.

    Raises:
        InputError: ``port`` is no port, or it cannot be listened on (in use, say); named as
            ``option``.
    """

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.startswith("/metrics"):
                body, status, kind = exposition(), 200, CONTENT_TYPE_LATEST
            elif self.path.startswith("/healthz"):
                ok = healthy()
                body, status, kind = (b"ok\n" if ok else b"stalled\n"), (200 if ok else 503), "text/plain"
            else:
                body, status, kind = b"not found\n", 404, "text/plain"
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return

    if not 0 <= port < 65536:  # 0: any free port (tests)
        raise InputError(f"{option} {port}: not a port (1 to 65535)")
    try:
        server = ThreadingHTTPServer((host, port), Handler)
    except OSError as exc:  # in use, or a port below 1024 without the privilege
        raise InputError(f"{option} {port}: cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    threading.Thread(target=server.serve_forever, daemon=True, name="sentinel-http").start()
    return server
