"""Assemble the sentinel of one node: which health source, kernel log and NICs its probes read.

On a real node the GPUs are read through NVML (``pynvml``), the NICs through sysfs and XIDs from
``/dev/kmsg``; against a simulated fleet the fleet itself is the health source (GPUs and NICs), so the
agent runs against a simulated node exactly as against a real one.

The GPUs a node should have come from a source that does not move with the fault: a number given
(``--expected-gpus``, the chart's ``sentinel.expectedGpus``), else the node's ``nvidia.com/gpu`` capacity
(or allocatable, the larger) as the API server reports it (:class:`GpuCapacity`), never from what NVML
lists at start nor GPU Feature Discovery's ``nvidia.com/gpu.count`` label, which follows what NVML lists
(a GPU lost before a restart would be expected no more). The capacity is what the device plugin
registered, so after a reboot with a dead GPU it may count one less: only a number given catches that.
With a state directory the agent keeps its state there across restarts in one boot
(:mod:`steps.sentinel.state`).

The NICs watched are the fabric's (``--fabric-nics``, the chart's ``sentinel.fabricNics``; else the RDMA
ports and the Ethernet interfaces up at start, :class:`steps.sentinel.probes.NicScope`). The taint budget
(``--taint-budget``, ``--taint-budget-window``, the chart's ``sentinel.taintBudget``) counts the GPU nodes
as the nodes the sentinel's DaemonSet runs on where it is named (``--fleet-daemonset``, as the chart does),
else the nodes with GPUs (:mod:`steps.sentinel.budget`).
"""

from __future__ import annotations

import datetime as dt
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from steps.cluster.errors import ClusterError
from steps.cluster.health import NicReport, NodeHealthSource, health_source
from steps.cluster.node import Node
from steps.cluster.port import GPU_RESOURCE, ClusterPort
from steps.errors import InputError
from steps.sentinel.actuator import RepairActuator
from steps.sentinel.agent import NODE_READ_S, PROBE_TIMEOUT_S, Agent, Metrics, PassResult
from steps.sentinel.budget import GpuNodes, TaintBudget, TaintBudgetSettings
from steps.sentinel.catalogue import FaultCatalogue
from steps.sentinel.kernel_log import KMSG, Boot, KernelLog
from steps.sentinel.nvml import NvmlSource, NvmlUnavailableError
from steps.sentinel.probes import NodeProbes
from steps.sentinel.state import StateFile
from steps.sentinel.sysfs import read_nics

__all__ = ["GpuCapacity", "Sentinel", "SourceKind", "build_probes", "build_sentinel"]

SourceKind = Literal["auto", "nvml", "cluster"]


class GpuCapacity:
    """The GPUs a node should have, as the API server reports them: the larger of the node's capacity
    and allocatable ``nvidia.com/gpu`` (what the device plugin registered). Read once, the first time
    the API server answers (:meth:`refresh`, outside the probes, so a slow API server never looks like
    a hung probe); calling it gives that count, ``None`` before it and on a node that reports none.
    """

    def __init__(self, port: ClusterPort, node: str) -> None:
        self.port, self.node = port, node
        self.read = False
        self.count: int | None = None

    def refresh(self) -> None:
        """Read the node's count, unless it was read already; a failing read is tried again later."""
        if self.read:
            return
        try:
            found = self.port.get_node(self.node)
        except ClusterError:
            return
        counts = [found.capacity.get(GPU_RESOURCE, "0"), found.allocatable.get(GPU_RESOURCE, "0")]
        self.count = max((int(c) for c in counts if str(c).isdigit()), default=0) or None
        self.read = True

    def __call__(self) -> int | None:
        return self.count


