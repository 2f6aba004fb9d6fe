"""The node's network ports as sysfs shows them: InfiniBand ports and physical Ethernet interfaces.

Everything is read under a root folder (``/sys`` on the node; where the chart mounts the host's ``/sys``
in the agent's pod; a fake tree in tests):

- ``class/infiniband/DEV/ports/N/state`` (``4: ACTIVE``), ``phys_state`` (``5: LinkUp``) and ``rate``
  (``400 Gb/sec (4X NDR)``), and of its ``counters/``: ``link_downed``, ``symbol_error`` and
  ``excessive_buffer_overrun_errors`` (RoCE devices may lack them: then unreported);
- ``class/net/IF/operstate`` (``up``) and ``speed`` (Mbit/s; unreadable or ``-1`` while down), for
  interfaces backed by a device (``class/net/IF/device``) that are not IPoIB (``type`` 32).

It reports every such port; which of them the NIC probe watches (the fabric's, never a port that was not
up since the agent started) is :class:`steps.sentinel.probes.NicScope`'s to say.
"""

from __future__ import annotations

import re
from pathlib import Path

from steps.cluster.health import NicReport

__all__ = ["read_nics"]

_RATE = re.compile(r"^\s*([0-9.]+)\s*Gb/sec")
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
