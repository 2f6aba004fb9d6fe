"""What the goodput report reads about each node, through the cluster port: its remediation ledger
entries, its state and certification marks, and the Events and conditions that say when a fault was
observed (see :mod:`steps.sentinel.goodput.ledger_report` for how they are accounted for).
"""

from __future__ import annotations

import datetime as dt
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from steps.cluster import vocabulary as vocab
from steps.cluster.port import NODE_EVENT_NAMESPACE, ClusterPort, Node

__all__ = ["NodeStory", "Observation", "Verdict", "parse_at", "read_stories", "stamp"]

_CHECK_OF_CONDITION = {condition: check for check, condition in vocab.CONDITION_SENTINEL.items()}
_XID = re.compile(r"\bxid\s*(\d+)", re.IGNORECASE)
_OBSERVED = re.compile(r"\bobserved (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)")
_VERDICT_EVENTS = {"DsxCertificationPassed": "passed", "DsxCertificationFailed": "failed"}


@dataclass(frozen=True)
class Observation:
    """The agent saw a fault: a Warning Event or a ``True`` condition of a sentinel check."""

    at: float
    check: str
    code: str = ""


@dataclass(frozen=True)
class Verdict:
    """A certification verdict written on the node (``passed`` or ``failed``), with its reason."""

    at: float
    status: str
    reason: str = ""


@dataclass
class NodeStory:
    """Everything read about one node, times as Unix seconds."""

    name: str
    gpus: int
    ledger: list[Mapping[str, Any]] = field(default_factory=list)
    """The node's ledger entries as stored (``at``, ``state``, ``attempt``, ``check``...), oldest first."""
    state: str = ""
    state_since: float | None = None
    observations: list[Observation] = field(default_factory=list)
    verdicts: list[Verdict] = field(default_factory=list)
    """Certification verdicts, oldest first (the Events and the label now)."""
    warnings: list[str] = field(default_factory=list)
    """Ledger entries passed over, each named with why (:func:`sound_ledger`)."""


def parse_at(text: Any) -> float | None:
    """An RFC 3339 time as Unix seconds (no offset: UTC); ``None`` when it is none."""
    if not isinstance(text, str) or not text:
        return None
    try:
        moment = dt.datetime.fromisoformat(text)  # RFC 3339 with Z reads since Python 3.11
    except ValueError:
        return None
    return (moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)).timestamp()


