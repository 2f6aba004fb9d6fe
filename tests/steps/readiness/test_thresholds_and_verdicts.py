"""Thresholds from the recipe, fault specs, and the verdicts judged from them."""

from __future__ import annotations

from pathlib import Path

import pytest

from steps.errors import InputError
from steps.readiness.judge import judge_collective, judge_relative
from steps.readiness.models import CollectiveRun, Measurement, RankStats, ResultTable, Row, Subject
from steps.readiness.nccl_tests import parse_nccl_tests_file
from steps.readiness.ranks.inject import parse_injections
from steps.readiness.sizes import format_size, parse_size, size_series
from steps.readiness.thresholds import group_timeout, load_thresholds
from tests.paths import shared_path

RECIPE = {
    "apiVersion": "dsx.dev/v1alpha1",
    "kind": "RecipeResult",
    "thresholds": {
        "nccl": {
            "allReduce": [
                {"size": "8GiB", "busBwGBps": 370, "scope": "node"},
                {"size": "1GiB", "busBwGBps": 360, "scope": "node"},
                {"size": "1GiB", "busBwGBps": 340, "scope": "multi-node"},
            ],
            "relative": {"madFactor": 3.0, "minGroups": 3},
            "timeoutFactor": 2.5,
        },
        "training": {"steps": 30, "stragglerSkew": 0.15, "minMfu": 0.30, "peakTflops": 989},
    },
}
GROUP = Subject(kind="group", name="rack-a", members=["node-1", "node-2"])


def test_sizes_read_binary_units_and_refuse_ambiguous_ones() -> None:
    assert [parse_size(v) for v in ("1GiB", "512 MiB", "32M", "4096", 8, "1.5KiB")] == [
        1 << 30,
        512 << 20,
        32 << 20,
        4096,
        8,
        1536,
    ]
    assert format_size(8 << 30) == "8GiB" and format_size(1536) == "1536B"
    for bad in ("1GB", "ten", "-1", "1.3B"):
        with pytest.raises(InputError):
            parse_size(bad)
    assert size_series(1024, 16384, 4) == [1024, 4096, 16384]
    assert size_series(1, 8, 2) == [4, 8]
    with pytest.raises(InputError, match="above"):
        size_series(2048, 1024, 2)


def test_thresholds_come_from_the_recipe_in_camel_case() -> None:
    limits = load_thresholds(RECIPE)
    assert [(t.size, t.bus_bw_gbps) for t in limits.all_reduce("node")] == [(1 << 30, 360), (8 << 30, 370)]
    assert limits.training.peak_tflops == 989 and limits.nccl.relative.min_groups == 3
    assert group_timeout(100.0, limits) == 250.0
    assert load_thresholds(None).nccl.all_reduce == []


def test_bad_thresholds_name_the_field(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"thresholds\.nccl\.allReduce\[0\]\.size"):
        load_thresholds({"nccl": {"allReduce": [{"size": "1GB", "busBwGBps": 1}]}})
    with pytest.raises(InputError, match=r"thresholds\.training\.stragglerSkw"):
        load_thresholds({"training": {"stragglerSkw": 0.1}})
    broken = tmp_path / "t.yaml"
    broken.write_text("nccl:\n  allReduce: [\n")
    with pytest.raises(InputError, match=r"t\.yaml"):
        load_thresholds(broken)


def test_fault_specs_are_checked_before_anything_runs() -> None:
    found = parse_injections(["3:delay=5ms", "2:fail"], 4)
    assert [(i.rank, i.kind, i.seconds) for i in found] == [(2, "fail", 0.0), (3, "delay", 0.005)]
    assert found[1].label() == "rank 3: delay=5ms (injected)"
    for bad, message in [
        ("4:fail", "outside a run of 4"),
        ("1:explode", "unknown fault"),
        ("1:delay", "needs a duration"),
        ("one:fail", "expected RANK:KIND"),
        ("1:delay=fast", "not a duration"),
    ]:
        with pytest.raises(InputError, match=message):
            parse_injections([bad], 4)


@pytest.mark.shared
def test_a_degraded_fabric_fails_the_multi_node_threshold_at_1gib_not_the_average() -> None:
    path = shared_path("fixtures", "nccl-tests", "h200_2node_16gpu_socket_single_nic_degraded_full_sweep.txt")
    run = parse_nccl_tests_file(path)
    verdicts = judge_collective(run, GROUP, load_thresholds(RECIPE), "multi-node", [str(path)])
    busbw = [v for v in verdicts if v.test == "allreduce-busbw@1GiB"]
    assert len(busbw) == 1 and busbw[0].status == "fail"
    assert busbw[0].measured == 91.98 and busbw[0].threshold == 340
    assert "rack-a" in busbw[0].message and busbw[0].evidence == [str(path)]


def _run(busbw_at: dict[int, float | None], stats: list[RankStats] | None = None) -> CollectiveRun:
    rows = [
        Row(
            size=size,
            count=size // 4,
            type="float",
            in_place=Measurement(time_us=1.0, busbw_gbps=bw, wrong=0),
        )
        for size, bw in sorted(busbw_at.items())
    ]
    return CollectiveRun(
        source="dsx-sweep", status="complete", results=ResultTable.of(rows), rank_stats=stats or []
    )


def test_a_size_the_sweep_did_not_reach_is_an_error_not_a_pass() -> None:
    verdicts = judge_collective(_run({1 << 20: 400.0}), GROUP, load_thresholds(RECIPE), "node")
    judged = {v.test: v for v in verdicts}
    assert judged["allreduce-busbw@1GiB"].status == "error"
    assert "largest size is 1MiB" in judged["allreduce-busbw@1GiB"].message
    assert judged["allreduce-run"].status == "pass"


def test_the_straggler_verdict_names_the_rank_and_its_node() -> None:
    stats = [
        RankStats(rank=0, host="node-1", outside_s=0.001, inside_s=2.0, skew=0.0),
        RankStats(
            rank=1,
            host="node-2",
            outside_s=1.5,
            inside_s=0.5,
            skew=0.74,
            injected="rank 1: delay=20ms (injected)",
        ),
        RankStats(rank=2, host="node-3", outside_s=0.001, inside_s=2.0, skew=0.0),
    ]
    verdicts = judge_collective(_run({1 << 20: 1.0}, stats), GROUP, load_thresholds(RECIPE))
    slow = [v for v in verdicts if v.test == "allreduce-straggler"]
    assert len(slow) == 1 and slow[0].status == "fail" and (slow[0].rank, slow[0].node) == (1, "node-2")
    assert slow[0].injected and "rank 1 on node node-2" in slow[0].message and "injected" in slow[0].message


def test_relative_mode_fails_the_group_far_below_its_peers() -> None:
    groups = [
        (
            Subject(kind="group", name=f"rack-{i}", members=[f"n{i}a", f"n{i}b"]),
            _run({1 << 30: bw, 1 << 20: 5.0}),
        )
        for i, bw in enumerate([300.0, 310.0, 305.0, 150.0, 302.0])
    ]
    verdicts = judge_relative(groups, load_thresholds(RECIPE))
    assert {v.subject.name: v.status for v in verdicts} == {
        "rack-0": "pass",
        "rack-1": "pass",
        "rack-2": "pass",
        "rack-3": "fail",
        "rack-4": "pass",
    }
    assert all(v.test == "allreduce-relative@1GiB" for v in verdicts)
    assert judge_relative(groups[:2], load_thresholds(RECIPE)) == []  # fewer than minGroups: no verdict
