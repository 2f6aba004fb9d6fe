"""Mark the one node that ``dsx-certify`` recertifies for remediation, and unmark it.

``dsx-certify`` picks its nodes by a label selector read from the workflow's parameters, which a calling
workflow cannot compute from its ``node`` parameter; ``dsx-remediate`` therefore fixes the selector to
``dsx.dev/recertify=true`` and these steps put that label on the node under remediation, and only on it,
while the recertify DAG holds the fleet-wide mutex ``dsx-recertify``. A label left behind by a run that was
killed mid-way is taken off other nodes first, so certification never reaches a node it was not asked for.

Step modules are read by Hera's runner in the pod, so this one keeps its annotations evaluated.
"""

from steps.cluster import connect
from steps.cluster import vocabulary as vocab

__all__ = ["mark", "unmark"]

_SELECTED = "true"


def mark(node: str) -> str:
    """Put ``dsx.dev/recertify=true`` on ``node`` alone (stale marks elsewhere are removed)."""
    port = connect()
    stale = [n.name for n in port.list_nodes(f"{vocab.LABEL_RECERTIFY}={_SELECTED}") if n.name != node]
    for name in stale:
        port.set_labels(name, {vocab.LABEL_RECERTIFY: None})
    port.set_labels(node, {vocab.LABEL_RECERTIFY: _SELECTED})
    return f"{node} marked for recertification" + (
        f"; stale marks removed from {', '.join(stale)}" if stale else ""
    )


def unmark(node: str) -> str:
    """Take the mark off ``node`` (nothing to do when it is gone or unmarked)."""
    port = connect()
    if node in {n.name for n in port.list_nodes(f"{vocab.LABEL_RECERTIFY}={_SELECTED}")}:
        port.set_labels(node, {vocab.LABEL_RECERTIFY: None})
    return f"{node} unmarked"
