"""The probes: small functions from what a node's hardware reports (the health seam) to health events.

Each check gives one reading per entity on every pass: the worst fault found for it, or a healthy
reading, which clears that entity's earlier fault. XIDs and SXids (the events module's
``PER_CODE_CHECKS``) give one reading per code found on the entity instead, so every XID is reported,
and one healthy reading when the entity has none. Severity and action come from the fault catalogue.
The same probes run over NVML with sysfs on a real node and over the simulated fleet.

The NIC probe watches only the fabric's ports (:class:`NicScope`): those the agent's ``--fabric-nics``
names, else the RDMA ports and the Ethernet interfaces up when the agent started; and of those, a port that
was never up since the agent started (a management or onboard port nobody cabled) is no fault.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from steps.cluster.health import GpuReport, NicReport, NodeHealthSource, NodeReport
from steps.cluster.node import Node
from steps.errors import InputError
from steps.sentinel.catalogue import FaultCatalogue
from steps.sentinel.events import CHECKS, HealthEvent, severity_rank
from steps.sentinel.history import XidHistory
from steps.sentinel.kernel_log import KernelLog, KernelXid, normalise_pci
from steps.sentinel.nvml import NvmlSource, NvmlUnavailableError
from steps.sentinel.rates import CounterRates
from steps.sentinel.unready import NOT_READY, not_ready_events

__all__ = [
    "NicScope",
    "NodeProbes",
    "Probe",
    "Reading",
    "gpu_events",
    "nic_events",
    "parse_fabric_nics",
    "xid_events",
]

Probe = tuple[str, Callable[[], list[HealthEvent]]]
"""A probe: its name and the function that runs it."""


@dataclass
class Reading:
    """The faults one check found on one entity in one pass; the worst becomes the event."""

    check: str
    entity: str
    faults: list[tuple[str, str]] = field(default_factory=list)
    """``(code, message)`` pairs."""


def _events(
    node: str, readings: Iterable[Reading], catalogue: FaultCatalogue, now: dt.datetime
) -> list[HealthEvent]:
    events: list[HealthEvent] = []
    for reading in readings:
        component = CHECKS[reading.check]
        if not reading.faults:
            events.append(
                HealthEvent(
                    node=node,
                    check=reading.check,
                    component=component,
                    entity=reading.entity,
                    healthy=True,
                    message=f"{reading.entity}: no {reading.check} problem",
                    observed_at=now,
                )
            )
            continue
        ranked = [
            (catalogue.rule(reading.check, code, message), code, message) for code, message in reading.faults
        ]
        rule, code, message = max(ranked, key=lambda r: severity_rank(r[0].severity))
        events.append(
            HealthEvent(
                node=node,
                check=reading.check,
                component=component,
                entity=reading.entity,
                code=code,
                severity=rule.severity,
                action=rule.action,
                healthy=False,
                message=message,
                observed_at=now,
            )
        )
    return events


def _per_code(readings: Iterable[Reading]) -> list[Reading]:
    """Each reading split into one per code it found (the worst wording of a code becomes its event);
    a reading without faults stays the entity's healthy one."""
    split: list[Reading] = []
    for reading in readings:
        if not reading.faults:
            split.append(reading)
            continue
        by_code: dict[str, list[tuple[str, str]]] = {}
        for code, message in reading.faults:
            by_code.setdefault(code, []).append((code, message))
        split += [Reading(reading.check, reading.entity, faults) for faults in by_code.values()]
    return split


def _name(gpu: GpuReport) -> str:
    pci = normalise_pci(gpu.pci_bus_id)
    return f"GPU {gpu.index} ({gpu.uuid}{', PCI ' + pci if pci else ''})"


def _threshold(catalogue: FaultCatalogue, check: str, code: str, default: float) -> float:
    found = catalogue.rule(check, code).threshold
    return default if found is None else found


