"""This machine's processes, as tests that check nothing outlives what they started read them."""

from __future__ import annotations

from pathlib import Path


def marked(entry: str) -> list[int]:
    """Pids of the processes whose environment holds ``entry`` (``KEY=VALUE``), from ``/proc``."""
    found = []
    for process in Path("/proc").iterdir():
        if not process.name.isdigit():
            continue
        try:
            environ = (process / "environ").read_bytes()
        except OSError:  # gone, or not ours
            continue
        if entry.encode() in environ.split(b"\0"):
            found.append(int(process.name))
    return found
