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
- Writes go through an ordered queue. When the API server is unreachable the queue keeps them and the
  next pass replays them in order; the taint is never dropped. An Event is best-effort: one the API
  refuses while the server answers is dropped, counted in a metric.
- A probe that raises becomes a ``probe`` reading about that probe; the agent never stops for it.
- The agent never removes the taint: remediation does, after recertification.
"""

from __future__ import annotations

import collections
import datetime as dt
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from steps.cluster import vocabulary as vocab
from steps.cluster.errors import ApiUnavailableError, ClusterError, ConflictError
from steps.cluster.port import ClusterPort
from steps.errors import DsxError
from steps.sentinel.catalogue import FaultCatalogue
from steps.sentinel.events import CHECKS, HealthEvent, severity_rank
from steps.sentinel.probes import Probe

__all__ = ["Agent", "Metrics", "PassResult", "Write", "serve"]

WriteKind = Literal["taint", "condition", "event"]

# Errors a later pass can get past: the server away, or the node changed under a write until its retries ran
# out (409). Such a write stays at the head of the queue; a write refused for good (403, 404, 422) is dropped.
_TRANSIENT = (ApiUnavailableError, ConflictError)


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
        self.queue = Gauge("dsx_sentinel_queue_depth", "Writes waiting for the API server.", registry=r)
        self.api_up = Gauge(
            "dsx_sentinel_api_up", "1 when the last write reached the API server.", registry=r
        )
        self.dropped = Counter("dsx_sentinel_dropped_writes", "Writes given up.", ["kind"], registry=r)
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

    def exposition(self) -> bytes:
        """The metrics in Prometheus' text format."""
        return generate_latest(self.registry)


