"""The fleet's metrics: what dsx keeps in the cluster, for Prometheus to scrape (``dsx exporter``).

The agents export what each node carries (:mod:`steps.sentinel.agent`); what belongs to the whole fleet
lives in dsx's ConfigMaps and is exported here, read on a scrape at most every ``refresh_s`` seconds:

- the quarantine circuit breaker (``dsx-quarantine-breaker``): ``dsx_sentinel_breaker_open``, when it
  tripped, the nodes it admitted in its window;
- the agents' taint budget (``dsx-taint-budget``): ``dsx_sentinel_taint_budget_held``, since when, the
  nodes tainted in its window;
- the week's goodput report (``dsx-goodput-report``): its ``metrics.prom`` as the report wrote it
  (``dsx_goodput_*``) and ``dsx_goodput_report_present``;
- any further source handed in (the certification report's figures, :mod:`steps.readiness.metrics`).

Each source read is its own ``dsx_exporter_source_up{source}``: one that cannot be read (forbidden,
edited into nonsense, the API server away) is 0, with the reason on stderr, and the others still export.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from http.server import ThreadingHTTPServer

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from steps.cluster.changes import timestamp_or_zero
from steps.cluster.port import ClusterPort
from steps.sentinel.agent import serve_metrics
from steps.sentinel.budget import TaintBudget
from steps.sentinel.goodput.keep import REPORT_CONFIGMAP
from steps.sentinel.policy import Breaker

__all__ = [
    "REFRESH_S",
    "SENTINEL_SOURCES",
    "FleetExporter",
    "Source",
    "breaker_metrics",
    "budget_metrics",
    "goodput_metrics",
    "serve",
]

REFRESH_S = 30.0
"""Seconds a read of the sources is served before the next scrape reads them again."""

Source = tuple[str, Callable[[ClusterPort], list[Metric]]]
"""A source of fleet metrics: its name (the ``source`` label) and what reads it."""


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)


def breaker_metrics(port: ClusterPort) -> list[Metric]:
    """The quarantine circuit breaker as stored."""
    status = Breaker(port).status()
    return [
        _gauge(
            "dsx_sentinel_breaker_open",
            "1 while the quarantine circuit breaker is open.",
            status.state == "open",
        ),
        _gauge(
            "dsx_sentinel_breaker_tripped_timestamp_seconds",
            "When the breaker last tripped (0: never).",
            timestamp_or_zero(status.tripped_at),
        ),
        _gauge(
            "dsx_sentinel_breaker_admitted_nodes",
            "Nodes the breaker admitted to quarantine within its window, as stored.",
            len(status.admitted),
        ),
    ]


def budget_metrics(port: ClusterPort) -> list[Metric]:
    """The agents' fleet-wide taint budget as stored."""
    status = TaintBudget(port).status()
    return [
        _gauge(
            "dsx_sentinel_taint_budget_held",
            "1 while the taint budget holds: agents withhold new taints until a person resets it.",
            status.state == "held",
        ),
        _gauge(
            "dsx_sentinel_taint_budget_held_timestamp_seconds",
            "When the taint budget last began to hold (0: never).",
            timestamp_or_zero(status.held_at),
        ),
        _gauge(
            "dsx_sentinel_taint_budget_tainted_nodes",
            "Nodes the agents tainted within the budget's window, as stored.",
            len(status.tainted),
        ),
    ]


def goodput_metrics(port: ClusterPort) -> list[Metric]:
    """The goodput report's own metrics, as ``dsx-goodput`` kept them, and whether there is one."""
    found = port.get_object("v1", "ConfigMap", REPORT_CONFIGMAP, port.namespace)
    text = str(((found or {}).get("data") or {}).get("metrics.prom") or "")
    families: list[Metric] = list(text_string_to_metric_families(text)) if text else []
    present = _gauge(
        "dsx_goodput_report_present",
        f"1 when the ConfigMap {REPORT_CONFIGMAP} holds a goodput report's metrics.",
        bool(families),
    )
    return [present, *families]


SENTINEL_SOURCES: Sequence[Source] = (
    ("breaker", breaker_metrics),
    ("taint-budget", budget_metrics),
    ("goodput", goodput_metrics),
)


class FleetExporter(Collector):
    """A Prometheus collector over ``sources``, read at most every ``refresh_s`` seconds.

    Args:
        port: the cluster.
        sources: what to read (default: the breaker, the taint budget and the goodput report).
        refresh_s: seconds one read is served (0: every scrape reads).
        clock: monotonic seconds (tests pass their own).
    """

    def __init__(
        self,
        port: ClusterPort,
        sources: Sequence[Source] = SENTINEL_SOURCES,
        refresh_s: float = REFRESH_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.port, self.sources, self.refresh_s, self.clock = port, list(sources), max(0.0, refresh_s), clock
        self._lock = threading.Lock()
        self._read_at: float | None = None
        self._families: list[Metric] = []

    def read(self) -> list[Metric]:
        """Every source now; one that fails is reported down, never the end of the read."""
        families: list[Metric] = []
        up = GaugeMetricFamily(
            "dsx_exporter_source_up", "1 when the source was read at the last refresh.", labels=["source"]
        )
        for name, read in self.sources:
            try:
                found = read(self.port)
            except Exception as exc:  # one source must never take the others down with it
                print(f"warning: dsx exporter: source {name}: {type(exc).__name__}: {exc}", file=sys.stderr)
                up.add_metric([name], 0)
                continue
            up.add_metric([name], 1)
            families.extend(found)
        refreshed = _gauge(
            "dsx_exporter_refresh_timestamp_seconds", "When the sources were last read.", time.time()
        )
        return [up, refreshed, *families]

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            now = self.clock()
            if self._read_at is None or now - self._read_at >= self.refresh_s:
                self._families, self._read_at = self.read(), now
            families = list(self._families)
        yield from families


def serve(exporter: FleetExporter, host: str, port: int) -> ThreadingHTTPServer:
    """Serve ``/metrics`` for ``exporter`` and ``/healthz`` on a daemon thread."""
    registry = CollectorRegistry()
    registry.register(exporter)
    return serve_metrics(host, port, lambda: generate_latest(registry), lambda: True, option="--port")
