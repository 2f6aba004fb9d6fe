"""Assemble the sentinel of one node: which health source, kernel log and NICs its probes read.

On a real node the GPUs are read through NVML (``pynvml``), the NICs through sysfs and XIDs from
``/dev/kmsg``; against a simulated fleet the fleet itself is the health source (GPUs and NICs), so the
agent runs against a simulated node exactly as against a real one.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from steps.cluster.errors import ClusterError
from steps.cluster.health import NicReport, NodeHealthSource, health_source
from steps.cluster.port import GPU_RESOURCE, ClusterPort
from steps.errors import InputError
from steps.sentinel.agent import Agent, Metrics, PassResult
from steps.sentinel.catalogue import FaultCatalogue
from steps.sentinel.kernel_log import KMSG, KernelLog
from steps.sentinel.nvml import NvmlSource, NvmlUnavailableError
from steps.sentinel.probes import NodeProbes
from steps.sentinel.sysfs import read_nics

__all__ = ["Sentinel", "SourceKind", "build_probes", "build_sentinel"]

SourceKind = Literal["auto", "nvml", "cluster"]


@dataclass
class Sentinel:
    """An agent with its probes and, on a real node, its NVML source (for the event wait)."""

    agent: Agent
    probes: NodeProbes
    nvml: NvmlSource | None

    def after_pass(self) -> None:
        """Figures only the probes know: kernel-log lines that did not parse."""
        log = self.probes.kernel_log
        if log is not None:
            self.agent.metrics.kernel_bad_lines.set(log.bad_lines)

    def run_once(self) -> PassResult:
        """One pass of the agent."""
        result = self.agent.run_once()
        self.after_pass()
        return result

    def wait(self, seconds: float) -> None:
        """Wait between passes: on NVML's XID events where there is an event set, else sleep."""
        import time

        if self.nvml is not None:
            try:
                self.nvml.start()
            except NvmlUnavailableError:
                time.sleep(seconds)  # said by the next pass, as the nvml condition
                return
            self.nvml.wait_xids(int(seconds * 1000))
        else:
            time.sleep(seconds)


def _nvml_module() -> Any:
    import pynvml

    return pynvml


def build_probes(
    node: str,
    catalogue: FaultCatalogue,
    *,
    port: ClusterPort | None = None,
    source: SourceKind = "auto",
    nvml_module: Any = None,
    kernel_log: str | None = None,
    sysfs: str | None = None,
    expected_gpus: int | None = None,
    clock: Callable[[], dt.datetime] | None = None,
) -> tuple[NodeProbes, NvmlSource | None]:
    """The node's probes over the chosen health source.

    ``auto`` takes the cluster's own health source where it has one (a simulated fleet), else NVML.
    The kernel log is read from ``kernel_log`` (``/dev/kmsg`` by default on NVML, none on a simulated
    node); NICs from sysfs under ``sysfs`` (default ``/sys``) on NVML, from the fleet otherwise.

    Raises:
        InputError: ``cluster`` was asked for but the cluster reads no hardware; a kernel log file that
            does not exist.
    """
    now = clock or (lambda: dt.datetime.now(dt.UTC))
    fleet = health_source(port) if port is not None else None
    if source == "cluster" and fleet is None:
        raise InputError("--source cluster: this cluster reads no hardware (only a simulated fleet does)")
    chosen: NodeHealthSource
    nvml: NvmlSource | None = None
    nics: Callable[[], list[NicReport]] | None = None
    log_path = kernel_log
    if fleet is not None and source != "nvml":
        chosen = fleet
    else:
        nvml = NvmlSource(nvml_module if nvml_module is not None else _nvml_module(), node)
        chosen = nvml
        root = sysfs or "/sys"
        nics = lambda: read_nics(root)  # noqa: E731 - a reader bound to its root
        if log_path is None and os.access(KMSG, os.R_OK):
            log_path = KMSG
    if log_path is not None and log_path != KMSG and not Path(log_path).is_file():
        raise InputError(f"--kernel-log {log_path}: no such file")
    log = KernelLog(log_path) if log_path else None
    return NodeProbes(node, catalogue, chosen, now, expected_gpus, log, nics), nvml


def build_sentinel(
    port: ClusterPort,
    node: str,
    catalogue: FaultCatalogue,
    *,
    source: SourceKind = "auto",
    nvml_module: Any = None,
    kernel_log: str | None = None,
    sysfs: str | None = None,
    expected_gpus: int | None = None,
    debounce: int = 1,
    metrics: Metrics | None = None,
    clock: Callable[[], dt.datetime] | None = None,
) -> Sentinel:
    """The agent of ``node``; the expected GPU count defaults to the node's ``nvidia.com/gpu.count``."""
    if expected_gpus is None:
        try:
            found = port.get_node(node)
        except ClusterError:
            found = None
        if found is not None:
            count = found.labels.get("nvidia.com/gpu.count") or found.capacity.get(GPU_RESOURCE, "0")
            expected_gpus = int(count) if str(count).isdigit() and int(count) else None
    probes, nvml = build_probes(
        node,
        catalogue,
        port=port,
        source=source,
        nvml_module=nvml_module,
        kernel_log=kernel_log,
        sysfs=sysfs,
        expected_gpus=expected_gpus,
        clock=clock,
    )
    agent = Agent(node, port, probes.probes(), catalogue, debounce=debounce, metrics=metrics, clock=clock)
    return Sentinel(agent, probes, nvml)
