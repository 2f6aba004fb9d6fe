"""The health seam: what the GPUs and NICs of a node report, whoever reads them.

Readiness asks it how a node's hardware stands, to make a local rank play that node; the sentinel will
ask it what to remediate. Each source of the figures is an adapter of :class:`NodeHealthSource`:

- the simulated fleet (:class:`steps.cluster.sim.SimCluster`), the first one, which reports the health
  its faults left;
- later, NVML for the GPUs and sysfs for the NICs, on the node itself.

A port that is no such source (a real cluster seen through the Kubernetes API) reports nothing: callers
get ``None`` from :func:`health_source` and do without. This module imports no adapter, so a node agent
that only needs the models pays for nothing else.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "GpuReport",
    "GpuResetError",
    "GpuResetter",
    "NicReport",
    "NodeHealthSource",
    "NodeReport",
    "NvlinkReport",
    "gpu_resetter",
    "health_source",
]


class NvlinkReport(BaseModel):
    """What one NVLink of a GPU reports (NVML's link state and error counters since the driver loaded).

    Attributes:
        link: the link's index on its GPU.
        active: whether the link is up.
        crc_errors: data-link CRC errors (flits) counted.
        replay_errors: data-link replays counted.
        recovery_errors: data-link recoveries counted.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    link: int
    active: bool = True
    crc_errors: int = 0
    replay_errors: int = 0
    recovery_errors: int = 0


class NicReport(BaseModel):
    """What one network port of a node reports (sysfs): an InfiniBand port or an Ethernet interface.

    Attributes:
        name: ``mlx5_0/1`` (InfiniBand device and port) or the interface name (``eth0``).
        kind: ``infiniband`` or ``ethernet``; speeds are compared only between NICs of one kind.
        up: whether the port carries traffic (IB ``ACTIVE`` and ``LinkUp``; Ethernet ``up``).
        state: the state as sysfs words it (``ACTIVE``, ``DOWN``, ``up``...).
        phys_state: the physical state (IB only: ``LinkUp``, ``Disabled``, ``Polling``...).
        speed_gbps: the link's rate in Gbit/s (``None``: unknown, as for a link that is down).
        link_downed: times the port's link went down since its counters were cleared (IB
            ``counters/link_downed``; ``None``: not reported, as for Ethernet).
        symbol_errors: symbol errors the port's physical layer counted (IB ``counters/symbol_error``).
        buffer_overruns: local buffer overruns counted (IB ``counters/excessive_buffer_overrun_errors``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    kind: str
    up: bool = True
    state: str = ""
    phys_state: str = ""
    speed_gbps: float | None = None
    link_downed: int | None = None
    symbol_errors: int | None = None
    buffer_overruns: int | None = None


class GpuReport(BaseModel):
    """What one GPU reports (the figures NVML gives).

    Attributes:
        index: the GPU's index on its node.
        uuid: the GPU's UUID.
        healthy: whether the device is usable (``False``: the device plugin stops offering it).
        xids: XID errors seen, oldest first.
        ecc_uncorrectable: uncorrectable ECC errors counted.
        temperature_c: temperature, in degrees Celsius.
        nvlink_gbps: NVLink bandwidth the GPU has now, in GB/s (0: no NVLink).
        nominal_nvlink_gbps: what its NVLink should give, in GB/s.
        pci_bus_id: the GPU's PCI address as NVML writes it (``00000000:1B:00.0``): the kernel log names
            GPUs by it.
        ecc_uncorrectable_aggregate: uncorrectable ECC errors over the GPU's life (``ecc_uncorrectable``
            counts since the driver loaded).
        retired_pages: pages retired for double-bit errors.
        retired_pages_pending: a retired page waits for a GPU reset to take effect.
        remap_pending: a remapped memory row waits for a GPU reset to take effect.
        remap_failed: a row could not be remapped (the GPU needs replacing).
        throttle_reasons: why clocks are held down now: ``hw-thermal``, ``sw-thermal``,
            ``hw-power-brake``, ``hw-slowdown``.
        slowdown_temperature_c: where the GPU slows itself down (``None``: unknown).
        shutdown_temperature_c: where the GPU shuts down (``None``: unknown).
        pcie_generation: the PCIe generation the link runs at now (0: unknown).
        pcie_max_generation: the highest generation the GPU and its slot support (0: unknown).
        pcie_width: the lanes the link runs with now (0: unknown).
        pcie_max_width: the lanes it should have (0: unknown).
        nvlinks: one report per NVLink the GPU has.
        reset_required: the driver asks for a GPU reset before the GPU is usable again.
        pcie_replays: PCIe replays counted (the link's retransmissions: its signal is marginal).
        ecc_correctable: corrected (single-bit) ECC errors since the driver loaded.
        ecc_correctable_aggregate: corrected ECC errors over the GPU's life.
        ecc_uncorrectable_sram: of ``ecc_uncorrectable``, those in the GPU's on-chip SRAM (``None``:
            NVML does not split them on this GPU).
        ecc_uncorrectable_dram: of ``ecc_uncorrectable``, those in its device memory (HBM).
        aer_correctable: PCIe AER correctable errors the kernel counted for the GPU's device this boot
            (sysfs ``aer_dev_correctable``; ``None``: not reported).
        aer_nonfatal: AER uncorrectable non-fatal errors this boot (``aer_dev_nonfatal``).
        aer_fatal: AER uncorrectable fatal errors this boot (``aer_dev_fatal``).
        fabric_state: the GPU's NVLink fabric registration where NVML reports one (NVSwitch and
            multi-node NVLink systems): ``not-started``, ``in-progress`` or ``completed``; ``""``: none.
        fabric_status: NVML's return code for a completed registration (0: success).
        compute_share: the share of its nominal compute throughput the GPU delivers (a simulated fleet's
            figure: a degraded GPU that delivers less while NVML reports nothing amiss, seen only in a
            workload's step time; no NVML reading sets it).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    index: int
    uuid: str
    healthy: bool = True
    xids: tuple[int, ...] = ()
    ecc_uncorrectable: int = 0
    temperature_c: float = 42.0
    nvlink_gbps: float = 0.0
    nominal_nvlink_gbps: float = 0.0
    pci_bus_id: str = ""
    ecc_uncorrectable_aggregate: int = 0
    retired_pages: int = 0
    retired_pages_pending: bool = False
    remap_pending: bool = False
    remap_failed: bool = False
    throttle_reasons: tuple[str, ...] = ()
    slowdown_temperature_c: float | None = None
    shutdown_temperature_c: float | None = None
    pcie_generation: int = 0
    pcie_max_generation: int = 0
    pcie_width: int = 0
    pcie_max_width: int = 0
    nvlinks: tuple[NvlinkReport, ...] = ()
    reset_required: bool = False
    pcie_replays: int = 0
    ecc_correctable: int = 0
    ecc_correctable_aggregate: int = 0
    ecc_uncorrectable_sram: int | None = None
    ecc_uncorrectable_dram: int | None = None
    aer_correctable: int | None = None
    aer_nonfatal: int | None = None
    aer_fatal: int | None = None
    fabric_state: str = ""
    fabric_status: int = 0
    compute_share: float = Field(1.0, gt=0.0, le=1.0)


class NodeReport(BaseModel):
    """What the GPUs and NICs of one node report.

    Attributes:
        node: the node's name.
        link_gbps: bandwidth of the node's scale-out links (all NICs together) now, in Gbit/s.
        nominal_link_gbps: what the links should give, in Gbit/s.
        gpus: one report per GPU, by index.
        link_failure_rate: the probability that a collective spanning this node and others fails on its
            links (a flaky NIC or cable; 0: never, 1: always). Traffic inside the node never crosses them.
        link_hangs: whether a collective spanning this node and others never completes on its links.
        nics: one report per network port sysfs shows (InfiniBand ports, Ethernet interfaces).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    node: str
    link_gbps: float
    nominal_link_gbps: float
    gpus: tuple[GpuReport, ...] = Field(default_factory=tuple)
    link_failure_rate: float = Field(0.0, ge=0.0, le=1.0)
    link_hangs: bool = False
    nics: tuple[NicReport, ...] = ()

    @property
    def ring_gbps(self) -> float:
        """What the node's links give a ring all-reduce, in Gbit/s.

        With InfiniBand ports (rails, one per GPU in a rail-optimised fabric), the collective is split
        evenly over them, so the slowest rail caps them all: the rails' count times the slowest one's rate.
        A rail that is down leaves its GPUs to share another rail's port, which then carries two shares:
        the ring runs at the rails' count times half the slowest port still up. Never more than
        ``link_gbps`` (a slow node as a whole); without InfiniBand ports, ``link_gbps``; with every rail
        down, 0 (nothing crosses the node's links).
        """
        rails = [nic for nic in self.nics if nic.kind == "infiniband"]
        up = [nic.speed_gbps for nic in rails if nic.up and nic.speed_gbps]
        if not rails:
            return self.link_gbps
        if not up:
            return 0.0
        share = min(up) / (2.0 if len(up) < len(rails) else 1.0)
        return min(self.link_gbps, len(rails) * share)


@runtime_checkable
class NodeHealthSource(Protocol):
    """Something that can read what a node's GPUs and NICs report."""

    def node_report(self, node: str) -> NodeReport:
        """What the node's GPUs and NICs report now.

        Raises:
            NotFoundError: the source knows no such node.
        """
        ...


def health_source(port: object) -> NodeHealthSource | None:
    """The health source behind a cluster port, or ``None`` when the port can read no hardware.

    A real cluster seen through its API shows Kubernetes objects, not NVML or sysfs; the simulated fleet
    holds the hardware's state too, and is its own source.
    """
    return port if isinstance(port, NodeHealthSource) else None


class GpuResetError(Exception):
    """A GPU reset that did not happen: refused (a process holds the GPU) or failed; the message says
    which and why."""


@runtime_checkable
class GpuResetter(Protocol):
    """Something that can reset a node's GPU (NVML's driver on the node, the simulated fleet)."""

    def gpu_holders(self, node: str, uuid: str) -> list[str]:
        """The processes that hold the GPU ``uuid`` now (``pid NAME``), empty when it is idle.

        Raises:
            GpuResetError: no GPU ``uuid`` on the node, or what holds it cannot be read.
        """
        ...

    def reset_gpu(self, node: str, uuid: str) -> str:
        """Reset the GPU ``uuid`` (it must be idle); what the reset said.

        Raises:
            GpuResetError: the reset failed or was refused.
        """
        ...


def gpu_resetter(source: object) -> GpuResetter | None:
    """The GPU reset behind a health source, or ``None`` when it can reset none."""
    return source if isinstance(source, GpuResetter) else None
