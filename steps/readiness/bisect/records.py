"""What the bisection steps of a workflow leave for each other and for the report: one record per test.

A bisection's search runs in one step per group, and later steps (the next stage, the report, ``finish``)
read what it found through the cluster: every test is kept in a small ConfigMap of the run, labelled like
the certification run's outcomes (:mod:`steps.readiness.outcomes`), so the report step reads them and
deleting the run's outcomes deletes them too; so is each accusation (a ``verdict`` record, with its
probability) and the end of each search (a ``summary`` record: the nodes left in service, how long they were
screened, the nodes left unresolved). From the records come the nodes a search cleared (partners for later
bisections), the suspects, and the attribution a failed group gets once it was bisected
(:func:`with_bisection`).
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Sequence
from typing import Any, Literal, TypeVar

from pydantic import Field

from steps.cluster import vocabulary as vocab
from steps.cluster.errors import ConflictError
from steps.models import Frozen
from steps.readiness.bisect.models import Fault, Outcome
from steps.readiness.check import CheckOutcome
from steps.readiness.models import Subject, Verdict
from steps.readiness.outcomes import OutcomeStore, workflow_owner

__all__ = ["BISECT_TEST", "KIND", "Record", "Records", "suspect_reason", "with_bisection"]

Judged = TypeVar("Judged", bound=CheckOutcome[Any])

KIND = "bisect"
"""The outcome kind (label ``dsx.dev/outcome``) of a bisection's records."""

BISECT_TEST = "multi-node-bisect"
"""The test of the verdict that names a node confirmed at fault beside a known-good partner."""

_DATA_KEY = "record.json"
_FAULT_WORDS: dict[str, str] = {
    "slow": "slow",
    "slow-relative": "slow relative to its peers",
    "fail": "fails",
    "hang": "hangs",
}


class Record(Frozen):
    """One test a bisection ran, one accusation, or the end of one search.

    Attributes:
        group: the group the bisection narrows (a certification group such as ``rack-01``, or ``bisect``).
        kind: a test (``group``, ``split``, ``pair``, ``partner``, as the search's runs say); ``verdict``
            (a node accused: ``members`` is the node, ``probability`` its posterior, ``fault`` what showed,
            ``partner`` the node of its last failed pair test); ``summary`` (the search ended: ``members``
            the nodes left in service, ``outcome`` ``pass`` when it screened them healthy, ``fail`` when it
            could not, ``none`` when a test gave no verdict).
        members: the nodes tested (for a verdict, the node; for a summary, the nodes left in service).
        outcome: ``pass``, ``fail``, ``hang``, or ``none``: no verdict (the test's pods were not all
            running within the scheduling budget, so nothing was measured: it names and clears no one).
        figure: the measured bus bandwidth in GB/s, if any.
        threshold: the threshold it was judged against, in GB/s.
        attempts: runs of the test.
        reason: what the test said.
        probability: a verdict's posterior probability; a summary's probability that a fault is left.
        kind_of_fault: a verdict's fault (``slow``, ``slow-relative``, ``fail``, ``hang``).
        partner: a verdict's partner, if any.
        screening: a summary's passes of the nodes left in service (the fewest any of them took part in
            since a failed test held it).
        caught: a summary's least intermittence the screening would have caught with 99%.
        unresolved: a summary's nodes left between accused and cleared, with their probability.
    """

    group: str
    kind: Literal["group", "split", "pair", "partner", "verdict", "summary"]
    members: list[str]
    outcome: Outcome | Literal["none"]
    figure: float | None = None
    threshold: float | None = None
    attempts: int = Field(1, ge=1)
    reason: str = ""
    probability: float | None = None
    kind_of_fault: Fault | None = None
    partner: str | None = None
    screening: int | None = None
    caught: float | None = None
    unresolved: dict[str, float] = Field(default_factory=dict)

    @property
    def suspect(self) -> str | None:
        """The node a verdict record accuses, else ``None``."""
        return self.members[0] if self.kind == "verdict" else None

    @property
    def fault(self) -> Fault:
        """What a failing test showed: ``hang``, ``slow`` (a figure under the threshold) or ``fail`` (a
        verdict's own fault when it has one)."""
        if self.kind_of_fault is not None:
            return self.kind_of_fault
        if self.outcome == "hang":
            return "hang"
        return "slow" if self.figure is not None else "fail"


def suspect_reason(record: Record) -> str:
    """The one line an accused node is labelled with (``dsx.dev/certification-reason``)."""
    node = record.members[0]
    seen = (
        f"{record.figure:.3g} GB/s < {record.threshold:.3g} GB/s"
        if record.figure is not None and record.threshold is not None and record.fault == "slow"
        else record.reason
    )
    beside = f" beside {record.partner}" if record.partner else ""
    probability = f"probability {record.probability:.4f}, " if record.probability is not None else ""
    return (
        f"{node}: {_FAULT_WORDS[record.fault]} in multi-node tests: {seen}{beside} "
        f"({probability}bisection of {record.group})"
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
        """Nodes a search screened healthy (the nodes left in service of a summary that passed)."""
        return sorted({n for r in self.summaries() if r.outcome == "pass" for n in r.members})

    def suspects(self) -> dict[str, Record]:
        """Each node accused, with its verdict record."""
        return {r.suspect: r for r in self.all() if r.suspect is not None}

    def summaries(self) -> list[Record]:
        """How each search ended."""
        return [r for r in self.all() if r.kind == "summary"]

    def tests(self) -> list[Record]:
        """Every test run."""
        return [r for r in self.all() if r.kind not in ("verdict", "summary")]


def with_bisection(groups: Sequence[Judged], store: OutcomeStore) -> list[Judged]:
    """Failed groups as their bisection attributes them.

    A bisected group's failure is laid on its members that bisection did not clear, and no longer names
    a node by itself (a local run's straggler attribution, say): a node is named by the test that
    confirmed it beside a known-good partner, whose verdict is added to the group's. A member a passing
    test cleared is no longer in doubt. Groups that were not bisected are returned as they are.
    """
    records = Records(store).all()
    if not records:
        return list(groups)
    cleared = {n for r in records if r.kind == "summary" and r.outcome == "pass" for n in r.members}
    suspects = {r.suspect: r for r in records if r.suspect is not None}
    result: list[Judged] = []
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
                    probability=record.probability,
                )
            )
        result.append(outcome.model_copy(update={"verdicts": verdicts}))
    return result
