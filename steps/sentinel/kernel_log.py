"""XID and SXid lines of the kernel log, as ``dmesg``, ``dmesg -T``, ``journalctl -k``, rsyslog's
``/var/log/kern.log`` and ``/dev/kmsg`` print them, read from the current boot only.

The NVIDIA driver writes ``NVRM: Xid (PCI:0000:1b:00): 79, pid=1234, name=python, GPU has fallen off the
bus.``; the NVSwitch driver ``nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, ...``. What
precedes ``NVRM:`` differs by tool (a timestamp in brackets, a syslog prefix, a kmsg record header) and
is ignored. Many XIDs reach only the kernel log, never NVML's event set. A line that names an Xid but
does not parse is counted and skipped.

Which lines are this boot's. ``/dev/kmsg`` holds only this boot's records. A file (rsyslog's
``kern.log``, a saved ``journalctl -k`` or ``dmesg``) keeps earlier boots and rotates, so the reader
tells the boots apart, line by line, with the boot's identity (:class:`Boot`: the boot id of
``/proc/sys/kernel/random/boot_id`` and the boot time ``btime`` of ``/proc/stat``):

1. A boot marker starts a new boot: the kernel's first line (``Linux version ...``), journald's
   ``-- Boot ID --`` and ``-- Reboot --`` separators, or the kernel's own seconds since boot
   (``[ 1234.567890]``, a kmsg header's microseconds) going backwards. The XIDs of lines before a
   marker whose boot was not known yet belong to an earlier boot.
2. journald's ``-- Boot ID --`` decides at once: this boot's id or not.
3. A line's wall-clock time, where it has one, decides a boot not decided yet, and turns an earlier
   boot into this one once a line is no older than the boot time (less :data:`BOOT_SLACK_S`, for a
   clock that NTP steps after boot): RFC 3339 stamps (rsyslog's ``RSYSLOG_FileFormat``, Ubuntu's
   default since 23.10; ``journalctl -o short-iso``), ``dmesg -T`` stamps, and the traditional syslog
   stamp (``Mar  3 12:00:02``, also ``journalctl -k``'s), which has no year and no zone: it is read in
   the agent's local time zone (``TZ``; UTC in the image), in the latest year that does not put it in
   the future.
4. Seconds since boot larger than this boot's uptime are an earlier boot.
5. A boot nothing decides by the end of what was read (a log with neither markers nor dates, such
   as plain ``dmesg`` output) is taken as this one.

A storm (an application crashing in a loop writes an ``Xid 31`` a second for days) costs bounded memory
and time: appended text is read in chunks of :data:`CHUNK_BYTES`, each parsed and let go; a read stops
once it has spent :data:`READ_BUDGET_S` and the next takes up where it stopped; per device and code the
reader keeps the count and when it first and last read one, and at most 16 distinct wordings.

Rotation: a file replaced under its path (logrotate's ``create``) is finished from ``PATH.1`` when that
is the file read so far, then the new one is read from its start; a file cut short in place
(``copytruncate``) is read again from its start. Where the reader stopped, the boot it had decided and
the XIDs it kept are :meth:`KernelLog.snapshot`, which a restarted agent of the same boot restores
(:mod:`steps.sentinel.state`), so it neither re-reads nor forgets them.
"""

from __future__ import annotations

import datetime as dt
import errno
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "BOOT_SLACK_S",
    "CHUNK_BYTES",
    "KMSG",
    "READ_BUDGET_S",
    "Boot",
    "KernelLog",
    "KernelXid",
    "ParseResult",
    "normalise_pci",
    "parse_lines",
]

KMSG = "/dev/kmsg"
BOOT_SLACK_S = 10.0
"""How much older than the boot time a dated line may be and still be this boot's (clock steps, stamps
cut to the second)."""
CHUNK_BYTES = 1 << 18
"""The most of a file read, parsed and let go at once: a storm's megabytes never sit in memory whole."""
READ_BUDGET_S = 2.0
"""How long one read may go on through a backlog (a first read of a long log, a storm): past it, the
chunk in hand is finished and the rest waits for the next read."""
_PER_CODE = 16
"""Distinct lines kept per device and code: a repeated XID (every crash of one application) is kept
once per wording, and at most this many wordings, so the memory of a boot stays small."""

