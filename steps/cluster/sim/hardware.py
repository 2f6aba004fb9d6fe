"""What the hardware of a healthy simulated node reports beyond bandwidth: PCI addresses, PCIe links,
NVLinks, temperature thresholds and the node's InfiniBand ports, as NVML and sysfs show them on such a
machine. Faults (:mod:`steps.cluster.sim.faults`) change these figures; the health seam reports them.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from steps.cluster.health import NicReport, NvlinkReport
from steps.cluster.sim.gpus import GpuModel

__all__ = ["gpu_hardware", "node_nics"]

_NVLINKS = {"a100": 12}
"""NVLinks per GPU where the model has other than 18 (A100: 12; H100, H200, B200, GB200: 18)."""
_PCIE_GEN = {"a100": 4}
"""PCIe generation where the model has other than 5."""


def gpu_hardware(model: GpuModel, index: int) -> dict[str, Any]:
    """The fields of GPU ``index``'s report that a healthy GPU of this model shows."""
    links = _NVLINKS.get(model.key, 18) if model.nvlink_gbps else 0
    generation = _PCIE_GEN.get(model.key, 5)
    return {
        "pci_bus_id": f"00000000:{0x18 + 0x10 * index:02X}:00.0",
        "pcie_generation": generation,
        "pcie_max_generation": generation,
        "pcie_width": 16,
        "pcie_max_width": 16,
        "slowdown_temperature_c": 87.0,
        "shutdown_temperature_c": 92.0,
        "nvlinks": _healthy_links(links),
    }


@cache
def _healthy_links(count: int) -> tuple[NvlinkReport, ...]:
    """``count`` healthy NVLinks: one tuple shared by every GPU (the reports are frozen)."""
    return tuple(NvlinkReport(link=link) for link in range(count))


def node_nics(model: GpuModel, gpus: int) -> list[NicReport]:
    """The node's scale-out ports: one InfiniBand port per GPU sharing the node's link bandwidth."""
    ports = max(gpus, 1)
    speed = model.link_gbps / ports
    return [
        NicReport(
            name=f"mlx5_{i}/1", kind="infiniband", state="ACTIVE", phys_state="LinkUp", speed_gbps=speed
        )
        for i in range(ports)
    ]
