"""XID and SXid lines of the kernel log, as ``dmesg``, ``dmesg -T``, ``journalctl -k`` and
``/dev/kmsg`` print them.

The NVIDIA driver writes ``NVRM: Xid (PCI:0000:1b:00): 79, pid=1234, name=python, GPU has fallen off the
bus.``; the NVSwitch driver ``nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, ...``. What
precedes ``NVRM:`` differs by tool (a timestamp in brackets, a syslog prefix, a kmsg record header) and
is ignored. Many XIDs reach only the kernel log, never NVML's event set. A line that names an Xid but
does not parse is counted and skipped.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["KMSG", "KernelLog", "KernelXid", "ParseResult", "normalise_pci", "parse_lines"]

KMSG = "/dev/kmsg"

_LINE = re.compile(
    r"\b(?P<kind>S?Xid) \((?:PCI:)?(?P<pci>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)\): "
    r"(?P<code>\d+)(?:,\s*(?P<message>.*?))?\s*$"
)
_PCI = re.compile(r"^(?:PCI:)?([0-9A-Fa-f]{1,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})(?:\.[0-7])?$")


def normalise_pci(address: str) -> str:
    """A PCI address as the kernel log writes it for a GPU: ``0000:1b:00`` (four-digit domain, lower
    case, no function), from NVML's ``00000000:1B:00.0`` or the log's own forms; ``""`` if malformed."""
    match = _PCI.match(address.strip())
    if match is None:
        return ""
    domain, bus, device = match.groups()
    return f"{int(domain, 16):04x}:{bus.lower()}:{device.lower()}"


@dataclass(frozen=True, slots=True)
class KernelXid:
    """One XID or SXid line.

    Attributes:
        kind: ``xid`` (a GPU) or ``sxid`` (an NVSwitch).
        pci: the device's PCI address, normalised (:func:`normalise_pci`).
        code: the XID or SXid number.
        message: the rest of the line after the code.
    """

    kind: str
    pci: str
    code: int
    message: str = ""


@dataclass
class ParseResult:
    """What a batch of kernel-log lines held: the XIDs in order and the count of lines that named an Xid
    but did not parse. (Plain dataclasses: a busy log has many lines, and validation would cost more
    than the parse.)"""

    xids: list[KernelXid] = field(default_factory=list)
    bad_lines: int = 0


def parse_lines(lines: Iterable[str]) -> ParseResult:
    """The XID and SXid lines among ``lines``; any other line is ignored."""
    found: list[KernelXid] = []
    pcis: dict[str, str] = {}
    bad = 0
    for line in lines:
        if "Xid" not in line:
            continue
        match = _LINE.search(line)
        if match is None:
            bad += 1
            continue
        pci = match.group("pci")
        found.append(
            KernelXid(
                match.group("kind").lower(),
                pcis.get(pci) or pcis.setdefault(pci, normalise_pci(pci)),
                int(match.group("code")),
                (match.group("message") or "").strip(),
            )
        )
    return ParseResult(xids=found, bad_lines=bad)


class KernelLog:
    """The kernel log of this node, read incrementally: ``/dev/kmsg`` (records since boot, then new
    ones) or a file of ``dmesg``/``journalctl -k`` lines (read from where the last pass stopped).

    Every XID seen since the reader started is kept (:attr:`xids`), so a pass reports the node's XIDs
    since boot: a reboot is what clears them.
    """

    def __init__(self, path: str | Path = KMSG) -> None:
        self.path = Path(path)
        self.xids: list[KernelXid] = []
        self.bad_lines = 0
        self._offset = 0
        self._fd: int | None = None

    def read(self) -> ParseResult:
        """Read what was appended since the last call; the XIDs it held (also added to :attr:`xids`).

        Raises:
            OSError: the log cannot be opened or read.
        """
        lines = self._read_kmsg() if str(self.path) == KMSG else self._read_file()
        result = parse_lines(lines)
        self.xids.extend(result.xids)
        self.bad_lines += result.bad_lines
        return result

    def _read_file(self) -> list[str]:
        size = self.path.stat().st_size
        if size < self._offset:  # the file was rotated or truncated: start again
            self._offset = 0
        with self.path.open("rb") as handle:
            handle.seek(self._offset)
            data = handle.read()
        end = data.rfind(b"\n") + 1  # a partial last line waits for the next pass
        self._offset += end
        return data[:end].decode("utf-8", errors="replace").splitlines()

    def _read_kmsg(self) -> list[str]:
        if self._fd is None:
            self._fd = os.open(KMSG, os.O_RDONLY | os.O_NONBLOCK)
        lines: list[str] = []
        while True:
            try:
                record = os.read(self._fd, 8192)  # one record per read
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # records overwritten before we read them: go on
                    continue
                raise
            if not record:
                break
            header, _, text = record.decode("utf-8", errors="replace").partition(";")
            lines.append(text.split("\n", 1)[0] if header else text)
        return lines

    def close(self) -> None:
        """Close ``/dev/kmsg`` if open."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
