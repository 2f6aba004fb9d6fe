"""``dsx goodput simulate``: the policies side by side, as a user runs it; bad input exits 2 naming it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from steps.sentinel.goodput.rates import POLICIES, default_rates_path
from tests import yamltext
from tests.cli import dsx_here

SMALL = ("--nodes", "128", "--days", "20", "--seeds", "3")


def test_json_compares_every_policy_over_every_seed_and_repeats_byte_for_byte(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = dsx_here(capsys, "goodput", "simulate", *SMALL, "--seed", "11", "-o", "json")
    assert code == 0, err
    report = json.loads(out)
    assert (report["nodes"], report["gpus_per_node"], report["days"]) == (128, 8, 20)
    assert report["seeds"] == [11, 12, 13]
    assert [p["policy"] for p in report["policies"]] == list(POLICIES)
    for policy in report["policies"]:
        assert len(policy["runs"]) == 3
        assert {"mean", "stdev", "min", "max"} == set(policy["goodput"])
        lost = sum(policy["lost_gpu_hours"].values())
        assert policy["useful_gpu_hours"] + lost == pytest.approx(report["gpu_hours"], rel=1e-6)
    assert dsx_here(capsys, "goodput", "simulate", *SMALL, "--seed", "11", "-o", "json")[1] == out


def test_yaml_carries_the_same_report(capsys: pytest.CaptureFixture[str]) -> None:
    _, as_json, _ = dsx_here(capsys, "goodput", "simulate", *SMALL, "-o", "json")
    code, as_yaml, _ = dsx_here(capsys, "goodput", "simulate", *SMALL, "-o", "yaml")
    assert code == 0
    assert yamltext.load(as_yaml) == json.loads(as_json)


def test_the_table_puts_the_policies_side_by_side(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = dsx_here(capsys, "goodput", "simulate", *SMALL)
    assert code == 0
    header = next(line for line in out.splitlines() if "remediate" in line)
    assert [header.index(p) for p in POLICIES] == sorted(header.index(p) for p in POLICIES)
    for row in ("goodput", "effective training time", "interruptions", "job restarts", "lost: slow"):
        assert row in out
    assert "128 nodes x 8 GPUs over 20 days" in out and "seeds 0-2" in out
    assert "GPU-hours lost by fault class" in out and "│ hbm3 " in out


def test_the_checkpoint_interval_and_restart_cost_can_be_set(capsys: pytest.CaptureFixture[str]) -> None:
    def run(*extra: str) -> dict[str, float]:
        code, out, _ = dsx_here(capsys, "goodput", "simulate", *SMALL, "-o", "json", *extra)
        assert code == 0
        report = json.loads(out)
        remediate = report["policies"][POLICIES.index("remediate")]
        return {**remediate["lost_gpu_hours"], "minutes": report["checkpoint_minutes"]}

    often, seldom = (
        run("--checkpoint-minutes", "5", "--restart-minutes", "0"),
        run("--checkpoint-minutes", "60"),
    )
    assert (often["minutes"], seldom["minutes"]) == (5, 60)
    assert often["rework"] < seldom["rework"] and often["restart"] == 0 < seldom["restart"]


def test_the_sweep_shows_goodput_against_the_interval_best_near_young_and_dalys(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ("goodput", "simulate", *SMALL, "--checkpoint-save-seconds", "60", "--sweep-checkpoint")
    code, out, err = dsx_here(capsys, *args, "-o", "json")
    assert code == 0, err
    sweep = json.loads(out)
    assert sweep["checkpoint_save_seconds"] == 60 and sweep["seeds"] == [0, 1, 2]
    # the table's 466 interruptions in 54 days on 2,048 nodes: on 128 nodes one about every 44.5 h
    assert sweep["hours_between_interruptions"] == pytest.approx(54 * 24 * 2048 / 128 / 466, rel=1e-3)
    minutes = [point["checkpoint_minutes"] for point in sweep["points"]]
    assert minutes == sorted(minutes) and len(minutes) == 17
    assert minutes[0] == pytest.approx(sweep["young_daly_minutes"] / 4, abs=0.01)
    for policy in POLICIES:
        best = sweep["best_minutes"][policy]
        assert sweep["young_daly_minutes"] / 2 <= best <= sweep["young_daly_minutes"] * 2, policy
        assert best in minutes
    code, table, _ = dsx_here(capsys, *args)
    assert code == 0
    assert "Young and Daly's interval sqrt(2 S M) is" in table and table.count(" * ") >= 1


def test_a_save_that_costs_is_its_own_loss(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = dsx_here(
        capsys, "goodput", "simulate", *SMALL, "--checkpoint-save-seconds", "30", "-o", "json"
    )
    assert code == 0
    report = json.loads(out)
    assert report["checkpoint_save_seconds"] == 30
    for policy in report["policies"]:
        assert policy["lost_gpu_hours"]["checkpoint"] > 0
    code, table, _ = dsx_here(capsys, "goodput", "simulate", *SMALL, "--checkpoint-save-seconds", "30")
    assert "a save stops it 30 s" in table and "lost: checkpoint" in table


def test_spares_replicas_and_a_rigid_job_are_reported_with_each_policys_best_spare_count(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ("goodput", "simulate", *SMALL, "--spares", "16", "--replica-nodes", "8", "--rigid")
    code, out, err = dsx_here(capsys, *args, "-o", "json")
    assert code == 0, err
    report = json.loads(out)
    assert (report["spares"], report["replica_nodes"], report["job_nodes"], report["elastic"]) == (
        16,
        8,
        112,
        False,
    )
    for policy in report["policies"]:
        assert policy["best_spares"]["spares"] in (0, 8, 16, 32)
        assert policy["best_spares"]["goodput"]["mean"] >= policy["goodput"]["mean"] - 1e-9
        assert policy["nodes_out"]["mean"] > 0
    code, table, _ = dsx_here(capsys, *args)
    assert code == 0
    assert "the job: 112 nodes in replicas of 8 (rigid), 16 spare;" in table
    assert "nodes out for repair" in table and "best spares" in table


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("--nodes", "16", "--spares", "1"), "--nodes 16 less --spares 1 hold no replica of 16 nodes"),
        (("--replica-nodes", "0"), "--replica-nodes"),
        (("--sweep-checkpoint",), "--checkpoint-save-seconds"),
        (
            ("--sweep-checkpoint", "--checkpoint-save-seconds", "5", "--checkpoint-minutes", "9"),
            "drop --checkpoint-minutes",
        ),
        (("--checkpoint-save-seconds", "-1"), "--checkpoint-save-seconds -1"),
        (("--nodes", "0"), "--nodes"),
        (("--gpus-per-node", "0"), "--gpus-per-node"),
        (("--days", "0"), "--days 0"),
        (("--days", "nan"), "--days nan"),
        (("--days", "-3"), "--days -3"),
        (("--seeds", "0"), "--seeds"),
        (("--checkpoint-minutes", "0.05"), "--checkpoint-minutes 0.05"),
        (("--restart-minutes", "inf"), "--restart-minutes inf"),
        (("--nodes", "100000", "--days", "3650"), "over the limit"),
        (("--rates", "no-such-rates.yaml"), "no-such-rates.yaml: cannot read"),
    ],
)
def test_bad_input_exits_2_naming_it(
    capsys: pytest.CaptureFixture[str], args: tuple[str, ...], named: str
) -> None:
    code, out, err = dsx_here(capsys, "goodput", "simulate", *args)
    assert code == 2 and out == ""
    assert err.startswith("error: ") and named in err and len(err.strip().splitlines()) == 1


def test_a_rate_table_of_your_own_is_read_and_its_mistakes_named_by_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    text = default_rates_path().read_text(encoding="utf-8")
    mine = tmp_path / "mine.yaml"
    mine.write_text(text.replace("count: 148", "count: 0"), encoding="utf-8")
    code, out, _ = dsx_here(capsys, "goodput", "simulate", *SMALL, "--rates", str(mine), "-o", "json")
    assert code == 0
    report = json.loads(out)
    assert report["rates"] == str(mine)
    assert all(run["faults"]["gpu"] == 0 for p in report["policies"] for run in p["runs"])

    broken = tmp_path / "broken.yaml"
    broken.write_text(text.replace("seenBy: agent", "seenBy: operator", 1), encoding="utf-8")
    line = next(i for i, row in enumerate(broken.read_text().splitlines(), 1) if "seenBy: operator" in row)
    code, _, err = dsx_here(capsys, "goodput", "simulate", "--rates", str(broken))
    assert code == 2
    assert f"{broken}:{line}: not a FaultRates: classes[0].seenBy:" in err


def test_the_table_can_be_run_without_its_slow_classes(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = dsx_here(capsys, "goodput", "simulate", *SMALL, "--without-slow", "-o", "json")
    assert code == 0
    report = json.loads(out)
    assert report["rates"].endswith("without its slow classes") and report["expected_slow_nodes"] == 0
    for policy in report["policies"]:
        assert policy["lost_gpu_hours"]["slow"] == 0 and policy["factors"]["program"]["mean"] == 1
