"""The remediation ledger: every state change of every node's remediation, with its time.

A goodput report reads it to tell how long each node was out of service and why. It lives in dsx's
namespace as one ConfigMap per node and calendar month (UTC), ``dsx-ledger-<node>-<yyyy-mm>``
(:func:`object_name`: a name past the 253 characters of a DNS subdomain keeps the node's first characters
and a hash of the whole), labelled ``app.kubernetes.io/part-of=dsx``, ``dsx.dev/ledger=true``,
``dsx.dev/node=<node>`` (a hash where the name passes the 63 characters of a label value) and
``dsx.dev/ledger-month=<yyyy-mm>`` (:func:`object_labels`), so that one label selector lists the whole
ledger (:func:`read_all`) or a node's part of it (:func:`entries`). Each is written with optimistic
concurrency through :meth:`~steps.cluster.port.ClusterPort.update_state`. Its data has one key, the node's
name, whose value is a JSON array of entries, oldest first; each entry is an object with:

- ``at``: when (RFC 3339, UTC, to the second);
- ``state``: the node's state after the change: ``requested`` (a remediation was asked for),
  ``refused`` (the guard said no: opted out, breaker open, already escalated), ``superseded`` (the
  fault that started the run no longer stood: another run, named in the detail, handled it), one of the
  ``dsx.dev/state`` values (``quarantined``, ``draining``, ``awaiting-repair``, ``recertifying``,
  ``escalated``), ``in-service`` (certified and back), ``cancelled`` (a person uncordoned the node
  mid-remediation), or ``ended`` (the exit handler: how the workflow ended);
- ``workflow``: the workflow that made the change;
- ``attempt``: the remediation attempt this change belongs to (1, 2...; counted since the node was last
  in service);
- ``check``: the check that started it (``xid``...);
- ``detail``: one line saying why (at most :data:`DETAIL_MAX` characters), and for ``ended`` the
  workflow's phase; a ``requested`` entry started by a HealthEvent ends with ``; observed <RFC 3339>``,
  when the agent saw the fault (Events, which also tell it, age out of the API server after an hour).

A node's history is its objects' arrays one after the other, month by month.

Why one object per node and month: the API server refuses a ConfigMap whose values pass 1 MiB together
(``ValidateConfigMap``: ``core.MaxSecretSize``, 422 ``Too long``), so nothing that grows with the fleet or
with time may live in one object. A remediation writes about eight entries (2 KB), and at the Llama 3
fault rate a node fails 1.4 times a year, so a node's month holds a few KB. One object still keeps at most
:data:`MAX_BYTES` of entries (past that the month's oldest go: a node refused over and over cannot fill
it), and retention is the deletion of whole objects.

Retention: :data:`RETENTION_DAYS` days, or ``$DSX_LEDGER_RETENTION_DAYS`` (the chart's
``remediate.ledger.retentionDays``) when set. A write drops its object's entries older than that, and a
node's first write of a month deletes every ledger object (any node's: a node that no longer fails, or
that is gone) whose month ended longer ago.

Upgrades: the ledger was once one ConfigMap, ``dsx-remediation-ledger`` (:data:`LEGACY_CONFIGMAP`), with
the same arrays under one key per node. It is still read (a node's entries there come first, each once)
and it is migrated on write: a node's first write of a month moves the node's entries within the
retention into their months' objects and removes its key; the same write drops the entries past the
retention of every node, and the ConfigMap goes once it is empty.

The node itself carries the current state in the ``dsx.dev/state`` label and the time it entered it in
the ``dsx.dev/state-since`` annotation.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import re
import sys
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import ValidationError

from steps.cluster import changes
from steps.cluster import vocabulary as vocab
from steps.cluster.errors import ClusterError
from steps.cluster.port import ClusterPort
from steps.errors import InputError
from steps.models import Frozen

__all__ = [
    "DETAIL_MAX",
    "ENDS",
    "IN_SERVICE",
    "LEGACY_CONFIGMAP",
    "MAX_BYTES",
    "OBJECT_PREFIX",
    "REPLACED",
    "RETENTION_DAYS",
    "RETENTION_MAX_DAYS",
    "Entry",
    "attempts",
    "changed_attempts",
    "encode",
    "entries",
    "month_of",
    "node_label",
    "node_object_name",
    "object_labels",
    "object_name",
    "read_all",
    "record",
    "retention_days",
]

LEGACY_CONFIGMAP = "dsx-remediation-ledger"
"""The ledger as it was: one ConfigMap, a key per node (read, and migrated on write)."""
OBJECT_PREFIX = "dsx-ledger-"
MAX_BYTES = 512 * 1024
"""What one object's entries may take, half the API server's 1 MiB (the oldest go first past it)."""
DETAIL_MAX = 4096
"""The longest ``detail`` kept (a longer one is cut)."""
RETENTION_DAYS = 400
"""Days kept unless ``$DSX_LEDGER_RETENTION_DAYS`` says otherwise: a year's report and its month before."""
RETENTION_MAX_DAYS = 3660
IN_SERVICE = "in-service"
REPLACED = "replaced"
"""The node object was deleted while remediation waited on its repair: the machine left the cluster, and a
node of the same name after it is another machine (its attempts, returns and faults start afresh)."""
ENDS = (IN_SERVICE, REPLACED)
"""The entries that end a machine's remediations: back in service, or gone from the cluster."""

