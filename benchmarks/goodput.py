"""The goodput simulation against the issue's targets: 54 days of the published fleet (2,048 nodes x 8
GPUs) well under a second per policy and seed (target < 0.25 s); the 10,000-node fleet over 90 days under
10 s for every policy over one seed; the command as a user runs it; and the report read back from a
10,000-node, 90-day ledger (target < 2 s). Prints each figure beside its
target, and the faults each run simulated.

    python benchmarks/goodput.py [REPEATS]
"""

from __future__ import annotations

import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

from steps.sentinel.goodput.ledger_report import NodeStory, Observation, account
from steps.sentinel.goodput.rates import POLICIES, load_rates
from steps.sentinel.goodput.simulate import simulate, simulate_run


def one_run_seconds(nodes: int, days: float, repeats: int) -> tuple[float, int]:
    """The median seconds of one run (policy remediate, seed 0), and the faults it met."""
    rates = load_rates()
    times, faults = [], 0
    for _ in range(repeats):
        start = time.perf_counter()
        run = simulate_run(rates, "remediate", nodes=nodes, gpus_per_node=8, days=days, seed=0)
        times.append(time.perf_counter() - start)
        faults = sum(run.faults.values())
    return statistics.median(times), faults


def every_policy_seconds(nodes: int, days: float) -> float:
    rates = load_rates()
    start = time.perf_counter()
    simulate(rates, nodes=nodes, gpus_per_node=8, days=days, seed=0, seeds=1)
    return time.perf_counter() - start


def command_seconds() -> float:
    """``dsx goodput simulate`` with its defaults (the published fleet, 5 seeds), start-up included."""
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "workflows.cli", "goodput", "simulate", "-o", "json"],
        check=True,
        capture_output=True,
        cwd=Path(__file__).resolve().parent.parent,
    )
    return time.perf_counter() - start


def _stamp(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


def ledger_fleet(nodes: int, days: float, seed: int = 0) -> tuple[list[NodeStory], float, float]:
    """A fleet whose every node went through a remediation about once a month, each one a full
    ledger story (requested to ended) with the agent's observation before it."""
    rng = random.Random(seed)
    start = 1_735_689_600.0  # 2025-01-01
    end = start + days * 86400
    stories = []
    for i in range(nodes):
        entries: list[dict[str, object]] = []
        observations = []
        at = start + rng.expovariate(1 / (30 * 86400))
        attempt = 0
        while at < end:
            attempt += 1
            observations.append(Observation(at, "xid", "79"))
            steps = ["requested", "quarantined", "draining", "awaiting-repair", "recertifying", "in-service"]
            for state in steps:
                at += rng.uniform(10, 4 * 3600)
                entries.append({"at": _stamp(at), "state": state, "attempt": attempt, "check": "xid"})
            entries.append({"at": _stamp(at), "state": "ended", "attempt": attempt, "check": "xid"})
            at += rng.expovariate(1 / (30 * 86400))
        stories.append(NodeStory(name=f"node-{i:05d}", gpus=8, ledger=entries, observations=observations))
    return stories, start, end


def report_seconds(nodes: int, days: float) -> tuple[float, int]:
    stories, start, end = ledger_fleet(nodes, days)
    begin = time.perf_counter()
    report = account(stories, start, end)
    return time.perf_counter() - begin, len(report.remediations)


def main() -> None:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    seconds, faults = one_run_seconds(2048, 54, repeats)
    print(f"2,048 nodes, 54 days, one policy:     {seconds:7.3f} s, {faults} faults (target < 0.25 s)")
    seconds, faults = one_run_seconds(10_000, 90, max(1, repeats // 2))
    print(f"10,000 nodes, 90 days, one policy:    {seconds:7.3f} s, {faults} faults")
    seconds = every_policy_seconds(10_000, 90)
    print(f"10,000 nodes, 90 days, {len(POLICIES)} policies:    {seconds:7.3f} s (target < 10 s)")
    seconds, remediations = report_seconds(10_000, 90)
    print(f"report, 10,000 nodes, 90 days:        {seconds:7.3f} s, {remediations} remediations (< 2 s)")
    command = command_seconds()
    print(f"dsx goodput simulate (defaults):      {command:7.3f} s (5 seeds x {len(POLICIES)} policies)")


if __name__ == "__main__":
    main()
