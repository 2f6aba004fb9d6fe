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

from steps.cluster import ClusterPort
from steps.cluster import vocabulary as vocab
from steps.cluster.base import lease_name
from steps.errors import DsxError, InputError
from steps.readiness.outcomes import LOCAL_RUN_NAME, RunRef

__all__ = [
    "LEASE_TTL_S",
    "holder",
    "holder_alive",
    "label_verdicts",
    "release_held",
    "release_nodes",
    "take_nodes",
]

#: How long a run's hold on its nodes lasts if the run dies without releasing it (the checks' outer bound).
LEASE_TTL_S = 8 * 3600


def holder(run: RunRef) -> str:
    """Who holds a node's Lease while this run certifies it: the Workflow, by namespace, name and uid."""
    return f"dsx-certify/{run.namespace}/{run.name}/{run.uid}"


#: The phases of a Workflow that has ended: its steps run no more, so a Lease it still holds is stale.
FINISHED_PHASES = vocab.WORKFLOW_FINISHED_PHASES


def holder_alive(port: ClusterPort, identity: str) -> bool:
    """Whether the certification run that holds a Lease may still be running: its Workflow (a
    certification's, or a remediation's whose recertification took the Lease) exists, with the uid the
    hold names, and has not finished. A killed run's hold, a deleted Workflow's, or a finished one's
    (its exit handler stopped before releasing, or never ran: ``onExit`` does not run for a DAG reached
    through ``templateRef``) is stale.

    A holder that is not a Workflow (a local run) counts as alive: its Lease's own expiry decides.
    """
    parts = identity.split("/")
    if len(parts) != 4 or parts[0] != "dsx-certify" or parts[2] == LOCAL_RUN_NAME:
        return True
    workflow = port.get_object("argoproj.io/v1alpha1", "Workflow", parts[2], parts[1])
    if workflow is None or (workflow.get("metadata") or {}).get("uid") != parts[3]:
        return False
    return (workflow.get("status") or {}).get("phase") not in FINISHED_PHASES


def take_nodes(port: ClusterPort, run: RunRef, names: list[str]) -> None:
    """Take every node's Lease for this run, or none: two certifications of one node measure each other.

    Raises:
        InputError: a node is held by another certification (or remediation) that is still running.
    """
    held_by = holder(run)
    taken: list[str] = []
    for name in names:
        if port.acquire_lock(name, held_by, LEASE_TTL_S):
            taken.append(name)
            continue
        lease = port.get_object("coordination.k8s.io/v1", "Lease", lease_name(name), port.namespace) or {}
        other = str((lease.get("spec") or {}).get("holderIdentity") or "")
        if other and not holder_alive(port, other):
            port.release_lock(name, other)
            if port.acquire_lock(name, held_by, LEASE_TTL_S):
                taken.append(name)
                continue
        for done in taken:
            port.release_lock(done, held_by)
        raise InputError(
            f"node {name} is held by {other or 'another run'} (Lease {port.namespace}/{lease_name(name)}): "
            "two certifications of one node would measure each other; wait for it to end or stop it"
        )


def release_nodes(port: ClusterPort, run: RunRef, names: list[str]) -> None:
    """Give up this run's hold on ``names`` (a node another run holds is left alone)."""
    held_by = holder(run)
    for name in names:
        port.release_lock(name, held_by)


def release_held(port: ClusterPort, run: RunRef) -> list[str]:
    """Give up every Lease this run holds, found by their node label; the nodes released, sorted."""
    held_by = holder(run)
    leases = port.list_objects("coordination.k8s.io/v1", "Lease", port.namespace, vocab.LABEL_LOCKED_NODE)
    released = []
    for lease in leases:
        node = ((lease.get("metadata") or {}).get("labels") or {}).get(vocab.LABEL_LOCKED_NODE, "")
        if (
            node
            and (lease.get("spec") or {}).get("holderIdentity") == held_by
            and port.release_lock(node, held_by)
        ):
            released.append(node)
    return sorted(released)


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
