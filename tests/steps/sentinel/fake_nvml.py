"""A fake of the ``pynvml`` module: the same function names, constants and ``NVMLError`` codes, over
GPUs a test describes. Its constants are read from the real module, so a renamed or renumbered
constant in nvidia-ml-py shows here."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml as real


class NVMLError(Exception):
    """Carries an NVML return code in ``value``, as pynvml's does."""

    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


@dataclass
class FakeGpu:
    uuid: str
    bus_id: str
    lost: bool = False
    volatile_ecc: int = 0
    aggregate_ecc: int = 0
    retired: int = 0
    pending_retire: bool = False
    remap: tuple[int, int, int, int] = (0, 0, 0, 0)
    reasons: int = 0
    temperature: int = 45
    slowdown: int = 87
    shutdown: int = 92
    pcie: tuple[int, int, int, int] = (5, 5, 16, 16)
    links: list[bool] = field(default_factory=lambda: [True] * 18)
    crc: dict[int, int] = field(default_factory=dict)
    """NVLink CRC (flit) errors counted, by link."""
    replays: dict[int, int] = field(default_factory=dict)
    recoveries: dict[int, int] = field(default_factory=dict)
    recovery_action: int = 0
    pcie_replays: int = 0
    corrected_ecc: int = 0
    corrected_ecc_aggregate: int = 0
    sram_ecc: int | None = None
    """Of ``volatile_ecc``, those in SRAM (the rest in DRAM); None: NVML does not split them."""
    fabric: tuple[int, int] | None = None
    """NVLink fabric registration (state, status) as NVML gives it; None: not supported."""
    processes: dict[int, str] = field(default_factory=dict)
    """The compute processes running on it: pid -> name."""


def gpus(count: int = 8) -> list[FakeGpu]:
    """``count`` healthy GPUs."""
    return [
        FakeGpu(uuid=f"GPU-fake-{i}", bus_id=f"00000000:{0x18 + 0x10 * i:02X}:00.0") for i in range(count)
    ]


