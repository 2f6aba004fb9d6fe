"""The NVML adapter of the health seam: what this node's GPUs report, read through ``pynvml``.

The module is a parameter (:class:`NvmlSource` never imports ``pynvml`` itself): the agent passes the
real one from ``nvidia-ml-py``, tests a fake with the same function names, constants and ``NVMLError``
codes. Per GPU, a call the GPU does not support (``NVML_ERROR_NOT_SUPPORTED``) leaves its figure unknown;
``NVML_ERROR_GPU_IS_LOST`` marks the GPU lost (fallen off the bus); ``NVML_ERROR_RESET_REQUIRED`` marks it
as needing a reset. XIDs arrive through an NVML event set (:meth:`NvmlSource.wait_xids`) and are kept per
GPU, each code once, for the life of the source; a restarted agent of the same boot gives the source
those it had (:attr:`NvmlSource.xids`, kept by :mod:`steps.sentinel.state`), since the event set
delivers only new ones.
"""

from __future__ import annotations

import contextlib
import ctypes
import subprocess
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from steps.cluster.errors import NotFoundError
from steps.cluster.health import GpuReport, GpuResetError, NodeReport, NvlinkReport
from steps.sentinel.sysfs import read_aer

__all__ = ["NvmlSource", "NvmlUnavailableError"]

_T = TypeVar("_T")

# Clock event (throttle) reason bits, as nvml.h defines them; the module's own names are used when it
# has them (they were renamed from ClocksThrottleReason to ClocksEventReason in recent releases).
_REASONS = (
    ("hw-slowdown", "HwSlowdown", 0x08),
    ("sw-thermal", "SwThermalSlowdown", 0x20),
    ("hw-thermal", "HwThermalSlowdown", 0x40),
    ("hw-power-brake", "HwPowerBrakeSlowdown", 0x80),
)
_RESET_ACTIONS = {1, 4, 6}
"""NVML_GPU_RECOVERY_ACTION_GPU_RESET, _DRAIN_AND_RESET and _BUS_RESET: the GPU needs a reset."""
_XID_EVENT = 0x08  # nvmlEventTypeXidCriticalError
_FABRIC_STATES = {1: "not-started", 2: "in-progress", 3: "completed"}
"""NVML_GPU_FABRIC_STATE_*: 0, not supported, has no word (no fabric to register with)."""


RESET_COMMAND = ("nvidia-smi", "--gpu-reset", "-i")
"""How a GPU is reset (its UUID appended): NVIDIA's documented reset, which the driver refuses while
anything holds the GPU and where the GPU or its NVLink/NVSwitch topology does not allow it."""
RESET_TIMEOUT_S = 120.0


def _count(value: Any) -> int | None:
    return None if value is None else int(value)


class NvmlUnavailableError(Exception):
    """NVML is absent or will not initialise (no driver, no GPU, no library): the agent reports it as
    its own condition and goes on serving metrics."""


class _Lost(Exception):
    pass