@dataclass
class _Rates:
    """The counters of one pass judged as rates: the node's history, this pass's time, the catalogue."""

    history: CounterRates
    at: float
    catalogue: FaultCatalogue

    def over(self, check: str, code: str, key: tuple[str, ...], value: int | None) -> str | None:
        """How the counter grew (``12 in the last 42 min, 10 an hour allowed``) when its rate is at or
        above the code's threshold; None otherwise, and for a counter not reported."""
        if value is None:
            return None
        rate = self.history.observe(key, value, self.at)
        limit = _threshold(self.catalogue, check, code, float("inf"))
        if rate is None or rate.per_hour < limit:
            return None
        return f"{rate.words()}, {limit:g} an hour allowed"


def _memory_readings(gpu: GpuReport, name: str, retired_limit: float, rates: _Rates) -> list[Reading]:
    """ECC (counts, and the corrected errors' rate) and the memory's repairs (remapped rows, retired
    pages) of one GPU."""
    ecc = Reading("ecc", gpu.uuid)
    if gpu.ecc_uncorrectable:
        volatile = f"{name}: {gpu.ecc_uncorrectable} uncorrectable ECC errors"
        if gpu.ecc_uncorrectable_sram is not None and gpu.ecc_uncorrectable_dram is not None:
            volatile += f" ({gpu.ecc_uncorrectable_sram} in SRAM, {gpu.ecc_uncorrectable_dram} in DRAM)"
        ecc.faults.append(("volatile-uncorrectable", volatile))
    if gpu.ecc_uncorrectable_aggregate:
        lifetime = f"{name}: {gpu.ecc_uncorrectable_aggregate} uncorrectable ECC errors over its life"
        ecc.faults.append(("aggregate-uncorrectable", lifetime))
    corrected = rates.over("ecc", "correctable-rate", (gpu.uuid, "ecc-corrected"), gpu.ecc_correctable)
    if corrected:
        ecc.faults.append(("correctable-rate", f"{name}: corrected ECC errors {corrected}"))
    remap = Reading("remap", gpu.uuid)
    if gpu.remap_failed:
        remap.faults.append(("remap-failed", f"{name}: a memory row could not be remapped"))
    if gpu.remap_pending:
        remap.faults.append(("remap-pending", f"{name}: a remapped row waits for a GPU reset"))
    if gpu.retired_pages_pending:
        remap.faults.append(("retired-pages-pending", f"{name}: a retired page waits for a GPU reset"))
    if gpu.retired_pages >= retired_limit:
        remap.faults.append(("retired-pages-limit", f"{name}: {gpu.retired_pages} pages retired"))
    return [ecc, remap]


def _thermal_reading(gpu: GpuReport, name: str) -> Reading:
    """Temperature against the GPU's slowdown and shutdown thresholds, and clocks held down."""
    thermal = Reading("thermal", gpu.uuid)
    temp = gpu.temperature_c
    if gpu.shutdown_temperature_c and temp >= gpu.shutdown_temperature_c:
        thermal.faults.append(
            ("temperature-shutdown", f"{name}: {temp:g} C, shutdown at {gpu.shutdown_temperature_c:g} C")
        )
    elif gpu.slowdown_temperature_c and temp >= gpu.slowdown_temperature_c:
        thermal.faults.append(
            ("temperature-slowdown", f"{name}: {temp:g} C, slowdown at {gpu.slowdown_temperature_c:g} C")
        )
    if {"hw-thermal", "sw-thermal"} & set(gpu.throttle_reasons):
        thermal.faults.append(("thermal-throttle", f"{name}: clocks held down for temperature ({temp:g} C)"))
    if "hw-power-brake" in gpu.throttle_reasons:
        thermal.faults.append(("power-brake", f"{name}: clocks held down by the power brake"))
    if "hw-slowdown" in gpu.throttle_reasons:
        thermal.faults.append(("hw-slowdown", f"{name}: clocks held down by the hardware slowdown signal"))
    return thermal


