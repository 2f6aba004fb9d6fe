"""How long `dsx --help` and `dsx run certify --dry-run` take, against goals of a median under 0.5 s and
1.5 s.

The second reads dsx's workflows compiled by an earlier process (the cache of
``workflows.compiler.cached_compile``, warmed by the first run); compiling them imports Hera and every
template module, seconds that each ``dsx run`` would otherwise pay again.

python benchmarks/cli_startup.py [RUNS]
"""

import statistics
import subprocess
import sys
import time

COMMANDS = (
    ("dsx --help", ["--help"], 0.5),
    ("dsx run certify --dry-run", ["run", "certify", "--dry-run"], 1.5),
)


def median_s(args: list[str], runs: int) -> float:
    cmd = [sys.executable, "-m", "workflows.cli", *args]
    subprocess.run(cmd, capture_output=True, check=True)  # warm the file cache (and the compiled workflows)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(cmd, capture_output=True, check=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 15
    for label, args, goal_s in COMMANDS:
        median = median_s(args, runs)
        print(
            f"{label:<26} median {median * 1000:7.1f} ms   goal {goal_s * 1000:.0f} ms   "
            f"ratio {median / goal_s:.2f}"
        )


if __name__ == "__main__":
    main()
