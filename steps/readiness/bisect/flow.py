"""The steps of ``dsx-bisect``, the recursive workflow, and of the bisection stages of ``dsx-certify``.

``dsx-bisect``'s ``bisect-group`` tests a list of nodes (:func:`test_group`); when the test fails it splits
the list in halves and calls itself on both at once, until a failing part has fewer than four members,
which are then each tested beside a known-good partner (:func:`confirm_members`). A member that fails
beside a good partner is labelled ``dsx.dev/certification=failed`` at once, with the reason, so nothing is
lost if the workflow stops; the test that clears a member makes it a partner for later confirmations.

The group test is the certification's own (:func:`steps.readiness.certify.sweep_group`): real gloo ranks
on this machine for a simulated fleet, Indexed Jobs with NCCL on a cluster. A certification lends its run
(the plan and the recipe's thresholds); a ``dsx-bisect`` of its own makes one with :func:`prepare` (dsx's
default thresholds, no Leases, no ``pending`` labels: it names the faulty, it certifies nobody). Every test
is kept as a :class:`~steps.readiness.bisect.records.Record` of the run.

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
from steps.cluster.health import health_source
from steps.errors import DsxError, InputError
from steps.files import write_text
from steps.models import Frozen, input_error
from steps.readiness import certify
from steps.readiness.bisect.models import GroupResult
from steps.readiness.bisect.records import Record, Records, suspect_reason
from steps.readiness.bisect.session import judged
from steps.readiness.bisect.strategies import halves
from steps.readiness.checks import SweepOutcome
from steps.readiness.evidence import output_dir
from steps.readiness.judge import only_slow
from steps.readiness.models import Subject
from steps.readiness.outcomes import OutcomeStore, RunRef
from steps.readiness.planning import LOCAL_RANKS_PER_NODE
from steps.readiness.sizes import parse_size
from steps.readiness.thresholds import load_thresholds

__all__ = [
    "ACTIONS",
    "CONFIRM",
    "PASS",
    "SPLIT",
    "BisectStart",
    "BisectSummary",
    "BisectTarget",
    "GroupStep",
    "bisect_targets",
    "confirm_members",
    "finish",
    "prepare",
    "test_group",
]

PASS, SPLIT, CONFIRM = "pass", "split", "confirm"
ACTIONS = (PASS, SPLIT, CONFIRM)
"""What ``bisect-group`` does after its test: nothing (it passed), split it, or confirm its members
(the ``action`` output the template's ``when`` conditions compare with)."""

STANDALONE = "bisect"
"""The group name of a ``dsx-bisect`` of its own."""


class BisectStart(Frozen):
    """A ``dsx-bisect`` of its own: its run, and the nodes it bisects (also its output parameters)."""

    run: RunRef
    members: list[str]
    launcher: str


class GroupStep(Frozen):
    """What one ``bisect-group`` test gave, and what comes next (also its output parameters).

    Attributes:
        action: ``pass``, ``split`` (``left`` and ``right`` are tested next) or ``confirm``.
        left: the first half when splitting, else empty.
        right: the second half when splitting, else empty.
        outcome: the test's outcome (``fail`` without a test when the caller had tested the group).
        reason: what the test said.
    """

    action: Literal["pass", "split", "confirm"]
    left: list[str] = Field(default_factory=list)
    right: list[str] = Field(default_factory=list)
    outcome: str
    reason: str = ""


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


def _run_ref(text: RunRef | str) -> RunRef:
    if isinstance(text, RunRef):
        return text
    try:
        return RunRef.model_validate_json(text)
    except ValidationError as exc:
        raise input_error(exc, "bisect run") from None


def _params(**values: str) -> None:
    params = output_dir(None) / "params"
    for key, value in values.items():
        write_text(params / key, value)


def _size(given: str, default: str) -> str:
    return default if given == certify.AUTO else given


def prepare(
    selector: str = "",
    workflow_name: str = "",
    workflow_uid: str = "",
    accelerator: str = certify.AUTO,
    min_bytes: str = certify.AUTO,
    max_bytes: str = certify.AUTO,
    iters: int = 20,
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
        selector=selector, accelerator=accelerator, min_bytes=min_bytes, max_bytes=max_bytes, iters=iters
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
    local = health_source(port) is not None
    plan = certify.CertifyPlan(
        options=options,
        launcher="local" if local else "job",
        nodes=names,
        groups=[Subject(kind="group", name=STANDALONE, members=names)],
        gpus_per_node=LOCAL_RANKS_PER_NODE if local else min(n.gpu_count for n in nodes),
        min_bytes=parse_size(_size(min_bytes, "64KiB" if local else "1MiB"), "min-bytes"),
        max_bytes=parse_size(_size(max_bytes, "4MiB" if local else "8GiB"), "max-bytes"),
        criteria={} if accelerator == certify.AUTO else {"accelerator": accelerator},
        started_at=datetime.now(UTC).isoformat(timespec="seconds"),
        run=run,
    )
    store = OutcomeStore(port, run)
    store.put_document("plan", plan.model_dump_json())
    store.put_document("recipe", json.dumps({"digest": None, "thresholds": None}))
    _params(run=run.model_dump_json(), members=json.dumps(names))
    return BisectStart(run=run, members=names, launcher=plan.launcher)


class NoVerdict(DsxError):
    """A group test that said nothing about its nodes: its pods were not all running within the
    scheduling budget (a workload holds a member's GPUs, say), so nothing was measured."""


def _group_result(outcome: SweepOutcome) -> GroupResult:
    """A certification sweep as a bisection reads it: pass, fail or hang, the figure and its threshold.

    Raises:
        NoVerdict: the sweep was ``unschedulable``.
    """
    if outcome.status == "unschedulable":
        raise NoVerdict(
            next((v.message for v in outcome.verdicts if v.status == "unschedulable"), "unschedulable")
        )
    rows = outcome.run.rows if outcome.run is not None else []
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
    """The certification's group test over a plan, judged as ``dsx bisect`` judges it: a figure within the
    recipe's noise band of its threshold is measured again and the median counts; a hang (past the
    recipe's ``timeoutFactor`` times a healthy run) counts at once, as its own outcome."""

    def __init__(self, plan: certify.CertifyPlan, recipe: dict[str, object]) -> None:
        self.plan = plan
        self.recipe = recipe
        self.noise = load_thresholds(_mapping(recipe.get("thresholds"))).nccl.noise_band

    def once(self, members: Sequence[str]) -> GroupResult:
        """One sweep of ``members`` together."""
        name = "bisect-" + "-".join(members) if len(members) <= 3 else f"bisect-{members[0]}-{len(members)}"
        subject = Subject(kind="group", name=name, members=list(members))
        return _group_result(certify.sweep_group(subject, self.plan, dict(self.recipe)))

    def record(self, group: str, kind: Literal["split", "partner"], members: list[str]) -> Record:
        """Test ``members`` (again, inside the noise band) and keep what counted as a record (outcome
        ``none`` when the test gave no verdict)."""
        try:
            counted, runs = judged(self.once, members, self.noise)
        except NoVerdict as exc:
            return Record(group=group, kind=kind, members=members, outcome="none", reason=str(exc))
        return Record(
            group=group,
            kind=kind,
            members=members,
            outcome=counted.outcome,
            figure=counted.figure,
            threshold=counted.threshold,
            attempts=len(runs),
            reason=counted.reason,
        )


def _mapping(value: object) -> dict[str, object] | None:
    return value if isinstance(value, dict) else None


def _tester(run: RunRef) -> tuple[OutcomeStore, _Test]:
    port = connect()
    plan, recipe = certify.load_plan(run, port)
    return OutcomeStore(port, plan.run), _Test(plan, recipe)


def test_group(run: RunRef, members: list[str], group: str = STANDALONE, tested: str = "") -> GroupStep:
    """Test ``members`` together; on a failure, say whether to split them or confirm each one.

    ``tested="fail"`` says the caller's own test of the group failed already (a certification's group
    check): it is not run again. Output parameters: ``action``, ``left``, ``right`` (JSON lists).

    Raises:
        InputError: fewer than two distinct members.
    """
    nodes = sorted(set(members))
    if len(nodes) < 2 or len(nodes) != len(members):
        raise InputError(f"bisect-group needs two or more distinct nodes, got {members}")
    run = _run_ref(run)
    if tested == "fail":
        result = GroupResult(outcome="fail", reason=f"group {group} failed its own test")
    else:
        store, test = _tester(run)
        record = test.record(group, "split", nodes)
        Records(store).put(record)
        if record.outcome == "none":
            # No verdict: nothing to narrow. The members stay uncleared, so in doubt (pending).
            print(f"warning: {group}: {', '.join(nodes)} gave no verdict: {record.reason}", file=sys.stderr)
            step = GroupStep(action=PASS, outcome=record.outcome, reason=record.reason)
            _params(action=step.action, left="[]", right="[]")
            return step
        result = GroupResult(outcome=record.outcome, figure=record.figure, reason=record.reason)
    parts = halves(nodes) if result.outcome != "pass" else None
    if result.outcome == "pass":
        step = GroupStep(action=PASS, outcome=result.outcome, reason=result.reason)
    elif parts is None:
        step = GroupStep(action=CONFIRM, outcome=result.outcome, reason=result.reason)
    else:
        step = GroupStep(
            action=SPLIT, left=parts[0], right=parts[1], outcome=result.outcome, reason=result.reason
        )
    _params(action=step.action, left=json.dumps(step.left), right=json.dumps(step.right))
    return step


def _label_failed(record: Record, digest: str) -> None:
    """Label a confirmed suspect failed with its reason, in one patch; an Event says so (best-effort)."""
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


def confirm_members(
    run: RunRef, members: list[str], partners: list[str], group: str = STANDALONE
) -> list[str]:
    """Test each member of a small failing part beside a known-good partner; label who fails at once.

    Known good: the ``partners`` lent by the caller, then every node a passing test of the run cleared
    (members of this part too, once cleared; never the member itself or a node named at fault). With no
    known-good node outside the part, pairs of its members are tested first until one passes. One member
    at a time, so a partner is in one test at a time. A member with no partner to test beside stays
    unconfirmed and unlabelled (said on stderr). Output parameter ``suspects``: the members labelled
    failed (JSON list).
    """
    run = _run_ref(run)
    store, test = _tester(run)
    records = Records(store)
    digest = str(test.recipe.get("digest") or "")
    suspects: list[str] = []
    if not [p for p in [*partners, *records.cleared()] if p not in members]:
        _clear_one_pair(sorted(members), test, records, group)
    for member in sorted(members):
        suspects_now = records.suspects()
        good = [p for p in [*partners, *records.cleared()] if p != member and p not in suspects_now]
        if not good:
            print(
                f"warning: {member}: no known-good partner to confirm it beside; not labelled",
                file=sys.stderr,
            )
            continue
        record = test.record(group, "partner", [member, good[0]])
        records.put(record)
        if record.suspect is not None:
            _label_failed(record, digest)
            suspects.append(member)
        elif record.outcome == "none":
            print(
                f"warning: {member}: no verdict beside {good[0]}; not labelled: {record.reason}",
                file=sys.stderr,
            )
    _params(suspects=json.dumps(suspects))
    return suspects


def _clear_one_pair(members: list[str], test: _Test, records: Records, group: str) -> None:
    """With no known-good node anywhere, test pairs of the members until one passes: both are cleared."""
    for index, first in enumerate(members):
        for second in members[index + 1 :]:
            record = test.record(group, "split", [first, second])
            records.put(record)
            if record.outcome == "pass":
                return


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
    outcomes = [o for o in store.sweeps("group") if (o.subject.name == certify.WHOLE) == (stage == "whole")]
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
    _params(targets=json.dumps([t.model_dump(mode="json") for t in targets]), count=str(len(targets)))
    return targets


def finish(run: RunRef) -> BisectSummary:
    """End a ``dsx-bisect`` of its own: what it found; its records go; Failed unless the group is healthy.

    The group is not healthy when a node was named, and also when a test failed yet no node could be
    named (no known-good partner to confirm a member beside, or a fault outside the nodes): as
    ``dsx bisect`` exits 1 on such an unresolved failure, the workflow does not end Succeeded.

    Raises:
        DsxError: suspects were found (named, with their reasons), or a test failed with no node named.
    """
    run = _run_ref(run)
    store = OutcomeStore(connect(), run)
    records = Records(store)
    found = records.all()
    suspects = {node: suspect_reason(r) for node, r in sorted(records.suspects().items())}
    failing = sorted((r for r in found if r.outcome != "pass"), key=lambda r: (len(r.members), r.members))
    summary = BisectSummary(suspects=suspects, tests=len(found), cleared=len(records.cleared()))
    store.delete()
    if suspects:
        raise DsxError("bisection found the nodes at fault: " + "; ".join(suspects.values()))
    if failing and all(r.outcome == "none" for r in failing):
        raise DsxError(
            f"bisection named no node: {len(failing)} test(s) gave no verdict (their pods were not all "
            f"scheduled in time), e.g. of {', '.join(failing[0].members)}: {failing[0].reason}"
        )
    if failing:
        smallest = failing[0]
        raise DsxError(
            f"bisection named no node, yet {len(failing)} test(s) failed, the smallest of "
            f"{', '.join(smallest.members)} ({smallest.outcome}: {smallest.reason or 'no reason given'}); "
            "no known-good node was found to confirm a member beside, or the fault is outside the nodes"
        )
    return summary
