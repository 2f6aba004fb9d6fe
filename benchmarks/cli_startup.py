"""How long `dsx --help` takes, against the goal of a median under 0.5 s.

python benchmarks/cli_startup.py [RUNS]
"""

import statistics
import subprocess
import sys
import time

GOAL_S = 0.5


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 15
    cmd = [sys.executable, "-m", "workflows.cli", "--help"]
    subprocess.run(cmd, capture_output=True, check=True)  # warm the file cache
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(cmd, capture_output=True, check=True)
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    print(
        f"dsx --help   median {median * 1000:7.1f} ms   goal {GOAL_S * 1000:.0f} ms   "
        f"ratio {median / GOAL_S:.2f}"
    )


if __name__ == "__main__":
    main()