def _link_readings(gpu: GpuReport, name: str, rates: _Rates) -> list[Reading]:
    """PCIe generation and width against their maximum and its replays' rate; NVLink state and the
    rates of each link's CRC errors and of its replay and recovery errors (where the GPU reports them)."""
    readings: list[Reading] = []
    if gpu.pcie_max_generation or gpu.pcie_max_width:
        pcie = Reading("pcie", gpu.uuid)
        if gpu.pcie_generation < gpu.pcie_max_generation or gpu.pcie_width < gpu.pcie_max_width:
            pcie.faults.append(
                (
                    "link-degraded",
                    f"{name}: PCIe gen {gpu.pcie_generation} x{gpu.pcie_width}, "
                    f"should be gen {gpu.pcie_max_generation} x{gpu.pcie_max_width}",
                )
            )
        replays = rates.over("pcie", "replay-rate", (gpu.uuid, "pcie-replays"), gpu.pcie_replays)
        if replays:
            pcie.faults.append(("replay-rate", f"{name}: PCIe replays {replays}"))
        pcie.faults += _aer_faults(gpu, name, rates)
        readings.append(pcie)
    if gpu.nvlinks:
        nvlink = Reading("nvlink", gpu.uuid)
        down = [str(link.link) for link in gpu.nvlinks if not link.active]
        if down:
            nvlink.faults.append(("link-down", f"{name}: NVLink {', '.join(down)} down"))
        if gpu.fabric_state == "completed" and gpu.fabric_status:
            nvlink.faults.append(
                (
                    "fabric-failed",
                    f"{name}: NVLink fabric registration failed (NVML status {gpu.fabric_status})",
                )
            )
        elif gpu.fabric_state in ("not-started", "in-progress"):
            nvlink.faults.append(
                ("fabric-not-ready", f"{name}: NVLink fabric registration {gpu.fabric_state}")
            )
        for link in gpu.nvlinks:
            key = (gpu.uuid, f"nvlink-{link.link}")
            crc = rates.over("nvlink", "crc-rate", (*key, "crc"), link.crc_errors)
            if crc:
                nvlink.faults.append(("crc-rate", f"{name}: NVLink {link.link} CRC errors {crc}"))
            both = link.replay_errors + link.recovery_errors
            errors = rates.over("nvlink", "error-rate", (*key, "replay-recovery"), both)
            if errors:
                nvlink.faults.append(
                    ("error-rate", f"{name}: NVLink {link.link} replay and recovery errors {errors}")
                )
        readings.append(nvlink)
    return readings


def _aer_faults(gpu: GpuReport, name: str, rates: _Rates) -> list[tuple[str, str]]:
    """The GPU's PCIe AER counters: a fatal error this boot, non-fatal and correctable ones by rate."""
    faults: list[tuple[str, str]] = []
    if gpu.aer_fatal:
        faults.append(("aer-fatal", f"{name}: {gpu.aer_fatal} fatal PCIe AER errors this boot"))
    nonfatal = rates.over("pcie", "aer-nonfatal-rate", (gpu.uuid, "aer-nonfatal"), gpu.aer_nonfatal)
    if nonfatal:
        faults.append(("aer-nonfatal-rate", f"{name}: non-fatal PCIe AER errors {nonfatal}"))
    correctable = rates.over(
        "pcie", "aer-correctable-rate", (gpu.uuid, "aer-correctable"), gpu.aer_correctable
    )
    if correctable:
        faults.append(("aer-correctable-rate", f"{name}: correctable PCIe AER errors {correctable}"))
    return faults


def gpu_events(
    report: NodeReport,
    catalogue: FaultCatalogue,
    now: dt.datetime,
    expected_gpus: int | None = None,
    rates: CounterRates | None = None,
) -> list[HealthEvent]:
    """Readings of every GPU check but XIDs: missing GPUs, ECC, remapping, thermal, PCIe, NVLink, reset.

    Error counters are judged by their rate over ``rates``, the node's history of them (a fresh one:
    no rate at a first reading)."""
    readings: list[Reading] = []
    if expected_gpus is not None:
        count = Reading("gpu-missing", "gpus")
        if len(report.gpus) < expected_gpus:
            count.faults.append(
                ("count-below-expected", f"{len(report.gpus)} of {expected_gpus} GPUs visible to NVML")
            )
        readings.append(count)
    retired_limit = _threshold(catalogue, "remap", "retired-pages-limit", 60)
    judged = _Rates(rates or CounterRates(), now.timestamp(), catalogue)
    for gpu in report.gpus:
        name = _name(gpu)
        lost = Reading("gpu-missing", gpu.uuid)
        if not gpu.healthy:
            lost.faults.append(("gpu-lost", f"{name}: lost (fallen off the bus or unusable)"))
        readings += [lost, *_memory_readings(gpu, name, retired_limit, judged), _thermal_reading(gpu, name)]
        readings += _link_readings(gpu, name, judged)
        reset = Reading("reset-required", gpu.uuid)
        if gpu.reset_required:
            reset.faults.append(("reset-required", f"{name}: the driver asks for a GPU reset"))
        readings.append(reset)
    return _events(report.node, readings, catalogue, now)


