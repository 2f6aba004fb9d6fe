"""Resuming a suspended node of a local run, as ``argo resume`` resumes one of a Workflow.

``argo resume WORKFLOW`` marks the workflow's suspended nodes Succeeded (with ``--node-field-selector``,
only those it selects); a suspend whose ``duration`` runs out resumes by itself, Succeeded too (Argo's
``executeSuspend``). A local run has no Workflow object to patch, so a resume is a file in the run
folder: ``<run folder>/resume/<name>`` for the suspend step or template ``name``, or
``<run folder>/resume/_all`` for every suspended node (``_`` starts no Argo name). ``dsx resume`` writes
it; a suspended node of the run resumes once it finds a file written after the node started, so a
resume never reaches a suspend that had not started yet, as ``argo resume`` never does.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from pathlib import Path

from steps.errors import InputError
from steps.files import write_text

__all__ = ["ALL", "RESUME_DIR", "RUN_FILE", "request_resume", "resumed_by", "write_run_record"]

RESUME_DIR = "resume"
ALL = "_all"
RUN_FILE = "run.json"
"""What a run folder says of its run from the start: the workflow's name and its suspend steps."""
ENDED_FILE = "workflow.json"


def write_run_record(run_dir: Path, workflow_name: str, suspend: list[str]) -> None:
    """Say in ``run_dir`` which run it holds and which suspend steps it has (what ``dsx resume`` checks)."""
    record = {"workflow": workflow_name, "suspend": sorted(suspend)}
    write_text(run_dir / RUN_FILE, json.dumps(record, indent=2, sort_keys=True) + "\n")


def request_resume(run_dir: Path, name: str | None = None) -> Path:
    """Ask the local run in ``run_dir`` to resume its suspended node ``name`` (every one when None).

    Raises:
        InputError: ``run_dir`` holds no run, one that has ended, or ``name`` is no suspend step or
            template of it.
    """
    try:
        record = json.loads((run_dir / RUN_FILE).read_text(encoding="utf-8"))
        workflow, known = str(record["workflow"]), [str(n) for n in record["suspend"]]
    except (OSError, ValueError, KeyError, TypeError):
        raise InputError(
            f"{run_dir}: not the folder of a local run (no {RUN_FILE} that dsx run wrote)"
        ) from None
    if (run_dir / ENDED_FILE).exists():
        raise InputError(f"{run_dir}: the run {workflow} has ended: nothing to resume")
    if name is not None and name not in known:
        raise InputError(
            f"--node {name}: the run {workflow} has no suspend step or template of that name "
            f"(suspend steps: {', '.join(known) or 'none'})"
        )
    return write_text(run_dir / RESUME_DIR / (name or ALL), f"{time.time():.3f}\n")


def resumed_by(run_dir: Path, names: Iterable[str], since: float) -> str | None:
    """The name a resume written at or after ``since`` (a node's start) asks for, among ``names`` or
    ``_all``; None when none was."""
    folder = run_dir / RESUME_DIR
    for name in [*names, ALL]:
        try:
            written = float((folder / name).read_text(encoding="utf-8").strip() or 0)
        except (OSError, ValueError):
            continue
        if written >= since:
            return name
    return None
