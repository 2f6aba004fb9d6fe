"""The probes: small functions from what a node's hardware reports (the health seam) to health events.

Each check gives one reading per entity on every pass: the worst fault found for it, or a healthy
reading, which clears that entity's earlier fault. Severity and action come from the fault catalogue.
The same probes run over NVML with sysfs on a real node and over the simulated fleet.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from steps.cluster.health import GpuReport, NicReport, NodeHealthSource, NodeReport
from steps.sentinel.catalogue import FaultCatalogue
from steps.sentinel.events import CHECKS, HealthEvent, severity_rank
from steps.sentinel.kernel_log import KernelLog, KernelXid, normalise_pci
from steps.sentinel.nvml import NvmlUnavailableError

__all__ = ["NodeProbes", "Probe", "Reading", "gpu_events", "nic_events", "xid_events"]

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


def _name(gpu: GpuReport) -> str:
    pci = normalise_pci(gpu.pci_bus_id)
    return f"GPU {gpu.index} ({gpu.uuid}{', PCI ' + pci if pci else ''})"


def _threshold(catalogue: FaultCatalogue, check: str, code: str, default: float) -> float:
    found = catalogue.rule(check, code).threshold
    return default if found is None else found


def _memory_readings(gpu: GpuReport, name: str, retired_limit: float) -> list[Reading]:
    """ECC and the memory's repairs (remapped rows, retired pages) of one GPU."""
    ecc = Reading("ecc", gpu.uuid)
    if gpu.ecc_uncorrectable:
        volatile = f"{name}: {gpu.ecc_uncorrectable} uncorrectable ECC errors"
        ecc.faults.append(("volatile-uncorrectable", volatile))
    if gpu.ecc_uncorrectable_aggregate:
        lifetime = f"{name}: {gpu.ecc_uncorrectable_aggregate} uncorrectable ECC errors over its life"
        ecc.faults.append(("aggregate-uncorrectable", lifetime))
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
    return thermal


def _link_readings(gpu: GpuReport, name: str, link_limit: float) -> list[Reading]:
    """PCIe generation and width against their maximum, NVLink state and error counters (where the GPU
    reports them)."""
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
        readings.append(pcie)
    if gpu.nvlinks:
        nvlink = Reading("nvlink", gpu.uuid)
        down = [str(link.link) for link in gpu.nvlinks if not link.active]
        if down:
            nvlink.faults.append(("link-down", f"{name}: NVLink {', '.join(down)} down"))
        errors = sum(k.crc_errors + k.replay_errors + k.recovery_errors for k in gpu.nvlinks)
        if errors >= link_limit:
            nvlink.faults.append(("link-errors", f"{name}: {errors} NVLink CRC, replay and recovery errors"))
        readings.append(nvlink)
    return readings


def gpu_events(
    report: NodeReport, catalogue: FaultCatalogue, now: dt.datetime, expected_gpus: int | None = None
) -> list[HealthEvent]:
    """Readings of every GPU check but XIDs: missing GPUs, ECC, remapping, thermal, PCIe, NVLink, reset."""
    readings: list[Reading] = []
    if expected_gpus is not None:
        count = Reading("gpu-missing", "gpus")
        if len(report.gpus) < expected_gpus:
            count.faults.append(
                ("count-below-expected", f"{len(report.gpus)} of {expected_gpus} GPUs visible to NVML")
            )
        readings.append(count)
    retired_limit = _threshold(catalogue, "remap", "retired-pages-limit", 60)
    link_limit = _threshold(catalogue, "nvlink", "link-errors", 100)
    for gpu in report.gpus:
        name = _name(gpu)
        lost = Reading("gpu-missing", gpu.uuid)
        if not gpu.healthy:
            lost.faults.append(("gpu-lost", f"{name}: lost (fallen off the bus or unusable)"))
        readings += [lost, *_memory_readings(gpu, name, retired_limit), _thermal_reading(gpu, name)]
        readings += _link_readings(gpu, name, link_limit)
        reset = Reading("reset-required", gpu.uuid)
        if gpu.reset_required:
            reset.faults.append(("reset-required", f"{name}: the driver asks for a GPU reset"))
        readings.append(reset)
    return _events(report.node, readings, catalogue, now)


def xid_events(
    report: NodeReport, kernel: Sequence[KernelXid], catalogue: FaultCatalogue, now: dt.datetime
) -> list[HealthEvent]:
    """XID readings per GPU (from the GPU's own report and the kernel log, matched by PCI address) and
    SXid readings per NVSwitch. A kernel XID on an address no GPU reports (a GPU NVML lost) is about
    ``PCI:ADDRESS``."""
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
    return _events(report.node, readings.values(), catalogue, now)


def _xid_message(catalogue: FaultCatalogue, name: str, code: int, detail: str) -> str:
    mnemonic = catalogue.describe("xid", str(code)) or "not in the XID catalogue"
    return f"{name}: XID {code} {mnemonic}" + (f": {detail}" if detail else "")


def nic_events(
    node: str, nics: Sequence[NicReport], catalogue: FaultCatalogue, now: dt.datetime
) -> list[HealthEvent]:
    """A reading per port: down, or slower than the fastest port of its kind on the node."""
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
        readings.append(reading)
    return _events(node, readings, catalogue, now)


class NodeProbes:
    """The probes of one node over a health source, a kernel log and the node's NICs.

    Args:
        node: the node's name.
        catalogue: what faults mean.
        source: the health seam's adapter (NVML, the simulated fleet).
        clock: the current time (UTC).
        expected_gpus: how many GPUs the node should show (``None``: not checked).
        kernel_log: the kernel log to read XIDs from (``None``: none).
        nics: reads the node's NICs (sysfs); ``None`` takes them from the source's report.
    """

    def __init__(
        self,
        node: str,
        catalogue: FaultCatalogue,
        source: NodeHealthSource,
        clock: Callable[[], dt.datetime],
        expected_gpus: int | None = None,
        kernel_log: KernelLog | None = None,
        nics: Callable[[], list[NicReport]] | None = None,
    ) -> None:
        self.node = node
        self.catalogue = catalogue
        self.source = source
        self.clock = clock
        self.expected_gpus = expected_gpus
        self.kernel_log = kernel_log
        self.nics = nics
        self.report: NodeReport | None = None

    def probes(self) -> list[Probe]:
        """The probes in the order a pass runs them: kernel log, GPUs (with XIDs), NICs."""
        found: list[Probe] = []
        if self.kernel_log is not None:
            found.append(("kernel-log", self._kernel))
        found.append(("gpu", self._gpus))
        found.append(("nic", self._nics))
        return found

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
            *gpu_events(self.report, self.catalogue, now, self.expected_gpus),
            *xid_events(self.report, kernel, self.catalogue, now),
        ]

    def _nics(self) -> list[HealthEvent]:
        if self.nics is not None:
            nics = self.nics()
        elif self.report is not None:
            nics = list(self.report.nics)
        else:
            return []
        return nic_events(self.node, nics, self.catalogue, self.clock())