def xid_events(
    report: NodeReport, kernel: Sequence[KernelXid], catalogue: FaultCatalogue, now: dt.datetime
) -> list[HealthEvent]:
    """XID readings per GPU and code (from the GPU's own report and the kernel log, matched by PCI
    address) and SXid readings per NVSwitch and code; a GPU without an XID since boot gives one healthy
    reading. A kernel XID on an address no GPU reports (a GPU NVML lost) is about ``PCI:ADDRESS``."""
    by_pci = {normalise_pci(g.pci_bus_id): g for g in report.gpus if g.pci_bus_id}
    readings: dict[tuple[str, str], Reading] = {}
    for gpu in report.gpus:
        reading = readings.setdefault(("xid", gpu.uuid), Reading("xid", gpu.uuid))
        for xid in gpu.xids:
            reading.faults.append((str(xid), _xid_message(catalogue, _name(gpu), xid, "")))
    for line in kernel:
        if line.kind == "sxid":
            entity = f"nvswitch PCI:{line.pci}"
            reading = readings.setdefault(("sxid", entity), Reading("sxid", entity))
            reading.faults.append(
                (str(line.code), f"{entity}: SXid {line.code}, {line.message}".rstrip(", "))
            )
            continue
        owner = by_pci.get(line.pci)
        entity = owner.uuid if owner else f"PCI:{line.pci}"
        name = _name(owner) if owner else f"GPU at PCI {line.pci}"
        reading = readings.setdefault(("xid", entity), Reading("xid", entity))
        reading.faults.append((str(line.code), _xid_message(catalogue, name, line.code, line.message)))
    return _events(report.node, _per_code(readings.values()), catalogue, now)


def _xid_message(catalogue: FaultCatalogue, name: str, code: int, detail: str) -> str:
    mnemonic = catalogue.describe("xid", str(code)) or "not in the XID catalogue"
    return f"{name}: XID {code} {mnemonic}" + (f": {detail}" if detail else "")


NODE_PROBLEM = "node-problem"
"""The check that reads node-problem-detector's conditions on the node."""


def node_problem_codes(catalogue: FaultCatalogue) -> frozenset[str]:
    """The node-problem-detector conditions the catalogue lists (the ``node-problem`` codes)."""
    return frozenset(e.code for e in catalogue.entries() if e.check == NODE_PROBLEM)


def node_problem_events(
    node: Node, catalogue: FaultCatalogue, now: dt.datetime, known: frozenset[str] | None = None
) -> list[HealthEvent]:
    """A reading per condition of node-problem-detector's the catalogue lists (``known``, the
    ``node-problem`` codes, by the condition's type) that the node carries: status ``True`` is the fault,
    with NPD's reason and message; ``False`` clears it; ``Unknown``, or a condition the node does not
    carry, says nothing."""
    known = node_problem_codes(catalogue) if known is None else known
    readings: list[Reading] = []
    for condition in node.conditions:
        if condition.type not in known or condition.status not in ("True", "False"):
            continue
        reading = Reading(NODE_PROBLEM, condition.type)
        if condition.status == "True":
            said = f" ({condition.reason})" if condition.reason else ""
            words = f": {condition.message}" if condition.message else ""
            reading.faults.append((condition.type, f"node-problem-detector: {condition.type}{said}{words}"))
        readings.append(reading)
    return _events(node.name, readings, catalogue, now)


_NIC_COUNTERS = (
    ("link-downed-rate", "link_downed", "link went down"),
    ("symbol-error-rate", "symbol_errors", "symbol errors"),
    ("buffer-overrun-rate", "buffer_overruns", "receive buffer overruns"),
)
"""The port counters judged by their rate: code, :class:`NicReport` field, words."""


