"""The steps of ``dsx-remediate``: guard, quarantine, drain, repair, recertification verdict, outcome.

Every step is idempotent and reads where the node stands before it acts, so a workflow stopped after any
step and submitted again picks up where the last one stopped: the node's ``dsx.dev/state`` label says how
far remediation got, and a step whose work is already done says so and returns. Every state change is
written to the node (the label with ``dsx.dev/state-since``, in one patch) and appended to the ledger
(:mod:`steps.sentinel.ledger`, the format a goodput report reads).

Rules every step keeps:

- The cordon is owned by :data:`OWNER` (``dsx.dev/cordoned-by=sentinel``). A node cordoned outside dsx
  before remediation came keeps that cordon: remediation records it and never uncordons the node.
- A person who uncordons the node mid-remediation cancels it: the next step sees the node schedulable
  (or cordoned by someone else), records ``cancelled``, clears the state label and stops the workflow.
- No node is left cordoned by dsx without a state label saying why: a failure escalates the node
  (``state=escalated``, ``dsx.dev/replace=requested``, a Warning Event) or leaves the label of the step
  that stopped, for a resubmission to pick up.
- A pod leaves only through the Eviction API, unless the drain policy says otherwise
  (:mod:`steps.sentinel.drain`).

Step modules are read by Hera's runner in the pod, so this one keeps its annotations evaluated.
"""

import contextlib
import dataclasses
import datetime as dt
import json
import math
import os
import re
import time
from pathlib import Path
from typing import Any, NoReturn

import yaml
from pydantic import ValidationError

from steps.cluster import ClusterPort, CordonRefusedError, Node, NotFoundError, changes, connect
from steps.cluster import vocabulary as vocab
from steps.durations import parse_duration
from steps.errors import DsxError, InputError
from steps.models import input_error
from steps.outputs import write_params
from steps.sentinel import ledger, repair
from steps.sentinel.catalogue import load_catalogue
from steps.sentinel.drain import DrainPolicy
from steps.sentinel.drain import drain as drain_pods
from steps.sentinel.events import HealthEvent, condition_reading
from steps.sentinel.history import FaultHistory, LemonRule
from steps.sentinel.outcome import Phase, RepairOutcome, annotation, outcome_of
from steps.sentinel.policy import Breaker, BreakerSettings, QuarantinePolicy, decide
from steps.sentinel.recertify import NO_VERDICT
from steps.sentinel.standing import SUPERSEDED, standing

__all__ = [
    "ACTIVE_STATES",
    "OWNER",
    "RemediationCancelled",
    "Settings",
    "check_parameters",
    "conclude",
    "drain",
    "guard",
    "quarantine",
    "record_outcome",
    "repair_problems",
    "repair_wait",
    "repaired",
    "request_repair",
    "returns_within",
]

OWNER = "sentinel"
"""The ``by`` of remediation's cordon (``dsx.dev/cordoned-by``)."""

REPAIR_POLL_S = 5.0
"""How often the repair wait reads the node (more often under a short timeout)."""
REPAIR_WAIT_LIMIT_S = 7 * 24 * 3600
"""The longest repair wait (the step's own deadline is compiled from it)."""
REPAIR_WAIT_MIN_S = 1.0
"""The shortest repair wait: ``0s`` would judge the node at once and ask for its replacement."""
MAX_ATTEMPTS_LIMIT = 100
"""The most attempts ``max-attempts`` may allow."""
# A node's name as the API server accepts it (a DNS subdomain: RFC 1123 labels, at most 253 characters).
_NODE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")

_RECERTIFYING = vocab.NodeState.recertifying.value
_PASSED = vocab.Certification.passed.value

ACTIVE_STATES = [s.value for s in vocab.NodeState if s is not vocab.NodeState.escalated]
"""States of a node whose remediation is under way (in the order it moves through them)."""


class RemediationCancelled(DsxError):
    """A person took the node back (uncordoned it) while remediation ran."""


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def returns_within(history: list[ledger.Entry], days: float, now: dt.datetime) -> list[ledger.Entry]:
    """The remediations of a node's ledger ``history`` that returned it to service within ``days`` of
    ``now``: their ``in-service`` entries, one per workflow (none before the node was replaced)."""
    start = now - dt.timedelta(days=days)
    returns: dict[str, ledger.Entry] = {}
    for entry in history:
        if entry.state == ledger.REPLACED:  # the name's returns before it were another machine's
            returns.clear()
        if entry.state != ledger.IN_SERVICE:
            continue
        try:
            at = changes.parse_time(entry.at)
        except ValueError:
            continue
        if at >= start:
            returns.setdefault(entry.workflow or entry.at, entry)
    return list(returns.values())


def _lemon_rule() -> LemonRule | None:
    """The fault history's lemon rule: the cluster's rules where this pod is given them (the chart gives
    guard :data:`~steps.cluster.vocabulary.ENV_FAULT_HISTORY`, its overrides' ``history``; or an overrides
    file, :data:`~steps.cluster.vocabulary.ENV_SENTINEL_OVERRIDES`, as the agent is), else the shipped one.

    Raises:
        InputError: the rules given do not read as a FaultHistory (the variable named).
    """
    given = os.environ.get(vocab.ENV_FAULT_HISTORY, "").strip()
    if given:
        try:
            found = FaultHistory.model_validate(yaml.safe_load(given))
        except (yaml.YAMLError, ValidationError) as exc:
            where = f"${vocab.ENV_FAULT_HISTORY}"
            if isinstance(exc, ValidationError):
                raise input_error(exc, where) from None
            raise InputError(f"{where}: not YAML or JSON ({exc})") from None
        return found.lemon
    overrides = os.environ.get(vocab.ENV_SENTINEL_OVERRIDES)
    return load_catalogue(overrides=Path(overrides) if overrides else None).history.lemon


