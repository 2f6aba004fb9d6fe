"""``dsx bisect``: the nodes at fault in a failing group, as a user runs it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from steps.readiness.bisect import STRATEGIES
from tests.cli import dsx_here
from workflows.cli.bisect import StrategyChoice

_KEYS = {
    "suspects",
    "unresolved",
    "screening",
    "caught",
    "fault_left",
    "tests",
    "rounds",
    "wall_clock_s",
    "node_seconds",
    "strategy",
    "runs",
}


def test_the_strategies_offered_are_the_steps_own() -> None:
    assert sorted(s.value for s in StrategyChoice) == sorted(STRATEGIES)


@pytest.mark.parametrize("strategy", ["halving", "pairs", "auto"])
def test_a_large_noisy_fleet_names_its_faulty_nodes_and_exits_1(
    capsys: pytest.CaptureFixture[str], strategy: str
) -> None:
    faults = "node-017:slow-nic=2240;node-100:flaky-nic=1;node-222:hang;node-400:slow-nic"
    code, out, _ = dsx_here(
        capsys,
        "bisect",
        "--cluster",
        f"sim:nodes=512,gpu=h100,racks=32,noise=0.03,seed=1,workloads=false,faults={faults}",
        "--strategy",
        strategy,
        "-o",
        "json",
    )
    assert code == 1
    result = json.loads(out)
    assert result.keys() >= _KEYS and result["strategy"] == strategy
    assert [(s["node"], s["fault"]) for s in result["suspects"]] == [
        ("node-017", "slow"),
        ("node-100", "fail"),
        ("node-222", "hang"),
        ("node-400", "slow"),
    ]
    assert all(s["probability"] >= 0.99 for s in result["suspects"]) and result["unresolved"] == []
    assert result["tests"] == len(result["runs"]) and result["runs"][0]["kind"] == "group"
    assert {"round", "members", "outcome", "figure"} <= result["runs"][0].keys()


def test_the_seed_repeats_a_run_and_another_seed_changes_the_figures(
    capsys: pytest.CaptureFixture[str],
) -> None:
    spec = "sim:nodes=16,noise=0.03,workloads=false,faults=node-03:slow-nic"

    def run(*extra: str) -> str:
        code, out, _ = dsx_here(capsys, "bisect", "--cluster", spec, "-o", "json", *extra)
        assert code == 1
        return out

    assert run("--seed", "4") == run("--seed", "4") != run("--seed", "5")


def test_a_healthy_group_exits_0_and_the_table_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = dsx_here(
        capsys,
        "bisect",
        "--cluster",
        "sim:nodes=8,racks=2,faults=node-02:slow-nic",
        "--nodes",
        "topology.dsx.dev/rack=rack-01",
    )
    # healthy only once screened: 21 passes see a fault failing 20% of tests with 99%
    assert code == 0 and "4 nodes" in out and "healthy" in out and "21 tests in 21 rounds" in out
    assert "screening: 21 passes" in out and "caught a fault failing 20% of tests or more" in out


def test_an_intermittent_link_is_named_with_its_probability_and_exits_1(
    capsys: pytest.CaptureFixture[str],
) -> None:
    spec = "sim:nodes=256,gpu=h100,racks=8,noise=0.03,seed=7,faults=node-230:flaky-nic=0.5"
    code, out, _ = dsx_here(capsys, "bisect", "--cluster", spec, "-o", "json")
    assert code == 1
    (suspect,) = json.loads(out)["suspects"]
    assert (suspect["node"], suspect["fault"]) == ("node-230", "fail") and suspect["probability"] >= 0.99


def test_a_nic_at_85_percent_passes_the_floor_yet_is_named_slow_relative_to_its_peers(
    capsys: pytest.CaptureFixture[str],
) -> None:
    spec = "sim:nodes=256,gpu=h100,noise=0.03,seed=3,faults=node-100:slow-nic=2720"
    code, out, _ = dsx_here(capsys, "bisect", "--cluster", spec)
    assert code == 1 and "node-100" in out and "slow relative to its peers" in out


def test_many_suspects_under_one_leaf_point_at_its_switch(capsys: pytest.CaptureFixture[str]) -> None:
    spec = "sim:nodes=64,gpu=h100,racks=4,noise=0.03,seed=1,switches=rack-02:slow=0.7"
    code, out, _ = dsx_here(capsys, "bisect", "--cluster", spec, "-o", "json")
    result = json.loads(out)
    under = {f"node-{i:02d}" for i in range(32, 48)}
    assert code == 1 and {s["node"] for s in result["suspects"]} == under
    assert [(leaf["leaf"], len(leaf["accused"]), leaf["nodes"]) for leaf in result["leaves"]] == [
        ("rack-02", 16, 16)
    ]
    code, out, _ = dsx_here(capsys, "bisect", "--cluster", spec)
    assert "leaf rack-02: 16 of its 16 nodes accused: suspect its switch before the nodes" in out


def test_spurious_failures_of_a_healthy_fleet_accuse_nobody(capsys: pytest.CaptureFixture[str]) -> None:
    spec = "sim:nodes=256,gpu=h100,noise=0.03,spurious=0.005,seed=5"
    code, out, _ = dsx_here(capsys, "bisect", "--cluster", spec, "-o", "json")
    result = json.loads(out)
    assert code == 0 and result["suspects"] == [] and result["unresolved"] == []
    assert result["screening"] >= 21


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cluster", "sim:nodes=4", "--nodes", "pool=none"], "--nodes 'pool=none' selects 0 node(s)"),
        (["--cluster", "sim:nodes=4,colour=red"], "unknown key 'colour'"),
        (["--cluster", "sim:nodes=40", "--measure", "local"], "40 nodes is more than 16 local ranks"),
        (["--cluster", "sim:nodes=4", "--strategy", "random"], "'random' is not one of"),
        (["--cluster", "sim:nodes=4", "--alpha", "2"], "bisection alpha 2.0: give 0 < value < 1"),
        (["--cluster", "sim:nodes=4,spurious=1.5"], "spurious"),
        (
            ["--cluster", "sim:nodes=4", "--measure", "local", "--seed", "3"],
            "--seed seeds the modelled tests",
        ),
    ],
)
def test_bad_input_exits_2_naming_it(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    code, _out, err = dsx_here(capsys, "bisect", *args)
    assert code == 2 and message in err


@pytest.mark.story
def test_real_local_ranks_find_the_slow_nic_the_node_checks_miss(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, _ = dsx_here(
        capsys,
        "bisect",
        "--cluster",
        "sim:nodes=4,gpu=h100,racks=2,faults=node-02:slow-nic",
        "--measure",
        "local",
        "--strategy",
        "halving",
        "--out",
        str(tmp_path),
        "-o",
        "json",
    )
    assert code == 1
    result = json.loads(out)
    assert [(s["node"], s["fault"]) for s in result["suspects"]] == [("node-02", "slow")]
    assert (tmp_path / "test-1" / "sweep.json").exists()