def nic_events(
    node: str,
    nics: Sequence[NicReport],
    catalogue: FaultCatalogue,
    now: dt.datetime,
    rates: CounterRates | None = None,
) -> list[HealthEvent]:
    """A reading per port given: down, slower than the fastest port of its kind among them, or with an
    error counter climbing (by its rate over ``rates``, as :func:`gpu_events`), a faulty one escalated by
    the fault history's port rules. Which ports to give, and when a port down is a fault at all, is
    :class:`NicScope`'s to say."""
    history = rates or CounterRates()
    judged = _Rates(history, now.timestamp(), catalogue)
    fastest: dict[str, float] = {}
    for nic in nics:
        if nic.up and nic.speed_gbps:
            fastest[nic.kind] = max(fastest.get(nic.kind, 0.0), nic.speed_gbps)
    readings: list[Reading] = []
    for nic in nics:
        reading = Reading("nic", nic.name)
        if not nic.up:
            phys = f", {nic.phys_state}" if nic.phys_state else ""
            reading.faults.append(
                ("port-down", f"{nic.kind} port {nic.name} is down ({nic.state or 'no state'}{phys})")
            )
        elif nic.speed_gbps and nic.speed_gbps < fastest.get(nic.kind, 0.0):
            reading.faults.append(
                (
                    "speed-below-peers",
                    f"{nic.kind} port {nic.name} at {nic.speed_gbps:g} Gb/s, "
                    f"its peers at {fastest[nic.kind]:g} Gb/s",
                )
            )
        for code, field_name, words in _NIC_COUNTERS:
            grew = judged.over("nic", code, (nic.name, field_name), getattr(nic, field_name))
            if grew:
                reading.faults.append((code, f"{nic.kind} port {nic.name}: {words} {grew}"))
        readings.append(reading)
    events = _events(node, readings, catalogue, now)
    at = now.timestamp()
    for rule in catalogue.history.nic:
        events = [
            rule.escalate(e, history.growth((e.entity, rule.counter), rule.within_minutes * 60, at))
            for e in events
        ]
    return events


_PATTERN = re.compile(r"[A-Za-z0-9_.:/*?\[\]!-]+")


def parse_fabric_nics(text: str | Sequence[str], where: str = "--fabric-nics") -> tuple[str, ...]:
    """The fabric NICs' names or globs, from ``mlx5_*,ib*`` (or a list of them), in the order given.

    Raises:
        InputError: naming ``where`` and the item that is empty or not a device name or glob.
    """
    items = text.split(",") if isinstance(text, str) else list(text)
    patterns: list[str] = []
    for item in (i.strip() for i in items):
        if not item or not _PATTERN.fullmatch(item):
            raise InputError(
                f"{where} {','.join(items)!r}: {item!r} is not a NIC name or glob "
                "(e.g. mlx5_*, efa*, ib0, mlx5_3/1), comma-separated"
            )
        if item not in patterns:
            patterns.append(item)
    return tuple(patterns)