def _condition(check: str) -> str:
    if check not in vocab.CONDITION_SENTINEL:
        known = ", ".join(sorted(vocab.CONDITION_SENTINEL))
        raise InputError(f"check {check!r} is not a sentinel check (known: {known})")
    return vocab.CONDITION_SENTINEL[check]


def _node(port: ClusterPort, name: str) -> Node:
    try:
        return port.get_node(name)
    except NotFoundError:
        raise DsxError(f"node {name} does not exist (deleted during remediation?)") from None


def _state(node: Node) -> str:
    return node.labels.get(vocab.LABEL_STATE, "")


def _attempt(port: ClusterPort, node: str) -> int:
    history = ledger.entries(port, node)
    return max(1, ledger.attempts(history))


def _record(port: ClusterPort, node: str, state: str, workflow: str, check: str, detail: str) -> None:
    """A ledger entry of this remediation's current attempt."""
    ledger.record(
        port, node, state, workflow=workflow, attempt=_attempt(port, node), check=check, detail=detail
    )


def _set_state(port: ClusterPort, node: str, state: str | None, workflow: str, **extra: str | None) -> Node:
    """The state label and the time it changed, in one patch, with any further annotations."""
    notes: dict[str, str | None] = {vocab.ANNOTATION_STATE_SINCE: changes.format_time(_now())}
    if state is not None:
        notes[vocab.ANNOTATION_REMEDIATION] = workflow
    notes.update(extra)
    return port.set_node_metadata(node, labels={vocab.LABEL_STATE: state}, annotations=notes)


def _held(port: ClusterPort, name: str, workflow: str, check: str = "") -> Node:
    """The node, when remediation still holds it; else record the cancellation and raise.

    Remediation holds the node while it carries a state label and a cordon whose dsx record is
    :data:`OWNER`'s (its own cordon, or its record on a cordon that predates dsx).
    """
    node = _node(port, name)
    cordon = node.cordon
    if cordon is not None and cordon.holder == OWNER:
        return node
    whose = "uncordoned" if cordon is None else f"cordoned by someone else ({cordon.describe()})"
    detail = f"{name} was {whose} during remediation (state {_state(node) or 'none'}); remediation cancelled"
    attempt = _attempt(port, name)
    _set_state(port, name, None, workflow, **{**_REMEDIATION_NAMED, **_REPAIR_ASKED})
    if vocab.LABEL_REPAIR in node.labels:  # the repair it asked for is no longer asked
        port.set_labels(name, {vocab.LABEL_REPAIR: None})
        repair.clear_request(port, name)
    ledger.record(port, name, "cancelled", workflow=workflow, attempt=attempt, check=check, detail=detail)
    port.record_event(name, "DsxRemediationCancelled", detail, "Warning")
    raise RemediationCancelled(detail)


_CHECK = vocab.ANNOTATION_REMEDIATION_CHECK
_REMEDIATION_NAMED: dict[str, str | None] = {vocab.ANNOTATION_REMEDIATION: None, _CHECK: None}
"""The remediation and the check it answers, named on the node while it runs; removed at its end."""

_REPAIR_ASKED: dict[str, str | None] = {
    vocab.ANNOTATION_REPAIR_BOOTED_AT: None,
    vocab.ANNOTATION_REPAIR_GPUS: None,
    vocab.ANNOTATION_REPAIR_OUTCOME: None,
}
"""What a repair request leaves on the node besides its time and boot, removed with it."""


def _out_of_service(port: ClusterPort, name: str, reason: str) -> None:
    """Cordon (as :data:`OWNER`) and taint a node that is escalated without having been quarantined, so
    that an escalated node never takes new work; a cordon someone else holds is kept as it is."""
    # cordoned already, by a person or another owner: it stays out of service either way
    with contextlib.suppress(CordonRefusedError):
        port.cordon(name, reason, by=OWNER)
    port.add_taint(name)


def _escalate(port: ClusterPort, name: str, workflow: str, check: str, why: str) -> NoReturn:
    """Leave the node cordoned with ``state=escalated``, ask for a replacement, say so; then raise."""
    attempt = _attempt(port, name)
    port.set_node_metadata(
        name,
        labels={
            vocab.LABEL_STATE: vocab.NodeState.escalated.value,
            vocab.LABEL_REPLACE: vocab.REPLACE_REQUESTED,
        },
        annotations={
            vocab.ANNOTATION_STATE_SINCE: changes.format_time(_now()),
            vocab.ANNOTATION_REMEDIATION: workflow,
            vocab.ANNOTATION_REMEDIATION_CHECK: check,
        },
    )
    ledger.record(
        port,
        name,
        vocab.NodeState.escalated.value,
        workflow=workflow,
        attempt=attempt,
        check=check,
        detail=why,
    )
    port.record_event(name, "DsxRemediationEscalated", f"{name} escalated: {why}", "Warning")
    raise DsxError(f"{name} escalated: {why}")


def _resume(
    port: ClusterPort, current: Node, workflow_name: str, check: str, done: int, observed: str = ""
) -> str:
    """A node already in remediation: an earlier workflow stopped; this one picks it up where it stands."""
    before = current.annotations.get(vocab.ANNOTATION_REMEDIATION, "an earlier run")
    ledger.record(
        port,
        current.name,
        "requested",
        workflow=workflow_name,
        attempt=max(done, 1),
        check=check,
        detail=f"resumed where {before} stopped ({_state(current)}){observed}",
    )
    write_params(proceed="true")
    return f"{current.name}: resuming remediation at {_state(current)}"


