"""The fabric model: group tests on a simulated fleet without processes."""

from __future__ import annotations

import pytest

from steps.cluster import connect
from steps.cluster.fabric import FabricModel, FabricSettings, fabric_model
from steps.cluster.health import NodeReport
from steps.errors import InputError


def _model(spec: str, nodes: int) -> FabricModel:
    names = [f"node-{i:02d}" for i in range(nodes)]
    model = fabric_model(connect(f"sim:nodes={nodes},gpu=h100,{spec}"), names)
    assert model is not None
    return model


def test_a_healthy_group_passes_near_its_links_and_a_slow_member_caps_the_group() -> None:
    model = _model("faults=node-03:slow-nic=2240", 8)  # 70% of 3200 Gbit/s
    healthy = model.allreduce([f"node-{i:02d}" for i in range(3)])
    assert healthy.outcome == "pass" and healthy.figure is not None
    assert 0.9 * 400 < healthy.figure <= 400  # 3200 Gbit/s is 400 GB/s
    capped = model.allreduce([f"node-{i:02d}" for i in range(8)])
    assert capped.outcome == "fail" and capped.figure is not None
    assert capped.figure == pytest.approx(0.7 * model.busbw(8, 3200), rel=0.03)
    assert "busbw" in capped.reason and "< " in capped.reason


def test_the_threshold_is_keyed_to_the_group_size() -> None:
    model = _model("", 2)
    # fixed costs weigh more on a short ring: a pair reaches less than a larger group
    assert model.busbw(2, 3200) < model.busbw(64, 3200) < model.busbw(128, 3200)
    assert model.threshold(2, 3200) == pytest.approx(0.8 * model.busbw(2, 3200))


def test_the_message_is_capped_as_a_real_tests_buffer_so_a_large_ring_hides_a_node_a_little_slow() -> None:
    model = _model("", 2)
    assert model.message(64) == 64 * 64 << 20
    assert model.message(128) == model.message(4096) == 8 << 30  # 8 GiB, not 64 MiB x 4,096
    # past the cap each ring step moves less and the per-step latency weighs more
    assert model.busbw(4096, 3200) < model.busbw(128, 3200)
    at_64 = model.busbw(64, 0.85 * 3200) / model.busbw(64, 3200)
    at_4096 = model.busbw(4096, 0.85 * 3200) / model.busbw(4096, 3200)
    assert at_64 == pytest.approx(0.85, abs=0.01)
    assert 0.9 < at_4096 < 0.95  # within the 10% a figure may lie below its peers: the ranks must tell


def test_one_slow_rail_caps_the_ring_and_a_rail_down_halves_it() -> None:
    model = _model("faults=node-01:slow-rail:mlx5_3=200;node-02:nic-down=mlx5_5", 4)
    assert model.reports["node-00"].ring_gbps == 3200
    assert model.reports["node-01"].ring_gbps == 8 * 200  # 8 rails at the slowest one's 200 Gbit/s
    assert model.reports["node-02"].ring_gbps == 8 * 400 / 2  # two rails' GPUs share one port
    test = model.allreduce(["node-00", "node-01"])
    assert test.outcome == "fail" and test.ranks is not None
    assert test.ranks["node-01"] == pytest.approx(200.0) and test.ranks["node-00"] == pytest.approx(400.0)


def test_a_faulty_leaf_switch_touches_every_node_under_it_at_once() -> None:
    model = _model("racks=4,switches=rack-01:slow=0.5;rack-02:flaky=1;rack-03:hang", 16)
    # rack-00: node-00..03, rack-01: node-04..07, rack-02: node-08..11, rack-03: node-12..15
    assert model.allreduce(["node-00", "node-01"]).outcome == "pass"
    slow = model.allreduce(["node-00", "node-04"])
    assert slow.outcome == "fail" and slow.ranks is not None and slow.figure is not None
    assert slow.ranks["node-04"] == pytest.approx(200.0) and slow.ranks["node-00"] == pytest.approx(400.0)
    assert model.allreduce(["node-04", "node-05"]).outcome == "fail"  # inside the leaf too
    flaky = model.allreduce(["node-00", "node-08"])
    assert (flaky.outcome, flaky.figure) == ("fail", None)
    assert model.allreduce(["node-00", "node-12"]).outcome == "hang"
    assert model.reports["node-04"].ring_gbps == 3200  # the node's own links are fine: nothing reports it


