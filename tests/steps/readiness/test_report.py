"""The certification report: node statuses, JSON, Markdown, plots, and dsx certify report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from steps.errors import InputError
from steps.readiness.check import CheckOutcome
from steps.readiness.checks import ALLREDUCE_SWEEP, SMOKE_TEST, SWEEP_TEST, TRAINING_SMOKE
from steps.readiness.models import CollectiveRun, Measurement, RankStats, ResultTable, Row, Subject, Verdict
from steps.readiness.ranks.smoke import RankTraining, SmokeResult
from steps.readiness.report import ReportRequest, build_report, load_report, node_results
from tests.cli import dsx_here
from workflows.cli.main import app

RACK = Subject(kind="group", name="rack-a", members=["node-1", "node-2", "node-3"])


def _sweep(status: str = "pass", straggler: int | None = None) -> CheckOutcome[CollectiveRun]:
    rows = [
        Row(
            size=s,
            count=s // 4,
            type="float",
            in_place=Measurement(time_us=10.0, busbw_gbps=s / 1e6, wrong=0),
        )
        for s in (1024, 4096, 16384)
    ]
    stats = [
        RankStats(
            rank=r, host=f"node-{r + 1}", outside_s=0.0, inside_s=1.0, skew=0.9 if r == straggler else 0.0
        )
        for r in range(3)
    ]
    run = CollectiveRun(
        source="dsx-sweep",
        status="complete",
        results=ResultTable.of(rows),
        rank_stats=stats,
        hosts=RACK.members,
    )
    verdicts = [Verdict(subject=RACK, test="allreduce-run", status="pass", message="ran")]
    if straggler is not None:
        verdicts.append(
            Verdict(
                subject=RACK,
                test="allreduce-straggler",
                status="fail",
                message=f"rank {straggler} | slow",
                rank=straggler,
                node=f"node-{straggler + 1}",
            )
        )
    return ALLREDUCE_SWEEP.outcome(
        test=SWEEP_TEST,
        subject=RACK,
        status=status,
        result=run,
        verdicts=verdicts,
        evidence=[],
        out_dir="x",
        elapsed_s=1.0,
    )  # type: ignore[arg-type]


def _smoke() -> CheckOutcome[SmokeResult]:
    ranks = [
        RankTraining(
            rank=r,
            host=f"node-{r + 1}",
            step_s=[0.01] * 8,
            own_s=[0.005] * 8,
            losses=[1.0] * 8,
            median_step_s=0.01,
            median_own_s=0.005,
            skew=0.0,
        )
        for r in range(2)
    ]
    result = SmokeResult(
        backend="gloo",
        device="CPU",
        world_size=2,
        steps=8,
        parameters=10,
        tokens_per_step=64,
        config={},
        losses=[2.0] * 4 + [1.0] * 4,
        initial_loss=2.0,
        final_loss=1.0,
        ranks=ranks,
        median_step_s=0.01,
        throughput_tokens_s=6400.0,
        tflops_per_gpu=None,
        mfu=None,
    )
    verdicts = [Verdict(subject=RACK, test="smoke-loss", status="pass", message="fell")]
    return TRAINING_SMOKE.outcome(
        test=SMOKE_TEST,
        subject=RACK,
        status="pass",
        result=result,
        verdicts=verdicts,
        evidence=[],
        out_dir="y",
        elapsed_s=1.0,
    )


def test_a_group_that_fails_together_leaves_its_members_pending_not_failed() -> None:
    """Which member slows the group is not known (bisection finds it): no member is failed blindly."""
    verdict = Verdict(subject=RACK, test="allreduce-busbw@1GiB", status="fail", message="slow group")
    results = node_results(["node-1", "node-9"], [verdict])
    nodes = {n.name: n.status for n in results}
    assert nodes == {"node-1": "pending", "node-2": "pending", "node-3": "pending", "node-9": "passed"}
    assert results[0].reasons == ["member of group rack-a: allreduce-busbw@1GiB fail: slow group"]
    # A verdict that names the node still fails it, whatever else it is a member of.
    named = Verdict(subject=RACK, test="allreduce-straggler", status="fail", node="node-2", message="slow")
    nodes = {n.name: n.status for n in node_results([], [verdict, named])}
    assert nodes == {"node-1": "pending", "node-2": "failed", "node-3": "pending"}


def test_a_group_test_that_could_not_be_scheduled_says_nothing_of_its_nodes() -> None:
    unscheduled = Verdict(
        subject=RACK, test="allreduce-sweep", status="unschedulable", message="2 pods Pending"
    )
    node = Subject(kind="node", name="node-9", members=["node-9"])
    alone = Verdict(subject=node, test="allreduce-sweep", status="unschedulable", message="pod Pending")
    nodes = {n.name: n.status for n in node_results([], [unscheduled, alone])}
    assert nodes == {"node-1": "pending", "node-2": "pending", "node-3": "pending", "node-9": "pending"}


def test_the_report_names_the_faulty_node_and_writes_json_markdown_and_plots(tmp_path: Path) -> None:
    request = ReportRequest(
        nodes=RACK.members,
        groups=[RACK],
        outcomes=[_sweep("fail", straggler=1), _smoke()],
        recipe_digest="sha256:0123",
        started_at="2025-01-01T00:00:00+00:00",
        finished_at="2025-01-01T00:05:00+00:00",
        thresholds={"nccl": {"allReduce": [{"size": "16KiB", "busBwGBps": 0.01}]}},
        out_dir=str(tmp_path),
    )
    report = build_report(request)
    assert report.status == "failed"
    assert {n.name: n.status for n in report.nodes} == {
        "node-1": "passed",
        "node-2": "failed",
        "node-3": "passed",
    }
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "busbw.png",
        "report.json",
        "report.md",
        "step-time.png",
    ]
    assert (tmp_path / "busbw.png").read_bytes()[:4] == b"\x89PNG"
    markdown = (tmp_path / "report.md").read_text()
    assert markdown.startswith("# dsx certification: FAILED") and "rank 1 \\| slow" in markdown
    assert "![busbw against message size](busbw.png)" in markdown
    first = (tmp_path / "report.json").read_bytes()
    build_report(request)
    assert (tmp_path / "report.json").read_bytes() == first  # deterministic
    assert json.loads(first)["recipe_digest"] == "sha256:0123"


def test_certify_report_shows_the_report_and_exits_1_on_failure(tmp_path: Path) -> None:
    build_report(
        ReportRequest(nodes=RACK.members, outcomes=[_sweep("fail", straggler=2)], out_dir=str(tmp_path))
    )
    runner = CliRunner()
    for fmt, expected in (
        ("markdown", "# dsx certification: FAILED"),
        ("json", '"status": "failed"'),
        ("table", "node-3"),
    ):
        result = runner.invoke(app, ["certify", "report", str(tmp_path / "report.json"), "-o", fmt])
        assert result.exit_code == 1 and expected in result.output, result.output
    passed = tmp_path / "ok"
    build_report(ReportRequest(nodes=RACK.members, outcomes=[_sweep()], out_dir=str(passed)))
    assert runner.invoke(app, ["certify", "report", str(passed / "report.json")]).exit_code == 0


def test_a_file_that_is_not_a_report_is_bad_input(tmp_path: Path) -> None:
    bogus = tmp_path / "r.json"
    bogus.write_text('{"status": "maybe"}')
    with pytest.raises(InputError, match=r"r\.json: not a certification report"):
        load_report(bogus)


def test_a_report_whose_sweep_result_is_not_a_run_is_bad_input_naming_the_outcome(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    build_report(ReportRequest(nodes=RACK.members, outcomes=[_sweep()], out_dir=str(tmp_path)))
    data = json.loads((tmp_path / "report.json").read_text())
    data["outcomes"][0]["result"] = {"rows": "many"}
    (tmp_path / "report.json").write_text(json.dumps(data))
    with pytest.raises(InputError, match=r"report\.json: outcomes\[0\]: not a valid allreduce-sweep outcome"):
        load_report(tmp_path / "report.json")
    code, _, err = dsx_here(capsys, "certify", "report", str(tmp_path / "report.json"))
    assert code == 2 and "outcomes[0]: not a valid allreduce-sweep outcome: result.source" in err, err