def _reading(event: str, node: str, check: str) -> tuple[bool, HealthEvent | None]:
    """Whether an event started the run, and the reading it stands for: the ``event`` parameter is the
    check's node condition (from the Sensor or the reconciler: ``{type, status, reason, ...}``) or a
    HealthEvent, as JSON; empty: a person asked for the remediation. A condition that names no fault (not
    True, a reason the agent does not write) gives no reading: the node's condition now decides."""
    if not event.strip():
        return False, None
    try:
        data = json.loads(event)
    except ValueError as exc:
        raise InputError(f"parameter event: not JSON ({exc})") from None
    if isinstance(data, dict) and "type" in data and "status" in data:
        if data.get("type") != vocab.CONDITION_SENTINEL[check]:
            raise InputError(
                f"parameter event: condition {data.get('type')!r} is not check {check}'s "
                f"({vocab.CONDITION_SENTINEL[check]})"
            )
        return True, condition_reading(node, check, data)
    try:
        return True, HealthEvent.model_validate(data)
    except ValidationError as exc:
        raise input_error(exc, "parameter event") from None


@dataclasses.dataclass(frozen=True)
class Settings:
    """``dsx-remediate``'s parameters, read and checked (:func:`check_parameters`)."""

    reading: HealthEvent | None
    triggered: bool
    max_attempts: int
    breaker: BreakerSettings
    drain_policy: DrainPolicy
    repair_timeout_s: float
    repair_template: repair.TemplateCall | None = None


def _number(name: str, text: object, kind: type[int] | type[float]) -> float:
    """A finite number of the parameter ``name``."""
    try:
        value = kind(str(text).strip())
    except ValueError:
        what = "a whole number" if kind is int else "a number"
        raise InputError(f"parameter {name}: {text!r} is not {what}") from None
    if not math.isfinite(value):
        raise InputError(f"parameter {name}: {text!r} is not a finite number")
    return value


def _drain_policy(text: str) -> DrainPolicy:
    """The ``drain-policy`` parameter, read."""
    try:
        return DrainPolicy.model_validate(json.loads(text or "{}"))
    except ValueError as exc:
        if isinstance(exc, ValidationError):
            raise input_error(exc, "parameter drain-policy") from None
        raise InputError(f"parameter drain-policy: not JSON ({exc})") from None


def _repair_timeout(text: str) -> float:
    """The ``repair-timeout`` parameter, in seconds."""
    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise InputError(f"parameter repair-timeout: {exc}") from None
    if not REPAIR_WAIT_MIN_S <= seconds <= REPAIR_WAIT_LIMIT_S:
        raise InputError(
            f"parameter repair-timeout: {text} is not between {REPAIR_WAIT_MIN_S:g}s and the repair "
            f"wait's bound ({REPAIR_WAIT_LIMIT_S // 3600}h)"
        )
    return seconds


def check_parameters(
    node: str = "",
    check: str = "xid",
    event: str = "",
    max_attempts: object = 3,
    breaker_share: object = 0.1,
    breaker_window_s: object = 3600.0,
    drain_policy: str = "{}",
    repair_timeout: str = "4h",
    repair_template: str = "",
    repair_template_actions: str = repair.TEMPLATE_ACTIONS,
) -> Settings:
    """Read every parameter of ``dsx-remediate`` that a later step would read, before anything changes:
    ``guard`` calls it first, and ``dsx run`` before a local run starts.

    Raises:
        InputError: a parameter is malformed or out of range (named as the workflow names it).
    """
    if not node:
        raise InputError("parameter node: required (the node to remediate)")
    if len(node) > 253 or not _NODE_NAME.fullmatch(node):
        raise InputError(f"parameter node: {node!r} is not a node name (a DNS subdomain: a-z, 0-9, '-', '.')")
    _condition(check)
    triggered, reading = _reading(event, node, check)
    attempts = _number("max-attempts", max_attempts, int)
    if not 1 <= attempts <= MAX_ATTEMPTS_LIMIT:
        raise InputError(f"parameter max-attempts: {max_attempts} is not between 1 and {MAX_ATTEMPTS_LIMIT}")
    share = _number("breaker-share", breaker_share, float)
    if not 0 < share <= 1:
        raise InputError(
            f"parameter breaker-share: {breaker_share} is not a share of the fleet (0 < share <= 1)"
        )
    window = _number("breaker-window-s", breaker_window_s, float)
    if window <= 0:
        raise InputError(
            f"parameter breaker-window-s: {breaker_window_s} is not a positive number of seconds"
        )
    return Settings(
        reading=reading,
        triggered=triggered,
        max_attempts=int(attempts),
        breaker=BreakerSettings(max_share=share, window_s=window),
        drain_policy=_drain_policy(drain_policy),
        repair_timeout_s=_repair_timeout(repair_timeout),
        repair_template=repair.template_call(repair_template, repair_template_actions),
    )


def _observed(reading: HealthEvent | None) -> str:
    """What a ``requested`` entry's detail ends with when an event started it: ``; observed <RFC 3339>``,
    when the agent saw the fault (the goodput report's detection time, kept after the Event ages out)."""
    return f"; observed {changes.format_time(reading.observed_at)}" if reading is not None else ""


def _by_event(
    port: ClusterPort,
    current: Node,
    reading: HealthEvent,
    policy: QuarantinePolicy,
    workflow_name: str,
    check: str,
    done: int,
) -> str | None:
    """The policy's decision on the event; a message when it sends the node anywhere but remediation."""
    breaker_open = Breaker(port, policy.breaker).status().state == "open"
    decision = decide(reading, current, policy, breaker_open)
    if decision.decision == "remediate":
        return None
    if decision.decision == "taint" and not policy.dry_run:
        port.add_taint(current.name)
    detail = f"{decision.decision}: {decision.reason}" + (" (dry run)" if policy.dry_run else "")
    ledger.record(
        port, current.name, "refused", workflow=workflow_name, attempt=done, check=check, detail=detail
    )
    write_params(proceed="false")
    return f"{current.name}: {decision.decision} ({decision.reason}); no remediation"