class NicScope:
    """Which ports the NIC probe watches, and which of them may be faulty at all.

    A node has ports that carry no job's traffic: the management uplink, the second onboard port nobody
    cabled, a spare card's ports. Reporting them down would taint, quarantine and reboot a healthy node,
    and escalate it when the port is still down after the repair. So the probe watches:

    - with ``patterns`` (the agent's ``--fabric-nics``, the chart's ``sentinel.fabricNics``): the ports
      whose device (``mlx5_3`` of ``mlx5_3/1``) or full name matches one of them, of any kind; no other;
    - without: every RDMA port (``/sys/class/infiniband``: InfiniBand, RoCE and EFA devices alike) and the
      Ethernet interfaces that were up at the agent's first reading.

    And of those, only a port that was up at some reading since the agent started can be faulty: a port
    that was never up (never cabled, not in use) gives no reading at all, while one that was up and goes
    down is ``port-down``. A port that gives no reading keeps what the agent holds about it, so a fault in
    force from before a restart stays until the port is up again. Speeds are compared among watched ports.
    """

    def __init__(self, patterns: Sequence[str] = ()) -> None:
        self.patterns = tuple(patterns)
        self.started = False
        self.up_at_start: set[str] = set()
        """Ethernet ports up at the first reading (watched without patterns)."""
        self.seen_up: set[str] = set()
        """Watched ports seen up at some reading: those that may be faulty."""

    def listed(self, nic: NicReport) -> bool:
        """Whether ``nic`` is one of the fabric's ports (``patterns`` given) or, without patterns, of the
        kinds watched: an RDMA port, or an Ethernet interface up at the first reading."""
        if self.patterns:
            names = (nic.name.partition("/")[0], nic.name)
            return any(fnmatch.fnmatchcase(n, p) for p in self.patterns for n in names)
        return nic.kind == "infiniband" or nic.name in self.up_at_start

    def watched(self, nics: Sequence[NicReport]) -> list[NicReport]:
        """The ports of one reading that the probe reports on, in order (see the class docstring)."""
        if not self.started:
            self.started = True
            self.up_at_start = {n.name for n in nics if n.up and n.kind != "infiniband"}
        chosen: list[NicReport] = []
        for nic in nics:
            if not self.listed(nic):
                continue
            if nic.up:
                self.seen_up.add(nic.name)
            if nic.name in self.seen_up:
                chosen.append(nic)
        return chosen