@dataclass
class Sentinel:
    """An agent with its probes and, on a real node, its NVML source (for the event wait); with a state
    file, what it keeps across restarts in one boot."""

    agent: Agent
    probes: NodeProbes
    nvml: NvmlSource | None
    state: StateFile | None = None
    actuator: RepairActuator | None = None
    _waiting: threading.Event | None = field(default=None, init=False, repr=False)
    """The NVML wait in flight (set once it returned)."""
    _node: Node | None = field(default=None, init=False, repr=False)
    """The node as the agent last read it, not yet shown to the actuator."""

    def __post_init__(self) -> None:
        if self.actuator is not None and not self.actuator.enabled:
            self.actuator = None
        self.agent.node_seen = self._seen

    def _seen(self, node: Node) -> None:
        """The node as the agent read it: for the probes (its node-problem-detector conditions) and the
        actuator."""
        self.probes.see_node(node)
        self._node = node

    def snapshot(self) -> dict[str, object]:
        """The state file's parts: the agent's, the kernel log's, the XID history's, NVML's XIDs and the
        error counters' history."""
        parts: dict[str, object] = {"agent": self.agent.snapshot()}
        if self.probes.kernel_log is not None:
            parts["kernel_log"] = self.probes.kernel_log.snapshot()
            parts["xid_history"] = self.probes.xid_history.snapshot()
        if self.nvml is not None:
            parts["nvml_xids"] = {str(i): list(x) for i, x in sorted(self.nvml.xids.items())}
        parts["counters"] = self.probes.rates.snapshot()
        return parts

    def restore(self) -> bool:
        """Take over what the state file kept in this boot; whether there was anything. A part that does
        not parse is said on stderr and left out (that part starts afresh)."""
        if self.state is None:
            return False
        data = self.state.load()
        if data is None:
            return False
        try:
            self.agent.restore(data["agent"])
        except (KeyError, ValueError) as exc:
            print(f"warning: sentinel: state {self.state.path}: agent part ignored: {exc}", file=sys.stderr)
        log = self.probes.kernel_log
        if log is not None and isinstance(data.get("kernel_log"), dict):
            log.restore(data["kernel_log"])
            if isinstance(data.get("xid_history"), dict):
                try:
                    self.probes.xid_history.restore(data["xid_history"])
                except ValueError as exc:
                    print(
                        f"warning: sentinel: state {self.state.path}: XID history ignored: {exc}",
                        file=sys.stderr,
                    )
        if "counters" in data:
            try:
                self.probes.rates.restore(data["counters"])
            except ValueError as exc:
                print(f"warning: sentinel: state {self.state.path}: counters ignored: {exc}", file=sys.stderr)
        xids = data.get("nvml_xids")
        if self.nvml is not None and isinstance(xids, dict):
            try:
                self.nvml.xids = {int(i): [int(x) for x in codes] for i, codes in xids.items()}
            except (TypeError, ValueError):
                self.nvml.xids = {}
        return True

    def after_pass(self) -> None:
        """Figures only the probes know (kernel-log lines that did not parse), the GPU count not read
        yet, and the state file."""
        log = self.probes.kernel_log
        if log is not None:
            self.agent.metrics.kernel_bad_lines.set(log.bad_lines)
        expected = self.probes.expected_gpus
        if isinstance(expected, GpuCapacity):
            expected.refresh()
        if self.state is not None:
            self.state.save(self.snapshot())

    def run_once(self) -> PassResult:
        """One pass of the agent, then :meth:`finish_pass` (the second pass's result when it made one)."""
        result = self.agent.run_once()
        return self.finish_pass() or result

    def finish_pass(self) -> PassResult | None:
        """After a pass of the agent (the loop's ``after``): with an actuator, the repair the node read
        in the pass asks for, and when GPUs were reset a second pass at once, so that their reading
        after the reset is written (that pass's result is returned); then :meth:`after_pass`."""
        node, self._node = self._node, None
        again = None
        if self.actuator is not None and node is not None and self.actuator.act(node):
            again = self.agent.run_once()
        self.after_pass()
        return again

    def wait(self, seconds: float, stop: threading.Event | None = None) -> None:
        """Wait between passes: on NVML's XID events where there is an event set, else sleep. The NVML
        wait runs on its own thread under the probe timeout, like a probe: a wedged driver makes it
        sleep instead, and no second wait starts while one hangs."""
        nvml = self.nvml
        timeout = self.agent.probe_timeout
        if nvml is None or (self._waiting is not None and not self._waiting.is_set()):
            (stop or threading.Event()).wait(seconds)  # ends early when the agent is told to stop
            return
        if timeout is None:
            self._wait_nvml(nvml, seconds)
            return
        done = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            try:
                self._wait_nvml(nvml, seconds)
            except BaseException as exc:  # handed to the loop, which says it
                failure.append(exc)
            finally:
                done.set()

        self._waiting = done
        threading.Thread(target=run, name="sentinel-nvml-wait", daemon=True).start()
        if not done.wait(seconds + timeout):
            return  # NVML hangs: the next pass says so; the next wait sleeps
        if failure:
            raise failure[0]

    @staticmethod
    def _wait_nvml(nvml: NvmlSource, seconds: float) -> None:
        try:
            nvml.start()
        except NvmlUnavailableError:
            time.sleep(seconds)  # said by the next pass, as the nvml condition
            return
        nvml.wait_xids(int(seconds * 1000))


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
    boot: Boot | None = None,
    fabric_nics: Sequence[str] = (),
) -> tuple[NodeProbes, NvmlSource | None]:
    """The node's probes over the chosen health source.

    ``auto`` takes the cluster's own health source where it has one (a simulated fleet), else NVML.
    The kernel log is read from ``kernel_log`` (``/dev/kmsg`` by default on NVML, none on a simulated
    node), this boot's lines only (``boot``, default read from ``/proc``); NICs from sysfs under
    ``sysfs`` (default ``/sys``) on NVML, from the fleet otherwise. The GPUs the node should have:
    ``expected_gpus``, else with a ``port`` the node's capacity (:class:`GpuCapacity`), else unchecked.
    The NICs watched: the ports ``fabric_nics`` names (device names or globs), else the RDMA ports and the
    Ethernet interfaces up at the first reading; never one that was not up since
    (:class:`~steps.sentinel.probes.NicScope`).

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
        root = sysfs or "/sys"
        nvml = NvmlSource(nvml_module if nvml_module is not None else _nvml_module(), node, sysfs=root)
        chosen = nvml
        nics = lambda: read_nics(root)  # noqa: E731 - a reader bound to its root
        if log_path is None and os.access(KMSG, os.R_OK):
            log_path = KMSG
    if log_path is not None and log_path != KMSG and not Path(log_path).is_file():
        raise InputError(f"--kernel-log {log_path}: no such file")
    log = KernelLog(log_path, boot) if log_path else None
    expected: int | GpuCapacity | None = expected_gpus
    if expected is None and port is not None:
        expected = GpuCapacity(port, node)
        expected.refresh()
    return NodeProbes(node, catalogue, chosen, now, expected, log, nics, fabric_nics), nvml


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
    probe_timeout: float | None = PROBE_TIMEOUT_S,
    state_dir: str | Path | None = None,
    boot: Boot | None = None,
    fabric_nics: Sequence[str] = (),
    taint_budget: TaintBudgetSettings | None = None,
    fleet_daemonset: tuple[str, str] | None = None,
    node_read_s: float = NODE_READ_S,
    reset_gpus: bool = False,
    kured_sentinel: str | Path | None = None,
    reboot_command: Sequence[str] | None = None,
) -> Sentinel:
    """The agent of ``node`` (its probes as :func:`build_probes` makes them); with ``state_dir``, its
    state kept there across restarts in this boot (``boot``, default read from ``/proc``) and taken
    over at once from an agent of this boot that ran before. Its taints ask the fleet-wide taint budget
    (``taint_budget``: share and window, default 10% of the GPU nodes within 1 h), whose GPU nodes are
    those the sentinel's DaemonSet ``fleet_daemonset`` (namespace, name) runs on, else the nodes with
    GPUs (:mod:`steps.sentinel.budget`). Its node is read for the node metrics every ``node_read_s``, and
    then for the repair it carries out when asked (:mod:`steps.sentinel.actuator`): GPU resets with
    ``reset_gpus``, reboots through kured with ``kured_sentinel``, the file kured watches, or with the
    agent's own ``reboot_command``."""
    boot = boot or Boot.read()
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
        boot=boot,
        fabric_nics=fabric_nics,
    )
    now = clock or (lambda: dt.datetime.now(dt.UTC))
    budget = TaintBudget(port, taint_budget, GpuNodes(port, fleet_daemonset), now)
    agent = Agent(
        node,
        port,
        probes.probes(),
        catalogue,
        debounce=debounce,
        metrics=metrics,
        clock=clock,
        probe_timeout=probe_timeout,
        on_timeout=probes.timeout_readings,
        budget=budget,
        node_read_s=node_read_s,
    )
    state = None
    if state_dir is not None:
        if boot is None:
            print("warning: sentinel: no boot id in /proc: state not kept across restarts", file=sys.stderr)
        else:
            state = StateFile(state_dir, node, boot.id)
    actuator = RepairActuator(
        node,
        port,
        probes,
        reset_gpus=reset_gpus,
        kured_sentinel=kured_sentinel,
        reboot_command=reboot_command,
        clock=clock,
    )
    sentinel = Sentinel(agent, probes, nvml, state, actuator)
    sentinel.restore()
    return sentinel
