"""The steps of ``dsx-bisect`` and of the bisection stages of ``dsx-certify``: the search of ``dsx bisect``.

``search-group`` runs :func:`search_group`: the search of :func:`steps.readiness.bisect.bisect` over the
certification's own group test (:func:`steps.readiness.certify.sweep_group`: real gloo ranks on this machine
for a simulated fleet, Indexed Jobs with NCCL on a cluster), one test after another. Every result is evidence;
a node whose probability of being faulty reaches ``1 - alpha`` is labelled ``dsx.dev/certification=failed`` at
once, with the reason and the probability, so nothing is lost if the workflow stops; the group is screened
healthy only after enough passes. A certification lends its run (the plan and the recipe's thresholds); a
``dsx-bisect`` of its own makes one with :func:`prepare` (dsx's default thresholds, no Leases, no ``pending``
labels: it names the faulty, it certifies nobody). Every test, accusation and end of a search is kept as a
:class:`~steps.readiness.bisect.records.Record` of the run.

Hera's runner calls these with pydantic inputs: no ``from __future__ import annotations`` here.
"""

import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Literal

from pydantic import Field, ValidationError

from steps.cluster import connect
from steps.cluster import vocabulary as vocab
from steps.errors import DsxError, InputError
from steps.models import Frozen, input_error
from steps.outputs import write_params
from steps.readiness import certify
from steps.readiness.bisect.evidence import P_MIN
from steps.readiness.bisect.models import BisectResult, GroupResult, Suspect, TestRun
from steps.readiness.bisect.records import Record, Records, suspect_reason
from steps.readiness.bisect.strategies import bisect
from steps.readiness.check import CheckOutcome
from steps.readiness.checks import ALLREDUCE_SWEEP, RANK_PRELOAD
from steps.readiness.judge import only_slow
from steps.readiness.models import CollectiveRun, Subject
from steps.readiness.outcomes import OutcomeStore, RunRef
from steps.readiness.planning import LOCAL_RANKS_PER_NODE, sweep_sizes
from steps.readiness.ranks.sweep import DEFAULTS as SWEEP

__all__ = [
    "BisectStart",
    "BisectSummary",
    "BisectTarget",
    "bisect_targets",
    "finish",
    "prepare",
    "search_group",
]

FORK_SERVER_PRELOAD = RANK_PRELOAD
"""The group search launches ranks as certification's checks do (:mod:`steps.forkserver`)."""

STANDALONE = "bisect"
"""The group name of a ``dsx-bisect`` of its own."""


class BisectStart(Frozen):
    """A ``dsx-bisect`` of its own: its run, and the nodes it bisects (also its output parameters)."""

    run: RunRef
    members: list[str]
    launcher: str


class BisectTarget(Frozen):
    """A failed group of a certification to bisect, with the known-good nodes lent to it as partners."""

    group: str
    members: list[str]
    partners: list[str]


class BisectSummary(Frozen):
    """What a ``dsx-bisect`` of its own found."""

    suspects: dict[str, str] = Field(description="node -> the reason it was labelled with")
    tests: int
    cleared: int
    screening: int = Field(
        0, description="passes of the nodes left in service since a failed test held them (the fewest of any)"
    )
    caught: float = Field(1.0, description="the least intermittence that screening catches with 99%")


def _run_ref(text: RunRef | str) -> RunRef:
    if isinstance(text, RunRef):
        return text
    try:
        return RunRef.model_validate_json(text)
    except ValidationError as exc:
        raise input_error(exc, "bisect run") from None


