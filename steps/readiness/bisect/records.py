"""What the bisection steps of a workflow leave for each other and for the report: one record per test.

The recursive ``dsx-bisect`` runs each group test in its own step, so the tests of one bisection meet only
through the cluster: every test is kept in a small ConfigMap of the run, labelled like the certification
run's outcomes (:mod:`steps.readiness.outcomes`), so the report step reads them and deleting the run's
outcomes deletes them too. From the records come the nodes a passing test cleared (known-good partners for
later confirmations), the suspects, and the attribution a failed group gets once it was bisected
(:func:`with_bisection`).
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Sequence
from typing import Literal

from pydantic import Field

from steps.cluster import vocabulary as vocab
from steps.cluster.errors import ConflictError
from steps.models import Frozen
from steps.readiness.bisect.models import Fault, Outcome
from steps.readiness.checks import SweepOutcome
from steps.readiness.models import Subject, Verdict
from steps.readiness.outcomes import OutcomeStore, workflow_owner

__all__ = ["BISECT_TEST", "KIND", "Record", "Records", "suspect_reason", "with_bisection"]

KIND = "bisect"
"""The outcome kind (label ``dsx.dev/outcome``) of a bisection's records."""

BISECT_TEST = "multi-node-bisect"
"""The test of the verdict that names a node confirmed at fault beside a known-good partner."""

_DATA_KEY = "record.json"
_FAULT_WORDS: dict[str, str] = {"slow": "slow", "fail": "fails", "hang": "hangs"}


class Record(Frozen):
    """One group test a bisection ran.

    Attributes:
        group: the group the bisection narrows (a certification group such as ``rack-01``, or ``bisect``).
        kind: ``split`` (part of the failing group) or ``partner`` (a member beside a known-good node,
            the partner last).
        members: the nodes tested.
        outcome: ``pass``, ``fail``, ``hang``, or ``none``: no verdict (the test's pods were not all
            running within the scheduling budget, so nothing was measured: it names and clears no one).
        figure: the measured bus bandwidth in GB/s, if any.
        threshold: the threshold it was judged against, in GB/s.
        attempts: runs of the test: a figure within the noise band of its threshold is measured again
            and the median counts (``figure``).
        reason: what the test said.
    """

    group: str
    kind: Literal["split", "partner"]
    members: list[str]
    outcome: Outcome | Literal["none"]
    figure: float | None = None
    threshold: float | None = None
    attempts: int = Field(1, ge=1)
    reason: str = ""

    @property
    def suspect(self) -> str | None:
        """The node a failing partner test names (its first member), else ``None`` (a pass, or no
        verdict)."""
        return self.members[0] if self.kind == "partner" and self.outcome in ("fail", "hang") else None

    @property
    def fault(self) -> Fault:
        """What a failing test showed: ``hang``, ``slow`` (a figure under the threshold) or ``fail``."""
        if self.outcome == "hang":
            return "hang"
        return "slow" if self.figure is not None else "fail"


def suspect_reason(record: Record) -> str:
    """The one line a confirmed suspect is labelled with (``dsx.dev/certification-reason``)."""
    node, partner = record.members[0], record.members[-1]
    seen = (
        f"{record.figure:.3g} GB/s < {record.threshold:.3g} GB/s"
        if record.figure is not None and record.threshold is not None
        else record.reason
    )
    return (
        f"{node}: {_FAULT_WORDS[record.fault]} in multi-node tests: {seen} beside known-good {partner} "
        f"(bisection of {record.group})"
    )


class Records:
    """The bisection records of one run, in the run's namespace (beside its outcomes)."""

    def __init__(self, store: OutcomeStore) -> None:
        self.port = store.port
        self.run = store.run

    def put(self, record: Record) -> None:
        """Keep ``record`` (a retried step's identical test replaces its earlier copy)."""
        text = record.model_dump_json()
        digest = hashlib.sha256(f"{self.run.uid}/{text}".encode()).hexdigest()[:20]
        name = f"dsx-outcome-{KIND}-{digest}"
        metadata: dict[str, object] = {
            "name": name,
            "namespace": self.run.namespace,
            "labels": {vocab.LABEL_CERTIFICATION_RUN: self.run.uid, vocab.LABEL_OUTCOME_KIND: KIND},
            "annotations": {vocab.ANNOTATION_SUBJECT: record.group, vocab.ANNOTATION_WORKFLOW: self.run.name},
        }
        owner = workflow_owner(self.port, self.run, self.run.namespace)
        if owner:
            metadata["ownerReferences"] = owner
        with contextlib.suppress(ConflictError):  # the same test, kept by an earlier try of the step
            self.port.create_object(
                {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": {_DATA_KEY: text}}
            )

    def all(self) -> list[Record]:
        """Every record of the run, in a stable order."""
        selector = f"{vocab.LABEL_CERTIFICATION_RUN}={self.run.uid},{vocab.LABEL_OUTCOME_KIND}={KIND}"
        found = self.port.list_objects("v1", "ConfigMap", self.run.namespace, selector)
        records = [
            Record.model_validate_json(str((item.get("data") or {}).get(_DATA_KEY) or "{}")) for item in found
        ]
        return sorted(records, key=lambda r: (r.group, r.kind, r.members, r.outcome))

    def cleared(self) -> list[str]:
        """Nodes a passing test took part in (for a partner test, the member: the partner was known good)."""
        return sorted({n for r in self.all() if r.outcome == "pass" for n in r.members})

    def suspects(self) -> dict[str, Record]:
        """Each node a failing partner test named, with that test."""
        return {r.suspect: r for r in self.all() if r.suspect is not None}


def with_bisection(groups: Sequence[SweepOutcome], store: OutcomeStore) -> list[SweepOutcome]:
    """Failed groups as their bisection attributes them.

    A bisected group's failure is laid on its members that bisection did not clear, and no longer names
    a node by itself (a local run's straggler attribution, say): a node is named by the test that
    confirmed it beside a known-good partner, whose verdict is added to the group's. A member a passing
    test cleared is no longer in doubt. Groups that were not bisected are returned as they are.
    """
    records = Records(store).all()
    if not records:
        return list(groups)
    cleared = {n for r in records if r.outcome == "pass" for n in r.members}
    suspects = {r.suspect: r for r in records if r.suspect is not None}
    result: list[SweepOutcome] = []
    for outcome in groups:
        mine = [r for r in records if r.group == outcome.subject.name]
        if not mine or outcome.status == "pass":
            result.append(outcome)
            continue
        doubtful = [m for m in outcome.subject.members if m not in cleared or m in suspects]
        verdicts: list[Verdict] = []
        for verdict in outcome.verdicts:
            if verdict.status == "pass":
                verdicts.append(verdict)
                continue
            narrowed = verdict.subject.model_copy(update={"members": doubtful})
            verdicts.append(verdict.model_copy(update={"subject": narrowed, "node": None, "rank": None}))
        for record in sorted((r for r in mine if r.suspect is not None), key=lambda r: r.members):
            node = record.members[0]
            verdicts.append(
                Verdict(
                    subject=Subject(kind="node", name=node, members=[node]),
                    test=BISECT_TEST,
                    status="hang" if record.outcome == "hang" else "fail",
                    measured=record.figure,
                    threshold=record.threshold,
                    unit="GB/s" if record.figure is not None else None,
                    message=suspect_reason(record),
                    node=node,
                )
            )
        result.append(outcome.model_copy(update={"verdicts": verdicts}))
    return result
