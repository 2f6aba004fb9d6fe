"""Mark the one node that ``dsx-certify`` recertifies for remediation, and unmark it.

``dsx-certify`` picks its nodes by a label selector read from the workflow's parameters, which a calling
workflow cannot compute from its ``node`` parameter; ``dsx-remediate`` therefore fixes the selector to
``dsx.dev/recertify=true`` and these steps put that label on the node under remediation, and only on it,
while the recertify DAG holds the fleet-wide mutex ``dsx-recertify``. A label left behind by a run that was
killed mid-way is taken off other nodes first, so certification never reaches a node it was not asked for.

The pair test that follows (:func:`pair_partner`, then ``dsx-bisect``'s ``prepare``, ``search-group``
and ``finish`` through ``templateRef``, then :func:`pair_verdict`) tests the node beside a known-good node:
a node labelled ``dsx.dev/certification=passed``, not cordoned, Ready, managed, with GPUs, not under
remediation itself, and whose GPUs no pod holds (the first by name). Both carry ``dsx.dev/recertify=pair``
(:data:`PAIR_SELECTOR`, the bisection's node selector) while it runs. What it found is written to the
node's ``dsx.dev/pair-test`` annotation, which ``conclude`` reads.

No verdict is not a failure. When every known-good node's GPUs are in use, or the pair test's pods could
not all be scheduled within the scheduling budget (a workload took the partner meanwhile), or a step of the
pair test stopped before it named the node, the test said nothing about the node: the note starts with
:data:`NO_VERDICT`, the node's certification label goes back to ``pending``, and ``conclude`` keeps it
recertifying, cordoned, for a later run to test again; it never escalates it for that.

The rule when no known-good node exists (a fleet whose every other node is cordoned or uncertified):
the pair test is skipped, the annotation says so, and the node's own certification decides. Escalating
instead would keep a small fleet's last nodes out of service forever for want of a partner; the node
still had to pass every check of ``dsx-certify`` on its own.

Step modules are read by Hera's runner in the pod, so this one keeps its annotations evaluated.
"""

import os
from pathlib import Path

from steps.cluster import ClusterPort, connect
from steps.cluster import vocabulary as vocab
from steps.files import write_text

__all__ = ["NO_VERDICT", "PAIR_SELECTOR", "mark", "pair_partner", "pair_verdict", "unmark"]

_SELECTED = "true"
_PAIR = "pair"
PAIR_SELECTOR = f"{vocab.LABEL_RECERTIFY}={_PAIR}"
"""The nodes of the pair test: the node under recertification and its known-good partner."""
_PASSED = vocab.Certification.passed.value
NO_VERDICT = "no verdict"
"""How the ``dsx.dev/pair-test`` note of a pair test that said nothing about the node begins."""


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


def _output(name: str, value: str) -> None:
    folder = os.environ.get(vocab.ENV_OUTPUT_DIR)
    if folder:
        write_text(Path(folder) / "params" / name, value)


def _unpair(port: ClusterPort) -> list[str]:
    """Take the pair mark off every node that carries it; the nodes unmarked."""
    marked = sorted(n.name for n in port.list_nodes(PAIR_SELECTOR))
    for name in marked:
        port.set_labels(name, {vocab.LABEL_RECERTIFY: None})
    return marked


def _note(port: ClusterPort, node: str, note: str) -> str:
    port.set_node_metadata(node, annotations={vocab.ANNOTATION_PAIR_TEST: note[:250]})
    return f"{node}: pair test {note}"


def pair_partner(node: str) -> str:
    """Choose the known-good partner of the pair test and mark both; output ``partner`` (empty: no test).

    No test when the node's own certification did not pass (it escalates anyway), or when no node is
    known good (see the module's rule); the ``dsx.dev/pair-test`` annotation says which.
    """
    port = connect()
    _unpair(port)
    verdict = port.get_node(node).labels.get(vocab.LABEL_CERTIFICATION, "")
    if verdict != _PASSED:
        _output("partner", "")
        return _note(port, node, f"not run: certification alone gave {verdict or 'no verdict'}")
    good = sorted(
        n.name
        for n in port.list_nodes(f"{vocab.LABEL_CERTIFICATION}={_PASSED}")
        if n.name != node
        and not n.unschedulable
        and n.ready
        and n.managed
        and n.gpu_count > 0
        and not n.labels.get(vocab.LABEL_STATE)
    )
    if not good:
        _output("partner", "")
        return _note(
            port,
            node,
            "skipped: no known-good partner (certification=passed, not cordoned, Ready); "
            "the node's own certification decides",
        )
    free = [name for name in good if not any(p.holds_gpus for p in port.pods_on(name))]
    if not free:
        _output("partner", "")
        _pending(port, node, f"every known-good partner's GPUs are in use ({', '.join(good)})")
        return _note(
            port, node, f"{NO_VERDICT}: every known-good partner's GPUs are in use ({', '.join(good)})"
        )
    good = free
    partner = good[0]
    for name in (node, partner):
        port.set_labels(name, {vocab.LABEL_RECERTIFY: _PAIR})
    _output("partner", partner)
    return _note(port, node, f"running beside {partner}")


def _pending(port: ClusterPort, node: str, why: str) -> None:
    """Nothing was proven about the node: its certification goes back to ``pending``, saying why."""
    port.set_node_metadata(
        node,
        labels={vocab.LABEL_CERTIFICATION: vocab.Certification.pending.value},
        annotations={vocab.ANNOTATION_CERTIFICATION_REASON: f"pair test: {why}"[:250]},
    )


def pair_verdict(node: str, partner: str = "", status: str = "") -> str:
    """After the pair test (``status``: how ``dsx-bisect``'s ``finish`` ended): unmark both nodes and
    write the verdict. The test names the node failed by labelling it (``search-group`` does, with
    its reason, when the node failed beside the partner); a test that ended otherwise without naming it
    gave no verdict (its pods could not all be scheduled, or a step stopped): the node goes back to
    ``pending``, and ``conclude`` keeps it recertifying."""
    port = connect()
    _unpair(port)
    if not partner:
        return f"{node}: no pair test"
    if status == "Succeeded":
        return _note(port, node, f"passed beside {partner}")
    current = port.get_node(node)
    reason = current.annotations.get(vocab.ANNOTATION_CERTIFICATION_REASON, "")
    if current.labels.get(vocab.LABEL_CERTIFICATION) == vocab.Certification.failed.value:
        return _note(port, node, f"failed beside {partner}: {reason}")
    why = (
        f"the test beside {partner} named nothing ({status or 'unknown'}): its pods could not all be "
        "scheduled, or a step stopped"
    )
    _pending(port, node, why)
    return _note(port, node, f"{NO_VERDICT}: {why}")