def _camel(text: str) -> str:
    return "".join(
        part[:1].upper() + part[1:] for part in text.replace("/", "-").split("-") if part.isalnum()
    )


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
    ) -> None:
        self.node = node
        self.port = port
        self.probes = list(probes)
        self.catalogue = catalogue
        self.debounce = max(1, debounce)
        self.queue_limit = queue_limit
        self.metrics = metrics or Metrics()
        self.clock = clock or (lambda: dt.datetime.now(dt.UTC))
        self.state: dict[tuple[str, str], _State] = {}
        self.queue: collections.deque[Write] = collections.deque()
        self._seq = 0
        self._seen_checks: set[str] = set()
        self._conditions: dict[str, tuple[bool, str]] | None = None
        self.last_pass: float | None = None

    # ----------------------------------------------------------------- one pass

    def run_probes(self) -> list[HealthEvent]:
        """Every probe once; a probe that raises gives a ``probe`` reading instead of stopping the pass."""
        events: list[HealthEvent] = []
        now = self.clock()
        for name, probe in self.probes:
            try:
                found = probe()
            except Exception as exc:  # a probe's defect or a failing device must not stop the agent
                self.metrics.probe_errors.labels(name).inc()
                rule = self.catalogue.rule("probe", "probe-failed")
                events.append(
                    HealthEvent(
                        node=self.node,
                        check="probe",
                        component="node",
                        entity=name,
                        code="probe-failed",
                        severity=rule.severity,
                        action=rule.action,
                        healthy=False,
                        message=f"probe {name} failed: {type(exc).__name__}: {exc}",
                        observed_at=now,
                    )
                )
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

    def run_once(self) -> PassResult:
        """One pass: probes, state, writes (fast path first), then the queue."""
        start = time.perf_counter()
        events = self.run_probes()
        result = self.apply(events)
        self.metrics.pass_seconds.observe(time.perf_counter() - start)
        self.last_pass = time.time()
        self.metrics.last_pass.set(self.last_pass)
        return result

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
            changed = self._fold(event)
            if changed is None:
                continue
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
        if fatal_now:  # every new fatal fault: remediation may have lifted an earlier taint
            self._fast_taint(result)
        self._queue_conditions()
        self._flush(result)
        return result

    def _fold(self, event: HealthEvent) -> HealthEvent | None:
        """The reading that changes the state of its (check, entity), or ``None``."""
        state = self.state.setdefault((event.check, event.entity), _State())
        current = state.event
        if event.healthy:
            state.streak_bad = 0
            if current is None:
                return None
            state.streak_good += 1
            if state.streak_good < self.debounce:
                return None
            state.event, state.streak_good = None, 0
            return event.model_copy(update={"severity": current.severity, "code": current.code})
        state.streak_good = 0
        if current is not None and severity_rank(event.severity) <= severity_rank(current.severity):
            return None  # set once; a fault no worse than the one in force changes nothing
        state.streak_bad += 1
        if event.severity != "fatal" and state.streak_bad < self.debounce:
            return None
        state.event, state.streak_bad = event, 0
        return event

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
            for (c, _), s in sorted(self.state.items())
            if c == check and s.event is not None and s.event.severity != "info"
        ]
        if self.catalogue.mode(check) != "enforce" or not bad:
            return False, "NoProblem", f"no {check} problem"
        worst = max(bad, key=lambda e: severity_rank(e.severity))
        reason = _camel(f"{worst.severity}-{worst.action}")
        message = "; ".join(f"{e.severity} ({e.action}): {e.message}" for e in bad)
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
        """Taint now, ahead of every queued write; on failure the taint heads the queue."""
        write = Write("taint", self._next(), fatal=True)
        try:
            self._send(write)
        except _TRANSIENT as exc:
            print(f"warning: sentinel: taint node/{self.node} queued: {exc}", file=sys.stderr)
            self.queue.appendleft(write)
            self.metrics.api_up.set(0)
            result.api_up = False
            return
        except ClusterError as exc:
            print(f"warning: sentinel: taint node/{self.node} failed: {exc}", file=sys.stderr)
            self.metrics.dropped.labels("taint").inc()
            return
        result.written += 1

    def _send(self, write: Write) -> None:
        """One write. Raises ApiUnavailableError when the API server is away."""
        if write.kind == "taint":
            self.port.add_taint(self.node, vocab.TAINT_UNHEALTHY, "", vocab.TAINT_UNHEALTHY_EFFECT)
        elif write.kind == "condition":
            self.port.set_condition(self.node, write.condition, write.status, write.reason, write.message)
        elif not self.port.record_event(self.node, write.reason, write.message, write.event_type):
            # record_event is best-effort and says only False: find out whether the server is there.
            self.port.get_node(self.node)
            self.metrics.dropped.labels("event").inc()

    def _flush(self, result: PassResult) -> None:
        """Write the queue in order; stop at the first write the API server is not there for."""
        while self.queue:
            write = self.queue[0]
            try:
                self._send(write)
            except _TRANSIENT:
                result.api_up = False
                break
            except ClusterError as exc:  # refused for good (forbidden, invalid): retrying cannot help
                print(f"warning: sentinel: {write.kind} on node/{self.node} dropped: {exc}", file=sys.stderr)
                self.metrics.dropped.labels(write.kind).inc()
            self.queue.popleft()
            result.written += 1
        self.metrics.api_up.set(1 if result.api_up else 0)
        self.metrics.queue.set(len(self.queue))
        result.queued = len(self.queue)

    # ----------------------------------------------------------------- loop

    def run(
        self,
        interval: float,
        stop: threading.Event,
        wait: Callable[[float], None] | None = None,
        after: Callable[[], None] | None = None,
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

    def healthy(self, interval: float) -> bool:
        """Whether the agent is alive: a pass ended within three intervals (or none was due yet)."""
        return self.last_pass is None or time.time() - self.last_pass < 3 * interval + 5


def serve(agent: Agent, host: str, port: int, interval: float) -> ThreadingHTTPServer:
    """Serve ``/metrics`` (Prometheus) and ``/healthz`` for ``agent`` on a daemon thread."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.startswith("/metrics"):
                body, status, kind = agent.metrics.exposition(), 200, CONTENT_TYPE_LATEST
            elif self.path.startswith("/healthz"):
                ok = agent.healthy(interval)
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

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True, name="sentinel-http").start()
    return server