class FakeNvml:
    """Module-like: pass an instance where the agent takes the ``pynvml`` module."""

    NVMLError = NVMLError
    c_nvmlGpuFabricInfo_t = real.c_nvmlGpuFabricInfo_t

    def __init__(self, devices: list[FakeGpu] | None = None, init_error: int | None = None) -> None:
        self.devices = devices if devices is not None else gpus()
        self.init_error = init_error
        self.pending_events: list[tuple[int, int]] = []
        self.initialised = False
        self.shutdowns = 0
        for name in dir(real):
            if name.startswith(("NVML_", "nvmlClocks", "nvmlEventType")):
                setattr(self, name, getattr(real, name))

    def _dev(self, handle: int) -> FakeGpu:
        gpu = self.devices[handle]
        if gpu.lost:
            raise NVMLError(real.NVML_ERROR_GPU_IS_LOST)
        return gpu

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self.initialised = False
        self.shutdowns += 1

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> int:
        for index, gpu in enumerate(self.devices):
            if gpu.uuid == uuid:
                return index
        raise NVMLError(real.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[Any]:
        return [SimpleNamespace(pid=pid, usedGpuMemory=1 << 30) for pid in self._dev(handle).processes]

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: int) -> list[Any]:
        self._dev(handle)
        return []

    def nvmlSystemGetProcessName(self, pid: int) -> str:
        for gpu in self.devices:
            if pid in gpu.processes:
                return gpu.processes[pid]
        raise NVMLError(real.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if not 0 <= index < len(self.devices):
            raise NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        return index

    def nvmlDeviceGetIndex(self, handle: int) -> int:
        return handle

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return self.devices[handle].uuid

    def nvmlDeviceGetPciInfo(self, handle: int) -> Any:
        return SimpleNamespace(busId=self.devices[handle].bus_id.encode())

    def nvmlDeviceGetTotalEccErrors(self, handle: int, error_type: int, counter: int) -> int:
        gpu = self._dev(handle)
        if error_type == real.NVML_MEMORY_ERROR_TYPE_CORRECTED:
            return gpu.corrected_ecc if counter == real.NVML_VOLATILE_ECC else gpu.corrected_ecc_aggregate
        return gpu.volatile_ecc if counter == real.NVML_VOLATILE_ECC else gpu.aggregate_ecc

    def nvmlDeviceGetGpuFabricInfo(self, handle: int, info: Any) -> int:
        gpu = self._dev(handle)
        if gpu.fabric is None:
            raise NVMLError(real.NVML_ERROR_NOT_SUPPORTED)
        info._obj.state, info._obj.status = gpu.fabric  # a ctypes.byref() of the caller's structure
        return int(real.NVML_SUCCESS)

    def nvmlDeviceGetMemoryErrorCounter(
        self, handle: int, error_type: int, counter: int, location: int
    ) -> int:
        gpu = self._dev(handle)
        if gpu.sram_ecc is None or counter != real.NVML_VOLATILE_ECC:
            raise NVMLError(real.NVML_ERROR_NOT_SUPPORTED)
        if error_type == real.NVML_MEMORY_ERROR_TYPE_CORRECTED:
            return 0
        if location == real.NVML_MEMORY_LOCATION_SRAM:
            return gpu.sram_ecc
        return gpu.volatile_ecc - gpu.sram_ecc if location == real.NVML_MEMORY_LOCATION_DRAM else 0

    def nvmlDeviceGetPcieReplayCounter(self, handle: int) -> int:
        return self._dev(handle).pcie_replays

    def nvmlDeviceGetRetiredPages(self, handle: int, cause: int) -> list[int]:
        return list(range(self._dev(handle).retired))

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: int) -> int:
        return int(self._dev(handle).pending_retire)

    def nvmlDeviceGetRemappedRows(self, handle: int) -> tuple[int, int, int, int]:
        return self._dev(handle).remap

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: int) -> int:
        return self._dev(handle).reasons

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:
        return self._dev(handle).temperature

    def nvmlDeviceGetTemperatureThreshold(self, handle: int, which: int) -> int:
        gpu = self._dev(handle)
        return gpu.slowdown if which == real.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN else gpu.shutdown

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: int) -> int:
        return self._dev(handle).pcie[0]

    def nvmlDeviceGetGpuMaxPcieLinkGeneration(self, handle: int) -> int:
        return self._dev(handle).pcie[1]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: int) -> int:
        return self._dev(handle).pcie[1]

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: int) -> int:
        return self._dev(handle).pcie[2]

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: int) -> int:
        return self._dev(handle).pcie[3]

    def nvmlDeviceGetNvLinkState(self, handle: int, link: int) -> int:
        links = self._dev(handle).links
        if link >= len(links):
            raise NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        return real.NVML_FEATURE_ENABLED if links[link] else real.NVML_FEATURE_DISABLED

    def nvmlDeviceGetNvLinkErrorCounter(self, handle: int, link: int, counter: int) -> int:
        gpu = self._dev(handle)
        by_counter = {
            real.NVML_NVLINK_ERROR_DL_CRC_FLIT: gpu.crc,
            real.NVML_NVLINK_ERROR_DL_REPLAY: gpu.replays,
            real.NVML_NVLINK_ERROR_DL_RECOVERY: gpu.recoveries,
        }
        return by_counter.get(counter, {}).get(link, 0)

    def nvmlDeviceGetFieldValues(self, handle: int, fields: list[int]) -> list[Any]:
        gpu = self._dev(handle)
        value = SimpleNamespace(uiVal=gpu.recovery_action)
        return [SimpleNamespace(fieldId=f, nvmlReturn=real.NVML_SUCCESS, value=value) for f in fields]

    def nvmlEventSetCreate(self) -> str:
        return "event-set"

    def nvmlDeviceRegisterEvents(self, handle: int, types: int, event_set: str) -> None:
        pass

    def nvmlEventSetWait(self, event_set: str, timeout_ms: int) -> Any:
        if not self.pending_events:
            raise NVMLError(real.NVML_ERROR_TIMEOUT)
        index, xid = self.pending_events.pop(0)
        return SimpleNamespace(device=index, eventType=real.nvmlEventTypeXidCriticalError, eventData=xid)

    def nvmlEventSetFree(self, event_set: str) -> None:
        pass
