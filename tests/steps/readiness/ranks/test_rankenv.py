"""What a rank process leaves when it dies (every thread's Python stack, not only its exit signal), and how it
finds its run's store."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from steps.cluster import vocabulary as vocab
from steps.errors import InputError
from steps.readiness.ranks.rankenv import RankEnv

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


# Rank 1 asks before rank 0 has a store; rank 0 then listens on a port of its own choosing. A rank 1 of a
# run whose rank 0 never comes gives up at its timeout, naming the file.
RENDEZVOUS = """
import os, sys, threading
import torch.distributed as dist
from steps.readiness.ranks.rankenv import RankEnv, _store
folder = sys.argv[1]
os.environ.update(MASTER_ADDR="127.0.0.1", DSX_RENDEZVOUS_FILE=folder + "/rendezvous")
joined = {}
def join(rank):
    joined[rank] = _store(dist, RankEnv(rank=rank, world_size=2, local_rank=rank, host="n"), 30.0)
late = threading.Thread(target=join, args=(1,))
late.start()
join(0)
late.join()
joined[1].set("from-1", "hello")
print(joined[0].get("from-1").decode(), joined[0].port, open(folder + "/rendezvous").read())
os.environ["DSX_RENDEZVOUS_FILE"] = folder + "/never"
try:
    _store(dist, RankEnv(rank=1, world_size=2, local_rank=1, host="n"), 0.3)
except TimeoutError as exc:
    print(exc)
"""


@pytest.mark.story
def test_rank_0_picks_the_port_and_the_others_find_it_in_the_rendezvous_file(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", RENDEZVOUS, str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    joined, gave_up = done.stdout.splitlines()
    said, listening, written = joined.split()
    assert said == "hello" and listening == written != "0"
    assert gave_up == f"rank 0 wrote no store port to {tmp_path}/never within 0.3 s"


def test_a_local_rank_needs_no_master_port_when_rank_0_picks_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.delenv("MASTER_PORT", raising=False)
    monkeypatch.delenv(vocab.ENV_RENDEZVOUS_FILE, raising=False)
    with pytest.raises(InputError, match="MASTER_PORT is not set"):
        RankEnv.from_environ()
    monkeypatch.setenv(vocab.ENV_RENDEZVOUS_FILE, "/nowhere/rendezvous")
    assert RankEnv.from_environ().rank == 1
