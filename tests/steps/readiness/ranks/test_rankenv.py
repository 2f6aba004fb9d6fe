"""What a rank process leaves when it dies: every thread's Python stack, not only its exit signal."""

from __future__ import annotations

import signal
import subprocess
import sys

# A rank whose C++ side calls std::terminate (gloo's "terminate called without an active exception") dies
# of SIGABRT: os.abort() stands for it.
ABORTS = """
import os, threading, time
from steps.readiness.ranks.rankenv import stacks_on_signals
stacks_on_signals()
threading.Thread(target=time.sleep, args=(60,), name="collective", daemon=True).start()
def inside_a_collective():
    os.abort()
inside_a_collective()
"""


def test_a_rank_that_aborts_writes_every_threads_stack() -> None:
    done = subprocess.run([sys.executable, "-c", ABORTS], capture_output=True, text=True, timeout=60)
    assert done.returncode == -signal.SIGABRT
    assert "Fatal Python error: Aborted" in done.stderr
    assert "in inside_a_collective" in done.stderr
    assert done.stderr.count("hread 0x") >= 2, done.stderr  # the other thread's stack too