_LINE = re.compile(
    r"\b(?P<kind>S?Xid) \((?:PCI:)?(?P<pci>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)\): "
    r"(?P<code>\d+)(?:,\s*(?P<message>.*?))?\s*$"
)
_PCI = re.compile(r"^(?:PCI:)?([0-9A-Fa-f]{1,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})(?:\.[0-7])?$")
_FALLEN = re.compile(
    r"NVRM: GPU (?:at )?(?:PCI:)?(?P<pci>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?): "
    r"GPU has fallen off the bus"
)
"""The driver's own line for a GPU lost from the bus (``NVRM: GPU 0000:1b:00.0: GPU has fallen off the
bus.``), which it may write without the Xid 79 line: read as an XID 79, what that code means."""
FALLEN_OFF_THE_BUS = 79


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
    """The XID and SXid lines among ``lines``, and the driver's fallen-off-the-bus line as an XID 79; any
    other line is ignored."""
    found: list[KernelXid] = []
    pcis: dict[str, str] = {}
    bad = 0
    for line in lines:
        if "Xid" not in line:
            fallen = _FALLEN.search(line) if "fallen off the bus" in line else None
            if fallen is not None:
                pci = normalise_pci(fallen.group("pci"))
                found.append(KernelXid("xid", pci, FALLEN_OFF_THE_BUS, "GPU has fallen off the bus"))
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


@dataclass(frozen=True, slots=True)
class Boot:
    """Which boot this is: the kernel's boot id and the boot time.

    Attributes:
        id: ``/proc/sys/kernel/random/boot_id`` (a new one at every boot).
        time: the boot time, seconds since the epoch (``btime`` of ``/proc/stat``).
    """

    id: str
    time: float

    @classmethod
    def read(cls, proc: str | Path = "/proc") -> Boot | None:
        """This machine's boot, or ``None`` when ``proc`` cannot say (no Linux ``/proc``)."""
        root = Path(proc)
        try:
            boot_id = (root / "sys/kernel/random/boot_id").read_text(encoding="ascii").strip()
            stat = (root / "stat").read_text(encoding="ascii")
        except OSError:
            return None
        for line in stat.splitlines():
            if line.startswith("btime "):
                return cls(boot_id, float(line.split()[1]))
        return None

    @property
    def journal_id(self) -> str:
        """The boot id as journald prints it (``-- Boot 5c1e... --``: lower case, no dashes)."""
        return self.id.replace("-", "").lower()


_MONTH_NAMES = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_MONTHS = {name: number for number, name in enumerate(_MONTH_NAMES, 1)}
_PREFIX = re.compile(
    r"^(?:(?P<iso>\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:?\d{2})?)\s"
    r"|(?P<bsd>[A-Z][a-z]{2} [ \d]\d \d{2}:\d{2}:\d{2})\s"
    r"|\[(?P<ctime>[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d{2}:\d{2}:\d{2} \d{4})\]"
    r"|\[\s*(?P<mono>\d+\.\d+)\]"
    r"|\d+,\d+,(?P<usec>\d+),[^;]*;)"
)
_KERNEL_MONO = re.compile(r" kernel: \[\s*(\d+\.\d+)\]")
_LINUX = re.compile(r"(?:^|kernel: |\] |;)Linux version \d")
_JOURNAL_BOOT = re.compile(r"^-- Boot ([0-9a-fA-F]{32}) --\s*$")
_JOURNAL_REBOOT = re.compile(r"^-- Reboot --\s*$")


