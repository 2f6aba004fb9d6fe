"""What every launcher takes and gives: a rank program in, rank 0's result text and the ending's verdicts out.

A check (:mod:`steps.readiness.check`) hands a launcher a :class:`RankProgram` and gets a
:class:`Launched` back, whichever launcher it is: the local one (processes on this machine) or the Job
one (pods on the cluster). Where the ranks run, how many per node and how they meet is the launcher's
own business, set when it is made; the ``run`` call is the same for both.
"""

from __future__ import annotations

from typing import Protocol

from pydantic import Field

from steps.readiness.models import Model, Subject, Verdict

__all__ = ["Launched", "Launcher", "RankProgram"]


class RankProgram(Model):
    """A program every rank runs: ``python -m MODULE ARGS`` plus the files rank 0 writes.

    ``outputs`` are ``(flag, file name)`` pairs: the launcher adds ``FLAG PATH`` for each, with a path
    of its own. The first is the result, JSON that the check reads; the others are kept as evidence
    where the launcher keeps files (a sweep's table in the nccl-tests layout). A launcher that keeps no
    files of rank 0 (on a cluster the result travels in a ConfigMap) asks for the result only.
    """

    module: str = Field(description="the rank program, e.g. steps.readiness.ranks.sweep")
    args: list[str] = Field(default_factory=list, description="its flags, the same on every rank")
    outputs: list[tuple[str, str]] = Field(min_length=1, description="(flag, file name); the result first")
    preload: list[str] = Field(
        default_factory=list,
        description="modules every rank imports anyway, imported once before the ranks start where the "
        "launcher forks them from a warm process (the smoke run's optimizer loads torch._dynamo: seconds "
        "of CPU in every rank)",
    )


class Launched(Model):
    """How a launched run ended, the same for every launcher.

    ``verdicts`` are those the ending alone gives (``hang``, ``error``, ``unschedulable``), empty when
    every rank ended well; ``text`` is rank 0's result, ``None`` when there is none.
    """

    text: str | None
    verdicts: list[Verdict] = Field(default_factory=list)
    outputs: list[str] = Field(
        default_factory=list, description="files that keep rank 0's outputs, the result first (local only)"
    )
    logs: list[str] = Field(
        default_factory=list, description="where the ranks' logs are: files locally, the Job on a cluster"
    )
    where: str = Field(description="the evidence folder, or the Job that ran (job/NAMESPACE/NAME)")
    elapsed_s: float


class Launcher(Protocol):
    """Runs a rank program for a test of a subject, bounded by a deadline."""

    def run(self, test: str, subject: Subject, program: RankProgram, timeout_s: float) -> Launched:
        """Run ``program`` on the ranks that stand for ``subject``; past ``timeout_s`` the run is a hang.

        Args:
            test: the test's name, for the verdicts the ending gives (``allreduce-sweep``).
            subject: the node or group the ranks stand for.
            program: what every rank runs.
            timeout_s: the run's deadline, counted once every rank has started.
        """
        ...
