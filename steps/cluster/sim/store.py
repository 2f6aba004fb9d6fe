"""Where a simulated fleet lives: in this process, or in a JSON file several processes share.

A :class:`FileStore` serves every request under an exclusive ``fcntl`` lock on ``PATH.lock``,
re-reading the file when another process changed it and writing it back when the request changed
the fleet, so the steps of a local workflow run (each in its own process) act on one fleet as the
pods of an Argo workflow act on one cluster. Its call log is appended to ``PATH.calls.jsonl``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

from pydantic import ValidationError

from steps.cluster.errors import ClusterConfigError
from steps.cluster.sim.model import CallRecord, Fleet

__all__ = ["FileStore", "FleetStore", "MemoryStore", "write_fleet"]


class FleetStore(Protocol):
    """Access to one fleet, one request at a time."""

    def transaction(self, write: bool = True) -> contextlib.AbstractContextManager[Fleet]:
        """The fleet, exclusively, for one request; changes made to it are kept.

        ``write=False`` promises only reads, apart from the API-fault counters and the log.
        """
        ...

    def describe(self) -> str:
        """Where the fleet lives, for reports."""
        ...

    def append_log(self, record: CallRecord) -> None:
        """Add an entry to the call log (its ``seq`` is assigned here)."""
        ...

    def read_log(self) -> list[CallRecord]:
        """The call log, oldest first."""
        ...


class MemoryStore:
    """A fleet held in this process (thread-safe)."""

    def __init__(self, fleet: Fleet) -> None:
        self._fleet = fleet
        self._lock = threading.RLock()

    @contextlib.contextmanager
    def transaction(self, write: bool = True) -> Iterator[Fleet]:
        """The fleet, under a lock."""
        with self._lock:
            yield self._fleet

    def describe(self) -> str:
        """The spec the fleet was built from."""
        return self._fleet.spec or "sim"

    def append_log(self, record: CallRecord) -> None:
        """Add an entry to the fleet's log."""
        with self._lock:
            self._fleet.append_log(record.model_copy(update={"seq": self._fleet.next_seq()}))

    def read_log(self) -> list[CallRecord]:
        """The fleet's log."""
        with self._lock:
            return [r.model_copy(deep=True) for r in self._fleet.log]


def write_fleet(fleet: Fleet, path: Path, text: str | None = None) -> None:
    """Write the fleet (or its JSON ``text``, when already made) to ``path`` atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(fleet.model_dump_json() if text is None else text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _fingerprint(fleet: Fleet) -> tuple[int, int, int, str]:
    """What a read-only request may still change: the revision, the log, the API-fault counters."""
    return fleet.revision, len(fleet.log), fleet.dropped_calls, fleet.api.model_dump_json()


class FileStore:
    """A fleet persisted as JSON at ``path``, shared by every process that opens it.

    The file is parsed again only when another process has replaced it since this one last read or
    wrote it (its inode, modification time and size differ), and written only when something changed.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        if not path.exists():
            raise ClusterConfigError(f"connect: fleet state {path} does not exist")
        self._lock_path = path.with_name(path.name + ".lock")
        self._thread_lock = threading.RLock()
        self._cache: tuple[tuple[int, int, int], Fleet, str] | None = None

    def _signature(self) -> tuple[int, int, int]:
        stat = self.path.stat()
        return stat.st_ino, stat.st_mtime_ns, stat.st_size

    def _load(self) -> tuple[Fleet, str]:
        try:
            signature = self._signature()
            if self._cache is not None and self._cache[0] == signature:
                return self._cache[1], self._cache[2]
            raw = self.path.read_text()
            return Fleet.model_validate_json(raw), raw
        except (OSError, ValidationError, ValueError) as exc:
            first = str(exc).splitlines()[0]
            raise ClusterConfigError(f"connect: fleet state {self.path} is unreadable: {first}") from None

    @contextlib.contextmanager
    def transaction(self, write: bool = True) -> Iterator[Fleet]:
        """Lock the file, read the fleet, hand it out, write it back if it changed."""
        with self._thread_lock, open(self._lock_path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                fleet, raw = self._load()
                before = None if write else _fingerprint(fleet)
                try:
                    yield fleet
                finally:
                    if before is None or _fingerprint(fleet) != before:
                        text = fleet.model_dump_json()
                        if text != raw:
                            write_fleet(fleet, self.path, text)
                            raw = text
                    self._cache = (self._signature(), fleet, raw)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def describe(self) -> str:
        """``state:PATH``."""
        return f"state:{self.path}"

    @property
    def log_path(self) -> Path:
        """Where the call log is kept: ``PATH.calls.jsonl``, one JSON record a line."""
        return self.path.with_name(self.path.name + ".calls.jsonl")

    def append_log(self, record: CallRecord) -> None:
        """Append a line to the log file (one ``O_APPEND`` write: processes never interleave lines)."""
        line = (record.model_dump_json() + "\n").encode()
        fd = os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)

    def read_log(self) -> list[CallRecord]:
        """Every line of the log file, numbered in order."""
        if not self.log_path.exists():
            return []
        lines = self.log_path.read_text().splitlines()
        return [
            CallRecord.model_validate_json(line).model_copy(update={"seq": n})
            for n, line in enumerate(lines, start=1)
        ]
