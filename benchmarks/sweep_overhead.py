"""The sweep's own overhead against a bare torch.distributed all_reduce loop on the same sizes.

Both run in the same rank processes, interleaved (sweep, bare, sweep, bare...), over gloo between
local processes: the sweep's timed loop (with its per-iteration bookkeeping: outside/inside timing
and the phase marker) against ``for _ in range(iters): dist.all_reduce(buf)``. Goal: under 3%.

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

    from steps.readiness.rankenv import PhaseMarker

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
                    outside = 0.0
                    start = time.perf_counter()
                    for _ in range(ITERS):  # the sweep's timed loop, as in steps.readiness.sweep
                        before = time.perf_counter()
                        after = time.perf_counter()
                        phase.inside()
                        dist.all_reduce(buf)
                        phase.outside()
                        outside += after - before
                    sweep_s[size].append(time.perf_counter() - start)
                else:
                    start = time.perf_counter()
                    for _ in range(ITERS):  # the bare loop
                        dist.all_reduce(buf)
                    bare_s[size].append(time.perf_counter() - start)
    if dist.get_rank() == 0:
        for size in SIZES:
            sweep, bare = statistics.median(sweep_s[size]), statistics.median(bare_s[size])
            print(
                f"{size:>9} B   sweep {sweep / ITERS * 1e6:9.1f} us   bare {bare / ITERS * 1e6:9.1f} us   "
                f"overhead {sweep / bare - 1:+7.2%}"
            )
        total_sweep = sum(statistics.median(v) for v in sweep_s.values())
        total_bare = sum(statistics.median(v) for v in bare_s.values())
        overhead = total_sweep / total_bare - 1
        print(f"all sizes   overhead {overhead:+.2%}   goal {GOAL:.0%}   ratio {max(overhead, 0) / GOAL:.2f}")
    dist.destroy_process_group()


def main() -> None:
    from steps.readiness.launch import launch_local

    ranks = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    rounds = sys.argv[2] if len(sys.argv) > 2 else "5"
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
