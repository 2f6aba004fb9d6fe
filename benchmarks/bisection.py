"""The bisection search on the fabric model: misses, false accusations, tests, rounds, time, and the targets.

Each scenario is a run of ``dsx bisect`` from the start: N nodes, k of them faulty, 3% measurement noise, a
spurious-failure rate q of healthy tests (0 or 0.5%), the search screening the group first. Fault classes:
an intermittent link failing a share P of the tests that hold it (P in 0.2, 0.5, 0.9), a hard one (P = 1),
and NICs at 70%, 78%, 85% and 90% of their peers' speed. Per row and strategy: faulty nodes missed (not
accused; ``in unres`` counts those listed in ``unresolved`` with their probability), healthy nodes accused,
runs with any false accusation, mean tests (and the most), rounds, wall-clock and node-seconds of the
modelled tests, and CPU seconds of the search. The targets (N <= 4096, k <= 4, q <= 0.5%):

- missed: <= 1% for P >= 0.5 and for NICs at <= 85% of their peers; <= 5% for P = 0.2 (none stated at 90%);
  every miss listed in ``unresolved``;
- healthy nodes accused <= 0.1%; runs with a false accusation <= 1%;
- tests at N = 4096: k = 1, <= 50 (P = 0.9), <= 80 (0.5), <= 200 (0.2); k = 4, <= 150 (0.9), <= 270 (0.5);
- hard faults: the narrowing tests (all but the screens), on average, within 2 x ceil(log2 C(N, k)) + 2k
  (the most of any scenario is printed beside);
- a bisection of 4,096 nodes: < 10 s CPU.

    python benchmarks/bisection.py [--scenarios N] [--sizes 64,256] [--ks 1,4] [--faults p0.5,slow0.85]
        [--strategies auto] [--spurious 0,0.005] [--free NODES]
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import time
from collections.abc import Sequence

from steps.cluster.fabric import FabricModel, FabricSettings
from steps.cluster.health import NodeReport
from steps.readiness.bisect import BisectResult, bisect
from steps.readiness.bisect.probes import fabric_test

NOMINAL = 3200.0
NOISE = 0.03
FAULTS = ("p0.2", "p0.5", "p0.9", "p1", "slow0.7", "slow0.78", "slow0.85", "slow0.9")
STRATEGIES = ("auto", "halving", "pairs")
TEST_TARGETS = {(4096, 1, "p0.9"): 50, (4096, 1, "p0.5"): 80, (4096, 1, "p0.2"): 200, (4096, 4, "p0.9"): 150}
TEST_TARGETS[(4096, 4, "p0.5")] = 270


def _miss_target(fault: str) -> float | None:
    if fault == "p0.2":
        return 0.05
    if fault.startswith("slow"):
        return 0.01 if float(fault[4:]) <= 0.85 else None
    return 0.01


def _scenario(n: int, k: int, fault: str, q: float, case: int) -> tuple[list[str], FabricModel, set[str]]:
    names = [f"node-{i:04d}" for i in range(n)]
    bad = set(random.Random(f"{n}-{k}-{fault}-{case}").sample(names, k))
    if fault.startswith("slow"):
        broken: dict[str, object] = {"link_gbps": NOMINAL * float(fault[4:])}
    else:
        broken = {"link_failure_rate": float(fault[1:])}
    reports = {
        name: NodeReport.model_validate(
            {"node": name, "link_gbps": NOMINAL, "nominal_link_gbps": NOMINAL}
            | (broken if name in bad else {})
        )
        for name in names
    }
    settings = FabricSettings(noise=NOISE, seed=case, spurious=q)
    return names, FabricModel(reports, settings), bad


def _row(results: Sequence[tuple[BisectResult, set[str], float]], n: int) -> dict[str, float]:
    faulty = sum(len(bad) for _, bad, _ in results)
    missed = [node for r, bad, _ in results for node in bad - {s.node for s in r.suspects}]
    listed = sum(
        1
        for r, bad, _ in results
        for node in bad - {s.node for s in r.suspects}
        if node in {u.node for u in r.unresolved}
    )
    false = [len({s.node for s in r.suspects} - bad) for r, bad, _ in results]
    healthy = sum(n - len(bad) for _, bad, _ in results)
    narrowing = [sum(1 for run in r.runs if run.kind != "group") for r, _, _ in results]
    return {
        "missed": len(missed) / faulty if faulty else 0.0,
        "listed": listed,
        "misses": len(missed),
        "accused": sum(false) / healthy if healthy else 0.0,
        "false_runs": sum(1 for f in false if f) / len(results),
        "tests": statistics.mean(r.tests for r, _, _ in results),
        "most": max(r.tests for r, _, _ in results),
        "narrowing": statistics.mean(narrowing),
        "narrowing_most": max(narrowing),
        "rounds": statistics.mean(r.rounds for r, _, _ in results),
        "wall": statistics.mean(r.wall_clock_s for r, _, _ in results),
        "node_s": statistics.mean(r.node_seconds for r, _, _ in results),
        "cpu": max(c for _, _, c in results),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", type=int, default=10, help="scenarios per row (default 10)")
    parser.add_argument("--sizes", default="64,256,1024,4096", help="N, comma-separated")
    parser.add_argument("--ks", default="1,2,4", help="k, comma-separated")
    parser.add_argument("--faults", default=",".join(FAULTS), help="fault classes, comma-separated")
    parser.add_argument("--strategies", default=",".join(STRATEGIES), help="strategies, comma-separated")
    parser.add_argument("--spurious", default="0,0.005", help="q, comma-separated")
    parser.add_argument("--free", type=int, default=None, help="nodes under test at once (default: all)")
    args = parser.parse_args()
    sizes = [int(v) for v in args.sizes.split(",")]
    ks = [int(v) for v in args.ks.split(",")]
    faults = args.faults.split(",")
    strategies = args.strategies.split(",")
    rates = [float(v) for v in args.spurious.split(",")]
    started = time.perf_counter()
    print(f"{args.scenarios} scenarios a row, noise {NOISE:.0%}, {args.free or 'all'} nodes free")
    header = (
        f"{'N':>5} {'k':>2} {'fault':<9} {'q':>6} {'strategy':<8} {'missed':>7} {'target':>6} "
        f"{'in unres':>8} {'accused':>8} {'runs FA':>7} {'tests':>6} {'most':>5} {'target':>6} "
        f"{'narrow':>6} {'most':>4} {'2xbound':>7} {'rounds':>6} {'wall s':>7} {'node-s':>10} {'cpu s':>6}"
    )
    print(header)
    print("-" * len(header))
    verdicts: list[str] = []
    worst_cpu = 0.0
    for n in sizes:
        for k in ks:
            bound = 2 * math.ceil(math.log2(math.comb(n, k))) + 2 * k
            for fault in faults:
                for q in rates:
                    for strategy in strategies:
                        results = []
                        for case in range(args.scenarios):
                            names, model, bad = _scenario(n, k, fault, q, case)
                            clock = time.process_time()
                            result = bisect(names, fabric_test(model), strategy, noise=NOISE, free=args.free)  # type: ignore[arg-type]
                            results.append((result, bad, time.process_time() - clock))
                        row = _row(results, n)
                        worst_cpu = max(worst_cpu, row["cpu"]) if n == 4096 else worst_cpu
                        miss_target = _miss_target(fault)
                        test_target = TEST_TARGETS.get((n, k, fault))
                        hard = fault == "p1"
                        print(
                            f"{n:>5} {k:>2} {fault:<9} {q:>6.3f} {strategy:<8} {row['missed']:>7.1%} "
                            f"{'-' if miss_target is None else f'{miss_target:.0%}':>6} "
                            f"{int(row['listed']):>3}/{int(row['misses']):<4} "
                            f"{row['accused']:>8.3%} {row['false_runs']:>7.1%} {row['tests']:>6.1f} "
                            f"{int(row['most']):>5} {'-' if test_target is None else test_target:>6} "
                            f"{row['narrowing']:>6.1f} {int(row['narrowing_most']):>4} "
                            f"{bound if hard else '-':>7} {row['rounds']:>6.1f} "
                            f"{row['wall']:>7.0f} {row['node_s']:>10.0f} {row['cpu']:>6.2f}"
                        )
                        where = f"N={n} k={k} {fault} q={q} {strategy}"
                        if miss_target is not None and row["missed"] > miss_target:
                            verdicts.append(f"missed {row['missed']:.1%} > {miss_target:.0%}: {where}")
                        if miss_target is not None and row["listed"] < row["misses"]:
                            unlisted = int(row["misses"] - row["listed"])
                            verdicts.append(f"{unlisted} missed node(s) not in unresolved: {where}")
                        if row["accused"] > 0.001 or row["false_runs"] > 0.01:
                            verdicts.append(f"false accusations: {where}")
                        if test_target is not None and row["tests"] > test_target:
                            verdicts.append(f"tests {row['tests']:.0f} > {test_target}: {where}")
                        if hard and row["narrowing"] > bound:
                            verdicts.append(f"narrowing {row['narrowing']:.1f} > {bound}: {where}")
    print("-" * len(header))
    if 4096 in sizes:
        print(f"most CPU for one bisection of 4,096 nodes: {worst_cpu:.2f} s (target < 10 s)")
    print("targets missed:" if verdicts else "every target in these rows met")
    for line in verdicts:
        print(f"  {line}")
    print(f"{time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
