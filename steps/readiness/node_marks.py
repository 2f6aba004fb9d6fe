"""What a certification run writes on its nodes: the Lease that holds each one, and its verdict label.

Each node a run tests is held by a Lease for the run, so two runs never measure each other. The plan
takes every node's Lease before any test starts (all or none); the report gives them up once the
verdicts are written, and the exit handler does so however the run ended. A Lease held by a run whose
Workflow is gone (a killed run) is stale and taken over; one held by a running run, or by remediation,
refuses the plan, naming who holds it.

Labels never lie: the report writes each node's verdict label with its annotations in one patch, failed
nodes first (:func:`label_verdicts`); a node it could not update keeps the ``pending`` the plan set.
"""

import sys
from typing import Any

from steps.cluster import ClusterPort, holds
from steps.cluster import vocabulary as vocab
from steps.errors import DsxError
from steps.readiness.outcomes import RunRef

__all__ = [
    "LEASE_TTL_S",
    "holder",
    "label_verdicts",
    "release_held",
    "release_nodes",
    "take_nodes",
]

#: How long a run's hold on its nodes lasts if the run dies without releasing it (the checks' outer bound).
LEASE_TTL_S = 8 * 3600


def holder(run: RunRef) -> str:
    """Who holds a node's Lease while this run certifies it: the Workflow, by namespace, name and uid."""
    return holds.run_holder(run.namespace, run.name, run.uid)


def take_nodes(port: ClusterPort, run: RunRef, names: list[str]) -> None:
    """Take every node's Lease for this run, or none: two certifications of one node measure each other.

    Raises:
        InputError: a node is held by another certification (or remediation) that is still running.
    """
    holds.take(
        port, holder(run), names, LEASE_TTL_S, "two certifications of one node would measure each other"
    )


def release_nodes(port: ClusterPort, run: RunRef, names: list[str]) -> None:
    """Give up this run's hold on ``names`` (a node another run holds is left alone)."""
    holds.release(port, holder(run), names)


def release_held(port: ClusterPort, run: RunRef) -> list[str]:
    """Give up every Lease this run holds, found by their node label; the nodes released, sorted."""
    return holds.release_held(port, holder(run))


def label_verdicts(
    port: ClusterPort, results: list[Any], digest: str, stamp: str
) -> tuple[list[str], list[str]]:
    """Write each node's verdict label with its annotations, failed nodes first; keep going past errors.

    Returns the nodes labelled and the ones that could not be (they keep the ``pending`` the plan set).
    """
    order = {"failed": 0, "pending": 1, "passed": 2}
    done: list[str] = []
    missed: list[str] = []
    for result in sorted(results, key=lambda r: (order[r.status], r.name)):
        reason = result.reasons[0] if result.reasons else ""
        try:
            port.set_node_metadata(
                result.name,
                labels={vocab.LABEL_CERTIFICATION: vocab.Certification(result.status).value},
                annotations={
                    vocab.ANNOTATION_CERTIFIED_AT: stamp,
                    vocab.ANNOTATION_CERTIFICATION_RECIPE: digest,
                    vocab.ANNOTATION_CERTIFICATION_REASON: reason[:250] or None,
                },
            )
        except DsxError as exc:
            print(f"warning: node {result.name}: verdict {result.status} not written: {exc}", file=sys.stderr)
            missed.append(result.name)
            continue
        done.append(result.name)
        port.record_event(
            result.name,
            {"passed": "DsxCertificationPassed", "failed": "DsxCertificationFailed"}.get(
                result.status, "DsxCertificationPending"
            ),
            f"dsx certification {result.status}" + (f": {reason[:200]}" if reason else ""),
            "Normal" if result.status == "passed" else "Warning",
        )
    return done, missed