def guard(
    node: str,
    check: str,
    event: str = "",
    workflow_name: str = "",
    dry_run: bool = False,
    max_attempts: str = "3",
    breaker_share: str = "0.1",
    breaker_window_s: str = "3600",
    drain_policy: str = "{}",
    repair_timeout: str = "4h",
    repair_template: str = "",
    repair_template_actions: str = repair.TEMPLATE_ACTIONS,
) -> str:
    """Decide whether this remediation may go on; the output ``proceed`` is ``true`` or ``false``.

    Refused (the workflow fails, nothing on the node changes): a node that does not exist, one opted
    out with ``dsx.dev/managed=false``, one already ``escalated`` (a person must look at it first), an
    open circuit breaker. A node past ``max_attempts`` since it was last in service is escalated, and so
    is one the fault history's lemon rule names (returned to service by that many remediations within its
    window, :mod:`steps.sentinel.history`): its replacement is asked for instead. A node
    already in remediation (an earlier workflow that stopped) is picked up where it stands; the
    per-node mutex of the workflow ensures no other remediation runs meanwhile. A run started by an
    ``event`` (the check's node condition as the Sensor and the reconciler pass it, or a HealthEvent, as
    JSON) whose fault no longer stands (:mod:`steps.sentinel.standing`: the condition cleared, written
    before the node's last return to service, or escalated by another run) is superseded: it ends with
    ``proceed=false``, changing nothing, and the ledger's ``superseded`` entry names the run that
    handled the fault. An event the policy does not send to remediation ends the workflow with
    ``proceed=false`` (a ``taint`` decision adds the taint). ``dry_run`` decides, records and stops.
    The ``requested`` entry's detail ends with ``; observed <RFC 3339>`` (when the condition turned
    True, or the HealthEvent's ``observed_at``) when an event started it.
    """
    settings = check_parameters(
        node,
        check,
        event,
        max_attempts,
        breaker_share,
        breaker_window_s,
        drain_policy,
        repair_timeout,
        repair_template,
        repair_template_actions,
    )
    reading = settings.reading
    port = connect()
    current = _node(port, node)
    history = ledger.entries(port, node)
    done = ledger.attempts(history)
    state = _state(current)
    if not current.managed:
        _refuse(port, node, check, workflow_name, done, f"{node} opts out (dsx.dev/managed=false)")
    if settings.triggered and state not in ACTIVE_STATES:
        superseded = _superseded(port, current, check, history, workflow_name, reading, done)
        if superseded:
            return superseded
    if state == vocab.NodeState.escalated.value:
        since = current.annotations.get(vocab.ANNOTATION_STATE_SINCE, "?")
        why = f"{node} is escalated since {since}; clear its dsx.dev/state label once it is dealt with"
        _refuse(port, node, check, workflow_name, done, why)
    if state in ACTIVE_STATES:
        return _resume(port, current, workflow_name, check, done, _observed(reading))
    policy = QuarantinePolicy(breaker=settings.breaker, dry_run=dry_run)
    if reading and (told := _by_event(port, current, reading, policy, workflow_name, check, done)):
        return told
    stopped = _past_limits(port, node, check, history, settings.max_attempts, workflow_name, dry_run, done)
    if stopped:
        return stopped
    if dry_run:
        detail = "dry run: would quarantine, drain, repair and recertify"
        ledger.record(port, node, "refused", workflow=workflow_name, attempt=done, check=check, detail=detail)
        write_params(proceed="false")
        return f"{node}: dry run: would remediate"
    return _admit(port, node, check, policy, workflow_name, done, reading)


def _refuse(port: ClusterPort, node: str, check: str, workflow: str, done: int, why: str) -> NoReturn:
    """Record the refusal in the ledger and fail the run (nothing on the node changed)."""
    ledger.record(port, node, "refused", workflow=workflow, attempt=done, check=check, detail=why)
    raise DsxError(f"remediation of {node} refused: {why}")


def _superseded(
    port: ClusterPort,
    current: Node,
    check: str,
    history: list[ledger.Entry],
    workflow_name: str,
    reading: HealthEvent | None,
    done: int,
) -> str | None:
    """For a run an event started: why it ends with nothing to do when its fault no longer stands (the
    ledger's ``superseded`` entry written, ``proceed=false``); ``None`` when it stands."""
    seen = changes.format_time(reading.observed_at) if reading is not None else ""
    verdict = standing(current, check, history, workflow_name, seen)
    if verdict.stands:
        return None
    handled = f"; handled by {verdict.handled}" if verdict.handled else ""
    detail = f"nothing to do: {verdict.why}{handled}"
    ledger.record(
        port, current.name, SUPERSEDED, workflow=workflow_name, attempt=done, check=check, detail=detail
    )
    write_params(proceed="false")
    return f"{current.name}: {detail}"


def _past_limits(
    port: ClusterPort,
    node: str,
    check: str,
    history: list[ledger.Entry],
    max_attempts: int,
    workflow_name: str,
    dry_run: bool,
    done: int,
) -> str | None:
    """Escalate a node past its attempts since it was last in service, or one the lemon rule names (a
    dry run only says so); ``None`` when neither applies."""
    changed = ledger.changed_attempts(history)
    if changed >= max_attempts:
        write_params(proceed="false")
        why = f"{changed} remediation attempts since it was last in service (limit {max_attempts})"
        _out_of_service(port, node, f"dsx-remediate {workflow_name}: {why}")
        _escalate(port, node, workflow_name, check, why)
    lemon = _lemon_rule()
    returned = returns_within(history, lemon.within_days, _now()) if lemon is not None else []
    if lemon is None or len(returned) < lemon.count:
        return None
    why = (
        f"remediated {len(returned)} times within {lemon.within_days:g} days (history rule lemon, "
        f"limit {lemon.count}): replace it rather than repair it again"
    )
    write_params(proceed="false")
    if dry_run:
        detail = f"dry run: would escalate: {why}"
        ledger.record(port, node, "refused", workflow=workflow_name, attempt=done, check=check, detail=detail)
        return f"{node}: {detail}"
    _out_of_service(port, node, f"dsx-remediate {workflow_name}: {why}")
    _escalate(port, node, workflow_name, check, why)


