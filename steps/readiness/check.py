"""The one check path: launch a rank program, read rank 0's result, judge it, build the outcome.

A :class:`Check` says what to run on the ranks, what rank 0's result is (a pydantic model) and how to
judge it; a launcher (:mod:`steps.readiness.launchers`) says where the ranks run. :func:`run` joins
the two, whichever launcher it is given, so the all-reduce sweep and the training smoke run
(:mod:`steps.readiness.checks`) are each one :class:`Check`, and a bisection's group test is another
use of the same path: a node list in, ``pass``, ``fail`` or ``hang`` with a figure out.

After :func:`run` a check is generic: its :class:`CheckOutcome` names its test, and what a test adds
beyond its verdicts (its result's model, its section of the report, its plot, the faults its result says
were injected) is one :class:`CheckKind`, registered in :mod:`steps.readiness.checks`. The outcome store,
the step's one-line result, the report and the node labels read outcomes by test and need nothing else.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError

from steps.readiness.judge import subject_name, verdict
from steps.readiness.launchers.base import Launched, Launcher, RankProgram
from steps.readiness.models import Model, Subject, Verdict, VerdictStatus, worst
from steps.readiness.thresholds import Thresholds

__all__ = ["Check", "CheckKind", "CheckOutcome", "Plot", "run"]

Result = TypeVar("Result", bound=BaseModel)

_LABEL_VALUE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")


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


class CheckOutcome(Model, Generic[Result]):
    """A judged check: its test, subject, status (the worst of its verdicts), verdicts, evidence, where
    it ran, and rank 0's result (absent when the ranks failed or hung, or wrote none).

    ``CheckOutcome[CollectiveRun]`` holds the result as its model; an outcome read back without its
    test's kind (``CheckOutcome[Any]``: a report, the store's every outcome) holds it as JSON, and
    :meth:`CheckKind.read` gives the model.
    """

    test: str
    subject: Subject
    status: VerdictStatus
    verdicts: list[Verdict]
    evidence: list[str]
    out_dir: str
    elapsed_s: float
    result: Result | None = None


@dataclass(frozen=True)
class Plot(Generic[Result]):
    """A figure the report draws from a test's results: its file name, its caption, and how it is drawn
    (from the subjects and results of the outcomes that have one, the recipe's thresholds, the file)."""

    file: str
    caption: str
    draw: Callable[[Sequence[tuple[Subject, Result]], Thresholds, Path], object]


def _no_faults(result: BaseModel) -> Sequence[str]:
    return ()


@dataclass(frozen=True)
class CheckKind(Generic[Result]):
    """What a test adds to the report beyond its verdicts, registered once per test.

    Attributes:
        test: the test's name, as its verdicts and outcomes carry it.
        result: rank 0's result model.
        title: the heading of its section of the report.
        section: the section's Markdown lines, from the test's outcomes (none: a table of its subjects).
        plot: a figure drawn from its results, if any.
        injected: the faults a result says were injected on purpose (the report warns of them).
    """

    test: str
    result: type[Result]
    title: str
    section: Callable[[Sequence[CheckOutcome[Result]]], list[str]] | None = None
    plot: Plot[Result] | None = None
    injected: Callable[[Result], Sequence[str]] = _no_faults

    def __post_init__(self) -> None:
        if not _LABEL_VALUE.fullmatch(self.test):
            raise ValueError(
                f"check {self.test!r}: a test's name labels its stored outcomes, so it must be a "
                "Kubernetes label value (at most 63 letters, digits, '-', '_' or '.')"
            )

    @cached_property
    def outcome(self) -> type[CheckOutcome[Result]]:
        """The outcome model of this test: ``CheckOutcome`` of its result."""
        return CheckOutcome[self.result]  # type: ignore[name-defined]

    def unrun(self, said: Verdict, out_dir: str = "") -> CheckOutcome[Result]:
        """An outcome of this test with no run behind it: the one verdict ``said`` says why (a planned
        check that stored nothing, a run with no node to run on)."""
        return self.outcome(
            test=self.test,
            subject=said.subject,
            status=said.status,
            verdicts=[said],
            evidence=[],
            out_dir=out_dir,
            elapsed_s=0.0,
        )

    def typed(self, outcome: CheckOutcome[Any]) -> CheckOutcome[Result]:
        """``outcome`` with its result as this test's model.

        Raises:
            ValueError: the outcome is another test's.
            pydantic.ValidationError: its result is not this test's model.
        """
        if outcome.test != self.test:
            raise ValueError(f"{outcome.subject.name}: a {outcome.test} outcome, not {self.test}")
        if isinstance(outcome, self.outcome):
            return outcome
        return self.outcome.model_validate(outcome.model_dump(mode="json"))

    def read(self, outcome: CheckOutcome[Any]) -> Result | None:
        """Rank 0's result of ``outcome`` as this test's model (``None`` when it has none)."""
        return self.typed(outcome).result


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


def run(check: Check[Result], launcher: Launcher) -> CheckOutcome[Result]:
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
    return CheckOutcome[check.result](  # type: ignore[name-defined]
        test=check.test,
        subject=check.subject,
        status=worst([v.status for v in verdicts]),
        result=result,
        verdicts=verdicts,
        evidence=evidence,
        out_dir=launched.where,
        elapsed_s=launched.elapsed_s,
    )
