"""Real measurements among local gloo ranks: sweeps and training smoke runs, healthy and faulty."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from steps.readiness.checks import SmokeRequest, SweepRequest, run_allreduce_sweep, run_training_smoke
from steps.readiness.models import Subject
from workflows.cli.main import app

NODES = ["node-0", "node-1", "node-2", "node-3"]
LOCAL = Subject(kind="group", name="local", members=NODES)
SMALL = {"min_bytes": "1KiB", "max_bytes": "64KiB", "factor": 4, "warmup": 1, "iters": 5}


@pytest.fixture(autouse=True)
def _no_output_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DSX_OUTPUT_DIR", raising=False)


def test_the_sweep_cli_gives_real_figures_per_size(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app,
        [
            "nccl",
            "sweep",
            "--ranks",
            "4",
            "--backend",
            "gloo",
            "-b",
            "1KiB",
            "-e",
            "256KiB",
            "-i",
            "5",
            "--out-dir",
            str(tmp_path),
            "-o",
            "json",
        ],
    )
    assert result.exit_code == 0, result.output
    outcome = json.loads(result.output)
    run = outcome["result"]
    assert outcome["status"] == "pass" and run["status"] == "complete"
    results = run["results"]  # the rows, column by column
    assert results["size"] == [1024, 4096, 16384, 65536, 262144] and results["out_of_place"] is None
    figures = results["in_place"]
    assert all(t > 0 for t in figures["time_us"]) and all(b > 0 for b in figures["busbw_gbps"])
    assert figures["wrong"] == [0] * 5
    for busbw, algbw in zip(figures["busbw_gbps"], figures["algbw_gbps"], strict=True):
        assert busbw == pytest.approx(algbw * 2 * 3 / 4, rel=1e-3)
    assert len(run["ranks"]) == 4 and len(run["rank_stats"]) == 4
    assert (tmp_path / "sweep.txt").read_text().count("float     sum") == 5
    assert (tmp_path / "outcome.json").exists() and (tmp_path / "ranks" / "rank-3.stderr").exists()


def test_a_rank_injected_slow_is_named_with_its_node(tmp_path: Path) -> None:
    outcome = run_allreduce_sweep(
        SweepRequest(
            subject=LOCAL, ranks=4, inject=["2:delay=20ms"], rank_hosts=NODES, out_dir=str(tmp_path), **SMALL
        )
    )
    assert outcome.status == "fail"
    slow = [v for v in outcome.verdicts if v.status != "pass"]
    assert len(slow) == 1 and slow[0].test == "allreduce-straggler"
    assert (slow[0].rank, slow[0].node, slow[0].injected) == (2, "node-2", True)
    assert "rank 2 on node node-2" in slow[0].message
    assert outcome.result is not None and outcome.result.injected == ["rank 2: delay=20ms (injected)"]
    assert "# injected: rank 2: delay=20ms (injected)" in (tmp_path / "sweep.txt").read_text()


def test_a_rank_that_dies_is_an_error_with_its_stderr_kept(tmp_path: Path) -> None:
    outcome = run_allreduce_sweep(
        SweepRequest(
            subject=LOCAL, ranks=3, inject=["1:fail"], rank_hosts=NODES[:3], out_dir=str(tmp_path), **SMALL
        )
    )
    assert outcome.status == "error" and outcome.result is None
    (verdict,) = outcome.verdicts
    assert (verdict.rank, verdict.node, verdict.injected) == (1, "node-1", True)
    assert "InjectedFailure" in verdict.message
    assert verdict.evidence[0].endswith("rank-1.stderr")
    assert "injected failure" in Path(verdict.evidence[0]).read_text()


@pytest.mark.story
def test_a_rank_that_hangs_is_a_hang_verdict_at_the_timeout(tmp_path: Path) -> None:
    outcome = run_allreduce_sweep(
        SweepRequest(subject=LOCAL, ranks=2, inject=["1:hang"], timeout_s=8, out_dir=str(tmp_path), **SMALL)
    )
    assert outcome.status == "hang"
    (verdict,) = outcome.verdicts
    assert verdict.rank == 1 and "not answering: rank 1" in verdict.message
    assert "injected hang" in Path(verdict.evidence[1]).read_text()


def test_a_wrong_reduction_is_an_error_never_a_number(tmp_path: Path) -> None:
    outcome = run_allreduce_sweep(
        SweepRequest(subject=LOCAL, ranks=2, inject=["1:corrupt"], out_dir=str(tmp_path), **SMALL)
    )
    assert outcome.status == "error" and outcome.result is not None
    assert outcome.result.status == "corrupted"
    assert all(row.busbw() is None and row.wrong() == 1 for row in outcome.result.rows)
    assert any(v.test == "allreduce-data" and v.status == "error" for v in outcome.verdicts)


@pytest.mark.story
def test_the_smoke_run_learns_and_names_the_straggler(tmp_path: Path) -> None:
    outcome = run_training_smoke(
        SmokeRequest(
            subject=LOCAL,
            ranks=3,
            steps=12,
            inject=["2:delay=80ms"],  # a step on a busy machine can take 200 ms: well beyond that
            rank_hosts=NODES[:3],
            out_dir=str(tmp_path),
        )
    )
    judged = {v.test: v for v in outcome.verdicts}
    assert judged["smoke-finite"].status == "pass"
    assert judged["smoke-loss"].status == "pass"
    assert outcome.result is not None and outcome.result.final_loss is not None
    assert outcome.result.initial_loss is not None and outcome.result.final_loss < outcome.result.initial_loss
    assert judged["smoke-straggler"].status == "fail"
    assert (judged["smoke-straggler"].rank, judged["smoke-straggler"].node) == (2, "node-2")
    assert len(outcome.result.ranks[0].step_s) == 12 and outcome.result.throughput_tokens_s > 0
    assert outcome.result.mfu is None  # no GPU, no MFU


@pytest.mark.story
def test_the_train_cli_reports_nan_on_the_rank_that_produced_it(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app,
        [
            "train",
            "smoke",
            "--ranks",
            "2",
            "--backend",
            "gloo",
            "--steps",
            "10",
            "--inject",
            "1:nan",
            "--out-dir",
            str(tmp_path),
            "-o",
            "json",
        ],
    )
    assert result.exit_code == 1, result.output
    outcome = json.loads(result.output)
    finite = next(v for v in outcome["verdicts"] if v["test"] == "smoke-finite")
    assert finite["status"] == "error" and finite["rank"] == 1 and finite["measured"] == 5


def test_bad_requests_write_nothing(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["nccl", "sweep", "--inject", "9:fail", "--out-dir", str(tmp_path / "x")]
    )
    assert result.exit_code != 0 and not (tmp_path / "x").exists()