def prepare(
    selector: str = "",
    workflow_name: str = "",
    workflow_uid: str = "",
    accelerator: str = certify.AUTO,
    min_bytes: str = certify.AUTO,
    max_bytes: str = certify.AUTO,
    iters: int = SWEEP.iters,
    p_min: float = P_MIN,
) -> BisectStart:
    """Start a ``dsx-bisect`` of its own: the Ready managed nodes with GPUs that ``selector`` picks.

    The run is kept like a certification's (a plan with dsx's default thresholds), so the group tests are
    the certification's. ``accelerator`` ``cpu`` runs them over gloo (a cluster without GPUs), and
    ``min_bytes``, ``max_bytes`` and ``iters`` size them as certification's options do (``auto``: 64KiB
    to 4MiB locally, 1MiB to 8GiB on a cluster); remediation's pair test passes its own. Nothing is
    labelled here. Output parameters: ``run`` and ``members``.

    Raises:
        InputError: an option is malformed, or the selector picks fewer than two nodes to test together.
    """
    options = certify.check_options(
        selector=selector,
        accelerator=accelerator,
        min_bytes=min_bytes,
        max_bytes=max_bytes,
        iters=iters,
        p_min=p_min,
    )
    port = connect()
    try:
        given = workflow_name or workflow_uid
        run = (
            RunRef(name=workflow_name, uid=workflow_uid, namespace=port.namespace)
            if given
            else RunRef.local(port.namespace)
        )
    except ValidationError as exc:
        raise input_error(exc, "bisect workflow") from None
    nodes = [
        n for n in port.list_nodes(options.selector or None) if n.managed and n.gpu_count > 0 and n.ready
    ]
    names = sorted(n.name for n in nodes)
    if len(names) < 2:
        what = f"selector {selector!r}" if selector else "the cluster"
        raise InputError(f"nothing to bisect: {what} has {len(names)} Ready managed node(s) with GPUs")
    local = not port.runs_pods
    smallest, largest = sweep_sizes("local" if local else "job", min_bytes, max_bytes)
    plan = certify.CertifyPlan(
        options=options,
        launcher="local" if local else "job",
        nodes=names,
        groups=[Subject(kind="group", name=STANDALONE, members=names)],
        gpus_per_node=LOCAL_RANKS_PER_NODE if local else min(n.gpu_count for n in nodes),
        min_bytes=smallest,
        max_bytes=largest,
        criteria={} if accelerator == certify.AUTO else {"accelerator": accelerator},
        started_at=datetime.now(UTC).isoformat(timespec="seconds"),
        run=run,
    )
    store = OutcomeStore(port, run)
    store.put_document("plan", plan.model_dump_json())
    store.put_document("recipe", certify.KeptRecipe().model_dump_json())
    write_params(run=run.model_dump_json(), members=json.dumps(names))
    return BisectStart(run=run, members=names, launcher=plan.launcher)


class NoVerdict(DsxError):
    """A group test that said nothing about its nodes: its pods were not all running within the
    scheduling budget (a workload holds a member's GPUs, say), so nothing was measured."""


def _group_result(outcome: CheckOutcome[CollectiveRun]) -> GroupResult:
    """A certification sweep as a bisection reads it: pass, fail or hang, the figure and its threshold.

    Raises:
        NoVerdict: the sweep was ``unschedulable``.
    """
    if outcome.status == "unschedulable":
        raise NoVerdict(
            next((v.message for v in outcome.verdicts if v.status == "unschedulable"), "unschedulable")
        )
    rows = outcome.result.rows if outcome.result is not None else []
    failed = [v for v in outcome.verdicts if v.status != "pass"]
    judged = next((v for v in failed if v.unit == "GB/s" and v.measured is not None), None)
    figure = judged.measured if judged is not None else (rows[-1].busbw() if rows else None)
    if failed and not only_slow(failed):
        figure = None  # broken, not slow: a bisection names the node failing, never slow
    if outcome.status == "pass":
        kind: Literal["pass", "fail", "hang"] = "pass"
    else:
        kind = "hang" if outcome.status == "hang" else "fail"
    return GroupResult(
        outcome=kind,
        figure=figure if kind != "hang" else None,
        threshold=judged.threshold if judged is not None else None,
        duration_s=outcome.elapsed_s,
        reason=failed[0].message if failed else f"{len(outcome.subject.members)} nodes passed together",
    )


class _Test:
    """The certification's group test over a plan, with the recipe's noise band (the search measures a
    figure within it again and counts the median; a hang, past the recipe's ``timeoutFactor`` times a
    healthy run, counts at once, as its own outcome)."""

    def __init__(self, plan: certify.CertifyPlan, recipe: certify.KeptRecipe) -> None:
        self.plan = plan
        self.recipe = recipe
        self.noise = recipe.limits().nccl.noise_band
        self.count = 0

    def once(self, members: Sequence[str]) -> GroupResult:
        """One sweep of ``members`` together (numbered: the search tests the same nodes again)."""
        self.count += 1
        which = "-".join(members) if len(members) <= 3 else f"{members[0]}-{len(members)}"
        name = f"bisect-{self.count}-{which}"
        subject = Subject(kind="group", name=name, members=list(members))
        return _group_result(certify.sweep_group(subject, self.plan, self.recipe))


def _tester(run: RunRef) -> tuple[OutcomeStore, _Test]:
    port = connect()
    plan, recipe = certify.load_plan(run, port)
    return OutcomeStore(port, plan.run), _Test(plan, recipe)


class _NoVerdict(Exception):
    """A test of the search gave no verdict: the search stops, its nodes left in doubt."""


