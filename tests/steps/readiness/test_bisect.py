"""The bisection search over the fabric model: every result is evidence, accusations carry a probability."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import pytest

from steps.cluster.fabric import FabricModel, FabricSettings
from steps.cluster.health import NodeReport
from steps.errors import InputError
from steps.readiness.bisect import BisectResult, GroupResult, GroupTest, bisect
from steps.readiness.bisect.evidence import INDEPENDENT_PRIOR, Evidence, caught, screening_runs
from steps.readiness.bisect.probes import fabric_test

NOMINAL = 3200.0


def _fleet(
    n: int, faults: dict[int, str], noise: float = 0.0, seed: int = 0
) -> tuple[list[str], FabricModel]:
    """``n`` nodes, node ``i`` given fault ``slow=F`` (its links at F of nominal), ``fail``, ``flaky=P``
    (fails a test with probability P) or ``hang``."""
    names = [f"n{i:04d}" for i in range(n)]
    reports = {}
    for i, name in enumerate(names):
        fault = faults.get(i, "")
        reports[name] = NodeReport(
            node=name,
            link_gbps=NOMINAL * float(fault[5:]) if fault.startswith("slow=") else NOMINAL,
            nominal_link_gbps=NOMINAL,
            link_failure_rate=1.0
            if fault == "fail"
            else float(fault[6:])
            if fault.startswith("flaky=")
            else 0.0,
            link_hangs=fault == "hang",
        )
    return names, FabricModel(reports, FabricSettings(noise=noise, seed=seed))


def _expected(names: list[str], faults: dict[int, str]) -> dict[str, str]:
    kinds = {"slow": "slow", "flaky": "fail"}
    return {names[i]: kinds.get(f.partition("=")[0], f) for i, f in faults.items()}


def _found(result: BisectResult) -> dict[str, str]:
    return {s.node: s.fault for s in result.suspects}


def _scenario(rng: random.Random, n: int, k: int) -> dict[int, str]:
    kinds = ["slow=0.7", "slow=0.25", "slow=0.5", "fail", "hang"]
    return {i: rng.choice(kinds) for i in rng.sample(range(n), k)}


@pytest.mark.story
@pytest.mark.parametrize("strategy", ["halving", "pairs", "auto"])
@pytest.mark.parametrize("noise", [0.0, 0.03])
def test_random_hard_faults_are_named_with_their_kind_and_a_probability_of_at_least_1_minus_alpha(
    strategy: str, noise: float
) -> None:
    rng = random.Random(f"{strategy}-{noise}")
    for case in range(40):
        n = rng.choice([4, 5, 7, 16, 33, 64, 100])
        k = rng.randint(0, max(1, n // 4))
        faults = _scenario(rng, n, k)
        names, model = _fleet(n, faults, noise, seed=case)
        result = bisect(names, fabric_test(model), strategy, noise=noise)  # type: ignore[arg-type]
        assert _found(result) == _expected(names, faults), (case, n, faults)
        assert result.unresolved == [] and result.healthy == (k == 0)
        assert all(s.probability >= 0.99 and s.confirmed_with not in faults for s in result.suspects)


@pytest.mark.story
@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_narrowing_hard_faults_stays_within_twice_the_lower_bound_on_1024_nodes(k: int) -> None:
    """The tests that narrow (all but the screens of the nodes left in service) stay within 2x
    ceil(log2 C(N, k)), plus a partner test per fault; the screens are what the stated confidence asks."""
    bound = math.ceil(math.log2(math.comb(1024, k)))
    rng = random.Random(k)
    for case in range(6):
        for noise in (0.0, 0.03):
            faults = _scenario(rng, 1024, k)
            names, model = _fleet(1024, faults, noise, seed=case)
            test = fabric_test(model)
            result = bisect(names, test, "auto", noise=noise, failed=test(names))
            assert _found(result) == _expected(names, faults)
            narrowing = [r for r in result.runs if r.kind != "group"]
            assert len(narrowing) <= 2 * bound + 2 * k, (k, noise, faults, len(narrowing))
            assert result.screening >= result.screening_needed == 21


def test_an_intermittent_link_is_named_though_most_of_its_tests_pass() -> None:
    for seed in range(6):
        names, model = _fleet(256, {230: "flaky=0.5"}, 0.03, seed=seed)
        result = bisect(names, fabric_test(model), "auto", noise=0.03)
        assert _found(result) == {"n0230": "fail"}, seed
        assert result.suspects[0].probability >= 0.99 and result.unresolved == []
        # evidence for the accusation includes passes of tests that held it: no pass cleared it
        held = [r for r in result.runs if "n0230" in r.members]
        assert any(r.outcome == "pass" for r in held) and any(r.outcome != "pass" for r in held)


def test_both_halves_passing_after_their_parent_failed_means_test_again_not_stop() -> None:
    failures = iter([True, False])  # the group fails, then the half holding n3 passes once; then it fails

    def test(members: Sequence[str]) -> GroupResult:
        bad = "n3" in members and next(failures, True)
        return GroupResult(outcome="fail" if bad else "pass", figure=None if bad else 100.0, threshold=80.0)

    result = bisect([f"n{i}" for i in range(8)], test, "halving")
    first, left, right, *rest = result.runs
    assert (first.outcome, left.outcome, right.outcome) == ("fail", "pass", "pass")
    again = next(r for r in rest if r.round == left.round + 1)
    assert "n3" in again.members  # the part that held the fault is tested again
    assert _found(result) == {"n3": "fail"}


def test_spurious_failures_of_healthy_tests_accuse_nobody() -> None:
    accused = 0
    for seed in range(20):
        rng = random.Random(seed)
        names, model = _fleet(64, {}, 0.03, seed=seed)
        healthy = fabric_test(model)

        def test(
            members: Sequence[str], healthy: GroupTest = healthy, rng: random.Random = rng
        ) -> GroupResult:
            result = healthy(members)
            return GroupResult(outcome="fail", threshold=result.threshold) if rng.random() < 0.05 else result

        result = bisect(names, test, "auto", noise=0.03, spurious=0.05)
        accused += len(result.suspects)
    assert accused == 0


def test_independent_faults_blame_a_node_only_for_what_the_others_leave_unexplained() -> None:
    nodes = [f"n{i}" for i in range(8)]
    evidence = Evidence(nodes)
    for _ in range(5):  # n1..n7 pass together
        evidence.observe(nodes[1:], failed=False)
    for partner in nodes[1:4]:  # n0 fails beside three of them
        evidence.observe(["n0", partner], failed=True)
    blamed = evidence.independent()
    assert blamed[0] >= 0.99
    assert max(blamed[1:]) < INDEPENDENT_PRIOR
    evidence.accuse("n0")
    evidence.observe(["n0", "n4"], failed=True)  # n0, a hard fault, explains it: n4 is not blamed
    assert evidence.independent()[4] < INDEPENDENT_PRIOR


def test_screening_counts_the_passes_since_a_failed_test_held_the_node() -> None:
    evidence = Evidence(["n0", "n1", "n2", "n3"])
    for _ in range(5):
        evidence.observe(["n0", "n1", "n2", "n3"], failed=False)
    evidence.observe(["n0", "n1"], failed=True)
    assert evidence.passes_since_failure().tolist() == [0, 0, 5, 5]
    evidence.observe(["n0", "n1", "n2", "n3"], failed=False)
    assert evidence.passes_since_failure().tolist() == [1, 1, 6, 6]


def test_a_second_intermittent_node_is_found_though_the_first_seemed_to_explain_its_failures() -> None:
    """Two links in 1,024 failing a fifth of their tests: the second failed four times, in large tests that
    the first one's accusation seemed to explain. Counting its passes before those failures, the screening
    called the group clear once the first was accused; counting the passes since, it is screened again and
    found."""
    bad = random.Random("1024-2-p0.2-0").sample(range(1024), 2)
    names, model = _fleet(1024, dict.fromkeys(bad, "flaky=0.2"), 0.03, seed=0)
    result = bisect(names, fabric_test(model), "auto", noise=0.03)
    assert {s.node for s in result.suspects} == {names[i] for i in bad}


@pytest.mark.story
def test_a_healthy_node_that_failed_beside_faulty_ones_is_tested_again_not_accused() -> None:
    """Four links in 64 failing half their tests: a healthy node fails beside a faulty member of a split and
    then beside a faulty partner that had passed its tests. One fault at a time, that is 0.99 against it;
    with the others' faults reckoned in, it is not, so it is tested again (3 of these 40 fleets accused a
    healthy node before)."""
    wrongly, found = [], 0
    for seed in range(40):
        bad = random.Random(f"64-4-p0.5-{seed}").sample(range(64), 4)
        names, model = _fleet(64, dict.fromkeys(bad, "flaky=0.5"), 0.03, seed=seed)
        result = bisect(names, fabric_test(model), "auto", noise=0.03)
        accused = {s.node for s in result.suspects}
        wrongly += sorted(accused - {names[i] for i in bad})
        found += len(accused & {names[i] for i in bad})
    assert wrongly == []
    assert found == 160


def test_a_healthy_group_is_healthy_only_after_its_screening() -> None:
    assert [screening_runs(p, 0.01) for p in (0.2, 0.5, 0.9, 1.0)] == [21, 7, 2, 1]
    assert caught(21, 0.01) == pytest.approx(0.197, abs=0.001) and caught(0, 0.01) == 1.0
    names, model = _fleet(16, {})
    result = bisect(names, fabric_test(model), "auto")
    assert result.healthy and result.tests == 21 and {r.kind for r in result.runs} == {"group"}
    assert (result.screening, result.caught) == (21, pytest.approx(0.197, abs=0.001))
    quick = bisect(names, fabric_test(_fleet(16, {})[1]), "auto", p_min=0.5)
    assert quick.healthy and quick.tests == 7


def test_a_node_a_little_slow_is_slow_relative_to_its_peers_and_its_rank_names_it_in_one_run() -> None:
    names, model = _fleet(256, {100: "slow=0.85"}, 0.03, seed=3)
    first = model.allreduce(names)
    assert first.outcome == "pass"  # above the absolute floor
    result = bisect(names, fabric_test(model), "auto", noise=0.03)
    assert _found(result) == {"n0100": "slow-relative"}
    assert result.runs[0].stragglers == ["n0100"]  # its rank fell behind its peers' in the first run


def test_a_budget_spent_leaves_unresolved_nodes_with_their_probability_and_the_tests_needed() -> None:
    names, model = _fleet(64, {9: "flaky=0.2"}, 0.03, seed=2)
    test = fabric_test(model)
    result = bisect(names, test, "auto", noise=0.03, budget=6, failed=GroupResult(outcome="fail"))
    assert result.tests == 6 and not result.healthy and not result.suspects
    assert result.unresolved and all(0.01 <= u.probability < 0.99 for u in result.unresolved)
    assert all(u.tests_needed >= 1 for u in result.unresolved)
    assert result.unresolved == sorted(result.unresolved, key=lambda u: (-u.probability, u.node))


def test_no_test_holds_more_nodes_than_are_free() -> None:
    names, model = _fleet(64, {17: "hang"}, 0.03)
    result = bisect(names, fabric_test(model), "halving", noise=0.03, free=8)
    assert _found(result) == {"n0017": "hang"}
    assert max(len(r.members) for r in result.runs) <= 8


def test_auto_asks_fewer_tests_than_halving_and_pairs_the_fewest_rounds() -> None:
    cost: dict[str, list[tuple[int, int]]] = {"halving": [], "pairs": [], "auto": []}
    for seed in range(4):
        for strategy, found in cost.items():
            names, model = _fleet(128, {77: "flaky=0.9"}, 0.03, seed=seed)
            test = fabric_test(model)
            result = bisect(names, test, strategy, noise=0.03, failed=test(names))  # type: ignore[arg-type]
            assert _found(result) == {"n0077": "fail"}
            found.append((result.tests, result.rounds))
    tests = {s: sum(t for t, _ in c) for s, c in cost.items()}
    rounds = {s: sum(r for _, r in c) for s, c in cost.items()}
    assert tests["auto"] < tests["halving"] < tests["pairs"]
    assert rounds["pairs"] < rounds["halving"] < rounds["auto"]


def test_a_figure_in_the_noise_band_is_run_again_and_the_median_counts() -> None:
    def measured(figures: list[float]) -> BisectResult:
        queue = iter(figures)

        def test(members: Sequence[str]) -> GroupResult:
            figure = next(queue, 100.0)
            return GroupResult(outcome="pass" if figure >= 80 else "fail", figure=figure, threshold=80.0)

        return bisect(["a", "b", "c", "d"], test, "halving", noise=0.03)  # the band: 77.6..82.4

    passed = measured([79.5, 81.0, 80.5])
    assert [(r.attempt, r.figure) for r in passed.runs[:4]] == [(1, 79.5), (2, 81.0), (3, 80.5), (1, 100.0)]
    assert passed.runs[2].outcome == "pass" and "median of 3 runs" in passed.runs[2].reason
    assert passed.healthy
    failed = measured([79.0, 81.0, 78.0])  # median 79: it fails, and then every test passes
    assert failed.runs[2].outcome == "fail" and failed.runs[3].attempt == 1
    assert failed.healthy and not failed.suspects  # one failure nothing repeats: spurious, not blamed
    assert measured([77.0]).runs[0].attempt == 1 and measured([77.0]).runs[1].attempt == 1  # outside: at once


def test_a_group_with_no_known_good_member_finds_partners_among_its_members() -> None:
    names, model = _fleet(4, {0: "hang", 2: "slow=0.5"})
    result = bisect(names, fabric_test(model), "halving")  # halves n0,n1 and n2,n3 both fail
    assert _found(result) == {"n0000": "hang", "n0002": "slow"}
    assert {s.confirmed_with for s in result.suspects} <= {"n0001", "n0003"}


def test_two_nodes_no_test_can_tell_apart_stay_unresolved_unless_a_partner_is_lent() -> None:
    names, model = _fleet(2, {1: "fail"})
    result = bisect(names, fabric_test(model), "pairs")
    assert not result.suspects and not result.healthy
    assert [(u.node, u.probability) for u in result.unresolved] == [
        ("n0000", pytest.approx(0.5, abs=0.01)),
        ("n0001", pytest.approx(0.5, abs=0.01)),
    ]
    lent = bisect(names, fabric_test(_fleet(3, {1: "fail"})[1]), "pairs", partners=["n0002"])
    assert _found(lent) == {"n0001": "fail"}


def test_accounting_counts_rounds_time_and_held_node_seconds() -> None:
    names, model = _fleet(8, {3: "slow=0.5"})
    result = bisect(names, fabric_test(model), "halving")
    assert result.rounds == len({r.round for r in result.runs}) and result.tests == len(result.runs)
    durations = [max(r.duration_s for r in result.runs if r.round == i) for i in range(result.rounds)]
    assert result.wall_clock_s == pytest.approx(sum(durations), abs=0.01)
    # each member is held from the start to the end of the last test that held it
    ends = {}
    clock = 0.0
    for i, duration in enumerate(durations):
        for run in (r for r in result.runs if r.round == i):
            for node in run.members:
                ends[node] = clock + run.duration_s
        clock += duration
    assert result.node_seconds == pytest.approx(sum(ends.values()), rel=0.01)


def test_the_same_seed_gives_the_same_bisection() -> None:
    def run(seed: int) -> BisectResult:
        names, model = _fleet(64, {7: "slow=0.6", 40: "fail"}, noise=0.03, seed=seed)
        return bisect(names, fabric_test(model), "halving", noise=0.03)

    assert run(5) == run(5)
    assert run(5).runs != run(6).runs


def test_bad_input_is_refused() -> None:
    names, model = _fleet(4, {})
    with pytest.raises(InputError, match="two or more distinct nodes"):
        bisect(["n0000"], fabric_test(model))
    with pytest.raises(InputError, match="two or more distinct nodes"):
        bisect(["n0000", "n0000"], fabric_test(model))
    with pytest.raises(InputError, match="unknown bisection strategy 'random'"):
        bisect(names, fabric_test(model), "random")  # type: ignore[arg-type]
    with pytest.raises(InputError, match="bisection alpha 0"):
        bisect(names, fabric_test(model), alpha=0.0)
    with pytest.raises(InputError, match=r"bisection p-max 0\.1"):
        bisect(names, fabric_test(model), p_max=0.1)
    with pytest.raises(InputError, match="bisection budget 0"):
        bisect(names, fabric_test(model), budget=0)
