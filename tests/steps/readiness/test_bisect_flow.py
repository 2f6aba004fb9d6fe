"""The workflow's bisection steps on their own: the groups a certification bisects, the attribution a
bisected group gets in the report, and the search of ``dsx bisect`` run over the certification's test."""

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from steps.cluster import connect
from steps.cluster import vocabulary as vocab
from steps.errors import DsxError
from steps.readiness import certify
from steps.readiness.bisect import GroupResult, flow
from steps.readiness.bisect.records import BISECT_TEST, Record, Records, with_bisection
from steps.readiness.check import CheckOutcome
from steps.readiness.checks import ALLREDUCE_SWEEP, SWEEP_TEST
from steps.readiness.judge import verdict
from steps.readiness.models import CollectiveRun, Subject, VerdictStatus
from steps.readiness.outcomes import OutcomeStore, RunRef

RECIPE = {"digest": "sha256:feed", "thresholds": {"nccl": {"allReduce": [], "noiseBand": 0.05}}}


@pytest.fixture
def run(sim_fleet: Callable[[str], str]) -> RunRef:
    """A certification run planned on nine simulated nodes in three racks, its recipe kept."""
    sim_fleet("sim:nodes=9,gpu=h100,racks=3")
    plan = certify.plan()
    certify.keep_recipe(plan.run, RECIPE)
    return plan.run


def _group(
    name: str, members: list[str], status: VerdictStatus, node: str | None = None
) -> CheckOutcome[CollectiveRun]:
    subject = Subject(kind="group", name=name, members=members)
    found = verdict(subject, "allreduce-busbw", status, f"group {name}: {status}", node=node)
    return ALLREDUCE_SWEEP.outcome(
        test=SWEEP_TEST,
        subject=subject,
        status=status,
        verdicts=[found],
        evidence=[],
        out_dir="",
        elapsed_s=1.0,
    )


def _rack(index: int) -> list[str]:
    return [f"node-{i:02d}" for i in range(3 * index, 3 * index + 3)]


def test_the_groups_that_failed_or_hung_are_bisected_each_with_partners_of_its_own(
    run: RunRef, tmp_path: Path
) -> None:
    store = OutcomeStore(connect(), run)
    store.put(_group("rack-00", _rack(0), "fail"))
    store.put(_group("rack-01", _rack(1), "hang"))
    store.put(_group("rack-02", _rack(2), "pass"))
    store.put(_group("all", [f"node-{i:02d}" for i in range(9)], "fail"))
    targets = flow.bisect_targets(run, "groups")
    # the whole set is its own stage; the passing rack's members are dealt out, none shared
    assert [(t.group, t.members, t.partners) for t in targets] == [
        ("rack-00", _rack(0), ["node-06", "node-08"]),
        ("rack-01", _rack(1), ["node-07"]),
    ]
    params = tmp_path / "out" / "params"
    assert (params / "count").read_text() == "2"
    assert [t["group"] for t in json.loads((params / "targets").read_text())] == ["rack-00", "rack-01"]
    # the whole set: partners are nodes bisection cleared outside it (none here: it holds every node)
    Records(store).put(
        Record(group="rack-00", kind="summary", members=["node-01", "node-02"], outcome="pass")
    )
    (whole,) = flow.bisect_targets(run, "whole")
    assert (whole.group, len(whole.members), whole.partners) == ("all", 9, [])


def test_a_stage_with_no_failed_group_has_nothing_to_bisect(run: RunRef, tmp_path: Path) -> None:
    store = OutcomeStore(connect(), run)
    store.put(_group("rack-00", _rack(0), "pass"))
    store.put(_group("rack-01", ["node-03"], "fail"))  # one member left standing: no group test
    assert flow.bisect_targets(run, "groups") == []
    assert (tmp_path / "out" / "params" / "count").read_text() == "0"


def test_a_bisected_group_blames_only_its_members_not_cleared_and_names_the_confirmed_one(
    run: RunRef,
) -> None:
    store = OutcomeStore(connect(), run)
    groups = [
        _group("rack-00", _rack(0), "fail", node="node-02"),  # the local run's own straggler guess
        _group("rack-01", _rack(1), "fail"),  # not bisected
        _group("rack-02", _rack(2), "pass"),
    ]
    assert with_bisection(groups, store) == groups  # no records: nothing changes
    records = Records(store)
    records.put(
        Record(group="rack-00", kind="split", members=_rack(0), outcome="fail", figure=1.0, threshold=2.0)
    )
    records.put(
        Record(
            group="rack-00",
            kind="verdict",
            members=["node-00"],
            outcome="hang",
            reason="the all-reduce did not complete within 50s",
            probability=0.9987,
            kind_of_fault="hang",
            partner="node-06",
        )
    )
    # the search ended with node-01 screened; node-02 left unresolved (not cleared)
    records.put(
        Record(
            group="rack-00",
            kind="summary",
            members=["node-01", "node-02"],
            outcome="fail",
            unresolved={"node-02": 0.4},
        )
    )
    bisected, untouched, passed = with_bisection(groups, store)
    assert (untouched, passed) == (groups[1], groups[2])
    first, confirmed = bisected.verdicts
    # nobody was cleared (the search could not settle): every member stays in doubt; node-00 is named
    assert (first.subject.members, first.node) == (_rack(0), None)
    assert (confirmed.test, confirmed.node, confirmed.status) == (BISECT_TEST, "node-00", "hang")
    assert confirmed.probability == 0.9987
    assert confirmed.message == (
        "node-00: hangs in multi-node tests: the all-reduce did not complete within 50s beside node-06 "
        "(probability 0.9987, bisection of rack-00)"
    )