def search_group(
    run: RunRef, members: list[str], partners: list[str], group: str = STANDALONE, tested: str = ""
) -> list[str]:
    """Search ``members`` for their faulty nodes, as ``dsx bisect`` does; label each accused node at once.

    ``tested="fail"`` says the caller's own test of the group failed already (a certification's group
    check): it counts as evidence and is not run again. ``partners`` are nodes outside the group taken as
    good. Every test is kept as a record; so is each accusation (with its probability) and the end (the
    nodes left in service, their screening, the nodes left unresolved). A test that gives no verdict (its
    pods not all running in time) stops the search: nothing more is named or cleared. Output parameter
    ``suspects``: the nodes labelled failed (JSON list).

    Raises:
        InputError: fewer than two distinct members (one, with no partner lent).
    """
    nodes = sorted(set(members))
    if len(nodes) + min(1, len([p for p in partners if p not in nodes])) < 2 or len(nodes) != len(members):
        raise InputError(
            f"search-group needs two or more distinct nodes, or one and a partner, got {members}"
        )
    run = _run_ref(run)
    store, test = _tester(run)
    search = _Search(Records(store), test, group, test.recipe.digest or "")
    failed = (
        GroupResult(outcome="fail", reason=f"group {group} failed its own test") if tested == "fail" else None
    )
    try:
        result = bisect(
            nodes,
            search.once,
            "auto",
            noise=test.noise,
            partners=partners,
            failed=failed,
            on_accuse=search.accused,
            p_min=test.plan.options.p_min,
        )
    except _NoVerdict as exc:
        print(f"warning: {group}: a test gave no verdict; the search stopped: {exc}", file=sys.stderr)
        left = [n for n in nodes if n not in search.labelled]
        search.records.put(Record(group=group, kind="summary", members=left, outcome="none", reason=str(exc)))
        write_params(suspects=json.dumps(search.labelled))
        return search.labelled
    left = [n for n in nodes if n not in search.labelled]
    search.records.put(
        Record(
            group=group,
            kind="summary",
            members=left,
            outcome="pass" if _settled(result) else "fail",
            probability=result.fault_left,
            screening=result.screening,
            caught=result.caught,
            unresolved={u.node: u.probability for u in result.unresolved},
            reason=_summary_reason(result.screening, result.screening_needed, result.caught),
        )
    )
    write_params(suspects=json.dumps(search.labelled))
    return search.labelled


class _Search:
    """One group's search: each test it runs and each node it accuses, kept as records; accused nodes
    labelled at once."""

    def __init__(self, records: Records, test: _Test, group: str, digest: str) -> None:
        self.records, self.test, self.group, self.digest = records, test, group, digest
        self.labelled: list[str] = []

    def once(self, tested_members: Sequence[str]) -> GroupResult:
        """Test ``tested_members`` together once and keep the test; a test with no verdict stops the
        search (:class:`_NoVerdict`)."""
        try:
            result = self.test.once(tested_members)
        except NoVerdict as exc:
            self.records.put(
                Record(
                    group=self.group,
                    kind="split",
                    members=list(tested_members),
                    outcome="none",
                    reason=str(exc),
                )
            )
            raise _NoVerdict(str(exc)) from None
        self.records.put(
            Record(
                group=self.group,
                kind="split",
                members=list(tested_members),
                outcome=result.outcome,
                figure=result.figure,
                threshold=result.threshold,
                reason=result.reason,
            )
        )
        return result

    def accused(self, suspect: Suspect, runs: list[TestRun]) -> None:
        """Keep the accusation and label the node failed at once."""
        record = _verdict(self.group, suspect, runs)
        self.records.put(record)
        _label_failed(record, self.digest)
        self.labelled.append(suspect.node)


def _settled(result: BisectResult) -> bool:
    """Whether a search left the nodes in service screened, none unresolved, no fault left above alpha."""
    return (
        not result.unresolved
        and result.fault_left < result.alpha
        and result.screening >= result.screening_needed
    )


def _summary_reason(screening: int, needed: int, caught: float) -> str:
    return (
        f"screened {screening} passes ({needed} needed): would have caught a fault failing "
        f"{caught:.0%} of tests or more with 99%"
    )


def _verdict(group: str, suspect: Suspect, runs: list[TestRun]) -> Record:
    """The record of an accusation: the most telling failed run that held the node gives its figure."""
    failing = [r for r in runs if suspect.node in r.members and r.outcome != "pass" and r.attempt >= 1]
    telling = min(failing, key=lambda r: (len(r.members), -r.round), default=None)
    return Record(
        group=group,
        kind="verdict",
        members=[suspect.node],
        outcome="hang" if suspect.fault == "hang" else "fail",
        figure=telling.figure if telling is not None else None,
        threshold=telling.threshold if telling is not None else None,
        reason=telling.reason if telling is not None else "its rank fell behind its peers",
        probability=suspect.probability,
        kind_of_fault=suspect.fault,
        partner=suspect.confirmed_with,
    )


