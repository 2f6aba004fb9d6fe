"""The agent's state on its node: what it reported and how far it read, kept across restarts of the agent
within one boot, never across a reboot.

A restarted agent (a rollout, an OOM kill, a failed liveness probe) would otherwise start from nothing:
read the kernel log of the boot again and report every XID in it a second time (Warning Events, the
taint path), forget the XIDs that NVML's event set delivered (it delivers only new ones) and clear
their condition, and lose the writes it had queued while the API server was away, the taint among them.

One JSON file, :data:`FILE_NAME` in a directory of the node (the chart mounts ``sentinel.stateDir`` from
the host), holds:

- ``boot_id``: the boot it was written in (``/proc/sys/kernel/random/boot_id``) and ``node``: whose it
  is. A file of another boot or node is ignored: XIDs clear at reboot, and the node's conditions say
  the rest.
- ``agent``: :meth:`steps.sentinel.agent.Agent.snapshot` (the faults in force, the writes not delivered).
- ``kernel_log``: :meth:`steps.sentinel.kernel_log.KernelLog.snapshot` (the log's inode and offset, or
  ``/dev/kmsg``'s last sequence number, and the XIDs of this boot it kept).
- ``nvml_xids``: the XIDs NVML's event set delivered, per GPU index.
- ``xid_history``: :meth:`steps.sentinel.history.XidHistory.snapshot` (the kernel log's XID lines per GPU
  and code over time, for the fault history's rules; ``dsx sentinel history`` reads it).
- ``counters``: :meth:`steps.sentinel.rates.CounterRates.snapshot` (the GPUs' and ports' error counters
  over the last hour, so a restart neither loses a climbing rate nor clears its condition).

A write goes to a temporary file in the same directory, is flushed to disk and renamed over the old one,
so a crash leaves the old file or the new one, never half of one; a file that does not parse is said
and ignored. The file is written only when what it would hold changed.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["FILE_NAME", "StateFile"]

FILE_NAME = "sentinel-state.json"
_VERSION = 1


class StateFile:
    """The state file of one node's agent in one boot.

    Args:
        directory: where the file lives (created if missing).
        node: the node's name.
        boot_id: this boot's id.
    """

    def __init__(self, directory: str | Path, node: str, boot_id: str) -> None:
        self.path = Path(directory) / FILE_NAME
        self.node = node
        self.boot_id = boot_id
        self._written: str | None = None
        self._warned: set[str] = set()

    def _warn(self, text: str) -> None:
        if text not in self._warned:  # once per distinct problem, not on every pass
            self._warned.add(text)
            print(f"warning: sentinel: state {self.path}: {text}", file=sys.stderr)

    def load(self) -> dict[str, Any] | None:
        """What the agent of this node kept in this boot (the ``agent``, ``kernel_log``, ``xid_history``
        and ``nvml_xids`` parts), or ``None``: no file, another boot's or node's, or one that does not
        parse (said on stderr)."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except OSError as exc:
            self._warn(f"not read: {exc}")
            return None
        try:
            data = json.loads(text)
        except ValueError as exc:
            self._warn(f"ignored, not JSON: {exc}")
            return None
        if not isinstance(data, dict) or data.get("version") != _VERSION:
            self._warn("ignored, not a state file this agent writes")
            return None
        if data.get("boot_id") != self.boot_id or data.get("node") != self.node:
            return None  # another boot (or node): nothing of it holds now
        self._written = text
        return data

    def save(self, parts: dict[str, Any]) -> bool:
        """Write ``parts`` (with this boot and node) atomically, unless the file already says exactly
        that; whether it was written. A failure is said on stderr, never raised: the agent goes on."""
        data = {"version": _VERSION, "node": self.node, "boot_id": self.boot_id, **parts}
        text = json.dumps(data, sort_keys=True, separators=(",", ":")) + "\n"
        if text == self._written:
            return False
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, temp = tempfile.mkstemp(prefix=f".{FILE_NAME}.", dir=self.path.parent)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as handle:
                    handle.write(text)
                    handle.flush()
                    os.fsync(handle.fileno())
                os.replace(temp, self.path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temp)
                raise
        except OSError as exc:
            self._warn(f"not written: {exc}")
            return False
        self._written = text
        return True
