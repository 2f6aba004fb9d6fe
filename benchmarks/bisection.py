"""Bisection strategies on the fabric model: accuracy, tests, rounds, wall-clock and node-seconds.

For N nodes in 64, 256, 1024, 4096 and k in 1, 2, 4 faulty ones, random scenarios at 3% measurement noise,
rotating through four fault classes: slow (links at 25% to 70% of nominal), failing (every multi-node
collective fails), hanging (it never completes), mixed (each fault one of those). Every strategy bisects
the same failing group (its own test is given, as a certification's failing group test gives it). One
table: false positives and negatives over all scenarios, then the mean (and most) tests, mean rounds,
wall-clock and node-seconds per strategy, beside the information-theoretic lower bound ceil(log2 C(N,k))
and testing every node beside a known-good partner (N tests; one round when N partners are free).
Goals (the issue's acceptance): no false result; halving within 2.5x the bound in tests at 3% noise;
auto within 1.1x the node-seconds of the better of halving and pairs. The table gives auto's ratio to the
better strategy in its worst scenario (``auto/best``) and on average over a row's scenarios (``mean``).
With every node free pairs is the better in every scenario and auto matches it. With few free (``--free``)
the better one turns on how many nodes are at fault, which no choice made before bisecting can know: at
N=256 and 32 free, one failing node favours halving by up to 1.5x and two favour pairs by up to 1.7x, with
the same group result, so a single scenario can exceed 1.1x while the average stays within it.

    python benchmarks/bisection.py [--quick] [--scenarios N] [--free NODES]
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import time

from steps.cluster.fabric import FabricModel, FabricSettings
from steps.cluster.health import NodeReport
from steps.readiness.bisect import bisect
from steps.readiness.bisect.probes import fabric_test

NOMINAL = 3200.0
NOISE = 0.03
CLASSES = ("slow", "failing", "hanging", "mixed")
STRATEGIES = ("halving", "pairs", "auto")


def _fault(rng: random.Random, kind: str) -> dict[str, object]:
    if kind == "mixed":
        kind = rng.choice(CLASSES[:3])
    if kind == "slow":
        return {"link_gbps": NOMINAL * rng.uniform(0.25, 0.7)}
    return {"link_failure_rate": 1.0} if kind == "failing" else {"link_hangs": True}


def _scenario(
    rng: random.Random, n: int, k: int, kind: str, seed: int
) -> tuple[list[str], FabricModel, set[str]]:
    names = [f"node-{i:04d}" for i in range(n)]
    bad = set(rng.sample(names, k))
    reports = {
        name: NodeReport.model_validate(
            {"node": name, "link_gbps": NOMINAL, "nominal_link_gbps": NOMINAL}
            | (_fault(rng, kind) if name in bad else {})
        )
        for name in names
    }
    return names, FabricModel(reports, FabricSettings(noise=NOISE, seed=seed)), bad


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20 scenarios each, N up to 1024")
    parser.add_argument("--scenarios", type=int, default=None, help="scenarios per N and k (default 200)")
    parser.add_argument("--free", type=int, default=None, help="nodes under test at once (default: all)")
    args = parser.parse_args()
    sizes = (64, 256, 1024) if args.quick else (64, 256, 1024, 4096)
    count = args.scenarios or (20 if args.quick else 200)
    started = time.perf_counter()
    print(
        f"{count} scenarios per N and k, {args.free or 'all'} nodes free, noise {NOISE:.0%}, "
        f"fault classes {', '.join(CLASSES)} in turn"
    )
    header = (
        f"{'N':>5} {'k':>2} {'bound':>5} {'strategy':<8} {'FP':>3} {'FN':>3} {'tests':>7} {'max':>5} "
        f"{'x bound':>7} {'rounds':>6} {'wall s':>7} {'node-s':>10} {'auto/best':>9} {'mean':>5}"
    )
    print(header)
    print("-" * len(header))
    worst_halving = worst_auto = worst_mean = 0.0
    false = 0
    for n in sizes:
        for k in (1, 2, 4):
            bound = math.ceil(math.log2(math.comb(n, k)))
            rows: dict[str, list[tuple[int, int, float, float, int, int]]] = {s: [] for s in STRATEGIES}
            auto_ratios: list[float] = []
            for case in range(count):
                kind = CLASSES[case % len(CLASSES)]
                cost: dict[str, float] = {}
                for strategy in STRATEGIES:
                    names, model, bad = _scenario(random.Random(f"{n}-{k}-{case}"), n, k, kind, case)
                    test = fabric_test(model)
                    result = bisect(
                        names,
                        test,
                        strategy,
                        noise=NOISE,
                        free=args.free,
                        failed=test(names),
                    )
                    found = {s.node for s in result.suspects}
                    rows[strategy].append(
                        (
                            result.tests,
                            result.rounds,
                            result.wall_clock_s,
                            result.node_seconds,
                            len(found - bad),
                            len(bad - found),
                        )
                    )
                    cost[strategy] = result.node_seconds
                auto_ratios.append(cost["auto"] / min(cost["halving"], cost["pairs"]))
            for strategy in STRATEGIES:
                data = rows[strategy]
                tests = [r[0] for r in data]
                fp, fn = sum(r[4] for r in data), sum(r[5] for r in data)
                false += fp + fn
                ratio = max(tests) / bound
                if strategy == "halving":
                    worst_halving = max(worst_halving, ratio)
                print(
                    f"{n:>5} {k:>2} {bound:>5} {strategy:<8} {fp:>3} {fn:>3} {statistics.mean(tests):>7.1f} "
                    f"{max(tests):>5} {ratio:>7.2f} {statistics.mean(r[1] for r in data):>6.1f} "
                    f"{statistics.mean(r[2] for r in data):>7.0f} "
                    f"{statistics.mean(r[3] for r in data):>10.0f}"
                    + (
                        f" {max(auto_ratios):>9.3f} {statistics.mean(auto_ratios):>5.2f}"
                        if strategy == "auto"
                        else ""
                    )
                )
            worst_auto = max(worst_auto, max(auto_ratios))
            worst_mean = max(worst_mean, statistics.mean(auto_ratios))
            print(
                f"{n:>5} {k:>2} {bound:>5} {'partner':<8} {'':>3} {'':>3} {n:>7.1f} {n:>5} "
                f"{n / bound:>7.2f} {1:>6.1f}"
            )
    print("-" * len(header))
    print(
        f"false results {false} (goal 0); halving tests at most {worst_halving:.2f}x the bound (goal 2.5); "
        f"auto at most {worst_auto:.3f}x the better node-seconds in one scenario, "
        f"{worst_mean:.3f}x on average over a row (goal 1.1); "
        f"{time.perf_counter() - started:.0f} s"
    )


if __name__ == "__main__":
    main()
