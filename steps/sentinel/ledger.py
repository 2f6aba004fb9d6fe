"""The remediation ledger: every state change of every node's remediation, with its time.

A goodput report reads it to tell how long each node was out of service and why. It lives in the
ConfigMap ``dsx-remediation-ledger`` in dsx's namespace (written with optimistic concurrency through
:meth:`~steps.cluster.port.ClusterPort.update_state`), one key per node, whose value is a JSON array of
entries, oldest first; each entry is an object with:

- ``at``: when (RFC 3339, UTC, to the second);
- ``state``: the node's state after the change: ``requested`` (a remediation was asked for),
  ``refused`` (the guard said no: opted out, breaker open, already escalated), one of the
  ``dsx.dev/state`` values (``quarantined``, ``draining``, ``awaiting-repair``, ``recertifying``,
  ``escalated``), ``in-service`` (certified and back), ``cancelled`` (a person uncordoned the node
  mid-remediation), or ``ended`` (the exit handler: how the workflow ended);
- ``workflow``: the workflow that made the change;
- ``attempt``: the remediation attempt this change belongs to (1, 2...; counted since the node was last
  in service);
- ``check``: the check that started it (``xid``...);
- ``detail``: one line saying why, and for ``ended`` the workflow's phase; a ``requested`` entry started
  by a HealthEvent ends with ``; observed <RFC 3339>``, when the agent saw the fault (Events, which
  also tell it, age out of the API server after an hour).

Each node keeps its last :data:`KEEP` entries (a ConfigMap holds at most 1 MiB). The node itself
carries the current state in the ``dsx.dev/state`` label and the time it entered it in the
``dsx.dev/state-since`` annotation.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from steps.cluster import changes
from steps.cluster.port import ClusterPort
from steps.models import Frozen

__all__ = ["IN_SERVICE", "KEEP", "LEDGER_CONFIGMAP", "Entry", "attempts", "entries", "record"]

LEDGER_CONFIGMAP = "dsx-remediation-ledger"
KEEP = 200
IN_SERVICE = "in-service"


class Entry(Frozen):
    """One state change of a node's remediation (see the module docstring)."""

    at: str
    state: str
    workflow: str = ""
    attempt: int = 0
    check: str = ""
    detail: str = ""


def _read(data: dict[str, str], node: str) -> list[Entry]:
    try:
        raw: Any = json.loads(data.get(node) or "[]")
    except ValueError:
        return []
    return [Entry.model_validate(e) for e in raw if isinstance(e, dict)] if isinstance(raw, list) else []


def entries(port: ClusterPort, node: str) -> list[Entry]:
    """The node's entries, oldest first (none when the ledger or the key is absent or unreadable)."""
    return _read(port.get_state(LEDGER_CONFIGMAP), node)


def attempts(history: list[Entry]) -> int:
    """The remediation attempts since the node was last in service (the highest attempt number since)."""
    since = [e for e in history[::-1]]
    count = 0
    for entry in since:
        if entry.state == IN_SERVICE:
            break
        count = max(count, entry.attempt)
    return count


def record(
    port: ClusterPort,
    node: str,
    state: str,
    *,
    workflow: str = "",
    attempt: int = 0,
    check: str = "",
    detail: str = "",
    now: dt.datetime | None = None,
) -> Entry:
    """Append an entry for ``node`` and return it. The same change written twice in a row by the same
    workflow (a retried step) is kept once."""
    entry = Entry(
        at=changes.format_time(now or dt.datetime.now(dt.UTC)),
        state=state,
        workflow=workflow,
        attempt=attempt,
        check=check,
        detail=detail,
    )

    def change(data: dict[str, str]) -> dict[str, str]:
        history = _read(data, node)
        last = history[-1] if history else None
        if last is not None and (last.state, last.workflow, last.detail) == (state, workflow, detail):
            return data
        history.append(entry)
        data[node] = json.dumps([e.model_dump() for e in history[-KEEP:]], separators=(",", ":"))
        return data

    port.update_state(LEDGER_CONFIGMAP, change)
    return entry
