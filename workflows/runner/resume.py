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

import time
from collections.abc import Iterable
from pathlib import Path

from steps.files import write_text

__all__ = ["ALL", "RESUME_DIR", "request_resume", "resumed_by"]

RESUME_DIR = "resume"
ALL = "_all"


def request_resume(run_dir: Path, name: str | None = None) -> Path:
    """Ask the local run in ``run_dir`` to resume its suspended node ``name`` (every one when None)."""
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
