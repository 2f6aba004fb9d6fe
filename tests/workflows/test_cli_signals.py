"""SIGTERM (CI cancel, ``timeout``, systemd) stops a local sweep as Ctrl-C does: no rank outlives it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.paths import REPO


def _children() -> dict[int, list[int]]:
    """Every process's children, from /proc."""
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        tree.setdefault(parent, []).append(int(entry.name))
    return tree


def _descendants(pid: int) -> set[int]:
    tree, found, todo = _children(), set[int](), [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.story
def test_sigterm_stops_a_sweep_promptly_with_every_rank_reaped(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    command = [
        "nccl",
        "sweep",
        "--ranks",
        "2",
        "--inject",
        "1:hang",
        "--timeout",
        "200",
        "--out-dir",
        str(out),
    ]
    sweep = subprocess.Popen(
        [sys.executable, "-m", "workflows.cli", *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        deadline = time.monotonic() + 200
        ranks: set[int] = set()
        while time.monotonic() < deadline and sweep.poll() is None:
            ranks = _descendants(sweep.pid)
            if all((out / "ranks" / f"rank-{r}.stdout").exists() for r in (0, 1)) and len(ranks) >= 3:
                break  # the fork server and both ranks are running, rank 1 hanging
            time.sleep(0.2)
        assert sweep.poll() is None and len(ranks) >= 3, sweep.communicate()
        time.sleep(0.5)
        ranks = _descendants(sweep.pid)
        sweep.send_signal(signal.SIGTERM)
        _, stderr = sweep.communicate(timeout=60)
    finally:
        if sweep.poll() is None:
            sweep.kill()
    assert sweep.returncode == 143, stderr
    assert stderr.strip() == f"error: terminated (SIGTERM): every rank was stopped; evidence so far in {out}"
    assert [pid for pid in ranks if _alive(pid)] == []  # gone when dsx is, not seconds later


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_signal_once_the_status_is_known_does_not_change_it(sig: signal.Signals) -> None:
    # The second of two quick Ctrl-Cs can land after the first stopped a run and its summary is out,
    # as the interpreter ends (here: in an exit hook); the status stays the one the command decided.
    program = (
        "import atexit, os, signal\n"
        "import workflows.cli.main as cli\n"
        "cli.run = lambda: 130\n"
        f"atexit.register(lambda: os.kill(os.getpid(), {int(sig)}))\n"
        "cli.main()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 130, done.stderr
    assert "KeyboardInterrupt" not in done.stderr
