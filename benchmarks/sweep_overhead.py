"""The sweep's own overhead against a bare torch.distributed all_reduce loop on the same sizes.

Both run in the same rank processes, interleaved (sweep, bare, bare, sweep...), over gloo between
local processes: the sweep's own timed loop (``steps.readiness.ranks.sweep.timed_loop``, with its
per-iteration bookkeeping: outside/inside timing and the phase marker) against
``for _ in range(iters): dist.all_reduce(buf)``. Each round gives a ratio per size; the figure is the
median ratio over rounds, which a busy machine's outliers do not move. Goal: under 3%.

    python benchmarks/sweep_overhead.py [RANKS] [ROUNDS]
"""

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

GOAL = 0.03
SIZES = [1 << 10, 1 << 14, 1 << 18, 1 << 20, 1 << 22]
ITERS = 30


def _rank() -> None:
    import torch
    import torch.distributed as dist

    from steps.readiness.ranks.rankenv import PhaseMarker
    from steps.readiness.ranks.sweep import timed_loop

    torch.set_num_threads(1)
    rounds = int(os.environ["BENCH_ROUNDS"])
    dist.init_process_group("gloo")
    phase = PhaseMarker()
    sweep_s = {size: [] for size in SIZES}
    bare_s = {size: [] for size in SIZES}
    for round_index in range(rounds):
        for size in SIZES:
            buf = torch.zeros(size // 4)
            for _ in range(3):
                dist.all_reduce(buf)
            order = ("sweep", "bare") if round_index % 2 == 0 else ("bare", "sweep")
            for kind in order:  # alternate which goes first, so neither gains from going second
                dist.barrier()
                if kind == "sweep":
                    start = time.perf_counter()
                    timed_loop(dist, buf, ITERS, 0.0, phase)
                    sweep_s[size].append(time.perf_counter() - start)
                else:
                    start = time.perf_counter()
                    for _ in range(ITERS):  # the bare loop
                        dist.all_reduce(buf)
                    bare_s[size].append(time.perf_counter() - start)
    if dist.get_rank() == 0:
        ratios = []
        for size in SIZES:
            sweep, bare = statistics.median(sweep_s[size]), statistics.median(bare_s[size])
            per_round = [s / b for s, b in zip(sweep_s[size], bare_s[size], strict=True)]
            ratios += per_round
            print(
                f"{size:>9} B   sweep {sweep / ITERS * 1e6:9.1f} us   bare {bare / ITERS * 1e6:9.1f} us   "
                f"overhead {statistics.median(per_round) - 1:+7.2%} (median of {len(per_round)} rounds)"
            )
        overhead = statistics.median(ratios) - 1
        bookkeeping = _bookkeeping_s(phase, timed_loop)
        smallest = statistics.median(bare_s[SIZES[0]]) / ITERS
        print(
            f"bookkeeping alone {bookkeeping * 1e6:.2f} us per iteration = {bookkeeping / smallest:.2%} "
            f"of the bare all-reduce at {SIZES[0]} B (the cheapest collective measured)"
        )
        print(f"all sizes   overhead {overhead:+.2%}   goal {GOAL:.0%}   ratio {max(overhead, 0) / GOAL:.2f}")
    dist.destroy_process_group()


class _NoCollective:
    """Stands in for torch.distributed to time the sweep loop's own work alone."""

    @staticmethod
    def all_reduce(buf: object) -> None:
        return None


def _bookkeeping_s(phase: object, timed_loop: object) -> float:
    """Seconds per iteration the sweep's timed loop spends on itself (no collective), best of 5."""
    runs = []
    for _ in range(5):
        start = time.perf_counter()
        timed_loop(_NoCollective, None, 10_000, 0.0, phase)  # type: ignore[operator]
        runs.append((time.perf_counter() - start) / 10_000)
    return min(runs)


def main() -> None:
    from steps.readiness.launchers.local import launch_local

    ranks = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    rounds = sys.argv[2] if len(sys.argv) > 2 else "15"
    with tempfile.TemporaryDirectory() as work:
        result = launch_local(
            "benchmarks.sweep_overhead",
            ["--rank"],
            ranks,
            Path(work),
            timeout_s=600,
            env={"BENCH_ROUNDS": rounds},
        )
        print(f"{ranks} gloo ranks on this machine, {ITERS} iterations per size, {rounds} interleaved rounds")
        sys.stdout.write((Path(work) / "rank-0.stdout").read_text())
        if not result.ok:
            sys.stdout.write((Path(work) / "rank-0.stderr").read_text())
            sys.exit(1)


if __name__ == "__main__":
    if "--rank" in sys.argv:
        _rank()
    else:
        main()
