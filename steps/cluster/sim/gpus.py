"""GPU node types of the simulated fleet, with the labels GPU Feature Discovery puts on such nodes.

Each model runs the data-centre driver the packaged recipe catalogue pins for its accelerator (the GPU
Operator's ``driver.version``: 580.82.07, the default of GPU Operator v25.3.4; 570.172.08 on A100),
so a fleet built with the defaults conforms to the recipe. The values are kept here as data: the
cluster layer never reads recipes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from steps.errors import InputError

__all__ = ["CUDA_BY_DRIVER_BRANCH", "GPU_MODELS", "GpuModel", "cuda_for_driver", "driver_labels", "gpu_model"]

_DRIVER = re.compile(r"^(?P<branch>\d+)\.\d+(?:\.\d+)?$")

CUDA_BY_DRIVER_BRANCH: dict[int, str] = {
    470: "11.4",
    510: "11.6",
    515: "11.7",
    520: "11.8",
    525: "12.0",
    530: "12.1",
    535: "12.2",
    545: "12.3",
    550: "12.4",
    555: "12.5",
    560: "12.6",
    565: "12.7",
    570: "12.8",
    575: "12.9",
    580: "13.0",
}
"""The CUDA version each data-centre driver branch supports (what ``nvidia-smi`` shows and GPU Feature
Discovery writes as ``cuda.runtime-version``)."""


def cuda_for_driver(driver: str) -> str:
    """The CUDA version a driver supports: that of its branch, or of the newest branch before it.

    Raises:
        InputError: ``driver`` is not ``MAJOR.MINOR[.REV]`` or is older than every known branch.
    """
    match = _DRIVER.match(driver.strip())
    if match is None:
        raise InputError(f"driver {driver!r}: expected a driver version such as 580.82.07")
    branch = int(match.group("branch"))
    known = [b for b in sorted(CUDA_BY_DRIVER_BRANCH) if b <= branch]
    if not known:
        oldest = min(CUDA_BY_DRIVER_BRANCH)
        raise InputError(f"driver {driver!r}: older than every branch the simulation knows (R{oldest})")
    return CUDA_BY_DRIVER_BRANCH[known[-1]]


def driver_labels(driver: str, cuda: str) -> dict[str, str]:
    """The driver and CUDA labels GPU Feature Discovery writes: the ``*-version.*`` labels of recent
    releases and the older split ``cuda.driver.*`` / ``cuda.runtime.*`` ones, which it still sets."""
    parts = driver.split(".")
    rev = parts[2] if len(parts) > 2 else ""
    major, minor = cuda.split(".")[:2]
    return {
        "nvidia.com/cuda.driver.major": parts[0],
        "nvidia.com/cuda.driver.minor": parts[1],
        "nvidia.com/cuda.driver.rev": rev,
        "nvidia.com/cuda.runtime.major": major,
        "nvidia.com/cuda.runtime.minor": minor,
        "nvidia.com/cuda.driver-version.full": driver,
        "nvidia.com/cuda.driver-version.major": parts[0],
        "nvidia.com/cuda.driver-version.minor": parts[1],
        "nvidia.com/cuda.driver-version.revision": rev,
        "nvidia.com/cuda.runtime-version.full": cuda,
        "nvidia.com/cuda.runtime-version.major": major,
        "nvidia.com/cuda.runtime-version.minor": minor,
    }


@dataclass(frozen=True)
class GpuModel:
    """One kind of GPU node.

    Attributes:
        key: the short name used in ``sim:gpu=KEY``.
        product: ``nvidia.com/gpu.product`` as GPU Feature Discovery writes it.
        memory_mib: ``nvidia.com/gpu.memory``.
        count: GPUs per node.
        family: ``nvidia.com/gpu.family``.
        compute: compute capability ``(major, minor)``.
        driver: the data-centre driver version (``major.minor.rev``) the node runs by default.
        cuda: the CUDA version that driver supports (``major.minor``).
        machine: ``nvidia.com/gpu.machine``.
        arch: ``kubernetes.io/arch``.
        link_gbps: bandwidth of one node's scale-out links (all NICs together), in Gbit/s.
        nvlink_gbps: NVLink bandwidth of one GPU, in GB/s.
        cpu: CPU cores per node; memory_gib: host memory per node.
    """

    key: str
    product: str
    memory_mib: int
    count: int
    family: str
    compute: tuple[int, int]
    driver: str
    cuda: str
    machine: str
    arch: str
    link_gbps: float
    nvlink_gbps: float
    cpu: int
    memory_gib: int

    def labels(self, count: int | None = None, driver: str | None = None) -> dict[str, str]:
        """The GPU Feature Discovery labels of a node of this kind, running ``driver`` (default the
        model's own; the CUDA labels follow the driver's branch)."""
        cuda = self.cuda if driver is None or driver == self.driver else cuda_for_driver(driver)
        return {
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.product": self.product,
            "nvidia.com/gpu.count": str(self.count if count is None else count),
            "nvidia.com/gpu.memory": str(self.memory_mib),
            "nvidia.com/gpu.family": self.family,
            "nvidia.com/gpu.machine": self.machine,
            "nvidia.com/gpu.compute.major": str(self.compute[0]),
            "nvidia.com/gpu.compute.minor": str(self.compute[1]),
            **driver_labels(driver or self.driver, cuda),
            "nvidia.com/mig.capable": "true",
        }


GPU_MODELS: dict[str, GpuModel] = {
    m.key: m
    for m in (
        GpuModel(
            "a100",
            "NVIDIA-A100-SXM4-80GB",
            81920,
            8,
            "ampere",
            (8, 0),
            "570.172.08",
            "12.8",
            "DGXA100-920-23687-2530-000",
            "amd64",
            1600.0,
            300.0,
            256,
            2048,
        ),
        GpuModel(
            "h100",
            "NVIDIA-H100-80GB-HBM3",
            81559,
            8,
            "hopper",
            (9, 0),
            "580.82.07",
            "13.0",
            "DGXH100",
            "amd64",
            3200.0,
            450.0,
            224,
            2048,
        ),
        GpuModel(
            "h200",
            "NVIDIA-H200",
            143771,
            8,
            "hopper",
            (9, 0),
            "580.82.07",
            "13.0",
            "DGXH200",
            "amd64",
            3200.0,
            450.0,
            224,
            2048,
        ),
        GpuModel(
            "b200",
            "NVIDIA-B200",
            183359,
            8,
            "blackwell",
            (10, 0),
            "580.82.07",
            "13.0",
            "DGXB200",
            "amd64",
            3200.0,
            900.0,
            224,
            4096,
        ),
        GpuModel(
            "gb200",
            "NVIDIA-GB200",
            189471,
            4,
            "blackwell",
            (10, 0),
            "580.82.07",
            "13.0",
            "GB200-NVL72",
            "arm64",
            1600.0,
            900.0,
            144,
            960,
        ),
    )
}


def gpu_model(key: str) -> GpuModel:
    """The GPU model for a short name (case-insensitive).

    Raises:
        InputError: the name is unknown (the message lists the known ones).
    """
    try:
        return GPU_MODELS[key.lower()]
    except KeyError:
        raise InputError(f"unknown GPU {key!r}: choose one of {', '.join(sorted(GPU_MODELS))}") from None