def _admit(
    port: ClusterPort,
    node: str,
    check: str,
    policy: QuarantinePolicy,
    workflow_name: str,
    done: int,
    reading: HealthEvent | None,
) -> str:
    """Ask the circuit breaker for a slot and record the ``requested`` entry: the run proceeds."""
    gpu_nodes = sum(1 for n in port.list_nodes() if n.gpu_count > 0)
    breaker = Breaker(port, policy.breaker)
    asked = breaker.clock()
    admitted, why = breaker.admit(node, gpu_nodes)
    if not admitted:
        _refuse(port, node, check, workflow_name, done, why)
    try:
        ledger.record(
            port,
            node,
            "requested",
            workflow=workflow_name,
            attempt=done + 1,
            check=check,
            detail=why + _observed(reading),
        )
    except Exception:
        # A slot in the breaker's window stands for a remediation under way: one whose requested entry
        # could not be written (the ledger refused, the API went away) gives it back, so guards failing
        # over and over never open the breaker with no node quarantined. The retry asks again.
        with contextlib.suppress(DsxError):
            breaker.withdraw(node, asked)
        raise
    write_params(proceed="true")
    return f"{node}: remediation attempt {done + 1} ({why})"


def quarantine(node: str, check: str, workflow_name: str = "") -> str:
    """Cordon the node as :data:`OWNER` and mark it ``quarantined``, with the taint.

    A cordon made outside dsx is kept (and recorded as such: dsx will not lift it); a cordon of
    another dsx owner refuses the quarantine.
    """
    _condition(check)
    port = connect()
    current = _node(port, node)
    if _state(current) in ACTIVE_STATES:
        _held(port, node, workflow_name, check)
        if _state(current) != vocab.NodeState.quarantined.value:
            return f"{node}: already past quarantine ({_state(current)})"
        attempt = _attempt(port, node)
        done = vocab.NodeState.quarantined.value
        if any(e.state == done and e.attempt == attempt for e in ledger.entries(port, node)):
            return f"{node}: already quarantined (attempt {attempt})"  # a resubmitted run: nothing to redo
    try:
        result = port.cordon(node, f"dsx-remediate {workflow_name}: {check}", by=OWNER)
    except CordonRefusedError as exc:
        raise DsxError(f"quarantine of {node} refused: {exc}") from None
    port.add_taint(node)
    _set_state(port, node, vocab.NodeState.quarantined.value, workflow_name, **{_CHECK: check})
    _record(port, node, vocab.NodeState.quarantined.value, workflow_name, check, result.summary)
    port.record_event(node, "DsxQuarantined", result.summary)
    return result.summary


def _past(node: Node, state: vocab.NodeState) -> bool:
    """Whether the node's remediation is already beyond ``state``."""
    current = _state(node)
    return current in ACTIVE_STATES and ACTIVE_STATES.index(current) > ACTIVE_STATES.index(state.value)


def drain(node: str, check: str, workflow_name: str = "", policy: str = "{}") -> dict[str, Any]:
    """Drain the node through the Eviction API (``policy``: a :class:`DrainPolicy` as JSON).

    Every pod and its outcome is the step's result and a ledger entry's detail. A drain past its
    deadline escalates the node; a node that disappeared ends the remediation.
    """
    settings = _drain_policy(policy)
    port = connect()
    current = _held(port, node, workflow_name, check)
    if _past(current, vocab.NodeState.draining):
        return {"node": node, "message": f"already drained ({_state(current)})", "pods": []}
    _set_state(port, node, vocab.NodeState.draining.value, workflow_name)
    attempt = _attempt(port, node)
    ledger.record(
        port, node, vocab.NodeState.draining.value, workflow=workflow_name, attempt=attempt, check=check
    )
    report = drain_pods(port, node, settings)
    told = "; ".join(f"{p.pod} {p.outcome}" for p in report.pods)
    ledger.record(
        port,
        node,
        vocab.NodeState.draining.value,
        workflow=workflow_name,
        attempt=attempt,
        check=check,
        detail=f"{report.summary()}: {told}"[:2000],
    )
    if report.node_gone:
        raise DsxError(f"{node} disappeared during the drain; nothing left to remediate")
    if report.escalate:
        _held(port, node, workflow_name, check)
        _escalate(port, node, workflow_name, check, f"drain incomplete: {report.message}")
    return report.model_dump()


