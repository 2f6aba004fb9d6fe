"""The workflow's bisection steps on their own: the groups a certification bisects, the attribution a
bisected group gets in the report, and each test judged as ``dsx bisect`` judges it."""

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from steps.cluster import connect, shareable
from steps.errors import DsxError
from steps.readiness import certify
from steps.readiness.bisect import GroupResult, flow
from steps.readiness.bisect.records import BISECT_TEST, Record, Records, with_bisection
from steps.readiness.checks import SweepOutcome
from steps.readiness.judge import verdict
from steps.readiness.models import Subject, VerdictStatus
from steps.readiness.outcomes import OutcomeStore, RunRef

RECIPE = {"digest": "sha256:feed", "thresholds": {"nccl": {"allReduce": [], "noiseBand": 0.05}}}


@pytest.fixture
def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> RunRef:
    """A certification run planned on nine simulated nodes in three racks, its recipe kept."""
    monkeypatch.setenv("DSX_OUTPUT_DIR", str(tmp_path / "out"))
    monkeypatch.setenv("DSX_CLUSTER", shareable("sim:nodes=9,gpu=h100,racks=3", tmp_path))
    plan = certify.plan()
    certify.keep_recipe(plan.run, RECIPE)
    return plan.run


def _group(name: str, members: list[str], status: VerdictStatus, node: str | None = None) -> SweepOutcome:
    subject = Subject(kind="group", name=name, members=members)
    found = verdict(subject, "allreduce-busbw", status, f"group {name}: {status}", node=node)
    return SweepOutcome(
        subject=subject, status=status, verdicts=[found], evidence=[], out_dir="", elapsed_s=1.0
    )


def _rack(index: int) -> list[str]:
    return [f"node-{i:02d}" for i in range(3 * index, 3 * index + 3)]


def test_the_groups_that_failed_or_hung_are_bisected_each_with_partners_of_its_own(
    run: RunRef, tmp_path: Path
) -> None:
    store = OutcomeStore(connect(), run)
    store.put("group", _group("rack-00", _rack(0), "fail"))
    store.put("group", _group("rack-01", _rack(1), "hang"))
    store.put("group", _group("rack-02", _rack(2), "pass"))
    store.put("group", _group("all", [f"node-{i:02d}" for i in range(9)], "fail"))
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
        Record(group="rack-00", kind="partner", members=["node-01", "node-06"], outcome="pass")
    )
    (whole,) = flow.bisect_targets(run, "whole")
    assert (whole.group, len(whole.members), whole.partners) == ("all", 9, [])


def test_a_stage_with_no_failed_group_has_nothing_to_bisect(run: RunRef, tmp_path: Path) -> None:
    store = OutcomeStore(connect(), run)
    store.put("group", _group("rack-00", _rack(0), "pass"))
    store.put("group", _group("rack-01", ["node-03"], "fail"))  # one member left standing: no group test
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
            kind="partner",
            members=["node-00", "node-06"],
            outcome="hang",
            reason="the all-reduce did not complete within 50s",
        )
    )
    records.put(Record(group="rack-00", kind="partner", members=["node-01", "node-06"], outcome="pass"))
    bisected, untouched, passed = with_bisection(groups, store)
    assert (untouched, passed) == (groups[1], groups[2])
    first, confirmed = bisected.verdicts
    # node-02 was never cleared: still in doubt; node-01 passed beside a good partner; node-00 named
    assert (first.subject.members, first.node) == (["node-00", "node-02"], None)
    assert (confirmed.test, confirmed.node, confirmed.status) == (BISECT_TEST, "node-00", "hang")
    assert confirmed.message == (
        "node-00: hangs in multi-node tests: the all-reduce did not complete within 50s beside known-good "
        "node-06 (bisection of rack-00)"
    )


class _Scripted(flow._Test):
    """The workflow's test, its sweeps replaced by figures in turn (threshold 80 GB/s), or hangs."""

    def __init__(self, run: RunRef, figures: Sequence[float | None]) -> None:
        super().__init__(*certify.load_plan(run))
        self.figures = iter(figures)

    def once(self, members: Sequence[str]) -> GroupResult:
        figure = next(self.figures)
        if figure is None:
            return GroupResult(outcome="hang", threshold=80.0, reason="did not finish within 50s")
        return GroupResult(outcome="pass" if figure >= 80 else "fail", figure=figure, threshold=80.0)


def test_the_workflow_runs_a_figure_in_the_noise_band_again_and_counts_a_hang_at_once(run: RunRef) -> None:
    members = ["node-00", "node-06"]
    near = _Scripted(run, [79.0, 83.0, 81.0]).record("rack-00", "partner", members)  # band 76..84 (5%)
    assert (near.outcome, near.figure, near.attempts, near.suspect) == ("pass", 81.0, 3, None)
    assert near.reason.startswith("median of 3 runs within the noise band")
    slow = _Scripted(run, [70.0]).record("rack-00", "partner", members)  # outside the band: at once
    assert (slow.outcome, slow.attempts, slow.fault, slow.suspect) == ("fail", 1, "slow", "node-00")
    hung = _Scripted(run, [None]).record("rack-00", "partner", members)
    assert (hung.outcome, hung.attempts, hung.fault) == ("hang", 1, "hang")


def test_a_hung_sweep_is_a_hang_to_bisection_with_no_figure() -> None:
    outcome = _group("bisect-node-00-node-06", ["node-00", "node-06"], "hang")
    result = flow._group_result(outcome)
    assert (result.outcome, result.figure) == ("hang", None)


def test_a_bisection_that_names_no_node_yet_saw_a_failure_does_not_end_healthy(run: RunRef) -> None:
    records = Records(OutcomeStore(connect(), run))
    records.put(Record(group="bisect", kind="split", members=["node-00", "node-01"], outcome="pass"))
    assert flow.finish(run).suspects == {}  # every test passed: healthy
    records.put(Record(group="bisect", kind="split", members=["node-03", "node-04"], outcome="hang"))
    # two members, no known-good partner to confirm either beside: nothing named, the group still failed
    with pytest.raises(
        DsxError, match=r"named no node, yet 1 test\(s\) failed, the smallest of node-03, node-04"
    ):
        flow.finish(run)


def test_a_broken_test_is_a_failure_to_bisection_a_slow_one_keeps_its_figure() -> None:
    """Wrong data or a dead rank names the node failing; only a bandwidth or straggler verdict says slow."""
    subject = Subject(kind="group", name="bisect-1", members=["node-00", "node-06"])
    slow = verdict(
        subject, "allreduce-busbw@64MiB", "fail", "low", measured=40.0, threshold=80.0, unit="GB/s"
    )
    wrong = verdict(subject, "allreduce-data", "fail", "3 wrong elements", measured=3, unit="wrong elements")

    def outcome(*found: object) -> SweepOutcome:
        return SweepOutcome(
            subject=subject, status="fail", verdicts=list(found), evidence=[], out_dir="", elapsed_s=1.0
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


def test_an_unschedulable_test_gives_no_verdict_names_and_clears_no_one(run: RunRef) -> None:
    record = _Unschedulable(run).record("rack-00", "partner", ["node-00", "node-06"])
    assert (record.outcome, record.suspect, record.attempts) == ("none", None, 1)
    assert "unschedulable" in record.reason
    records = Records(OutcomeStore(connect(), run))
    records.put(record)
    assert records.cleared() == [] and records.suspects() == {}
    with pytest.raises(DsxError, match=r"named no node: 1 test\(s\) gave no verdict"):
        flow.finish(run)
