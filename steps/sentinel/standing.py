"""Whether the fault a remediation was started for still stands, or another run already dealt with it.

A trigger is an edge seen once, but the run it starts may begin much later: it waits on the node's mutex
behind another remediation (two checks turning fatal in two updates fire two Workflows; the reconciler
and the Sensor may both start one for a fault), on the Sensor's rate limit, or on a reconciler pass. By
then the node may have been repaired and put back. A run started for a fault goes on only while:

- the check's condition is ``True``, and
- the sentinel wrote it (``lastHeartbeatTime``: the agent's last write of it, a new fault on any entity
  rewrites it) after the node's last return to service (the ledger's last ``in-service`` entry): a
  condition older than that was there when the node was certified and put back, so the run that put it
  back handled it; and
- the node is not ``escalated`` by another run since the condition turned True (that run handled it: a
  person must look at the node now).

Otherwise the run is superseded: it changes nothing and ends Succeeded, and the ledger names the run that
handled the fault. A run a person started (no event) is not judged by this: they asked for it.
"""

from __future__ import annotations

from dataclasses import dataclass

from steps.cluster import changes
from steps.cluster import vocabulary as vocab
from steps.cluster.node import Condition, Node
from steps.sentinel.ledger import ENDS, Entry

__all__ = ["SUPERSEDED", "Standing", "last_in_service", "standing"]

SUPERSEDED = "superseded"
"""The ledger state of a run whose fault no longer stood: it changed nothing."""


@dataclass(frozen=True)
class Standing:
    """The verdict: ``stands`` (go on), else ``why`` not and the run that ``handled`` it (may be empty)."""

    stands: bool
    why: str = ""
    handled: str = ""


def last_in_service(history: list[Entry]) -> Entry | None:
    """The ledger's last ``in-service`` (or ``replaced``) entry: when the node last returned to service (or
    its name went to another machine), and by which run."""
    return next((e for e in reversed(history) if e.state in ENDS), None)


def _written(condition: Condition) -> str:
    return condition.last_heartbeat_time or condition.last_transition_time


def _not_after(stamp: str, than: str) -> bool:
    """``stamp`` is at or before ``than`` (both RFC 3339; a missing or malformed stamp is not after)."""
    try:
        return changes.parse_time(stamp) <= changes.parse_time(than)
    except ValueError:
        return True


def _before(stamp: str, than: str) -> bool:
    """``stamp`` is before ``than`` (an empty or malformed ``than`` bounds nothing)."""
    try:
        return changes.parse_time(stamp) < changes.parse_time(than)
    except ValueError:
        return False


def standing(
    node: Node, check: str, history: list[Entry], workflow: str = "", observed: str = ""
) -> Standing:
    """Whether the fault of ``check`` on ``node`` still stands for the run ``workflow`` (see the module
    docstring); ``history`` is the node's ledger, oldest first; ``observed`` (RFC 3339), when the trigger
    saw the fault: a return to service before it did not handle it."""
    name = vocab.CONDITION_SENTINEL[check]
    back = last_in_service(history)
    condition = node.condition(name)
    if condition is None or condition.status != "True":
        since = condition.last_transition_time if condition is not None else ""
        cleared = f" (since {since})" if since else ""
        handled = back.workflow if back is not None and not _before(back.at, observed) else ""
        return Standing(False, f"{name} is no longer True{cleared}", handled)
    if back is not None and _not_after(_written(condition), back.at):
        return Standing(
            False,
            f"{name} was last written at {_written(condition) or '?'}, before {node.name} returned to "
            f"service at {back.at}",
            back.workflow,
        )
    if node.labels.get(vocab.LABEL_STATE) == vocab.NodeState.escalated.value:
        since = condition.last_transition_time
        escalated = next(
            (
                e
                for e in reversed(history)
                if e.state == vocab.NodeState.escalated.value
                and e.workflow != workflow
                and not _before(e.at, since)
            ),
            None,
        )
        if escalated is not None:
            return Standing(
                False, f"{node.name} was escalated at {escalated.at} for this fault", escalated.workflow
            )
    return Standing(True)