def test_a_slow_gpu_passes_every_fabric_test() -> None:
    model = _model("faults=node-01:slow-gpu=0.5", 2)
    assert model.reports["node-01"].gpus[0].compute_share == 0.5
    assert model.allreduce(["node-00", "node-01"]).outcome == "pass"


def test_nic_faults_show_only_in_multi_node_tests_as_fail_and_hang() -> None:
    model = _model("faults=node-01:flaky-nic=1;node-02:hang", 4)
    failed = model.allreduce(["node-00", "node-01"])
    assert (failed.outcome, failed.figure) == ("fail", None)
    hung = model.allreduce(["node-00", "node-02", "node-03"])
    assert (hung.outcome, hung.figure) == ("hang", None)
    assert hung.duration_s > model.settings.launch_s + model.settings.hang_grace_s
    with pytest.raises(InputError, match="two or more distinct nodes"):
        model.allreduce(["node-01"])
    with pytest.raises(InputError, match="knows no node 'node-09'"):
        model.allreduce(["node-00", "node-09"])


def test_a_flaky_link_fails_about_as_often_as_it_says() -> None:
    model = _model("seed=3,faults=node-01:flaky-nic=0.3", 2)
    outcomes = [model.allreduce(["node-00", "node-01"]).outcome for _ in range(2000)]
    assert 0.25 < outcomes.count("fail") / len(outcomes) < 0.35


def test_noise_stays_in_its_band_and_the_seed_repeats_every_figure() -> None:
    def figures(seed: int) -> list[float]:
        model = _model(f"noise=0.03,seed={seed}", 4)
        return [model.allreduce(["node-00", "node-01", "node-02"]).figure or 0.0 for _ in range(200)]

    clean = _model("", 4).busbw(3, 3200)
    first = figures(1)
    assert first == figures(1) and first != figures(2)
    assert all(0.97 * clean <= f <= 1.03 * clean for f in first)
    assert max(first) - min(first) > 0.03 * clean  # the noise is there


def test_ports_without_a_fabric_give_no_model() -> None:
    assert fabric_model(object(), ["node-00"]) is None
    report = NodeReport(node="a", link_gbps=100.0, nominal_link_gbps=100.0)
    model = FabricModel({"a": report, "b": report.model_copy(update={"node": "b"})}, FabricSettings())
    assert model.allreduce(["a", "b"]).outcome == "pass"


def test_a_noisy_figure_and_the_time_it_took_agree_a_higher_bandwidth_taking_less_time() -> None:
    model = _model("noise=0.03,seed=2", 4)
    launch, members = model.settings.launch_s, ["node-00", "node-01", "node-02"]
    runs = [model.allreduce(members) for _ in range(50)]
    work = [(r.figure or 0.0) * (r.duration_s - launch) for r in runs]
    assert len({r.figure for r in runs}) > 1
    assert work == pytest.approx([work[0]] * len(work), rel=1e-9)  # bandwidth times time: the work, fixed


def test_each_rank_times_its_own_links_so_a_straggler_shows_beside_its_peers() -> None:
    model = _model("noise=0.03,seed=2,faults=node-05:slow-nic=2720", 8)  # 85%: above the floor
    names = [f"node-{i:02d}" for i in range(8)]
    result = model.allreduce(names)
    assert result.outcome == "pass" and result.ranks is not None and result.expected is not None
    assert result.expected == pytest.approx(model.busbw(8, 3200))
    slowest = min(result.ranks, key=lambda n: result.ranks[n] if result.ranks else 0.0)
    assert slowest == "node-05" and result.ranks["node-05"] == pytest.approx(340.0, rel=0.031)


def test_spurious_failures_strike_healthy_tests_at_the_stated_rate() -> None:
    model = _model("noise=0.03,seed=4,spurious=0.1", 4)
    names = [f"node-{i:02d}" for i in range(4)]
    results = [model.allreduce(names) for _ in range(2000)]
    failed = [r for r in results if r.outcome != "pass"]
    assert 0.07 < len(failed) / len(results) < 0.13
    # a transient error fails outright; congestion slows the figure under the threshold
    assert {r.figure is None for r in failed} == {True, False}
    assert _model("noise=0.03,seed=4", 4).allreduce(names).outcome == "pass"
