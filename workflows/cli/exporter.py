"""``dsx exporter``: the fleet's metrics (the breaker, the taint budget, the goodput and certification
reports) served for Prometheus, read from dsx's ConfigMaps."""

from __future__ import annotations

import threading

import typer
from prometheus_client import CollectorRegistry, generate_latest

from steps.cluster import connect
from steps.readiness.metrics import certification_metrics
from steps.sentinel.exporter import SENTINEL_SOURCES, FleetExporter, serve


def exporter_cmd(
    cluster: str | None = typer.Option(None, "--cluster", help="Cluster spec (default $DSX_CLUSTER, kube)."),
    port: int = typer.Option(9401, "--port", min=1, max=65535, help="Port of /metrics and /healthz."),
    host: str = typer.Option("0.0.0.0", "--host", help="Address to listen on."),
    refresh: float = typer.Option(
        30.0,
        "--refresh",
        min=0.0,
        help="Seconds a read of the ConfigMaps is served before the next reads them.",
    ),
    once: bool = typer.Option(
        False, "--once", help="Print the metrics once, in Prometheus' text format, and exit."
    ),
) -> None:
    """Serve the fleet's metrics for Prometheus, read from dsx's ConfigMaps.

    The quarantine breaker and the taint budget (dsx_sentinel_*), the goodput report's figures
    (dsx_goodput_*) and the newest certification report's (dsx_certification_*), with
    dsx_exporter_source_up for each source read. The agents export each node's own figures."""

    exporter = FleetExporter(
        connect(cluster), [*SENTINEL_SOURCES, ("certification", certification_metrics)], refresh_s=refresh
    )
    if once:
        registry = CollectorRegistry()
        registry.register(exporter)
        typer.echo(generate_latest(registry).decode(), nl=False)
        return
    serve(exporter, host, port)
    typer.echo(f"dsx exporter: serving http://{host}:{port}/metrics", err=True)
    stop = threading.Event()
    try:
        stop.wait()
    except KeyboardInterrupt:
        stop.set()


def register(app: typer.Typer) -> None:
    """Add the ``exporter`` command."""
    app.command("exporter")(exporter_cmd)