class _ResetRequired(Exception):
    pass


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlSource:
    """A :class:`~steps.cluster.health.NodeHealthSource` over NVML.

    Args:
        nvml: the ``pynvml`` module, or a fake with the same names.
        node: the node this agent runs on (the only node it can report).
        nvlinks: how many NVLinks to ask about per GPU (NVML_NVLINK_MAX_LINKS by default); links the GPU
            does not have answer not-supported or invalid and are skipped.
        sysfs: where the host's ``/sys`` is, for each GPU's PCIe AER counters (None: not read).
        reset_command: the command that resets one GPU, its UUID appended (:data:`RESET_COMMAND`).
        reset_timeout_s: how long a reset may take.
    """

    def __init__(
        self,
        nvml: Any,
        node: str,
        nvlinks: int | None = None,
        sysfs: str | None = None,
        reset_command: Sequence[str] = RESET_COMMAND,
        reset_timeout_s: float = RESET_TIMEOUT_S,
    ) -> None:
        self._nvml = nvml
        self.reset_command = tuple(reset_command)
        self.reset_timeout_s = reset_timeout_s
        self.node = node
        self._sysfs = sysfs
        self._nvlinks = nvlinks if nvlinks is not None else int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))
        self._event_set: Any = None
        self._started = False
        self._lock = threading.Lock()  # the pass's probe and the wait between passes may both start it
        self.xids: dict[int, list[int]] = {}

    # ----------------------------------------------------------------- life

    def start(self) -> None:
        """Initialise NVML and register every GPU for XID events (where the GPU supports them).

        Raises:
            NvmlUnavailableError: NVML cannot be initialised.
        """
        with self._lock:
            self._start()

    def _start(self) -> None:
        if self._started:
            return
        nvml = self._nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            raise NvmlUnavailableError(f"NVML did not initialise: {exc}") from None
        except OSError as exc:  # the library itself is missing
            raise NvmlUnavailableError(f"NVML library not loaded: {exc}") from None
        self._started = True
        try:
            self._event_set = nvml.nvmlEventSetCreate()
            for index in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                try:
                    nvml.nvmlDeviceRegisterEvents(handle, _XID_EVENT, self._event_set)
                except nvml.NVMLError:
                    continue  # no XID events from this GPU: the kernel log still has them
        except nvml.NVMLError:
            self._event_set = None

    def close(self) -> None:
        """Free the event set and shut NVML down."""
        if not self._started:
            return
        nvml = self._nvml
        if self._event_set is not None:
            with contextlib.suppress(nvml.NVMLError):
                nvml.nvmlEventSetFree(self._event_set)
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()
        self._started, self._event_set = False, None

    # ----------------------------------------------------------------- events

    def wait_xids(self, timeout_ms: int) -> list[tuple[int, int]]:
        """Wait up to ``timeout_ms`` for an XID event; the ``(gpu index, xid)`` pairs received (kept in
        :attr:`xids` too, each code once per GPU). Returns at once with nothing when the GPUs gave no
        event set."""
        nvml = self._nvml
        if self._event_set is None:
            return []
        got: list[tuple[int, int]] = []
        wait = timeout_ms
        while True:
            try:
                data = nvml.nvmlEventSetWait(self._event_set, wait)
            except nvml.NVMLError as exc:
                if getattr(exc, "value", None) == nvml.NVML_ERROR_TIMEOUT:
                    return got
                raise
            if int(data.eventType) & _XID_EVENT:
                index = int(nvml.nvmlDeviceGetIndex(data.device))
                xid = int(data.eventData)
                kept = self.xids.setdefault(index, [])
                if xid not in kept:  # each code once: a repeat says nothing new until reboot
                    kept.append(xid)
                got.append((index, xid))
            wait = 0  # take what else is queued, without waiting again

    # ----------------------------------------------------------------- reset

    def gpu_holders(self, node: str, uuid: str) -> list[str]:
        """The processes NVML says run on the GPU ``uuid`` (compute and graphics), as ``pid NAME``.

        Raises:
            GpuResetError: not this node, NVML unavailable, or no such GPU.
        """
        nvml = self._nvml
        self._this_node(node)
        try:
            self.start()
            handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
            running = [
                *nvml.nvmlDeviceGetComputeRunningProcesses(handle),
                *nvml.nvmlDeviceGetGraphicsRunningProcesses(handle),
            ]
        except NvmlUnavailableError as exc:
            raise GpuResetError(str(exc)) from None
        except nvml.NVMLError as exc:
            raise GpuResetError(f"NVML cannot say what holds GPU {uuid}: {exc}") from None
        holders: list[str] = []
        for pid in dict.fromkeys(int(p.pid) for p in running):
            try:
                name = _text(nvml.nvmlSystemGetProcessName(pid))
            except nvml.NVMLError:
                name = "(name unknown)"
            holders.append(f"pid {pid} {name}")
        return holders

    def reset_gpu(self, node: str, uuid: str) -> str:
        """Reset the GPU ``uuid`` with :attr:`reset_command`; what it printed. NVML is shut down first (a
        client of the GPU, this source among them, would make the driver refuse) and starts again at the
        next read; the XIDs kept of the GPU are forgotten once it is reset.

        Raises:
            GpuResetError: not this node, the command is missing, failed, or took too long.
        """
        self._this_node(node)
        index = self._index_of(uuid)
        with self._lock:
            self.close()
        command = [*self.reset_command, uuid]
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=self.reset_timeout_s, check=False
            )
        except FileNotFoundError:
            raise GpuResetError(f"{command[0]} not found: the GPU reset needs the driver's tools") from None
        except subprocess.TimeoutExpired:
            took = f"{' '.join(command)} did not end within {self.reset_timeout_s:g} s"
            raise GpuResetError(took) from None
        said = " ".join((done.stdout + " " + done.stderr).split())
        if done.returncode != 0:
            raise GpuResetError(f"{' '.join(command)} exited {done.returncode}: {said or 'nothing said'}")
        if index is not None:
            self.xids.pop(index, None)
        return said or f"GPU {uuid} reset"

    def _this_node(self, node: str) -> None:
        if node != self.node:
            raise GpuResetError(f"NVML here is {self.node}'s, not {node}'s")

    def _index_of(self, uuid: str) -> int | None:
        """The index NVML gives the GPU ``uuid`` (``None``: NVML cannot say)."""
        nvml = self._nvml
        try:
            self.start()
            return int(nvml.nvmlDeviceGetIndex(nvml.nvmlDeviceGetHandleByUUID(uuid)))
        except (NvmlUnavailableError, nvml.NVMLError):
            return None

    # ----------------------------------------------------------------- reading

    def _call(self, fn: Callable[..., _T], *args: Any) -> _T | None:
        """One NVML query; ``None`` when the GPU does not support it."""
        nvml = self._nvml
        try:
            return fn(*args)
        except nvml.NVMLError as exc:
            code = getattr(exc, "value", None)
            if code == nvml.NVML_ERROR_GPU_IS_LOST:
                raise _Lost from None
            if code == nvml.NVML_ERROR_RESET_REQUIRED:
                raise _ResetRequired from None
            return None

    def node_report(self, node: str) -> NodeReport:
        """What this node's GPUs report now (NICs come from sysfs, not NVML).

        Raises:
            NotFoundError: ``node`` is not the node this source runs on.
            NvmlUnavailableError: NVML cannot be initialised or cannot count the GPUs.
        """
        if node != self.node:
            raise NotFoundError(
                "node_report", f"node/{node}", f"NVML here reports {self.node}, not {node}", 404
            )
        self.start()
        nvml = self._nvml
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except nvml.NVMLError as exc:
            raise NvmlUnavailableError(f"NVML cannot count the GPUs: {exc}") from None
        gpus = tuple(self._gpu(index) for index in range(count))
        return NodeReport(node=node, link_gbps=0.0, nominal_link_gbps=0.0, gpus=gpus)

    def _gpu(self, index: int) -> GpuReport:
        nvml = self._nvml
        uuid, bus = f"gpu-{index}", ""
        try:
            handle = self._call(nvml.nvmlDeviceGetHandleByIndex, index)
            if handle is None:
                raise _Lost
            uuid = _text(self._call(nvml.nvmlDeviceGetUUID, handle) or uuid)
            pci = self._call(nvml.nvmlDeviceGetPciInfo, handle)
            bus = _text(pci.busId) if pci is not None else ""
            return self._read(index, handle, uuid, bus)
        except _Lost:
            return GpuReport(index=index, uuid=uuid, pci_bus_id=bus, healthy=False, xids=self._xids(index))
        except _ResetRequired:
            return GpuReport(
                index=index, uuid=uuid, pci_bus_id=bus, reset_required=True, xids=self._xids(index)
            )

    def _xids(self, index: int) -> tuple[int, ...]:
        return tuple(self.xids.get(index, ()))

    def _read(self, index: int, handle: Any, uuid: str, bus: str) -> GpuReport:
        nvml, call = self._nvml, self._call
        unc = nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        volatile = call(nvml.nvmlDeviceGetTotalEccErrors, handle, unc, nvml.NVML_VOLATILE_ECC) or 0
        aggregate = call(nvml.nvmlDeviceGetTotalEccErrors, handle, unc, nvml.NVML_AGGREGATE_ECC) or 0
        where = {
            place: call(nvml.nvmlDeviceGetMemoryErrorCounter, handle, unc, nvml.NVML_VOLATILE_ECC, location)
            for place, location in (
                ("sram", getattr(nvml, "NVML_MEMORY_LOCATION_SRAM", None)),
                ("dram", getattr(nvml, "NVML_MEMORY_LOCATION_DRAM", None)),
            )
            if location is not None
        }
        cor = nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
        corrected = call(nvml.nvmlDeviceGetTotalEccErrors, handle, cor, nvml.NVML_VOLATILE_ECC) or 0
        corrected_life = call(nvml.nvmlDeviceGetTotalEccErrors, handle, cor, nvml.NVML_AGGREGATE_ECC) or 0
        retired = call(
            nvml.nvmlDeviceGetRetiredPages, handle, nvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
        )
        pending = call(nvml.nvmlDeviceGetRetiredPagesPendingStatus, handle)
        remap = call(nvml.nvmlDeviceGetRemappedRows, handle)
        reasons_fn = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        mask = call(reasons_fn or nvml.nvmlDeviceGetCurrentClocksThrottleReasons, handle) or 0
        reasons = tuple(sorted(name for name, suffix, bit in _REASONS if mask & self._bit(suffix, bit)))
        temperature = call(nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU)
        slowdown = call(
            nvml.nvmlDeviceGetTemperatureThreshold, handle, nvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
        )
        shutdown = call(
            nvml.nvmlDeviceGetTemperatureThreshold, handle, nvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN
        )
        reset_required = False
        fields = call(nvml.nvmlDeviceGetFieldValues, handle, [nvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION])
        if fields is not None and len(fields) and int(fields[0].nvmlReturn) == nvml.NVML_SUCCESS:
            reset_required = int(fields[0].value.uiVal) in _RESET_ACTIONS
        return GpuReport(
            index=index,
            uuid=uuid,
            pci_bus_id=bus,
            xids=self._xids(index),
            ecc_uncorrectable=int(volatile),
            ecc_uncorrectable_aggregate=int(aggregate),
            retired_pages=len(retired) if retired is not None else 0,
            retired_pages_pending=bool(pending),
            remap_pending=bool(remap[2]) if remap is not None else False,
            remap_failed=bool(remap[3]) if remap is not None else False,
            throttle_reasons=reasons,
            temperature_c=float(temperature) if temperature is not None else 0.0,
            slowdown_temperature_c=float(slowdown) if slowdown else None,
            shutdown_temperature_c=float(shutdown) if shutdown else None,
            pcie_generation=int(call(nvml.nvmlDeviceGetCurrPcieLinkGeneration, handle) or 0),
            pcie_max_generation=int(
                call(
                    getattr(nvml, "nvmlDeviceGetGpuMaxPcieLinkGeneration", None)
                    or nvml.nvmlDeviceGetMaxPcieLinkGeneration,
                    handle,
                )
                or 0
            ),
            pcie_width=int(call(nvml.nvmlDeviceGetCurrPcieLinkWidth, handle) or 0),
            pcie_max_width=int(call(nvml.nvmlDeviceGetMaxPcieLinkWidth, handle) or 0),
            nvlinks=self._links(handle),
            reset_required=reset_required,
            pcie_replays=int(call(nvml.nvmlDeviceGetPcieReplayCounter, handle) or 0),
            ecc_correctable=int(corrected),
            ecc_correctable_aggregate=int(corrected_life),
            ecc_uncorrectable_sram=_count(where.get("sram")),
            ecc_uncorrectable_dram=_count(where.get("dram")),
            **self._fabric(handle),
            **(read_aer(self._sysfs, bus) if self._sysfs and bus else {}),
        )

    def _fabric(self, handle: Any) -> dict[str, Any]:
        """The GPU's NVLink fabric registration, where NVML has the call and the GPU one to report."""
        nvml = self._nvml
        info_type = getattr(nvml, "c_nvmlGpuFabricInfo_t", None)
        read = getattr(nvml, "nvmlDeviceGetGpuFabricInfo", None)
        if info_type is None or read is None:
            return {}
        info = info_type()
        if self._call(read, handle, ctypes.byref(info)) is None:
            return {}  # not supported (no NVSwitch fabric), or NVML refused
        state = _FABRIC_STATES.get(int(info.state), "")
        return {"fabric_state": state, "fabric_status": int(info.status)} if state else {}

    def _bit(self, suffix: str, bit: int) -> int:
        """A clock event reason's bit, by the module's name for it where it has one."""
        nvml = self._nvml
        found: Any = getattr(nvml, f"nvmlClocksEventReason{suffix}", None)
        if found is None:
            found = getattr(nvml, f"nvmlClocksThrottleReason{suffix}", bit)
        return int(found)

    def _links(self, handle: Any) -> tuple[NvlinkReport, ...]:
        nvml, call = self._nvml, self._call
        links: list[NvlinkReport] = []
        for link in range(self._nvlinks):
            state = call(nvml.nvmlDeviceGetNvLinkState, handle, link)
            if state is None:
                continue  # the GPU has no such link
            counters = [
                call(nvml.nvmlDeviceGetNvLinkErrorCounter, handle, link, counter) or 0
                for counter in (
                    nvml.NVML_NVLINK_ERROR_DL_CRC_FLIT,
                    nvml.NVML_NVLINK_ERROR_DL_REPLAY,
                    nvml.NVML_NVLINK_ERROR_DL_RECOVERY,
                )
            ]
            links.append(
                NvlinkReport(
                    link=link,
                    active=int(state) == nvml.NVML_FEATURE_ENABLED,
                    crc_errors=int(counters[0]),
                    replay_errors=int(counters[1]),
                    recovery_errors=int(counters[2]),
                )
            )
        return tuple(links)
