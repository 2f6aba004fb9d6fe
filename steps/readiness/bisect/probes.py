"""The group tests a bisection runs: the fabric model of a simulated fleet, or real local measurements.

- :func:`fabric_test`: every test answered by :class:`~steps.cluster.fabric.FabricModel` (no processes),
  for large simulated fleets;
- :func:`local_test`: every test a real all-reduce among local gloo ranks, one per member, each rank
  playing its node as the simulated fleet has it (a slow or failing NIC injected, labelled as such), as a
  certification's local group check does. One adapter over the check code, so that it is the one place to
  change when that code moves.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from steps.cluster.fabric import FabricModel
from steps.cluster.port import ClusterPort
from steps.readiness.bisect.models import GroupResult, GroupTest
from steps.readiness.thresholds import Thresholds

__all__ = ["fabric_test", "local_test"]


def fabric_test(model: FabricModel) -> GroupTest:
    """A group test answered by the fabric model."""

    def test(members: Sequence[str]) -> GroupResult:
        return GroupResult.model_validate(model.allreduce(members).model_dump())

    return test


def local_test(
    port: ClusterPort, out_dir: Path, thresholds: Thresholds | None = None, timeout_s: float = 120.0
) -> GroupTest:
    """A group test measured for real: a small all-reduce sweep among local gloo ranks, one per member.

    Args:
        port: the simulated fleet whose node health the ranks play.
        out_dir: where each test keeps its evidence (``test-N/``).
        thresholds: the recipe's thresholds (default: dsx's defaults; a straggler fails the group).
        timeout_s: a test that has not finished by then is a hang.
    """
    from steps.readiness.checks import SweepRequest, run_allreduce_sweep
    from steps.readiness.judge import only_slow
    from steps.readiness.launchers.local import local_injections
    from steps.readiness.models import Subject

    count = iter(range(1, 1 << 30))

    def test(members: Sequence[str]) -> GroupResult:
        inject = [
            spec for rank, node in enumerate(members) for spec in local_injections(port, node, rank, "group")
        ]
        number = next(count)
        outcome = run_allreduce_sweep(
            SweepRequest(
                subject=Subject(kind="group", name=f"bisect-{number}", members=list(members)),
                ranks=len(members),
                max_bytes="256KiB",
                iters=8,
                inject=inject,
                timeout_s=timeout_s,
                thresholds=thresholds or Thresholds(),
                scope="multi-node",
                rank_hosts=list(members),
                out_dir=str(out_dir / f"test-{number}"),
            )
        )
        rows = outcome.result.rows if outcome.result is not None else []
        failed = [v for v in outcome.verdicts if v.status != "pass"]
        broken = bool(failed) and not only_slow(failed)  # a broken test names a failing node, not a slow one
        return GroupResult(
            outcome="pass" if outcome.status == "pass" else "hang" if outcome.status == "hang" else "fail",
            figure=rows[-1].busbw() if rows and not broken else None,
            duration_s=outcome.elapsed_s,
            reason=failed[0].message if failed else f"{len(members)} local ranks passed",
        )

    return test