def _label_failed(record: Record, digest: str) -> None:
    """Label an accused node failed with its reason, in one patch; an Event says so (best-effort)."""
    port = connect()
    node, reason = record.members[0], suspect_reason(record)
    port.set_node_metadata(
        node,
        labels={vocab.LABEL_CERTIFICATION: vocab.Certification.failed.value},
        annotations={
            vocab.ANNOTATION_CERTIFIED_AT: datetime.now(UTC).isoformat(timespec="seconds"),
            vocab.ANNOTATION_CERTIFICATION_RECIPE: digest,
            vocab.ANNOTATION_CERTIFICATION_REASON: reason[:250],
        },
    )
    port.record_event(node, "DsxCertificationFailed", f"dsx certification failed: {reason[:200]}", "Warning")


def bisect_targets(run: RunRef, stage: Literal["groups", "whole"]) -> list[BisectTarget]:
    """The groups of a certification stage to bisect: those that failed or hung while every member had
    passed alone (a group tests only such members), each lent known-good partners of its own.

    ``groups``: the groups of the group label; partners are the members of the groups that passed, dealt
    out so no two targets share one. ``whole``: the whole set; partners are the nodes bisection cleared.
    Output parameters: ``targets`` (JSON list) and ``count``.
    """
    run = _run_ref(run)
    port = connect()
    plan, _ = certify.load_plan(run, port)
    store = OutcomeStore(port, plan.run)
    outcomes = [
        o
        for o in store.outcomes(ALLREDUCE_SWEEP, "group")
        if (o.subject.name == certify.WHOLE) == (stage == "whole")
    ]
    failed = [o for o in outcomes if o.status in ("fail", "hang") and len(o.subject.members) >= 2]
    if stage == "whole":
        spare = [n for n in Records(store).cleared() if failed and n not in failed[0].subject.members]
    else:
        spare = sorted({m for o in outcomes if o.status == "pass" for m in o.subject.members})
    targets: list[BisectTarget] = []
    for index, outcome in enumerate(sorted(failed, key=lambda o: o.subject.name)):
        lent = spare[index :: len(failed)] if failed else []
        targets.append(
            BisectTarget(group=outcome.subject.name, members=list(outcome.subject.members), partners=lent)
        )
    write_params(targets=json.dumps([t.model_dump(mode="json") for t in targets]), count=str(len(targets)))
    return targets


def finish(run: RunRef) -> BisectSummary:
    """End a ``dsx-bisect`` of its own: what it found; its records go; Failed unless the group is healthy.

    The group is healthy when no node was accused and the search screened the nodes left in service: as
    ``dsx bisect`` exits 1 otherwise (a node accused, nodes left unresolved, a fault left above alpha, too
    few passes, or a test with no verdict), the workflow does not end Succeeded.

    Raises:
        DsxError: nodes were accused (named, with their reasons), or the search could not settle.
    """
    run = _run_ref(run)
    store = OutcomeStore(connect(), run)
    records = Records(store)
    suspects = {node: suspect_reason(r) for node, r in sorted(records.suspects().items())}
    summaries = records.summaries()
    screening = min((r.screening or 0 for r in summaries), default=0)
    summary = BisectSummary(
        suspects=suspects,
        tests=len(records.tests()),
        cleared=len(records.cleared()),
        screening=screening,
        caught=max((r.caught or 1.0 for r in summaries), default=1.0),
    )
    store.delete()
    if suspects:
        raise DsxError("bisection found the nodes at fault: " + "; ".join(suspects.values()))
    if not summaries:
        raise DsxError("bisection named no node and did not finish its search (no summary was kept)")
    unsettled = [r for r in summaries if r.outcome != "pass"]
    if unsettled:
        first = unsettled[0]
        if first.outcome == "none":
            raise DsxError(f"bisection named no node: a test gave no verdict: {first.reason}")
        doubt = ", ".join(
            f"{node} ({p:.3f})" for node, p in sorted(first.unresolved.items(), key=lambda i: -i[1])
        )
        raise DsxError(
            f"bisection named no node, yet could not clear the group: {first.reason}; probability a "
            f"fault is left {first.probability or 0.0:.4f}" + (f"; unresolved: {doubt}" if doubt else "")
        )
    return summary