class NodeProbes:
    """The probes of one node over a health source, a kernel log and the node's NICs.

    Args:
        node: the node's name.
        catalogue: what faults mean.
        source: the health seam's adapter (NVML, the simulated fleet).
        clock: the current time (UTC).
        expected_gpus: how many GPUs the node should show, or a function that says it at each pass
            (the node's ``nvidia.com/gpu`` capacity as the API server reports it, read by
            ``steps.sentinel.node.GpuCapacity``); ``None`` (or a function answering ``None``): not
            checked.
        kernel_log: the kernel log to read XIDs from (``None``: none).
        nics: reads the node's NICs (sysfs); ``None`` takes them from the source's report.
        fabric_nics: the fabric's ports, names or globs (:class:`NicScope`); empty: the RDMA ports and
            the Ethernet interfaces up at the first reading.
    """

    def __init__(
        self,
        node: str,
        catalogue: FaultCatalogue,
        source: NodeHealthSource,
        clock: Callable[[], dt.datetime],
        expected_gpus: int | Callable[[], int | None] | None = None,
        kernel_log: KernelLog | None = None,
        nics: Callable[[], list[NicReport]] | None = None,
        fabric_nics: Sequence[str] = (),
    ) -> None:
        self.node = node
        self.catalogue = catalogue
        self.source = source
        self.clock = clock
        self.expected_gpus = expected_gpus
        self.kernel_log = kernel_log
        self.nics = nics
        self.nic_scope = NicScope(fabric_nics)
        self.report: NodeReport | None = None
        self.xid_history = XidHistory(catalogue.history.xid)
        """The kernel log's XID lines per GPU over time, for the catalogue's history rules."""
        self.rates = CounterRates(
            keep_s=max((r.within_minutes * 60 for r in catalogue.history.nic), default=0.0)
        )
        """The GPUs' and ports' error counters over the last hour, judged as rates."""
        self.node_read: Node | None = None
        """The node as the agent last read it (:meth:`see_node`): its node-problem-detector conditions and its
        Ready condition."""
        self._node_problems_known = node_problem_codes(catalogue)

    def see_node(self, node: Node) -> None:
        """Keep the node as the agent read it, for the ``node-problem`` probe's next pass."""
        self.node_read = node

    def probes(self) -> list[Probe]:
        """The probes in the order a pass runs them: kernel log, GPUs (with XIDs), NICs, and the node's
        node-problem-detector conditions and Ready condition as the agent last read them."""
        found: list[Probe] = []
        if self.kernel_log is not None:
            found.append(("kernel-log", self._kernel))
        found.append(("gpu", self._gpus))
        found.append(("nic", self._nics))
        found.append((NODE_PROBLEM, self._node_problems))
        found.append((NOT_READY, self._not_ready))
        return found

    def timeout_readings(self, name: str, seconds: float) -> list[HealthEvent]:
        """What a probe that did not return within ``seconds`` means beyond the agent's own ``probe``
        reading: the GPU probe over NVML gives a degraded ``nvml`` reading (``nvml-timeout``), since NVML
        not answering is itself the fault (a wedged driver or GPU)."""
        if name != "gpu" or not isinstance(self.source, NvmlSource):
            return []
        rule = self.catalogue.rule("nvml", "nvml-timeout")
        return [
            HealthEvent(
                node=self.node,
                check="nvml",
                component="node",
                entity="nvml",
                code="nvml-timeout",
                severity=rule.severity,
                action=rule.action,
                healthy=False,
                message=f"NVML did not answer within {seconds:g} s",
                observed_at=self.clock(),
            )
        ]

    def forget_gpus(self, uuids: Sequence[str]) -> None:
        """Forget what the GPUs ``uuids`` reported before they were reset: their XIDs in the kernel log
        (the source forgets those it kept itself). The next pass reads them afresh."""
        pci_of = {g.uuid: g.pci_bus_id for g in self.report.gpus if g.pci_bus_id} if self.report else {}
        if self.kernel_log is not None:
            self.kernel_log.forget(pci_of[u] for u in uuids if u in pci_of)

    def _expected(self) -> int | None:
        expected = self.expected_gpus
        return expected() if callable(expected) else expected

    def _kernel(self) -> list[HealthEvent]:
        assert self.kernel_log is not None
        self.kernel_log.read()
        return []  # its XIDs are read with the GPUs, which map them to GPU UUIDs

    def _gpus(self) -> list[HealthEvent]:
        now = self.clock()
        nvml_reading = HealthEvent(
            node=self.node,
            check="nvml",
            component="node",
            entity="nvml",
            healthy=True,
            message="NVML answers",
            observed_at=now,
        )
        try:
            self.report = self.source.node_report(self.node)
        except NvmlUnavailableError as exc:
            self.report = None
            rule = self.catalogue.rule("nvml", "nvml-unavailable")
            kernel = self.kernel_log.xids if self.kernel_log else []
            empty = NodeReport(node=self.node, link_gbps=0.0, nominal_link_gbps=0.0)
            return [
                nvml_reading.model_copy(
                    update={
                        "healthy": False,
                        "code": "nvml-unavailable",
                        "severity": rule.severity,
                        "action": rule.action,
                        "message": str(exc),
                    }
                ),
                *xid_events(empty, kernel, self.catalogue, now),
            ]
        kernel = self.kernel_log.xids if self.kernel_log else []
        return [
            nvml_reading,
            *gpu_events(self.report, self.catalogue, now, self._expected(), self.rates),
            *self._with_history(self.report, xid_events(self.report, kernel, self.catalogue, now), now),
        ]

    def _with_history(
        self, report: NodeReport, events: list[HealthEvent], now: dt.datetime
    ) -> list[HealthEvent]:
        """The XID readings as the history rules make them (an XID harmless once, seen on one GPU over
        and over), from the kernel log's count of lines per GPU and code."""
        if self.kernel_log is None or not self.xid_history.rules:
            return events
        at = now.timestamp()
        self.xid_history.observe(self.kernel_log.seen, at)
        pci_of = {g.uuid: normalise_pci(g.pci_bus_id) for g in report.gpus if g.pci_bus_id}

        def pci(entity: str) -> str | None:
            return entity[4:] if entity.startswith("PCI:") else pci_of.get(entity)

        return [self.xid_history.escalate(e, pci(e.entity), at) for e in events]

    def _node_problems(self) -> list[HealthEvent]:
        if self.node_read is None:
            return []  # the node not read yet: nothing to say of its conditions
        return node_problem_events(self.node_read, self.catalogue, self.clock(), self._node_problems_known)

    def _not_ready(self) -> list[HealthEvent]:
        if self.node_read is None:
            return []
        return not_ready_events(self.node_read, self.catalogue, self.clock())

    def _nics(self) -> list[HealthEvent]:
        if self.nics is not None:
            nics = self.nics()
        elif self.report is not None:
            nics = list(self.report.nics)
        else:
            return []
        return nic_events(self.node, self.nic_scope.watched(nics), self.catalogue, self.clock(), self.rates)
