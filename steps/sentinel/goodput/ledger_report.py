"""What the fleet lost, read back from what remediation and certification wrote.

Sources, per node (all through the cluster port; nothing else is kept):

- the remediation ledger (:mod:`steps.sentinel.ledger`): every state change with its time, the check
  that started it and the attempt it belongs to;
- the node's ``dsx.dev/state`` label and ``dsx.dev/state-since`` annotation (the state now: they win
  where the ledger lost entries);
- the certification label with ``dsx.dev/certified-at`` and ``dsx.dev/certification-reason`` (a
  bisection suspect is labelled ``failed`` with a reason naming the bisection), and the
  ``DsxCertification*`` Events, which keep the verdicts before the last one;
- the sentinel agent's Events (reason: the check's condition, ``DsxGpuXid``...) and its conditions
  (``lastTransitionTime`` while ``True``): when a fault was observed, and for an XID its code, whose
  resolution bucket comes from the fault catalogue.

Every second of every node in the period is in exactly one state: ``in-service``, one of the remediation
states (``quarantined``, ``draining``, ``awaiting-repair``, ``recertifying``, ``escalated``),
``certification-failed`` or ``bisection-suspect``. A remediation state wins over a certification
verdict (a node being recertified carries ``pending``). Time out of service is lost to a cause: the
fault of the remediation attempt (``xid:RESTART_BM``, ``ecc``...) while the node is quarantined,
drained or escalated, ``waiting-for-repair``, ``waiting-for-recertification``, ``certification-failure``
or ``slow-node-bisection``. :func:`account` checks that each node's states add up to the period and
that the fleet's in-service and lost GPU-hours add up to its GPU-hours.

Time to detect is from the first observation of the attempt's fault (the agent's Event or condition,
after the node was last back in service) to the quarantine the ledger records; time to repair is from
the quarantine (the cordon) to ``in-service`` (the uncordon). Events age out of the API server (an
hour by default), so the observation ``dsx-remediate`` keeps in its ``requested`` entry (``observed
<RFC 3339>`` in the detail, from the HealthEvent that started it) counts too; a remediation older than
an hour started without an event shows no detection time unless its condition still says ``True``.
Nodes no longer in the cluster are not counted.
"""

from __future__ import annotations

import bisect
import contextlib
import datetime as dt
import gc
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field

from steps.cluster import changes
from steps.cluster import vocabulary as vocab
from steps.cluster.port import ClusterPort
from steps.errors import InputError
from steps.models import Frozen
from steps.sentinel.goodput.stories import NodeStory, Observation, Verdict, parse_at, read_stories, stamp

__all__ = [
    "CAUSE_CERTIFICATION",
    "CAUSE_RECERTIFICATION",
    "CAUSE_REPAIR",
    "CAUSE_SLOW",
    "IN_SERVICE",
    "STATES",
    "Fleet",
    "GoodputReport",
    "NodeAccount",
    "NodeStory",
    "Observation",
    "Remediation",
    "Segment",
    "Verdict",
    "account",
    "parse_since",
    "read_stories",
    "report",
]

IN_SERVICE = "in-service"
CERTIFICATION_FAILED = "certification-failed"
BISECTION_SUSPECT = "bisection-suspect"
_REMEDIATION_STATES = frozenset(s.value for s in vocab.NodeState)
# The states read for every ledger entry, as plain strings (an Enum member's value is a slow lookup).
_RECERTIFYING = vocab.NodeState.recertifying.value
_ESCALATED = vocab.NodeState.escalated.value
_AWAITING_REPAIR = vocab.NodeState.awaiting_repair.value
STATES: tuple[str, ...] = (IN_SERVICE, *_REMEDIATION_STATES, CERTIFICATION_FAILED, BISECTION_SUSPECT)
"""Every state a node's time is counted in, in the order reports show them."""

CAUSE_REPAIR = "waiting-for-repair"
CAUSE_RECERTIFICATION = "waiting-for-recertification"
CAUSE_CERTIFICATION = "certification-failure"
CAUSE_SLOW = "slow-node-bisection"

