"""Holds on nodes: the Leases (``dsx-node-<node>``) that keep two runs from testing one node at once.

A run holds a node under an identity that names its Workflow: ``dsx-certify/<namespace>/<name>/<uid>``
(:func:`run_holder`); a local run (``dsx run --local``, which has no Workflow object) adds
``/<host>:<pid>`` of its process. Certification takes every node it tests so; remediation's
recertification takes the node under repair and the pair test's partner under its own Workflow's
identity, so the exit handler of either gives back all it took with one call (:func:`release_held`). A
hold whose Workflow is gone, has another uid, or has finished is stale (:func:`holder_alive`) and is
taken over; a live one refuses, naming who holds the node. A local run's hold lives while its process
does: on this host the process is looked up; on another, the Lease's expiry decides.
"""

import os
import socket

from steps.cluster import vocabulary as vocab
from steps.cluster.base import lease_name
from steps.cluster.port import ClusterPort
from steps.errors import InputError

__all__ = [
    "HOLDER_KIND",
    "LOCAL_RUN_NAME",
    "NodeHeldError",
    "holder_alive",
    "lease_holder",
    "release",
    "release_held",
    "run_holder",
    "take",
]

HOLDER_KIND = vocab.WORKFLOW_CERTIFY
"""The first part of every run's holder identity."""
LOCAL_RUN_NAME = "dsx-certify-local"
"""The name of a run with no Workflow behind it (steps called directly, not by Argo)."""
_LEASE_API = "coordination.k8s.io/v1"
_WORKFLOW_API = "argoproj.io/v1alpha1"


class NodeHeldError(InputError):
    """A node is held by another run that is still running (the CLI exits 2).

    Attributes:
        node: the node.
        holder: who holds it (``""`` when the Lease does not say).
    """

    def __init__(self, message: str, node: str, holder: str) -> None:
        super().__init__(message)
        self.node = node
        self.holder = holder


def run_holder(namespace: str, name: str, uid: str) -> str:
    """Who holds a node while a run tests it: the Workflow, by namespace, name and uid; for a local run,
    and the host and process of the runner (``$DSX_LOCAL_RUN``)."""
    local = os.environ.get(vocab.ENV_LOCAL_RUN, "").strip()
    base = f"{HOLDER_KIND}/{namespace}/{name}/{uid}"
    return f"{base}/{local}" if local else base


def holder_alive(port: ClusterPort, identity: str) -> bool:
    """Whether the run that holds a Lease may still be running: its Workflow (a certification's, or a
    remediation's whose recertification took the Lease) exists, with the uid the hold names, and has not
    finished. A killed run's hold, a deleted Workflow's, or a finished one's (its exit handler stopped
    before releasing, or never ran: ``onExit`` does not run for a DAG reached through ``templateRef``)
    is stale.

    A local run's hold (``.../<host>:<pid>``) lives while its process does, looked up where the host is
    this one; another host's, and any other holder, count as alive: the Lease's own expiry decides.
    """
    parts = identity.split("/")
    if len(parts) == 5 and parts[0] == HOLDER_KIND:
        host, _, pid = parts[4].rpartition(":")
        return host != socket.gethostname() or not pid.isdigit() or _process_alive(int(pid))
    if len(parts) != 4 or parts[0] != HOLDER_KIND or parts[2] == LOCAL_RUN_NAME:
        return True
    workflow = port.get_object(_WORKFLOW_API, "Workflow", parts[2], parts[1])
    if workflow is None or (workflow.get("metadata") or {}).get("uid") != parts[3]:
        return False
    return (workflow.get("status") or {}).get("phase") not in vocab.WORKFLOW_FINISHED_PHASES


def _process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host (one of another user counts too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def lease_holder(port: ClusterPort, node: str) -> str:
    """Who the node's Lease names as its holder (``""``: no Lease, or nobody)."""
    lease = port.get_object(_LEASE_API, "Lease", lease_name(node), port.namespace) or {}
    return str((lease.get("spec") or {}).get("holderIdentity") or "")


def take(port: ClusterPort, holder: str, names: list[str], ttl_seconds: int, why: str) -> None:
    """Take every node's Lease for ``holder``, or none; a stale hold (:func:`holder_alive`) is taken over.

    Raises:
        NodeHeldError: a node is held by another run that is still running (``why`` says what that
            would break); the Leases taken before it are given back.
    """
    taken: list[str] = []
    for name in names:
        if port.acquire_lock(name, holder, ttl_seconds):
            taken.append(name)
            continue
        other = lease_holder(port, name)
        if other and not holder_alive(port, other):
            port.release_lock(name, other)
            if port.acquire_lock(name, holder, ttl_seconds):
                taken.append(name)
                continue
        release(port, holder, taken)
        raise NodeHeldError(
            f"node {name} is held by {other or 'another run'} (Lease {port.namespace}/{lease_name(name)}): "
            f"{why}; wait for it to end or stop it",
            node=name,
            holder=other,
        )


def release(port: ClusterPort, holder: str, names: list[str]) -> None:
    """Give up ``holder``'s hold on ``names`` (a node another run holds is left alone)."""
    for name in names:
        port.release_lock(name, holder)


def release_held(port: ClusterPort, holder: str) -> list[str]:
    """Give up every Lease ``holder`` holds, found by their node label; the nodes released, sorted."""
    leases = port.list_objects(_LEASE_API, "Lease", port.namespace, vocab.LABEL_LOCKED_NODE)
    released = []
    for lease in leases:
        node = ((lease.get("metadata") or {}).get("labels") or {}).get(vocab.LABEL_LOCKED_NODE, "")
        if (
            node
            and (lease.get("spec") or {}).get("holderIdentity") == holder
            and port.release_lock(node, holder)
        ):
            released.append(node)
    return sorted(released)