class _Scripted(flow._Test):
    """The workflow's test, its sweeps answered by a rule of the members (threshold 80 GB/s)."""

    def __init__(self, run: RunRef, slow: str) -> None:
        super().__init__(*certify.load_plan(run))
        self.slow = slow

    def once(self, members: Sequence[str]) -> GroupResult:
        self.count += 1
        figure = 50.0 if self.slow in members else 100.0
        return GroupResult(outcome="pass" if figure >= 80 else "fail", figure=figure, threshold=80.0)


def test_the_workflow_runs_the_search_of_dsx_bisect_and_labels_the_accused_node_at_once(
    run: RunRef, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(flow, "_Test", lambda plan, recipe: _Scripted(run, "node-04"))
    members = _rack(1)
    suspects = flow.search_group(run, members, ["node-00", "node-01"], "rack-01", tested="fail")
    assert suspects == ["node-04"]
    assert json.loads((tmp_path / "out" / "params" / "suspects").read_text()) == ["node-04"]
    records = Records(OutcomeStore(connect(), run))
    (verdict_record,) = records.suspects().values()
    assert verdict_record.probability is not None and verdict_record.probability >= 0.99
    assert verdict_record.fault == "slow" and verdict_record.figure == 50.0
    (summary,) = records.summaries()
    assert summary.outcome == "pass" and summary.members == ["node-03", "node-05"]
    assert summary.screening is not None and summary.screening >= 21
    node = connect().get_node("node-04")
    assert node.labels[vocab.LABEL_CERTIFICATION] == "failed"
    assert "probability" in node.annotations[vocab.ANNOTATION_CERTIFICATION_REASON]
    with pytest.raises(DsxError, match="bisection found the nodes at fault: node-04: slow"):
        flow.finish(run)


def test_a_hung_sweep_is_a_hang_to_bisection_with_no_figure() -> None:
    outcome = _group("bisect-node-00-node-06", ["node-00", "node-06"], "hang")
    result = flow._group_result(outcome)
    assert (result.outcome, result.figure) == ("hang", None)


def test_a_bisection_that_names_no_node_yet_could_not_clear_the_group_does_not_end_healthy(
    run: RunRef,
) -> None:
    records = Records(OutcomeStore(connect(), run))
    records.put(Record(group="bisect", kind="summary", members=["node-00", "node-01"], outcome="pass"))
    assert flow.finish(run).suspects == {}  # screened: healthy
    records.put(
        Record(
            group="bisect",
            kind="summary",
            members=["node-03", "node-04"],
            outcome="fail",
            probability=0.5,
            unresolved={"node-03": 0.5, "node-04": 0.5},
            reason="screened 0 passes (21 needed)",
        )
    )
    with pytest.raises(DsxError, match=r"named no node, yet could not clear the group.*node-03 \(0.500\)"):
        flow.finish(run)


def test_a_broken_test_is_a_failure_to_bisection_a_slow_one_keeps_its_figure() -> None:
    """Wrong data or a dead rank names the node failing; only a bandwidth or straggler verdict says slow."""
    subject = Subject(kind="group", name="bisect-1", members=["node-00", "node-06"])
    slow = verdict(
        subject, "allreduce-busbw@64MiB", "fail", "low", measured=40.0, threshold=80.0, unit="GB/s"
    )
    wrong = verdict(subject, "allreduce-data", "fail", "3 wrong elements", measured=3, unit="wrong elements")

    def outcome(*found: object) -> CheckOutcome[CollectiveRun]:
        return ALLREDUCE_SWEEP.outcome(
            test=SWEEP_TEST,
            subject=subject,
            status="fail",
            verdicts=list(found),
            evidence=[],
            out_dir="",
            elapsed_s=1.0,
        )

    assert flow._group_result(outcome(slow)).figure == 40.0
    assert flow._group_result(outcome(wrong)).figure is None
    assert flow._group_result(outcome(slow, wrong)).figure is None  # broken as well as slow: failing


class _Unschedulable(flow._Test):
    """The workflow's test, each sweep's pods never all scheduled (a workload holds a member's GPUs)."""

    def __init__(self, run: RunRef) -> None:
        super().__init__(*certify.load_plan(run))

    def once(self, members: Sequence[str]) -> GroupResult:
        return flow._group_result(_group("bisect-x", list(members), "unschedulable"))


def test_an_unschedulable_test_gives_no_verdict_stops_the_search_names_and_clears_no_one(
    run: RunRef, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(flow, "_Test", lambda plan, recipe: _Unschedulable(run))
    assert flow.search_group(run, _rack(0), [], "rack-00") == []
    records = Records(OutcomeStore(connect(), run))
    assert records.cleared() == [] and records.suspects() == {}
    (summary,) = records.summaries()
    assert summary.outcome == "none" and "unschedulable" in summary.reason
    with pytest.raises(DsxError, match=r"named no node: a test gave no verdict"):
        flow.finish(run)


def test_a_bisection_of_its_own_sizes_its_sweep_as_certification_does(
    sim_fleet: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from steps.errors import InputError
    from steps.readiness.planning import SWEEP_SIZES
    from steps.readiness.sizes import parse_size

    sim_fleet("sim:nodes=4,gpu=h100,racks=2")
    started = flow.prepare()
    plan, _ = certify.load_plan(started.run)
    assert (plan.min_bytes, plan.max_bytes) == tuple(parse_size(s, "") for s in SWEEP_SIZES["local"])
    with pytest.raises(InputError, match="min-bytes 8388608 is larger than max-bytes 1048576"):
        flow.prepare(min_bytes="8MiB", max_bytes="1MiB")
