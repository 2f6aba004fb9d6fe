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


# A rank that finished: its output buffered, a background thread still running, as torch's are at exit.
FINISHES = """
import threading, time
from steps.readiness.ranks.rankenv import exit_rank
threading.Thread(target=time.sleep, args=(60,), daemon=False).start()
print("result written", end="")
exit_rank(3)
"""


def test_a_finished_rank_exits_with_its_code_at_once_its_output_flushed() -> None:
    done = subprocess.run([sys.executable, "-c", FINISHES], capture_output=True, text=True, timeout=30)
    # a non-daemon thread would keep a normal exit waiting 60 s; the rank's code and output are kept
    assert (done.returncode, done.stdout) == (3, "result written")
