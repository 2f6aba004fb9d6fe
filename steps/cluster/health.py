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

__all__ = ["GpuReport", "NodeHealthSource", "NodeReport", "health_source"]


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
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    node: str
    link_gbps: float
    nominal_link_gbps: float
    gpus: tuple[GpuReport, ...] = Field(default_factory=tuple)
    link_failure_rate: float = Field(0.0, ge=0.0, le=1.0)
    link_hangs: bool = False


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
