"""How long parsing a 10,000-line nccl-tests log takes, against the goal of 100 ms.

python benchmarks/nccl_parse.py [RUNS]
"""

import statistics
import sys
import time

from steps.readiness.nccl_tests import parse_nccl_tests

GOAL_S = 0.100
ROWS = 10_000

_COLUMNS = "size count type redop root time algbw busbw #wrong time algbw busbw #wrong"
_UNITS = "(B) (elements) (us) (GB/s) (GB/s) (us) (GB/s) (GB/s)"
_DEVICE = "device {d} [0000:04:00] NVIDIA H100 80GB HBM3"
HEAD = [
    "# nThread 1 nGpus 1 minBytes 8 maxBytes 8589934592 step: 2(factor) warmup iters: 5 iters: 20 "
    "agg iters: 1 validation: 1 graph: 0",
    "#",
    "# Using devices",
    *(
        f"#  Rank {r:2d} Group  0 Pid  {6899 + r} on node-{r // 8} " + _DEVICE.format(d=r % 8)
        for r in range(16)
    ),
    "#",
    "#  " + "  ".join(f"{name:>8}" for name in _COLUMNS.split()),
    "#  " + _UNITS,
]
ROW = "  ".join(
    f"{v:>8}"
    for v in [
        "1073741824",
        "268435456",
        "float",
        "sum",
        "-1",
        "6759.0",
        "158.86",
        "297.86",
        "0",
        "6737.4",
        "159.37",
        "298.82",
        "0",
    ]
)
TAIL = ["# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 297.86", "#"]


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    lines = HEAD + [ROW] * (ROWS - len(HEAD) - len(TAIL)) + TAIL
    parse_nccl_tests(lines)  # warm up
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        run = parse_nccl_tests(lines)
        times.append(time.perf_counter() - start)
    assert run.status == "complete"
    median = statistics.median(times)
    print(
        f"parse {len(lines)} lines   median {median * 1000:7.1f} ms   goal {GOAL_S * 1000:.0f} ms   "
        f"ratio {median / GOAL_S:.2f}"
    )


if __name__ == "__main__":
    main()