_BACK = (IN_SERVICE, "cancelled", "replaced")
"""Ledger states after which the node is in service again (cancelled: a person took it back; replaced:
the machine left the cluster, and a node of its name hereafter is another machine, in service)."""
_SINCE = re.compile(r"^(\d+(?:\.\d+)?)([mhdw])$")
_UNIT_S = {"m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
#: The times a period may start or end at: nothing dsx wrote is older than the Unix epoch.
EARLIEST = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


# ----------------------------------------------------------------------------- what is reported


class Segment(Frozen):
    """A stretch of time a node spent in one state."""

    start: str
    end: str
    state: str


class Remediation(Frozen):
    """One remediation attempt of a node, as the ledger tells it."""

    node: str
    attempt: int
    check: str
    cause: str
    """The fault class the attempt's out-of-service time is charged to (``xid:RESTART_BM``...)."""
    xid: str = ""
    observed_at: str = ""
    quarantined_at: str
    returned_at: str = ""
    outcome: Literal["in-service", "cancelled", "replaced", "escalated", "open"]
    detect_s: float | None = None
    """Fault observed to quarantine; ``None`` when no observation is left."""
    repair_s: float | None = None
    """Quarantine (cordon) to back in service (uncordon); ``None`` unless it came back."""
    recertification: Literal["passed", "failed"] | None = None


class NodeAccount(Frozen):
    """One node's period."""

    node: str
    gpus: int
    state: str
    """The state at the end of the period."""
    hours: dict[str, float]
    """Hours in each state (every state listed; they add up to the period)."""
    lost_gpu_hours: float
    lost_by_cause: dict[str, float]
    """GPU-hours out of service by cause (only the causes that cost something)."""
    timeline: list[Segment]


class Fleet(Frozen):
    """The fleet's period."""

    nodes: int
    gpus: int
    gpu_hours: float
    in_service_gpu_hours: float
    lost_gpu_hours: float
    availability: float | None
    """In-service GPU-hours over the fleet's (``None`` for a fleet without GPUs): availability, the
    share of the fleet's hours its nodes were in service. Not goodput: a node in service may be idle,
    slow, or running work a later fault throws away (``dsx goodput simulate`` models those)."""
    hours_by_state: dict[str, float]
    """Node-hours in each state."""
    gpu_hours_by_state: dict[str, float]
    lost_by_cause: dict[str, float]
    """GPU-hours lost by cause, largest first."""
    nodes_by_state: dict[str, int]
    """Nodes in each state at the end of the period."""
    mean_time_to_detect_s: float | None
    detections: int
    mean_time_to_repair_s: float | None
    repairs: int
    recertifications_passed: int
    recertifications_failed: int
    recertification_pass_rate: float | None


class GoodputReport(Frozen):
    """``dsx goodput``: the period, the fleet, the nodes ranked by GPU-hours lost, the remediations."""

    api_version: vocab.ApiVersion = vocab.API_VERSION
    kind: Literal["GoodputReport"] = "GoodputReport"
    cluster: str
    since: str
    until: str
    period_hours: float
    fleet: Fleet
    nodes: list[NodeAccount]
    remediations: list[Remediation]
    warnings: list[str] = Field(default_factory=list)
    """What was read and passed over (a malformed ledger entry), each naming the entry and why."""


# ----------------------------------------------------------------------------- accounting


@dataclass
class _Attempt:
    attempt: int
    check: str
    quarantined: float
    start_after: float
    """When the node was last back in service before this attempt (observations after it count)."""
    returned: float | None = None
    outcome: str = "open"
    recertification: str | None = None
    reached_recertifying: bool = False


def _xid_buckets() -> dict[str, str]:
    from steps.sentinel.catalogue import load_catalogue

    return {e.code: e.source for e in load_catalogue().entries() if e.check == "xid" and e.code != "*"}


def _remediation_track(
    story: NodeStory, texts: dict[float, str]
) -> tuple[list[tuple[float, str | None, int]], list[_Attempt]]:
    """The node's remediation state changes ``(at, state or None for in service, attempt index)`` and
    its attempts; ``texts`` gets each time whose ledger text is already as :func:`stamp` writes it."""
    track: list[tuple[float, str | None, int]] = []
    attempts: list[_Attempt] = []
    current: _Attempt | None = None
    back = float("-inf")
    for entry in story.ledger:
        text = entry.get("at")
        at = parse_at(text)
        state = str(entry.get("state") or "")
        if at is None:
            continue
        if isinstance(text, str) and len(text) == 20 and text[10] == "T" and text[19] == "Z":
            texts[at] = text
        if state in _REMEDIATION_STATES:
            if current is None:
                current = _Attempt(
                    attempt=int(entry.get("attempt") or 0),
                    check=str(entry.get("check") or ""),
                    quarantined=at,
                    start_after=back,
                )
                attempts.append(current)
            if state == _RECERTIFYING:
                current.reached_recertifying = True
            elif state == _ESCALATED:
                if current.reached_recertifying and current.recertification is None:
                    current.recertification = "failed"
                current.outcome = "escalated"
            track.append((at, state, len(attempts) - 1))
        elif state in _BACK:
            if current is not None:
                current.returned = at
                current.outcome = state
                if state == IN_SERVICE and current.reached_recertifying:
                    current.recertification = "passed"
                current = None
            back = at
            track.append((at, None, -1))
    # The label is the truth now: where the ledger ends elsewhere (entries trimmed, a person cleared an
    # escalated node's label), the node moved when the label says, or at the ledger's last entry.
    last = track[-1][1] if track else None
    label = story.state or None
    if label != last and (label is None or label in _REMEDIATION_STATES):
        at = max(story.state_since or float("-inf"), track[-1][0] if track else float("-inf"))
        if label is not None and current is None:
            attempts.append(_Attempt(attempt=0, check="", quarantined=at, start_after=back))
        elif label is None and current is not None:
            current.returned, current.outcome = at, "cancelled"
        track.append((at, label, len(attempts) - 1 if label else -1))
    return track, attempts


def _cause_of(attempt: _Attempt, xid: str, buckets: Mapping[str, str]) -> str:
    if attempt.check == "xid" and xid:
        return f"xid:{buckets.get(xid, 'unlisted')}"
    return attempt.check or "unknown"


def _cert_state(verdict: Verdict | None) -> str:
    if verdict is None or verdict.status != "failed":
        return IN_SERVICE
    return BISECTION_SUSPECT if "bisect" in verdict.reason.lower() else CERTIFICATION_FAILED


def _cause_of_state(state: str, fault: str) -> str:
    if state == _AWAITING_REPAIR:
        return CAUSE_REPAIR
    if state == _RECERTIFYING:
        return CAUSE_RECERTIFICATION
    if state == CERTIFICATION_FAILED:
        return CAUSE_CERTIFICATION
    if state == BISECTION_SUSPECT:
        return CAUSE_SLOW
    return fault


def _remediations(
    story: NodeStory,
    attempts: list[_Attempt],
    start: float,
    end: float,
    buckets: Mapping[str, str],
    stamps: dict[float, str],
) -> tuple[list[str], list[Remediation]]:
    """Each attempt's cause (fault class, or XID bucket), and the remediations quarantined in the period
    with their detection and repair times (``stamps``: times already written as :func:`stamp` does)."""

    def text(at: float) -> str:
        return stamps.get(at) or stamp(at)

    causes: list[str] = []
    remediations: list[Remediation] = []
    obs_times = [o.at for o in story.observations]
    for a in attempts:
        # The first observation of the attempt's check since the node was last back, up to the quarantine.
        lo = bisect.bisect_right(obs_times, a.start_after)
        hi = bisect.bisect_right(obs_times, a.quarantined)
        seen = [o for o in story.observations[lo:hi] if o.check == a.check]
        first = seen[0] if seen else None
        xid = next((o.code for o in seen if o.code), "")
        cause = _cause_of(a, xid, buckets)
        causes.append(cause)
        if a.check and start <= a.quarantined < end:
            remediations.append(
                Remediation(
                    node=story.name,
                    attempt=a.attempt,
                    check=a.check,
                    cause=cause,
                    xid=xid,
                    observed_at=text(first.at) if first else "",
                    quarantined_at=text(a.quarantined),
                    returned_at=text(a.returned) if a.returned is not None else "",
                    outcome=a.outcome,
                    detect_s=a.quarantined - first.at if first else None,
                    repair_s=a.returned - a.quarantined
                    if a.returned is not None and a.outcome == IN_SERVICE
                    else None,
                    recertification=a.recertification,
                )
            )
    return causes, remediations


def _node(
    story: NodeStory, start: float, end: float, buckets: Mapping[str, str]
) -> tuple[NodeAccount, list[Remediation]]:
    stamps: dict[float, str] = {}
    track, attempts = _remediation_track(story, stamps)
    causes, remediations = _remediations(story, attempts, start, end, buckets, stamps)
    # One sweep over both tracks' changes, in time order (a remediation change first at a tie).
    changes_: list[tuple[float, int, str | None, int, Verdict | None]] = [
        (at, 0, state, index, None) for at, state, index in track
    ]
    changes_ += [(v.at, 1, None, -1, v) for v in story.verdicts]
    changes_.sort(key=lambda c: (c[0], c[1]))
    remediation: tuple[str, int] | None = None
    verdict: Verdict | None = None
    seconds = dict.fromkeys(STATES, 0.0)
    lost: dict[str, float] = {}
    timeline: list[list[Any]] = []
    cursor = start

    def close(until: float) -> None:
        nonlocal cursor
        until = min(until, end)
        if until <= cursor:
            return
        if remediation is not None:
            state, index = remediation
            fault = causes[index] if index >= 0 else "unknown"
        else:
            state, fault = _cert_state(verdict), ""
        span = until - cursor
        seconds[state] += span
        if state != IN_SERVICE:
            cause = _cause_of_state(state, fault)
            lost[cause] = lost.get(cause, 0.0) + span
        if timeline and timeline[-1][2] == state:
            timeline[-1][1] = until
        else:
            timeline.append([cursor, until, state])
        cursor = until

    for at, kind, state, index, seen_verdict in changes_:
        if at > start:
            close(at)
        if kind == 0:
            remediation = (state, index) if state is not None else None
        else:
            verdict = seen_verdict
    close(end)
    period = end - start
    total = sum(seconds.values())
    if abs(total - period) > 1e-6 * max(period, 1.0):
        raise RuntimeError(
            f"goodput accounting: node {story.name}: its states add up to {total:.3f} s, "
            f"not the period's {period:.3f} s"
        )
    now = timeline[-1][2] if timeline else IN_SERVICE
    for segment in timeline:
        for at in segment[:2]:
            if at not in stamps:
                stamps[at] = stamp(at)
    # One validation of plain data (pydantic-core is quicker at it than building each Segment).
    node_account = NodeAccount.model_validate(
        {
            "node": story.name,
            "gpus": story.gpus,
            "state": now,
            "hours": {s: v / 3600 for s, v in seconds.items()},
            "lost_gpu_hours": sum(lost.values()) * story.gpus / 3600,
            "lost_by_cause": {c: v * story.gpus / 3600 for c, v in sorted(lost.items())},
            "timeline": [{"start": stamps[a], "end": stamps[b], "state": s} for a, b, s in timeline],
        }
    )
    return node_account, remediations


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


@contextlib.contextmanager
def _without_cyclic_gc() -> Iterator[None]:
    """No cyclic garbage collection while the nodes are accounted: they build hundreds of thousands of
    small objects that reference counting frees (a cycle among them waits for the collector, on again
    after), and each collection would walk every one already built; for a 10,000-node, 90-day ledger
    that walking was 40% of the report's time."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def account(stories: Iterable[NodeStory], start: float, end: float, cluster: str = "") -> GoodputReport:
    """The report of ``stories`` over ``[start, end)`` (Unix seconds).

    Raises:
        RuntimeError: a node's states do not add up to the period, or the fleet's in-service and lost
            GPU-hours do not add up to its GPU-hours (a defect of this module, never of the input).
    """
    buckets = _xid_buckets()
    nodes: list[NodeAccount] = []
    remediations: list[Remediation] = []
    with _without_cyclic_gc():
        for story in stories:
            node_account, done = _node(story, start, end, buckets)
            nodes.append(node_account)
            remediations += done
    hours = (end - start) / 3600
    gpus = sum(n.gpus for n in nodes)
    hours_by_state = {s: sum(n.hours[s] for n in nodes) for s in STATES}
    gpu_hours_by_state = {s: sum(n.hours[s] * n.gpus for n in nodes) for s in STATES}
    by_cause: dict[str, float] = {}
    for n in nodes:
        for cause, value in n.lost_by_cause.items():
            by_cause[cause] = by_cause.get(cause, 0.0) + value
    total = gpus * hours
    in_service = gpu_hours_by_state[IN_SERVICE]
    lost = sum(by_cause.values())
    if abs(in_service + lost - total) > 1e-6 * max(total, 1.0):
        raise RuntimeError(
            f"goodput accounting: {in_service:.3f} GPU-hours in service and {lost:.3f} lost do not add "
            f"up to the fleet's {total:.3f}"
        )
    detect = [r.detect_s for r in remediations if r.detect_s is not None]
    repair = [r.repair_s for r in remediations if r.repair_s is not None]
    passed = sum(1 for r in remediations if r.recertification == "passed")
    failed = sum(1 for r in remediations if r.recertification == "failed")
    now = {s: 0 for s in STATES}
    for n in nodes:
        now[n.state] += 1
    fleet = Fleet(
        nodes=len(nodes),
        gpus=gpus,
        gpu_hours=total,
        in_service_gpu_hours=in_service,
        lost_gpu_hours=lost,
        availability=in_service / total if total else None,
        hours_by_state=hours_by_state,
        gpu_hours_by_state=gpu_hours_by_state,
        lost_by_cause=dict(sorted(by_cause.items(), key=lambda kv: (-kv[1], kv[0]))),
        nodes_by_state=now,
        mean_time_to_detect_s=_mean(detect),
        detections=len(detect),
        mean_time_to_repair_s=_mean(repair),
        repairs=len(repair),
        recertifications_passed=passed,
        recertifications_failed=failed,
        recertification_pass_rate=passed / (passed + failed) if passed + failed else None,
    )
    ranked = sorted(nodes, key=lambda n: (-n.lost_gpu_hours, n.hours[IN_SERVICE], n.node))
    return GoodputReport(
        cluster=cluster,
        since=stamp(start),
        until=stamp(end),
        period_hours=hours,
        fleet=fleet,
        nodes=ranked,
        remediations=sorted(remediations, key=lambda r: (r.quarantined_at, r.node, r.attempt)),
    )


def parse_since(text: str, until: dt.datetime) -> dt.datetime:
    """``--since``: a duration back from ``until`` (``90m``, ``36h``, ``7d``, ``2w``) or an RFC 3339 time.

    Raises:
        InputError: neither, or not before ``until``.
    """
    value = text.strip()
    match = _SINCE.match(value)
    if match:
        back = float(match.group(1)) * _UNIT_S[match.group(2)]
        if back > (until - EARLIEST).total_seconds():
            raise InputError(
                f"--since {text!r}: the period would start before {changes.format_time(EARLIEST)}"
            )
        start = until - dt.timedelta(seconds=back)
    else:
        try:
            start = changes.parse_time(value)
        except ValueError:
            raise InputError(
                f"--since {text!r}: expected a duration (90m, 36h, 7d, 2w) or an RFC 3339 time"
            ) from None
        if start.tzinfo is None:
            raise InputError(f"--since {text!r}: an RFC 3339 time needs its offset (Z for UTC)")
        if start < EARLIEST:
            raise InputError(f"--since {text!r}: before {changes.format_time(EARLIEST)}")
    if start >= until:
        raise InputError(f"--since {text!r}: the period must start before {changes.format_time(until)}")
    return start


def report(port: ClusterPort, since: dt.datetime, until: dt.datetime) -> GoodputReport:
    """Read the cluster and account for ``[since, until)``; what was passed over is in ``warnings``."""
    warnings: list[str] = []
    stories = read_stories(port, warnings)
    result = account(stories, since.timestamp(), until.timestamp(), port.endpoint)
    warnings.extend(w for story in stories for w in story.warnings)
    return result.model_copy(update={"warnings": warnings})