def request_repair(
    node: str,
    check: str,
    workflow_name: str = "",
    repair_template: str = "",
    repair_template_actions: str = repair.TEMPLATE_ACTIONS,
) -> str:
    """Ask for a repair: the request (:mod:`steps.sentinel.repair`: the action, the GPUs and the
    evidence, in ``dsx-repair-<node>``, the action also as the node's ``dsx.dev/repair`` label and the
    GPUs' UUIDs as ``dsx.dev/repair-gpus``) and ``dsx.dev/repair-requested-at``, noting the boot id the
    repaired node must no longer show (``dsx.dev/repair-boot-id``). An action the operator's
    WorkflowTemplate takes (``repair_template``, for the actions ``repair_template_actions``) is handed
    to it: a Workflow of it is created with the request as parameters, its outcome ``Running``.

    Raises:
        InputError: the template parameters are malformed.
    """
    call = repair.template_call(repair_template, repair_template_actions)
    port = connect()
    current = _held(port, node, workflow_name, check)
    asked = current.annotations.get(vocab.ANNOTATION_REPAIR_REQUESTED_AT)
    if _state(current) == vocab.NodeState.awaiting_repair.value and asked:
        handed = _hand_to_template(port, current, check, workflow_name, call)
        return f"{node}: repair already requested at {asked}" + (f"; {handed}" if handed else "")
    if _past(current, vocab.NodeState.awaiting_repair):
        return f"{node}: already repaired ({_state(current)})"
    boot = current.node_info.boot_id
    at = changes.format_time(_now())
    request = repair.build_request(current, check, workflow_name, at, repair.node_events(port, node))
    name = repair.write_request(port, request)
    port.set_labels(node, {vocab.LABEL_REPAIR: request.action})
    current = _set_state(
        port,
        node,
        vocab.NodeState.awaiting_repair.value,
        workflow_name,
        **{
            vocab.ANNOTATION_REPAIR_REQUESTED_AT: at,
            vocab.ANNOTATION_REPAIR_BOOT_ID: boot,
            **_REPAIR_ASKED,
            vocab.ANNOTATION_REPAIR_GPUS: ",".join(g.uuid for g in request.gpus) or None,
        },
    )
    gpus = ", ".join(f"GPU {g.index} ({g.uuid})" for g in request.gpus) or "the node"
    what = f"{request.action} of {gpus}"
    _record(
        port,
        node,
        vocab.NodeState.awaiting_repair.value,
        workflow_name,
        check,
        f"repair requested: {what} (boot id {boot or 'unknown'}; request {name})",
    )
    port.record_event(
        node,
        "DsxRepairRequested",
        f"dsx-remediate {workflow_name} asks for a repair of {node}: {what}; the request is ConfigMap {name}",
    )
    handed = _hand_to_template(port, current, check, workflow_name, call)
    return f"{node}: repair requested at {at}: {what} (ConfigMap {name})" + (f"; {handed}" if handed else "")


def _hand_to_template(
    port: ClusterPort, current: Node, check: str, workflow_name: str, call: repair.TemplateCall | None
) -> str:
    """Create the operator's repair Workflow for the request on ``current`` when its action is the
    template's and nothing answered it yet; what was done (empty: nothing)."""
    action = current.labels.get(vocab.LABEL_REPAIR, "")
    asked = current.annotations.get(vocab.ANNOTATION_REPAIR_REQUESTED_AT, "")
    if call is None or action not in call.actions or not asked or outcome_of(current) is not None:
        return ""
    created = repair.call_template(port, current, call.template, workflow_name)
    _write_outcome(port, current.name, asked, f"workflow/{created}", "Running", f"{call.template} asked")
    detail = f"repair handed to WorkflowTemplate {call.template}: Workflow {created}"
    _record(port, current.name, vocab.NodeState.awaiting_repair.value, workflow_name, check, detail)
    return detail


def _write_outcome(
    port: ClusterPort, node: str, asked: str, actuator: str, phase: Phase, message: str
) -> Node:
    """Write what the repair's actuator did with the request of ``asked`` on the node."""
    outcome = RepairOutcome(
        requested_at=asked, actuator=actuator, phase=phase, at=changes.format_time(_now()), message=message
    )
    return port.set_node_metadata(node, annotations={vocab.ANNOTATION_REPAIR_OUTCOME: annotation(outcome)})


def repair_problems(node: Node, check: str) -> list[str]:
    """What keeps ``node`` from counting as repaired for ``check``; empty when it is.

    Repaired is: on a boot id other than the one the repair request recorded (or, for a ``reset-gpu``
    request, the GPUs reset: its actuator's outcome ``Succeeded``), Ready, and the check's condition not
    True. A condition that changed after the request must have been written after the new boot (its
    heartbeat no older than :data:`~steps.cluster.vocabulary.ANNOTATION_REPAIR_BOOTED_AT`, the last read
    of the old boot, or than the request when the wait never saw the old boot) or after the reset, so a
    reading from before the repair never clears a node: on a real node the boot id changes first, Ready
    comes tens of seconds later and the sentinel's first reading of the new boot later still. An
    actuator's ``Failed`` outcome is a problem of its own, and so is one still ``Running``, and so is the
    taint ``node.kubernetes.io/out-of-service``: a person confirmed the node down, and only they say it is
    back (Kubernetes leaves its removal to them), so recertification never runs under it.
    """
    condition = _condition(check)
    before = node.annotations.get(vocab.ANNOTATION_REPAIR_BOOT_ID, "")
    asked = node.annotations.get(vocab.ANNOTATION_REPAIR_REQUESTED_AT, "")
    booted = node.annotations.get(vocab.ANNOTATION_REPAIR_BOOTED_AT, "") or asked
    outcome = outcome_of(node)
    problems = []
    if outcome is not None and outcome.phase == "Failed":
        problems.append(f"{outcome.actuator} failed: {outcome.message}")
    elif outcome is not None and outcome.phase == "Running":
        problems.append(f"{outcome.actuator} not done ({outcome.message})")
    rebooted = not before or node.node_info.boot_id != before
    reset = (
        node.labels.get(vocab.LABEL_REPAIR) == "reset-gpu"
        and outcome is not None
        and outcome.phase == "Succeeded"
    )
    if not rebooted and not reset:
        problems.append(f"still on boot {before} (no reboot)")
    elif not rebooted and outcome is not None:
        booted = outcome.at  # the GPUs were reset, not the node: the reading must follow the reset
    if not node.ready:
        problems.append("not Ready")
    if node.has_taint(vocab.TAINT_OUT_OF_SERVICE):
        problems.append(f"out of service (a person's taint {vocab.TAINT_OUT_OF_SERVICE}, theirs to remove)")
    fault = node.condition(condition)
    if fault is not None and fault.status == "True":
        problems.append(f"condition {condition} still True")
    elif (
        fault is not None
        and asked
        and _after(fault.last_transition_time, asked)
        and not _after(fault.last_heartbeat_time, booted)
    ):
        when = "the reset" if booted != asked and not rebooted else "the boot"
        problems.append(f"condition {condition} last written at {fault.last_heartbeat_time}, before {when}")
    return problems


