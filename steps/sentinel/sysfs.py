"""The node's network ports as sysfs shows them: InfiniBand ports and physical Ethernet interfaces.

Everything is read under a root folder (``/sys`` on the node; where the chart mounts the host's ``/sys``
in the agent's pod; a fake tree in tests):

- ``class/infiniband/DEV/ports/N/state`` (``4: ACTIVE``), ``phys_state`` (``5: LinkUp``) and ``rate``
  (``400 Gb/sec (4X NDR)``), and of its ``counters/``: ``link_downed``, ``symbol_error`` and
  ``excessive_buffer_overrun_errors`` (RoCE devices may lack them: then unreported);
- ``class/net/IF/operstate`` (``up``) and ``speed`` (Mbit/s; unreadable or ``-1`` while down), for
  interfaces backed by a device (``class/net/IF/device``) that are not IPoIB (``type`` 32).

And a PCI device's AER counters (``bus/pci/devices/ADDRESS/aer_dev_correctable``, ``aer_dev_nonfatal``,
``aer_dev_fatal``: one ``NAME COUNT`` line per error kind and a ``TOTAL_ERR_...`` line), for the GPUs.

It reports every such port; which of them the NIC probe watches (the fabric's, never a port that was not
up since the agent started) is :class:`steps.sentinel.probes.NicScope`'s to say.
"""

from __future__ import annotations

import re
from pathlib import Path

from steps.cluster.health import NicReport

__all__ = ["read_aer", "read_nics", "sysfs_pci"]

_RATE = re.compile(r"^\s*([0-9.]+)\s*Gb/sec")
_BUS_ID = re.compile(r"^([0-9a-fA-F]{1,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")
_IPOIB = "32"


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _count(path: Path) -> int | None:
    text = _read(path)
    return int(text) if text.isdigit() else None


def _word(text: str) -> str:
    """``ACTIVE`` from ``4: ACTIVE``."""
    return text.partition(":")[2].strip() if ":" in text else text


def _infiniband(root: Path) -> list[NicReport]:
    ports: list[NicReport] = []
    for device in sorted((root / "class" / "infiniband").glob("*")):
        for port in sorted((device / "ports").glob("*"), key=lambda p: (len(p.name), p.name)):
            state, phys = _word(_read(port / "state")), _word(_read(port / "phys_state"))
            rate = _RATE.match(_read(port / "rate"))
            up = state == "ACTIVE" and phys == "LinkUp"
            ports.append(
                NicReport(
                    name=f"{device.name}/{port.name}",
                    kind="infiniband",
                    up=up,
                    state=state,
                    phys_state=phys,
                    speed_gbps=float(rate.group(1)) if rate and up else None,
                    link_downed=_count(port / "counters" / "link_downed"),
                    symbol_errors=_count(port / "counters" / "symbol_error"),
                    buffer_overruns=_count(port / "counters" / "excessive_buffer_overrun_errors"),
                )
            )
    return ports


def _ethernet(root: Path) -> list[NicReport]:
    nics: list[NicReport] = []
    for iface in sorted((root / "class" / "net").glob("*")):
        if not (iface / "device").exists() or _read(iface / "type") == _IPOIB:
            continue
        state = _read(iface / "operstate")
        speed = _read(iface / "speed")
        mbits = int(speed) if speed.lstrip("-").isdigit() else -1
        up = state == "up"
        nics.append(
            NicReport(
                name=iface.name,
                kind="ethernet",
                up=up,
                state=state,
                speed_gbps=mbits / 1000 if up and mbits > 0 else None,
            )
        )
    return nics


def read_nics(root: str | Path = "/sys") -> list[NicReport]:
    """Every InfiniBand port, then every physical Ethernet interface, under ``root``, by name."""
    base = Path(root)
    return _infiniband(base) + _ethernet(base)


def sysfs_pci(bus_id: str) -> str:
    """``0000:1b:00.0`` (sysfs's name) from NVML's ``00000000:1B:00.0``; ``""`` for anything else."""
    found = _BUS_ID.match(bus_id.strip())
    if not found:
        return ""
    domain, bus, device, function = found.groups()
    return f"{int(domain, 16):04x}:{bus}:{device}.{function}".lower()


def _aer_total(path: Path) -> int | None:
    """The ``TOTAL_ERR_...`` count of an AER file (else the sum of its lines); None when unreadable."""
    counts: dict[str, int] = {}
    for line in _read(path).splitlines():
        name, _, count = line.strip().rpartition(" ")
        if name and count.isdigit():
            counts[name.strip()] = int(count)
    if not counts:
        return None
    totals = [value for name, value in counts.items() if name.startswith("TOTAL_ERR")]
    return totals[0] if totals else sum(counts.values())


def read_aer(root: str | Path, bus_id: str) -> dict[str, int | None]:
    """The AER counts of the PCI device ``bus_id`` (NVML's form or sysfs's) under ``root``, as
    :class:`~steps.cluster.health.GpuReport` fields; each None where the kernel shows none."""
    device = Path(root) / "bus" / "pci" / "devices" / (sysfs_pci(bus_id) or bus_id)
    return {
        "aer_correctable": _aer_total(device / "aer_dev_correctable"),
        "aer_nonfatal": _aer_total(device / "aer_dev_nonfatal"),
        "aer_fatal": _aer_total(device / "aer_dev_fatal"),
    }
