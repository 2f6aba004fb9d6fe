"""Step functions the runner's fixture workflows call through Hera's runner (never shipped).

Like dsx's own steps they take and return pydantic-typed values and write evidence files under
``$DSX_OUTPUT_DIR``. (No ``from __future__ import annotations``: Hera reads the annotations.)
"""

import json
import os
import sys
import time
from pathlib import Path

from pydantic import BaseModel

#: What :func:`launch_ranks`' ranks find imported: a local runner's fork server imports it for this
#: module's steps, and forks their ranks from a server that has it (as for dsx's checks and torch).
FORK_SERVER_PRELOAD = ("xml.dom.minidom",)


class Halves(BaseModel):
    """A list cut in two."""

    left: list[str]
    right: list[str]
    size: int


class Stamp(BaseModel):
    """When a step ran."""

    name: str
    start: float
    end: float


def _out(name: str) -> Path:
    folder = Path(os.environ["DSX_OUTPUT_DIR"])
    folder.mkdir(parents=True, exist_ok=True)
    return folder / name


def split(items: list[str]) -> Halves:
    """Cut ``items`` in two; the halves and the size also go to files for output parameters."""
    middle = len(items) // 2
    halves = Halves(left=items[:middle], right=items[middle:], size=len(items))
    _out("left.json").write_text(json.dumps(halves.left))
    _out("right.json").write_text(json.dumps(halves.right))
    _out("size").write_text(str(halves.size))
    return halves


def leaf(items: list[str]) -> str:
    """The single item a bisection ended on."""
    if len(items) != 1:
        raise ValueError(f"a leaf needs one item, got {items}")
    _out("item").write_text(items[0])
    return items[0]


def flaky(state: str, failures: int = 2) -> str:
    """Fail ``failures`` times (counted in the file ``state``), then succeed."""
    path = Path(state)
    count = int(path.read_text()) if path.exists() else 0
    path.write_text(str(count + 1))
    if count < failures:
        retries = os.environ.get("DSX_RETRIES", "?")
        print(f"attempt {count} (retries={retries}): failing on purpose", file=sys.stderr)
        raise SystemExit(3)
    return f"succeeded after {count} failures"


def fail(message: str = "failing on purpose") -> str:
    """Always fail."""
    raise RuntimeError(message)


def sleep(seconds: float) -> str:
    """Sleep, then say so."""
    time.sleep(seconds)
    return f"slept {seconds}"


def stamp(name: str, seconds: float = 0.3) -> Stamp:
    """Record when this step ran (``stamp.json``), sleeping ``seconds`` in between."""
    start = time.time()
    time.sleep(seconds)
    result = Stamp(name=name, start=start, end=time.time())
    _out("stamp.json").write_text(result.model_dump_json())
    return result


def echo(text: str) -> str:
    """Return the text."""
    return text


def coin(side: str) -> str:
    """Return ``side`` and write it to the ``side`` file (an output parameter)."""
    _out("side").write_text(side)
    return side


def count(n: int) -> list[dict[str, int]]:
    """``n`` items ``{"index": i, "square": i*i}`` for a withParam fan-out."""
    return [{"index": i, "square": i * i} for i in range(n)]


def square(index: int, square: int) -> dict[str, int]:
    """Check one item of :func:`count` and return it."""
    if index * index != square:
        raise ValueError(f"{index}^2 != {square}")
    return {"index": index, "square": square}


def report(status: str, failures: str) -> str:
    """An exit handler's report: the workflow's status and failures as received, kept as ``report.json``."""
    data = {"status": status, "failures": failures}
    _out("report.json").write_text(json.dumps(data, sort_keys=True))
    return status


def env(name: str) -> str:
    """An environment variable of the step."""
    return os.environ.get(name, "")


def launch_ranks(folder: str, seconds: float) -> str:
    """Note this step's pid, then run two ranks of the probe that sleep ``seconds``, as dsx's checks do."""
    from steps.readiness.launchers.local import launch_local

    # whether this step's server was forked from a dsx process (a nested server), not started as a new one
    note = {"pid": os.getpid(), "pgid": os.getpgrp(), "nested": "workflows.cli.main" in sys.modules}
    Path(folder, "step.json").write_text(json.dumps(note))
    result = launch_local(
        "tests.steps.readiness.launchers.rank_probe",
        [folder, str(seconds), *FORK_SERVER_PRELOAD],
        2,
        Path(folder) / "ranks",
        timeout_s=300,
    )
    return "ranks ok" if result.ok else "ranks failed"