def stamp(at: float) -> str:
    """RFC 3339 in UTC to the second, as :func:`steps.cluster.changes.format_time` writes it."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


def _eventparse_at(event: Mapping[str, Any]) -> float | None:
    meta = event.get("metadata") or {}
    for text in (event.get("firstTimestamp"), event.get("eventTime"), meta.get("creationTimestamp")):
        at = parse_at(text)
        if at is not None:
            return at
    return None


FUTURE_SKEW_S = 300.0
"""How far ahead of this machine's clock a ledger entry may be (clocks of pods differ) before it is a
future time, passed over."""


def _attempt_ok(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return 0 <= value < 10**6
    return value is None or (isinstance(value, str) and value.isdigit() and len(value) < 7)


def sound_ledger(
    node: str, entries: Iterable[Mapping[str, Any]], now: float
) -> tuple[list[Mapping[str, Any]], list[str]]:
    """The node's ledger entries the report can count, oldest first, and a warning naming each one passed
    over: a time it cannot read or one in the future, an attempt that is no whole number, no state, or
    a time before the entry kept before it (a pod's skewed clock, an edit), which would make a negative
    duration."""
    kept: list[Mapping[str, Any]] = []
    warnings: list[str] = []
    last = float("-inf")
    for index, entry in enumerate(entries):
        at = parse_at(entry.get("at"))
        why = ""
        if at is None:
            why = f"time {entry.get('at')!r} is no RFC 3339 time"
        elif at > now + FUTURE_SKEW_S:
            why = f"time {entry.get('at')} is in the future"
        elif not _attempt_ok(entry.get("attempt")):
            why = f"attempt {entry.get('attempt')!r} is no whole number"
        elif not isinstance(entry.get("state"), str) or not entry.get("state"):
            why = f"state {entry.get('state')!r} is no state"
        elif at < last:
            why = f"time {entry.get('at')} is before the entry before it ({stamp(last)})"
        if why:
            warnings.append(f"ledger of {node}, entry {index + 1} ({entry.get('state')!r}): {why}; skipped")
            continue
        last = at if at is not None else last
        kept.append({**entry, "attempt": int(entry.get("attempt") or 0)})
    return kept, warnings


def _story(
    node: Node, ledger: Iterable[Mapping[str, Any]], events: Iterable[Mapping[str, Any]], now: float
) -> NodeStory:
    entries, warnings = sound_ledger(node.name, ledger, now)
    story = NodeStory(
        name=node.name,
        gpus=node.gpu_count,
        ledger=entries,
        state=node.labels.get(vocab.LABEL_STATE, ""),
        state_since=parse_at(node.annotations.get(vocab.ANNOTATION_STATE_SINCE)),
        warnings=warnings,
    )
    verdicts: list[Verdict] = []
    for event in events:
        at = _eventparse_at(event)
        reason = str(event.get("reason") or "")
        if at is None:
            continue
        message = str(event.get("message") or "")
        if reason in _CHECK_OF_CONDITION and event.get("type") == "Warning":
            match = _XID.search(message)
            story.observations.append(
                Observation(at, _CHECK_OF_CONDITION[reason], match.group(1) if match else "")
            )
        elif reason in _VERDICT_EVENTS:
            verdicts.append(Verdict(at, _VERDICT_EVENTS[reason], message.partition(": ")[2]))
    for condition in node.conditions:
        check = _CHECK_OF_CONDITION.get(condition.type)
        at = parse_at(condition.last_transition_time)
        if check and condition.status == "True" and at is not None:
            match = _XID.search(condition.message)
            story.observations.append(Observation(at, check, match.group(1) if match else ""))
    for entry in story.ledger:
        # dsx-remediate keeps the event's observation in its requested entry, after the Event ages out.
        seen = _OBSERVED.search(str(entry.get("detail") or "")) if entry.get("state") == "requested" else None
        at = parse_at(seen.group(1)) if seen else None
        if at is not None and entry.get("check"):
            story.observations.append(Observation(at, str(entry["check"])))
    label = node.labels.get(vocab.LABEL_CERTIFICATION, "")
    certified = parse_at(node.annotations.get(vocab.ANNOTATION_CERTIFIED_AT))
    if label in ("passed", "failed") and certified is not None:
        reason = node.annotations.get(vocab.ANNOTATION_CERTIFICATION_REASON, "")
        verdicts.append(Verdict(certified, label, reason))
    story.verdicts = sorted(verdicts, key=lambda v: (v.at, v.status))
    story.observations.sort(key=lambda o: (o.at, o.check, o.code))
    return story


def read_stories(port: ClusterPort, warnings: list[str] | None = None) -> list[NodeStory]:
    """Every node's story: the nodes, the ledger (every object of it, listed by its label, and the old
    single ConfigMap: :func:`steps.sentinel.ledger.read_all`) and the Events about nodes. A ledger value
    that is no array of entries is passed over and said in ``warnings``; each story says which of its
    entries it passed over."""
    from steps.sentinel.ledger import read_all

    nodes = port.list_nodes()
    problems: list[str] = []
    ledger = read_all(port, problems)
    by_node: dict[str, list[dict[str, Any]]] = {}
    for event in port.list_objects("v1", "Event", NODE_EVENT_NAMESPACE):
        involved = event.get("involvedObject") or {}
        if involved.get("kind") == "Node" and involved.get("name"):
            by_node.setdefault(str(involved["name"]), []).append(event)
    now = time.time()
    stories = [
        _story(n, ledger.get(n.name, []), by_node.get(n.name, []), now)
        for n in sorted(nodes, key=lambda n: n.name)
    ]
    if warnings is not None:
        warnings.extend(f"ledger {p}" for p in problems)
    return stories
