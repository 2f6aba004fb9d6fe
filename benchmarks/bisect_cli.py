"""How long `dsx bisect` takes on 4,096 simulated nodes with four faults, on one core, against the goal of
an answer in under 10 s.

The faults mix the kinds a group test feels: two slow NICs, a flaky one (failing every collective) and a
hanging one, at 3% measurement noise. The command runs pinned to CPU 0 (``taskset -c 0``) when taskset is
there; the figures are wall-clock and the CPU time of the command (user and system), the median of RUNS.
Measured on a shared 2-core development machine under load: 4.9 s of CPU, 7.5 to 9.5 s wall (building the
simulated fleet takes most of it; the bisection itself, ``auto`` choosing ``pairs``, 0.3 s).

    python benchmarks/bisect_cli.py [RUNS]
"""

import json
import os
import shutil
import statistics
import subprocess
import sys
import time

GOAL_S = 10.0
SPEC = (
    "sim:nodes=4096,gpu=h100,racks=256,noise=0.03,seed=1,"
    "faults=node-0117:slow-nic;node-1500:flaky-nic=1;node-2222:hang;node-3900:slow-nic=250"
)
FAULTY = {"node-0117": "slow", "node-1500": "fail", "node-2222": "hang", "node-3900": "slow"}


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    pin = ["taskset", "-c", "0"] if shutil.which("taskset") else []
    cmd = [*pin, sys.executable, "-m", "workflows.cli", "bisect", "--cluster", SPEC, "-o", "json"]
    walls, cpus = [], []
    for _ in range(runs):
        before = os.times()
        start = time.perf_counter()
        result = subprocess.run(cmd, capture_output=True, text=True, check=False)
        walls.append(time.perf_counter() - start)
        after = os.times()
        cpus.append(
            (after.children_user - before.children_user) + (after.children_system - before.children_system)
        )
        if result.returncode != 1:  # 1: suspects found
            raise SystemExit(f"dsx bisect exited {result.returncode}: {result.stderr[-2000:]}")
        found = {s["node"]: s["fault"] for s in json.loads(result.stdout)["suspects"]}
        if found != FAULTY:
            raise SystemExit(f"dsx bisect named {found}, expected {FAULTY}")
    wall, cpu = statistics.median(walls), statistics.median(cpus)
    print(
        f"dsx bisect, 4096 nodes, 4 faults{' (CPU 0)' if pin else ''}   median wall {wall:5.2f} s   "
        f"cpu {cpu:5.2f} s   goal {GOAL_S:.0f} s   ratio {wall / GOAL_S:.2f}"
    )


if __name__ == "__main__":
    main()