_CONFIGMAP = ("v1", "ConfigMap")
_NAME_MAX = 253  # a DNS subdomain
_LABEL_MAX = 63
_HASH = 10
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_MONTH = re.compile(r"^(\d{4})-(0[1-9]|1[0-2])$")


class Entry(Frozen):
    """One state change of a node's remediation (see the module docstring)."""

    at: str
    state: str
    workflow: str = ""
    attempt: int = 0
    check: str = ""
    detail: str = ""


# ----------------------------------------------------------------------------- names and labels


def month_of(moment: dt.datetime) -> str:
    """The month (``yyyy-mm``, UTC) a moment's entry is kept under."""
    return moment.astimezone(dt.UTC).strftime("%Y-%m")


def _month_start(month: str) -> dt.datetime | None:
    match = _MONTH.match(month)
    return dt.datetime(int(match[1]), int(match[2]), 1, tzinfo=dt.UTC) if match else None


def _first_day(moment: dt.datetime) -> dt.datetime:
    """Midnight (UTC) of the first day of the moment's month."""
    return moment.astimezone(dt.UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def _next_month(start: dt.datetime) -> dt.datetime:
    return start.replace(year=start.year + start.month // 12, month=start.month % 12 + 1)


def _digest(node: str) -> str:
    return hashlib.sha256(node.encode()).hexdigest()[:_HASH]


def _dns_head(node: str, room: int) -> str:
    """The node's name made a DNS subdomain prefix of at most ``room`` characters (lower case, each
    dot-separated part starting and ending with a letter or digit)."""
    parts = (re.sub(r"[^a-z0-9-]", "-", p).strip("-") for p in node.lower().split("."))
    return ".".join(p for p in parts if p)[:room].rstrip("-.")


def object_name(node: str, month: str) -> str:
    """The name of ``node``'s ledger object for ``month``: ``dsx-ledger-<node>-<yyyy-mm>`` (see
    :func:`node_object_name`)."""
    return node_object_name(OBJECT_PREFIX, node, f"-{month}")


def node_object_name(prefix: str, node: str, suffix: str = "") -> str:
    """``<prefix><node><suffix>``, or, where that is no DNS subdomain of at most 253 characters, the
    node's first characters and a hash of its name in its place."""
    name = f"{prefix}{node}{suffix}"
    if len(name) <= _NAME_MAX and _DNS_SUBDOMAIN.match(name):
        return name
    room = _NAME_MAX - len(prefix) - len(suffix) - _HASH - 1
    head = _dns_head(node, room)
    return f"{prefix}{head}-{_digest(node)}{suffix}" if head else f"{prefix}{_digest(node)}{suffix}"


def node_label(node: str) -> str:
    """The ``dsx.dev/node`` label value of ``node``'s objects: its name, or, where that is no label value
    (63 characters at most), its first characters and a hash."""
    if len(node) <= _LABEL_MAX and _LABEL_VALUE.match(node):
        return node
    head = re.sub(r"[^-A-Za-z0-9_.]", "-", node)[: _LABEL_MAX - _HASH - 1].strip("-_.")
    return f"{head}-{_digest(node)}" if head else _digest(node)


def object_labels(node: str, month: str) -> dict[str, str]:
    """The labels of ``node``'s ledger object for ``month``."""
    return {
        "app.kubernetes.io/part-of": "dsx",
        vocab.LABEL_LEDGER: "true",
        vocab.LABEL_NODE: node_label(node),
        vocab.LABEL_LEDGER_MONTH: month,
    }


def retention_days(environ: Mapping[str, str] | None = None) -> int:
    """The days the ledger keeps: ``$DSX_LEDGER_RETENTION_DAYS``, else :data:`RETENTION_DAYS`.

    Raises:
        InputError: the variable is not a whole number of days from 1 to :data:`RETENTION_MAX_DAYS`.
    """
    name = vocab.ENV_LEDGER_RETENTION_DAYS
    text = (os.environ if environ is None else environ).get(name, "").strip()
    if not text:
        return RETENTION_DAYS
    days = int(text) if text.isdigit() else 0
    if not 1 <= days <= RETENTION_MAX_DAYS:
        raise InputError(
            f"{name}={text!r}: the ledger's retention is a whole number of days from 1 to "
            f"{RETENTION_MAX_DAYS} (the chart value remediate.ledger.retentionDays)"
        )
    return days


# ----------------------------------------------------------------------------- values


def _decode(text: str | None) -> list[dict[str, Any]]:
    """An object's value as stored: the JSON objects of its array (nothing, when it is not one)."""
    try:
        raw: Any = json.loads(text or "[]")
    except ValueError:
        return []
    return [e for e in raw if isinstance(e, dict)] if isinstance(raw, list) else []


def encode(batch: Iterable[Mapping[str, Any]]) -> str:
    """A node's entries as an object's value: a compact JSON array, oldest first, of at most
    :data:`MAX_BYTES` (the oldest are dropped until it fits; the newest is always kept)."""
    parts = [json.dumps(dict(e), separators=(",", ":")) for e in batch]  # ASCII: a character is a byte
    size = 1 + sum(len(p) + 1 for p in parts)
    start = 0
    while size > MAX_BYTES and start < len(parts) - 1:
        size -= len(parts[start]) + 1
        start += 1
    return "[" + ",".join(parts[start:]) + "]"


def _recent(entry: Mapping[str, Any], horizon: dt.datetime) -> bool:
    """Whether an entry is within the retention (one whose time cannot be read is kept)."""
    try:
        return changes.parse_time(str(entry.get("at"))) >= horizon
    except ValueError:
        return True


def _identity(entry: Mapping[str, Any]) -> str:
    return json.dumps(entry, sort_keys=True, separators=(",", ":"))


def _history(legacy: list[dict[str, Any]], months: Iterable[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """A node's entries: those of the old ConfigMap not migrated yet, then each month's in order."""
    later = [e for chunk in months for e in chunk]
    if not legacy:
        return later
    migrated = {_identity(e) for e in later}
    return [*(e for e in legacy if _identity(e) not in migrated), *later]


def _objects(port: ClusterPort, selector: str) -> list[dict[str, Any]]:
    """Ledger objects matching ``selector``, oldest month first."""

    def month(obj: Mapping[str, Any]) -> tuple[str, str]:
        meta = obj.get("metadata") or {}
        return (meta.get("labels") or {}).get(vocab.LABEL_LEDGER_MONTH, ""), str(meta.get("name", ""))

    return sorted(port.list_objects(*_CONFIGMAP, port.namespace, selector), key=month)


# ----------------------------------------------------------------------------- reading


def _checked(text: str | None, where: str, problems: list[str] | None) -> list[dict[str, Any]]:
    """:func:`_decode`, saying in ``problems`` what it passed over: a value that is no JSON array, an
    element that is no object."""
    found = _decode(text)
    if problems is not None and text:
        try:
            raw: Any = json.loads(text)
        except ValueError:
            raw = None
        if not isinstance(raw, list):
            problems.append(f"{where}: not a JSON array of entries; skipped")
        elif len(raw) != len(found):
            problems.append(f"{where}: {len(raw) - len(found)} element(s) that are no entry; skipped")
    return found


def read_all(port: ClusterPort, problems: list[str] | None = None) -> dict[str, list[dict[str, Any]]]:
    """Every node's entries as stored (plain JSON objects, unchecked), oldest first, by node name: every
    ledger object (one label selector) and the old single ConfigMap. A value that is not a JSON array of
    objects is passed over, and said in ``problems`` when given."""
    months: dict[str, list[list[dict[str, Any]]]] = {}
    for obj in _objects(port, f"{vocab.LABEL_LEDGER}=true"):
        name = str((obj.get("metadata") or {}).get("name", ""))
        for node, text in sorted((obj.get("data") or {}).items()):
            months.setdefault(node, []).append(_checked(text, f"ConfigMap {name}, node {node}", problems))
    legacy = port.get_state(LEGACY_CONFIGMAP)
    return {
        n: _history(
            _checked(legacy.get(n), f"ConfigMap {LEGACY_CONFIGMAP}, node {n}", problems), months.get(n, [])
        )
        for n in sorted({*months, *legacy})
    }


def _raw(port: ClusterPort, node: str) -> list[dict[str, Any]]:
    selector = f"{vocab.LABEL_LEDGER}=true,{vocab.LABEL_NODE}={node_label(node)}"
    months = [_decode(data[node]) for o in _objects(port, selector) if node in (data := o.get("data") or {})]
    return _history(_decode(port.get_state(LEGACY_CONFIGMAP).get(node)), months)


def entries(port: ClusterPort, node: str) -> list[Entry]:
    """The node's entries, oldest first (none when it has none; an entry that is not one, edited into
    something else, is passed over)."""
    found: list[Entry] = []
    for raw in _raw(port, node):
        try:
            found.append(Entry.model_validate(raw))
        except ValidationError:
            continue
    return found


def attempts(history: list[Entry]) -> int:
    """The remediation attempts since the node was last in service, or replaced (the highest attempt number
    since)."""
    since = [e for e in history[::-1]]
    count = 0
    for entry in since:
        if entry.state in ENDS:
            break
        count = max(count, entry.attempt)
    return count


def changed_attempts(history: list[Entry]) -> int:
    """The remediation attempts since the node was last in service that changed the node: those that
    reached a remediation state (quarantined and after) or were cancelled by a person taking the cordoned
    node back. An attempt stopped before its quarantine (the workflow stopped, the pod lost) changed
    nothing and counts for nothing against ``max-attempts``."""
    changing = {s.value for s in vocab.NodeState} | {"cancelled"}
    counted: set[int] = set()
    for entry in reversed(history):
        if entry.state in ENDS:
            break
        if entry.state in changing:
            counted.add(entry.attempt)
    return len(counted)


# ----------------------------------------------------------------------------- writing


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
    """Append an entry for ``node`` to its object of the month and return it. The same change written
    twice in a row by the same workflow (a retried step) is kept once in a month's object.

    The node's first entry of a month also keeps the ledger within its retention (the old ConfigMap's
    entries of the node migrated, objects of months past the retention deleted); that is best-effort,
    and a failure of it is told on stderr, never the step's.

    Raises:
        InputError: ``$DSX_LEDGER_RETENTION_DAYS`` is malformed.
        ClusterError: the entry could not be written.
    """
    moment = (now or dt.datetime.now(dt.UTC)).astimezone(dt.UTC)
    entry = Entry(
        at=changes.format_time(moment),
        state=state,
        workflow=workflow,
        attempt=attempt,
        check=check,
        detail=detail[:DETAIL_MAX],
    )
    horizon = moment - dt.timedelta(days=retention_days())
    month = month_of(moment)
    first: list[bool] = []

    def change(data: dict[str, str]) -> dict[str, str]:
        history = _decode(data.get(node))
        first[:] = [not history]
        last = history[-1] if history else None
        if last is not None and (last.get("state"), last.get("workflow", ""), last.get("detail", "")) == (
            state,
            workflow,
            entry.detail,
        ):
            return data
        history.append(entry.model_dump())
        return {**data, node: encode(e for e in history if _recent(e, horizon))}

    port.update_state(object_name(node, month), change, labels=object_labels(node, month))
    if first and first[0]:
        try:
            _migrate(port, node, month, horizon)
            _sweep(port, moment, horizon)
        except ClusterError as exc:
            print(f"ledger: keeping {node}'s ledger within its retention failed: {exc}", file=sys.stderr)
    return entry


def _merge_month(port: ClusterPort, node: str, month: str, batch: list[dict[str, Any]]) -> None:
    """Put entries of ``month`` into the node's object for it, before those it has, each once."""

    def change(data: dict[str, str]) -> dict[str, str]:
        have = _decode(data.get(node))
        kept = {_identity(e) for e in have}
        return {**data, node: encode([*(e for e in batch if _identity(e) not in kept), *have])}

    port.update_state(object_name(node, month), change, labels=object_labels(node, month))


def _migrate(port: ClusterPort, node: str, month: str, horizon: dt.datetime) -> None:
    """Move the node's entries out of the old single ConfigMap into their months' objects (one whose time
    cannot be read into ``month``'s), drop every node's entries there past the retention, and delete the
    ConfigMap once nothing is left in it."""
    legacy = port.get_state(LEGACY_CONFIGMAP)
    if not legacy:
        return
    by_month: dict[str, list[dict[str, Any]]] = {}
    for e in _decode(legacy.get(node)):
        if _recent(e, horizon):
            try:
                of = month_of(changes.parse_time(str(e.get("at"))))
            except ValueError:
                of = month
            by_month.setdefault(of, []).append(e)
    for of, batch in sorted(by_month.items()):
        _merge_month(port, node, of, batch)

    def change(data: dict[str, str]) -> dict[str, str]:
        left: dict[str, str] = {}
        for key, text in data.items():
            if key == node:
                continue
            stored = _decode(text)
            kept = [e for e in stored if _recent(e, horizon)]
            if kept:
                left[key] = text if len(kept) == len(stored) else encode(kept)
        return left

    if not port.update_state(LEGACY_CONFIGMAP, change):
        port.delete_object(*_CONFIGMAP, LEGACY_CONFIGMAP, port.namespace)


def _sweep(port: ClusterPort, moment: dt.datetime, horizon: dt.datetime) -> None:
    """Delete every ledger object whose month ended before ``horizon``. The API server lists only the
    objects of other months than those kept (a ``notin`` selector), so a sweep reads little."""
    kept, month, last = [], _first_day(horizon), _next_month(_next_month(_first_day(moment)))
    while month < last:  # to the month after this one: a clock a little ahead keeps its entries
        kept.append(month_of(month))
        month = _next_month(month)
    selector = f"{vocab.LABEL_LEDGER}=true,{vocab.LABEL_LEDGER_MONTH} notin ({','.join(kept)})"
    for obj in port.list_objects(*_CONFIGMAP, port.namespace, selector):
        meta = obj.get("metadata") or {}
        began = _month_start(str((meta.get("labels") or {}).get(vocab.LABEL_LEDGER_MONTH, "")))
        if began is not None and _next_month(began) <= horizon:
            port.delete_object(*_CONFIGMAP, str(meta["name"]), port.namespace)