def _marker(line: str) -> tuple[bool, str | None]:
    """Whether ``line`` starts a boot (the kernel's first line, journald's separators), and the boot id
    journald names there (lower case), if it names one."""
    if line.startswith("-- "):
        journal = _JOURNAL_BOOT.match(line)
        if journal is not None:
            return True, journal.group(1).lower()
        return _JOURNAL_REBOOT.match(line) is not None, None
    return "Linux version " in line and _LINUX.search(line) is not None, None


def _local(year: int, month_name: str, day: int, clock: str) -> float | None:
    """Seconds since the epoch of a local date and ``HH:MM:SS``; ``None`` for an impossible date."""
    month = _MONTHS.get(month_name)
    if month is None:
        return None
    hour, minute, second = (int(p) for p in clock.split(":"))
    try:
        return dt.datetime(year, month, day, hour, minute, second).timestamp()
    except ValueError:
        return None


def _wall(match: re.Match[str], now: float) -> float | None:
    """The wall-clock time of a line whose prefix ``match`` found, or ``None`` where it has none."""
    if match.group("iso"):
        stamp = dt.datetime.fromisoformat(match.group("iso").replace(" ", "T", 1))
        return stamp.timestamp()  # a stamp without a zone is local time, as rsyslog wrote it
    if match.group("bsd"):
        month_name, day, clock = match.group("bsd").split()
        this_year = dt.datetime.fromtimestamp(now).year
        for year in (this_year, this_year - 1):  # the latest year that does not put it in the future
            found = _local(year, month_name, int(day), clock)
            if found is not None and found <= now + 86400:
                return found
        return None
    if match.group("ctime"):
        _, month_name, day, clock, year_text = match.group("ctime").split()
        return _local(int(year_text), month_name, int(day), clock)
    return None


def _mono(match: re.Match[str] | None, line: str) -> float | None:
    """The kernel's seconds since boot that a line carries, or ``None``."""
    if match is not None:
        if match.group("mono"):
            return float(match.group("mono"))
        if match.group("usec"):
            return int(match.group("usec")) / 1e6
    found = _KERNEL_MONO.search(line) if " kernel: [" in line else None
    return float(found.group(1)) if found else None


