"""How long parsing a 10,000-line nccl-tests log takes, against the goal of 100 ms.

python benchmarks/nccl_parse.py [RUNS]

Two logs of 10,000 lines, every figure different as on a real cluster (a bandwidth model with jitter):

- ``one sweep``: one table of some 10,000 sizes (``all_reduce_perf -b 1M -e 9984M -i 1M``), the shape that
  makes the most rows;
- ``repeated runs``: ``all_reduce_perf -b 8 -e 8G -f 2`` run again and again on 16 ranks, each run with its
  preamble, rank lines, header, 31 rows and footer, as a soak test's log reads.

Each parse is timed alone: the previous result is freed before the clock starts.
"""

import random
import statistics
import sys
import time

from steps.readiness.nccl_tests import parse_nccl_tests

GOAL_S = 0.100
LINES = 10_000
RANKS = 16

_HEADER = [
    "#" + " " * 62 + "out-of-place                       in-place",
    "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw"
    "   busbw #wrong",
    "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)"
    "  (GB/s)",
]


def _preamble(min_bytes: int, max_bytes: int, step: str) -> list[str]:
    return [
        f"# nThread 1 nGpus 1 minBytes {min_bytes} maxBytes {max_bytes} step: {step} warmup iters: 5 "
        "iters: 20 agg iters: 1 validation: 1 graph: 0",
        "#",
        "# Using devices",
        *(
            f"#  Rank {r:2d} Group  0 Pid {4000 + r:6d} on {'node-' + str(r // 8):>10} device {r % 8:2d} "
            f"[0000:{16 * (r % 8) + 4:02x}:00] NVIDIA H100 80GB HBM3"
            for r in range(RANKS)
        ),
        "NCCL version 2.21.5+cuda12.4",
        "#",
    ]


def _row(rng: random.Random, size: int) -> str:
    """One result row: time from a latency-bandwidth model with 2% jitter, the layout nccl-tests prints."""
    halves = []
    for _ in range(2):
        seconds = (25e-6 + size / 380e9) * rng.uniform(0.98, 1.02)
        algbw = size / 1e9 / seconds
        busbw = algbw * 2 * (RANKS - 1) / RANKS
        halves.append(f"{seconds * 1e6:8.2f} {algbw:7.2f} {busbw:7.2f} {0:6d}")
    return f"{size:12d}  {size // 4:12d}     float     sum      -1 " + "   ".join(halves)


def _footer(average: float) -> list[str]:
    return ["# Out of bounds values : 0 OK", f"# Avg bus bandwidth    : {average:.4f} ", "#"]


def one_sweep() -> list[str]:
    rng = random.Random(1)
    head = ["$ mpirun -np 16 ./build/all_reduce_perf -b 1M -e 9984M -i 1M -g 1"]
    head += _preamble(1 << 20, 9984 << 20, "1048576(bytes)") + _HEADER
    count = LINES - len(head) - 3
    rows = [_row(rng, (index + 1) << 20) for index in range(count)]
    return head + rows + _footer(301.5)


def repeated_runs() -> list[str]:
    rng = random.Random(2)
    lines: list[str] = []
    while True:
        run = ["$ mpirun -np 16 ./build/all_reduce_perf -b 8 -e 8G -f 2 -g 1"]
        run += _preamble(8, 8 << 30, "2(factor)") + _HEADER
        run += [_row(rng, 8 << shift) for shift in range(31)]
        run += _footer(120.25)
        if len(lines) + len(run) > LINES:
            break
        lines += run
    return lines + [f"$ # soak test: {len(lines)} lines"] * (LINES - len(lines))


def _median_s(lines: list[str], runs: int) -> float:
    kept = [parse_nccl_tests(lines)]  # warm up
    assert kept[0].status == "complete", kept[0].problems
    times = []
    for _ in range(runs):
        kept.clear()  # the previous result is freed here, not while the clock runs
        start = time.perf_counter()
        kept.append(parse_nccl_tests(lines))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    for name, lines in (("one sweep", one_sweep()), ("repeated runs", repeated_runs())):
        assert len(lines) == LINES
        median = _median_s(lines, runs)
        print(
            f"{name:14s} parse {len(lines)} lines   median {median * 1000:7.1f} ms   "
            f"goal {GOAL_S * 1000:.0f} ms   ratio {median / GOAL_S:.2f}"
        )


if __name__ == "__main__":
    main()
