"""Per-step overhead of the local runner: a workflow of N trivial steps run one after the other.

Each step is a dsx-style script template (``python -m hera.workflows.runner -e module:function``) whose
function returns at once, so the time per step is the runner's own cost: forking the step from the
preloaded forkserver, substituting variables, collecting outputs, writing logs. Printed beside the goal
(under 100 ms per step) and beside starting a fresh interpreter per step, as Argo's pods do.

    python benchmarks/runner_overhead.py [N]
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

GOAL_MS = 100.0
STEP = "tests.workflows.runner.fixture_steps:echo"


def workflow(steps: int) -> dict:
    """A WorkflowTemplate whose entry is a steps template of ``steps`` sequential trivial steps."""
    script = {
        "image": "ghcr.io/dsx-dev/dsx:0.1.0",
        "command": ["python"],
        "args": ["-m", "hera.workflows.runner", "-e", STEP],
        "source": "{{inputs.parameters}}",
    }
    groups = [
        [
            {
                "name": f"s{i}",
                "template": "echo",
                "arguments": {"parameters": [{"name": "text", "value": str(i)}]},
            }
        ]
        for i in range(steps)
    ]
    return {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "WorkflowTemplate",
        "metadata": {"name": "dsx-bench"},
        "spec": {
            "entrypoint": "main",
            "templates": [
                {"name": "main", "steps": groups},
                {"name": "echo", "inputs": {"parameters": [{"name": "text"}]}, "script": script},
            ],
        },
    }


def run_once(steps: int, folder: Path) -> float:
    from workflows.runner import RunOptions, run

    start = time.perf_counter()
    result = run(workflow(steps), [], {}, RunOptions(out_dir=folder, allow_host_commands=True))
    elapsed = time.perf_counter() - start
    if not result.succeeded:
        raise SystemExit(f"benchmark workflow ended {result.phase}: {result.message}")
    return elapsed


def fresh_interpreter(folder: Path) -> float:
    """One step the way a pod runs it: a new Python process importing Hera."""
    args = folder / "args.json"
    args.write_text('[{"name": "text", "value": "x"}]')
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "hera.workflows.runner", "-e", STEP, str(args)],
        check=True,
        capture_output=True,
        cwd=REPO,
    )
    return time.perf_counter() - start


def main() -> None:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    with tempfile.TemporaryDirectory() as tmp:
        run_once(1, Path(tmp) / "warm")  # starts the forkserver (imports Hera once)
        small = min(run_once(1, Path(tmp) / f"one-{i}") for i in range(3))
        large = min(run_once(steps, Path(tmp) / f"many-{i}") for i in range(3))
        per_step_ms = (large - small) / (steps - 1) * 1000
        fresh_ms = min(fresh_interpreter(Path(tmp)) for _ in range(3)) * 1000
    print(f"steps per workflow      : {steps}")
    print(f"workflow of 1 step      : {small * 1000:8.1f} ms")
    print(f"workflow of {steps} steps    : {large * 1000:8.1f} ms")
    ratio = per_step_ms / GOAL_MS
    print(f"per-step overhead       : {per_step_ms:8.1f} ms   goal < {GOAL_MS:.0f} ms   ratio {ratio:.2f}")
    print(f"fresh interpreter / step: {fresh_ms:8.1f} ms   runner is {fresh_ms / per_step_ms:.1f}x faster")


if __name__ == "__main__":
    main()