def _after(stamp: str, than: str) -> bool:
    """Whether the time ``stamp`` is not before ``than`` (both as the API server writes them); an
    unreadable or absent stamp is never after."""
    try:
        return changes.parse_time(stamp) >= changes.parse_time(than)
    except (TypeError, ValueError):
        return False


def repair_wait(node: str, check: str, timeout: str, workflow_name: str = "") -> str:
    """Wait, up to ``timeout`` (``4h``, ``30m``), for the node to be repaired as :func:`repaired` judges
    it (:func:`repair_problems`), reading it every few seconds. Once it is seen on a new boot, the last
    time it was read on the old one is written on the node (``dsx.dev/repair-booted-at``): the boot came
    after it, so a sentinel reading of the new boot is no older. A repair handed to a Workflow of the
    operator's template is followed too: once that Workflow ends, its phase is the outcome's. Ends when
    the node is repaired, its actuator failed, or the time ran out: the ``repaired`` step decides.

    Raises:
        InputError: ``timeout`` is not a duration between :data:`REPAIR_WAIT_MIN_S` and
            :data:`REPAIR_WAIT_LIMIT_S`.
    """
    seconds = _repair_timeout(timeout)
    port = connect()
    if _gone(port, node):
        return f"{node}: gone from the cluster (its Node object was deleted): the repair check records it"
    deadline = time.monotonic() + seconds
    interval = min(REPAIR_POLL_S, max(0.2, seconds / 30))
    current = _held(port, node, workflow_name, check)
    before = current.annotations.get(vocab.ANNOTATION_REPAIR_BOOT_ID, "")
    on_old_boot: dt.datetime | None = None  # when the node was last read on the old boot
    while True:
        if current.node_info.boot_id == before:
            on_old_boot = _now()
        elif on_old_boot is not None and not current.annotations.get(vocab.ANNOTATION_REPAIR_BOOTED_AT):
            # The boot came after the last read of the old one: a reading of the new boot is newer.
            current = port.set_node_metadata(
                node, annotations={vocab.ANNOTATION_REPAIR_BOOTED_AT: changes.format_time(on_old_boot)}
            )
        current = _follow_workflow(port, current)
        outcome = outcome_of(current)
        if outcome is not None and outcome.phase == "Failed":
            return f"{node}: the repair failed: {outcome.actuator}: {outcome.message}"
        problems = repair_problems(current, check)
        if not problems:
            return f"{node}: repaired (boot {current.node_info.boot_id})"
        left = deadline - time.monotonic()
        if left <= 0:
            return f"{node}: not repaired within {timeout}: " + ", ".join(problems)
        time.sleep(min(interval, left))
        if _gone(port, node):
            return f"{node}: gone from the cluster (its Node object was deleted): the repair check records it"
        current = _held(port, node, workflow_name, check)


def _follow_workflow(port: ClusterPort, current: Node) -> Node:
    """The node, with the outcome of a repair handed to a Workflow written once that Workflow ended
    (``Succeeded``, or ``Failed`` for any other end and for a Workflow that is gone)."""
    outcome = outcome_of(current)
    if outcome is None or outcome.finished or not outcome.actuator.startswith("workflow/"):
        return current
    name = outcome.actuator.removeprefix("workflow/")
    found = repair.workflow_phase(port, name)
    if found is None:
        phase: Phase = "Failed"
        said = f"Workflow {name} is gone"
    elif found[0] in vocab.WORKFLOW_FINISHED_PHASES:
        phase = "Succeeded" if found[0] == "Succeeded" else "Failed"
        said = f"Workflow {name} {found[0]}" + (f": {found[1]}" if found[1] else "")
    else:
        return current
    asked = current.annotations.get(vocab.ANNOTATION_REPAIR_REQUESTED_AT, "")
    return _write_outcome(port, current.name, asked, outcome.actuator, phase, said)


def repaired(node: str, check: str, workflow_name: str = "") -> str:
    """After the repair wait: the node must be repaired (:func:`repair_problems`: a new boot or the GPUs
    reset, Ready, the check's condition cleared by a reading after it). What the repair's actuator did is
    recorded in the ledger; a Workflow it handed the repair to is read once more (a suspend followed none).

    Anything else (the wait ran out: no repair came) escalates the node. On success the node moves to
    ``recertifying`` and its certification label to ``pending``, so a certification that never ran can
    never read as a pass. A node whose object was deleted meanwhile (a cloud's terminate-and-replace, a
    person's ``kubectl delete node``) left the cluster: the ledger records it ``replaced`` and the output
    parameter ``gone`` (``true``) skips its recertification; the run ends there.
    """
    _condition(check)
    port = connect()
    if _gone(port, node):
        write_params(gone="true")
        return _replaced(port, node, workflow_name, check)
    write_params(gone="false")
    current = _held(port, node, workflow_name, check)
    if _past(current, vocab.NodeState.recertifying) or _state(current) == vocab.NodeState.recertifying.value:
        return f"{node}: already repaired"
    current = _follow_workflow(port, current)  # after a suspend, which followed nothing
    outcome = outcome_of(current)
    if outcome is not None:
        detail = f"repair by {outcome.actuator}: {outcome.phase} at {outcome.at}: {outcome.message}"
        _record(port, node, vocab.NodeState.awaiting_repair.value, workflow_name, check, detail)
    problems = repair_problems(current, check)
    if outcome is not None and outcome.phase == "Failed":
        _escalate(port, node, workflow_name, check, "the repair failed: " + ", ".join(problems))
    if problems:
        _escalate(port, node, workflow_name, check, "the repair did not come: " + ", ".join(problems))
    _set_state(port, node, vocab.NodeState.recertifying.value, workflow_name)
    port.set_labels(node, {vocab.LABEL_CERTIFICATION: vocab.Certification.pending.value})
    boot = current.node_info.boot_id
    kept = boot == current.annotations.get(vocab.ANNOTATION_REPAIR_BOOT_ID)
    how = f"GPUs reset, boot {boot} kept" if kept else f"boot {boot}"
    _record(port, node, _RECERTIFYING, workflow_name, check, f"repaired: {how}")
    return f"{node}: repaired ({how}); recertifying"


