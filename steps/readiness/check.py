"""The one check path: launch a rank program, read rank 0's result, judge it, build the outcome.

A :class:`Check` says what to run on the ranks, what rank 0's result is (a pydantic model) and how to
judge it; a launcher (:mod:`steps.readiness.launchers`) says where the ranks run. :func:`run` joins
the two, whichever launcher it is given, so the all-reduce sweep and the training smoke run
(:mod:`steps.readiness.checks`) are each one :class:`Check`, and a bisection's group test is another
use of the same path: a node list in, ``pass``, ``fail`` or ``hang`` with a figure out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError

from steps.readiness.judge import subject_name, verdict
from steps.readiness.launchers.base import Launched, Launcher, RankProgram
from steps.readiness.models import Subject, Verdict, VerdictStatus, worst

__all__ = ["Check", "Checked", "run"]

Result = TypeVar("Result", bound=BaseModel)


@dataclass(frozen=True)
class Check(Generic[Result]):
    """A test of a subject: the program its ranks run, rank 0's result model, and how it is judged.

    ``judge`` gets the result and the evidence its verdicts cite: the last of rank 0's outputs that the
    launcher kept (the file a person reads: a sweep's table, a smoke run's result), else where the ranks'
    logs are (the Job on a cluster).
    """

    test: str
    subject: Subject
    program: RankProgram
    result: type[Result]
    judge: Callable[[Result, list[str]], list[Verdict]]
    timeout_s: float


@dataclass(frozen=True)
class Checked(Generic[Result]):
    """A judged check: its status (the worst of its verdicts), rank 0's result if read, the evidence."""

    subject: Subject
    status: VerdictStatus
    result: Result | None
    verdicts: list[Verdict]
    evidence: list[str]
    out_dir: str
    elapsed_s: float

    def judged(self) -> dict[str, Any]:
        """Everything but the result, by field name: what every check's outcome model holds."""
        return {
            "subject": self.subject,
            "status": self.status,
            "verdicts": self.verdicts,
            "evidence": self.evidence,
            "out_dir": self.out_dir,
            "elapsed_s": self.elapsed_s,
        }


def _read(
    check: Check[Result], launched: Launched, evidence: Sequence[str]
) -> tuple[Result | None, list[Verdict]]:
    """Rank 0's result read as the check's model, or the ``error`` verdict saying why there is none.

    A run whose ending already gave a verdict (a hang, a failed rank) needs no other.
    """
    name = subject_name(check.subject)
    if launched.text is None:
        if launched.verdicts:
            return None, []
        message = f"{name}: rank 0 wrote no readable result"
        return None, [verdict(check.subject, check.test, "error", message, evidence=evidence)]
    try:
        return check.result.model_validate_json(launched.text), []
    except (ValueError, ValidationError):
        message = f"{name}: rank 0's result is not readable: {launched.text[:200]}"
        return None, [verdict(check.subject, check.test, "error", message, evidence=evidence)]


def run(check: Check[Result], launcher: Launcher) -> Checked[Result]:
    """Run ``check`` with ``launcher`` and judge it.

    The verdicts are those of the run's ending (``hang``, ``error``, ``unschedulable``), an ``error`` when
    rank 0's result is missing or unreadable, else the check's own judgement of the result. The
    evidence is rank 0's kept outputs (when its result was read) and the ranks' logs.
    """
    launched = launcher.run(check.test, check.subject, check.program, check.timeout_s)
    result, unread = _read(check, launched, launched.logs)
    verdicts = [*launched.verdicts, *unread]
    evidence = list(launched.logs)
    if result is not None:
        evidence = [*launched.outputs, *evidence]
        verdicts += check.judge(result, launched.outputs[-1:] or list(launched.logs))
    return Checked(
        subject=check.subject,
        status=worst([v.status for v in verdicts]),
        result=result,
        verdicts=verdicts,
        evidence=evidence,
        out_dir=launched.where,
        elapsed_s=launched.elapsed_s,
    )