class KernelLog:
    """The kernel log of this node, read incrementally from this boot: ``/dev/kmsg`` (records since boot,
    then new ones) or a file of ``dmesg``/``journalctl -k``/syslog lines (from where the last read
    stopped, earlier boots' lines skipped as the module says).

    Every distinct XID line of this boot is kept (:attr:`xids`; a line repeated word for word once, at
    most 16 wordings per device and code), so a pass reports the node's XIDs since boot: a reboot is
    what clears them.

    Args:
        path: ``/dev/kmsg`` or a file.
        boot: this boot (default: read from ``/proc``); where it cannot be known, every line of a file
            is taken as this boot's.
        clock: the current time, seconds since the epoch (for this boot's uptime).
    """

    def __init__(
        self,
        path: str | Path = KMSG,
        boot: Boot | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = Path(path)
        self.boot = boot if boot is not None else Boot.read()
        self.clock = clock
        self.xids: list[KernelXid] = []
        self.bad_lines = 0
        self.earlier_boot_lines = 0
        """XID lines skipped because they were written before this boot."""
        self._kept: dict[tuple[str, str, int], list[str]] = {}
        self.seen: dict[tuple[str, str, int], tuple[int, float, float]] = {}
        """Per ``(kind, pci, code)``: how many lines this boot, and when the first and the last were read
        (this machine's clock)."""
        self.monotonic: Callable[[], float] = time.monotonic
        self._offset = 0
        self._inode: int | None = None
        self._seq = -1
        self._current: bool | None = None
        self._by_id = False
        self._last_mono = -1.0
        self._fd: int | None = None

    def read(self) -> ParseResult:
        """Read what was appended since the last call, in chunks, for at most :data:`READ_BUDGET_S`
        (what is left waits for the next call); the XIDs of this boot it newly kept (also in
        :attr:`xids`) and the lines it could not parse.

        Raises:
            OSError: the log cannot be opened or read.
        """
        found = ParseResult()
        ends = self.monotonic() + READ_BUDGET_S
        batches = iter([self._read_kmsg()]) if str(self.path) == KMSG else self._file_batches()
        for lines in batches:
            if str(self.path) != KMSG:
                lines = self._this_boot(lines)
            result = parse_lines(lines)
            found.xids += self._keep(result.xids)
            found.bad_lines += result.bad_lines
            if self.monotonic() >= ends:
                break
        self.bad_lines += found.bad_lines
        return found

    def _keep(self, xids: Iterable[KernelXid], count: bool = True) -> list[KernelXid]:
        """Count each XID and keep it when its wording is new (at most 16 per device and code); the
        XIDs newly kept."""
        kept: list[KernelXid] = []
        now = self.clock()
        for xid in xids:
            key = (xid.kind, xid.pci, xid.code)
            if count:
                seen, first, _ = self.seen.get(key, (0, now, now))
                self.seen[key] = (seen + 1, first, now)
            wordings = self._kept.setdefault(key, [])
            if xid.message in wordings or len(wordings) >= _PER_CODE:
                continue
            wordings.append(xid.message)
            self.xids.append(xid)
            kept.append(xid)
        return kept

    # ----------------------------------------------------------------- which boot

    def _this_boot(self, lines: list[str]) -> list[str]:
        """The lines among ``lines`` that name an Xid and were written in this boot."""
        if self.boot is None:
            return [line for line in lines if "Xid" in line]
        kept: list[str] = []
        pending: list[str] = []  # XID lines of a boot not decided yet
        now = self.clock()
        uptime = now - self.boot.time
        since = self.boot.time - BOOT_SLACK_S
        for line in lines:
            prefix = _PREFIX.match(line)
            mono = _mono(prefix, line)
            marker, journal = _marker(line)
            if mono is not None:
                marker = marker or mono + 1.0 < self._last_mono  # the kernel's clock started again
                self._last_mono = mono
            if marker:
                self.earlier_boot_lines += len(pending)  # a boot began after them: theirs was earlier
                pending = []
                self._current, self._by_id = None, False
                if journal is not None:
                    self._current, self._by_id = journal == self.boot.journal_id, True
            if mono is not None and mono > uptime + BOOT_SLACK_S:
                self._current = False  # longer after its boot than this boot has lasted
            elif self._current is not True and not self._by_id and prefix is not None:
                wall = _wall(prefix, now)
                if wall is not None:
                    self._current = wall >= since
            if self._current is True and pending:
                kept += pending
                pending = []
            elif self._current is False and pending:
                self.earlier_boot_lines += len(pending)
                pending = []
            if "Xid" not in line:
                continue
            if self._current is None:
                pending.append(line)
            elif self._current:
                kept.append(line)
            else:
                self.earlier_boot_lines += 1
        if self._current is None:  # nothing could say: this boot's, as the module says
            self._current = True
            kept += pending
        return kept

    # ----------------------------------------------------------------- reading

    def _file_batches(self) -> Iterator[list[str]]:
        """The lines appended to the file since the last read, a chunk at a time; the offset moves past
        each chunk as it is handed out, so a read stopped between two takes up at the next."""
        stat = self.path.stat()
        if self._inode is not None and stat.st_ino != self._inode:
            rotated = self.path.with_name(self.path.name + ".1")
            try:
                moved = rotated.stat().st_ino == self._inode
            except OSError:
                moved = False
            if moved:  # finish the file read so far, where logrotate moved it (PATH.1)
                for lines, offset in self._chunks(rotated, self._offset, partial=True):
                    self._offset = offset
                    yield lines
            self._offset = 0
        elif stat.st_size < self._offset:  # cut short in place (copytruncate): start again
            self._offset = 0
        self._inode = stat.st_ino
        for lines, offset in self._chunks(self.path, self._offset):
            self._offset = offset
            yield lines

    @staticmethod
    def _chunks(path: Path, offset: int, partial: bool = False) -> Iterator[tuple[list[str], int]]:
        """The whole lines of ``path`` from ``offset``, a chunk of at most about :data:`CHUNK_BYTES` at a
        time, each with the offset after it (and a last partial line when ``partial``: the file will not
        grow any more; else it waits for the next read). A line longer than a chunk is cut."""
        with path.open("rb") as handle:
            handle.seek(offset)
            carry = b""
            while data := handle.read(CHUNK_BYTES):
                data = carry + data
                end = data.rfind(b"\n") + 1 or (len(data) if len(data) >= CHUNK_BYTES else 0)
                carry = data[end:]
                offset += end
                if end:
                    yield data[:end].decode("utf-8", errors="replace").splitlines(), offset
            if partial and carry:
                yield carry.decode("utf-8", errors="replace").splitlines(), offset + len(carry)

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
            fields = header.split(",")
            if len(fields) > 1 and fields[1].isdigit():
                seq = int(fields[1])
                if seq <= self._seq:
                    continue  # read before a restart (the snapshot says how far)
                self._seq = seq
            lines.append(text.split("\n", 1)[0] if header else text)
        return lines

    # ----------------------------------------------------------------- restart

    def snapshot(self) -> dict[str, Any]:
        """Where the reader stands, as JSON-ready data: the log, its inode and offset (a file) or the
        last record's sequence number (``/dev/kmsg``), the boot it decided, and the XIDs it kept."""
        return {
            "path": str(self.path),
            "inode": self._inode,
            "offset": self._offset,
            "seq": self._seq,
            "current": self._current,
            "by_id": self._by_id,
            "mono": self._last_mono,
            "bad_lines": self.bad_lines,
            "earlier_boot_lines": self.earlier_boot_lines,
            "xids": [[x.kind, x.pci, x.code, x.message] for x in self.xids],
            "seen": [[*key, *value] for key, value in sorted(self.seen.items())],
        }

    def restore(self, data: dict[str, Any]) -> bool:
        """Take up where a reader of the same log and the same boot stopped (a :meth:`snapshot`);
        ``False`` (nothing changed) when ``data`` is about another log or does not parse."""
        if data.get("path") != str(self.path):
            return False
        try:
            xids = [KernelXid(str(k), str(p), int(c), str(m)) for k, p, c, m in data.get("xids", [])]
            seen = {
                (str(k), str(p), int(c)): (int(n), float(first), float(last))
                for k, p, c, n, first, last in data.get("seen", [])
            }
            inode = data.get("inode")
            current = data.get("current")
            state = (
                int(inode) if inode is not None else None,
                int(data.get("offset", 0)),
                int(data.get("seq", -1)),
                bool(current) if current is not None else None,
                bool(data.get("by_id", False)),
                float(data.get("mono", -1.0)),
                int(data.get("bad_lines", 0)),
                int(data.get("earlier_boot_lines", 0)),
            )
        except (TypeError, ValueError):
            return False
        (
            self._inode,
            self._offset,
            self._seq,
            self._current,
            self._by_id,
            self._last_mono,
            self.bad_lines,
            self.earlier_boot_lines,
        ) = state
        self.xids, self._kept = [], {}
        self._keep(xids, count=False)
        self.seen = seen
        return True

    def forget(self, pcis: Iterable[str]) -> int:
        """Forget the XIDs kept of the GPUs at ``pcis`` (a GPU reset ends the life they were about): a pass
        no longer reports them, and a new line, even a repeat of a forgotten one, is kept again. Their
        counts stay (:attr:`seen`: the fault history counts a GPU's XIDs across its resets). How many
        were forgotten."""
        gone = {normalise_pci(p) for p in pcis}
        before = len(self.xids)
        self.xids = [x for x in self.xids if not (x.kind == "xid" and x.pci in gone)]
        self._kept = {k: v for k, v in self._kept.items() if not (k[0] == "xid" and k[1] in gone)}
        return before - len(self.xids)

    def close(self) -> None:
        """Close ``/dev/kmsg`` if open."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