def _gone(port: ClusterPort, name: str) -> bool:
    """Whether the node's object is gone from the cluster (deleted: a cloud's terminate-and-replace, or a
    person's ``kubectl delete node``)."""
    try:
        port.get_node(name)
    except NotFoundError:
        return True
    return False


def _replaced(port: ClusterPort, node: str, workflow: str, check: str) -> str:
    """A node deleted while awaiting its repair: the machine left the cluster, and this remediation ends
    with it. The ledger says so (a node of the same name hereafter is another machine, whose attempts
    and returns start afresh); the repair request is kept, the case of the machine that left."""
    request = port.get_object("v1", "ConfigMap", repair.request_name(node), port.namespace)
    action = ((request or {}).get("metadata", {}).get("labels") or {}).get(vocab.LABEL_REPAIR, "")
    asked = f" (the repair asked: {action})" if action else ""
    detail = (
        f"the Node object was deleted while awaiting its repair{asked}: the machine left the cluster; "
        f"a node named {node} hereafter is another machine; the request {repair.request_name(node)} is kept"
    )
    history = ledger.entries(port, node)
    if history and history[-1].state == ledger.REPLACED and history[-1].workflow == workflow:
        return f"{node}: replaced (recorded already)"
    _record(port, node, ledger.REPLACED, workflow, check, detail)
    with contextlib.suppress(DsxError):  # an Event about a deleted node: kept where the API server keeps it
        port.record_event(node, "DsxNodeReplaced", f"{node}: {detail}", "Normal")
    return f"{node}: replaced: {detail}"


def conclude(node: str, check: str, workflow_name: str = "") -> str:
    """After recertification: a pass puts the node back in service; a failure escalates it; no verdict
    (certification left the node ``pending``: its pods unschedulable, a step stopped; or the pair test
    could not test it: every known-good partner busy) keeps it recertifying and cordoned, and ends the
    workflow Failed saying so, for a later run to test again.

    Recertification passed when the node's certification label reads ``passed``: certification on the
    node alone passed and the pair test beside a known-good node did not label it failed (its note, the
    ``dsx.dev/pair-test`` annotation, goes into the ledger's detail and is cleared on a pass).
    Back in service: dsx's cordon lifted (a cordon that predates dsx stays, and the result says so),
    the taint removed, the state label and remediation annotations cleared.
    """
    port = connect()
    current = _held(port, node, workflow_name, check)
    verdict = current.labels.get(vocab.LABEL_CERTIFICATION, "")
    pair = current.annotations.get(vocab.ANNOTATION_PAIR_TEST, "")
    paired = f"; pair test {pair}" if pair else ""
    why = current.annotations.get(vocab.ANNOTATION_CERTIFICATION_REASON, "")
    if pair.startswith(NO_VERDICT) or verdict not in (vocab.Certification.failed.value, _PASSED):
        # Nothing was proven against the node (the pair test, or certification itself, could not test
        # it): it stays recertifying, cordoned, to be tested again.
        said = (
            pair.removeprefix(NO_VERDICT).lstrip(": ")
            if pair.startswith(NO_VERDICT)
            else f"certification {verdict or 'did not run'}" + (f": {why}" if why else "")
        )
        _record(port, node, _RECERTIFYING, workflow_name, check, f"kept recertifying: {said}"[:2000])
        raise DsxError(
            f"{node}: recertification gave no verdict ({said}); it stays recertifying and cordoned, not "
            "escalated: submit dsx-remediate again to test it"
        )
    if verdict != _PASSED:
        _escalate(
            port,
            node,
            workflow_name,
            check,
            f"recertification {verdict}" + (f": {why}" if why else "") + paired,
        )
    if not pair.startswith(("passed", "skipped")):
        # Certification passed but the pair test did not finish (a step of it errored): the node stays
        # recertifying, cordoned, for a resubmitted workflow to test again.
        raise DsxError(
            f"{node}: the pair test did not finish ({pair or 'not run'}); submit dsx-remediate again"
        )
    try:
        summary = port.uncordon(node, by=OWNER).summary
    except CordonRefusedError as exc:
        summary = f"{node} left cordoned: {exc}"
    port.remove_taint(node)
    attempt = _attempt(port, node)
    _set_state(
        port,
        node,
        None,
        workflow_name,
        **{
            **_REMEDIATION_NAMED,
            vocab.ANNOTATION_REPAIR_REQUESTED_AT: None,
            vocab.ANNOTATION_REPAIR_BOOT_ID: None,
            **_REPAIR_ASKED,
            vocab.ANNOTATION_PAIR_TEST: None,
        },
    )
    port.set_labels(node, {vocab.LABEL_REPLACE: None, vocab.LABEL_REPAIR: None})
    repair.clear_request(port, node)  # repaired: an escalated node keeps its request, the vendor's case
    ledger.record(
        port,
        node,
        ledger.IN_SERVICE,
        workflow=workflow_name,
        attempt=attempt,
        check=check,
        detail=f"certified{paired}; {summary}",
    )
    port.record_event(node, "DsxBackInService", f"{node} recertified{paired} and back in service: {summary}")
    return summary


def record_outcome(node: str, check: str, workflow_name: str = "", status: str = "") -> str:
    """The exit handler: record how the workflow ended and where the node stands.

    A node left in an active state (the workflow stopped, or a step failed for the infrastructure)
    keeps its label and cordon, so that a resubmitted workflow picks up from there.
    """
    port = connect()
    try:
        current = port.get_node(node)
    except NotFoundError:
        state = "node gone"
    else:
        state = _state(current) or "in service"
    detail = f"workflow {status or 'ended'}; node {state}"
    _record(port, node, "ended", workflow_name, check, detail)
    return f"{node}: {detail}"
