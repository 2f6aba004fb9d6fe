"""GPU node types of the simulated fleet, with the labels GPU Feature Discovery puts on such nodes."""

from __future__ import annotations

from dataclasses import dataclass

from steps.errors import InputError

__all__ = ["GPU_MODELS", "GpuModel", "gpu_model"]


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
        driver: the data-centre driver version (``major.minor.rev``).
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

    def labels(self, count: int | None = None) -> dict[str, str]:
        """The GPU Feature Discovery labels of a node of this kind (both the ``*-version.*`` labels of
        recent releases and the older split ``cuda.driver.*`` / ``cuda.runtime.*`` ones)."""
        driver = self.driver.split(".")
        cuda = self.cuda.split(".")
        return {
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.product": self.product,
            "nvidia.com/gpu.count": str(self.count if count is None else count),
            "nvidia.com/gpu.memory": str(self.memory_mib),
            "nvidia.com/gpu.family": self.family,
            "nvidia.com/gpu.machine": self.machine,
            "nvidia.com/gpu.compute.major": str(self.compute[0]),
            "nvidia.com/gpu.compute.minor": str(self.compute[1]),
            "nvidia.com/cuda.driver.major": driver[0],
            "nvidia.com/cuda.driver.minor": driver[1],
            "nvidia.com/cuda.driver.rev": driver[2] if len(driver) > 2 else "",
            "nvidia.com/cuda.runtime.major": cuda[0],
            "nvidia.com/cuda.runtime.minor": cuda[1],
            "nvidia.com/cuda.driver-version.full": self.driver,
            "nvidia.com/cuda.driver-version.major": driver[0],
            "nvidia.com/cuda.driver-version.minor": driver[1],
            "nvidia.com/cuda.driver-version.revision": driver[2] if len(driver) > 2 else "",
            "nvidia.com/cuda.runtime-version.full": self.cuda,
            "nvidia.com/cuda.runtime-version.major": cuda[0],
            "nvidia.com/cuda.runtime-version.minor": cuda[1],
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
            "535.216.03",
            "12.2",
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
            "550.127.08",
            "12.4",
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
            "560.35.03",
            "12.6",
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
            "570.124.06",
            "12.8",
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
            "570.124.06",
            "12.8",
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
