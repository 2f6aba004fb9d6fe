"""What a repair's actuator did with a repair request: the contract between the two sides of the sentinel.

``dsx-remediate`` asks for a repair on the node (``dsx.dev/repair-requested-at``, the action as the label
``dsx.dev/repair``, the GPUs as ``dsx.dev/repair-gpus``); whatever acts on it (the agent resetting a GPU,
the agent asking kured for a reboot, a WorkflowTemplate the operator names) says what became of it in the
node's annotation ``dsx.dev/repair-outcome``, a JSON object:

- ``requestedAt``: the request it answers (an outcome of an earlier request is no answer to this one);
- ``actuator``: who acted (``agent/reset-gpu``, ``agent/kured``, ``workflow/NAME``);
- ``phase``: ``Running`` (under way), ``Succeeded`` or ``Failed``;
- ``at``: when the phase was written; ``message``: what it says, for a person and the ledger.

The repair wait reads it: a ``Failed`` outcome ends the wait (the node is escalated with its message), a
``Succeeded`` reset counts as the repair once the sentinel's reading after it clears the fault. This
module is the one both sides import: the agent side never reaches into remediation, nor the reverse.
"""

from __future__ import annotations

import json
from typing import Literal

from pydantic import ValidationError

from steps.cluster import vocabulary as vocab
from steps.cluster.node import Node
from steps.models import Camel

__all__ = ["Phase", "RepairOutcome", "annotation", "outcome_of", "requested_gpus"]

Phase = Literal["Running", "Succeeded", "Failed"]
FINISHED: tuple[Phase, ...] = ("Succeeded", "Failed")


class RepairOutcome(Camel):
    """What an actuator did with the repair request of ``requested_at``."""

    requested_at: str
    actuator: str
    phase: Phase
    at: str
    message: str = ""

    @property
    def finished(self) -> bool:
        """Whether the actuator is done with the request (``Succeeded`` or ``Failed``)."""
        return self.phase in FINISHED


def annotation(outcome: RepairOutcome) -> str:
    """``outcome`` as the annotation's value."""
    return json.dumps(outcome.model_dump(mode="json", by_alias=True), separators=(",", ":"))


def outcome_of(node: Node) -> RepairOutcome | None:
    """The outcome written for the node's repair request now, or ``None``: none yet, one of an earlier
    request, or one that does not read as an outcome (said nowhere: it is no answer to this request)."""
    asked = node.annotations.get(vocab.ANNOTATION_REPAIR_REQUESTED_AT, "")
    text = node.annotations.get(vocab.ANNOTATION_REPAIR_OUTCOME, "")
    if not asked or not text:
        return None
    try:
        found = RepairOutcome.model_validate(json.loads(text))
    except (ValueError, ValidationError):
        return None
    return found if found.requested_at == asked else None


def requested_gpus(node: Node) -> list[str]:
    """The UUIDs of the GPUs the node's repair request names, in order."""
    text = node.annotations.get(vocab.ANNOTATION_REPAIR_GPUS, "")
    return [uuid.strip() for uuid in text.split(",") if uuid.strip()]
