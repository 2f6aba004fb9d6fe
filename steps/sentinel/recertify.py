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

The partner is held while the test runs, as certification holds its nodes: its Lease (and the node's)
under this remediation's Workflow, so no certification measures it meanwhile, and a cordon owned by
:data:`PAIR_OWNER`, so the scheduler puts no workload on its free GPUs before the test's pods are bound
(they tolerate the cordon, as the node's own test tolerates its quarantine). A partner whose GPUs a pod
took between the choice and the cordon is given back and the next one tried. :func:`pair_verdict` gives
the hold back; so does :func:`release_pair` in the exit handler, however the run ended, and a hold whose
run has ended is lifted by the next pair test.

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

from steps.cluster import ClusterPort, CordonRefusedError, connect, holds
from steps.cluster import vocabulary as vocab
from steps.outputs import write_params

__all__ = [
    "NO_VERDICT",
    "PAIR_OWNER",
    "PAIR_SELECTOR",
    "mark",
    "pair_partner",
    "pair_verdict",
    "release_pair",
    "unmark",
]

_SELECTED = "true"
_PAIR = "pair"
PAIR_SELECTOR = f"{vocab.LABEL_RECERTIFY}={_PAIR}"
"""The nodes of the pair test: the node under recertification and its known-good partner."""
_PASSED = vocab.Certification.passed.value
NO_VERDICT = "no verdict"
"""How the ``dsx.dev/pair-test`` note of a pair test that said nothing about the node begins."""
PAIR_OWNER = "dsx-pair"
"""The owner of the cordon that holds a pair test's partner (``dsx.dev/cordoned-by``)."""
#: How long a pair test's hold on its nodes lasts if the run dies without giving it back.
PAIR_HOLD_TTL_S = 2 * 3600


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


def _unpair(port: ClusterPort) -> list[str]:
    """Take the pair mark off every node that carries it; the nodes unmarked."""
    marked = sorted(n.name for n in port.list_nodes(PAIR_SELECTOR))
    for name in marked:
        port.set_labels(name, {vocab.LABEL_RECERTIFY: None})
    return marked


def _note(port: ClusterPort, node: str, note: str) -> str:
    port.set_node_metadata(node, annotations={vocab.ANNOTATION_PAIR_TEST: note[:250]})
    return f"{node}: pair test {note}"


def _holder(port: ClusterPort, workflow_name: str, workflow_uid: str) -> str:
    return holds.run_holder(port.namespace, workflow_name or holds.LOCAL_RUN_NAME, workflow_uid or "pair")


def _lift(port: ClusterPort, holder: str, alive: bool) -> list[str]:
    """Uncordon the partners :data:`PAIR_OWNER` cordoned for ``holder`` (``alive=False``: for any run that
    is no longer running) and give back their Leases; the nodes lifted."""
    lifted = []
    for current in port.list_nodes():
        cordon = current.cordon
        if cordon is None or cordon.owner != PAIR_OWNER:
            continue
        held_by = holds.lease_holder(port, current.name)
        if alive:
            if held_by != holder:
                continue
        elif held_by and holds.holder_alive(port, held_by):
            continue
        port.uncordon(current.name, by=PAIR_OWNER)
        if held_by:
            port.release_lock(current.name, held_by)
        lifted.append(current.name)
    return lifted


def _hold(port: ClusterPort, node: str, partner: str, holder: str) -> str:
    """Hold the partner for the test (its Lease and the node's, then a cordon); ``""`` when held, else
    why not (another run holds one of them, someone cordoned it, or a pod took its GPUs meanwhile)."""
    try:
        holds.take(port, holder, [node, partner], PAIR_HOLD_TTL_S, "a pair test would measure it meanwhile")
    except holds.NodeHeldError as exc:
        return f"{exc.node} held by {exc.holder or 'another run'}"
    try:
        port.cordon(partner, f"pair test of {node}", by=PAIR_OWNER)
    except CordonRefusedError as exc:
        holds.release(port, holder, [node, partner])
        return f"{partner}: {exc.cordon.describe()}"
    cordon = port.get_node(partner).cordon
    why = ""
    if cordon is None or cordon.owner != PAIR_OWNER:
        why = f"{partner}: cordoned outside dsx meanwhile"
    elif any(p.holds_gpus for p in port.pods_on(partner)):
        why = f"{partner}: a pod took its GPUs"
    if why:
        if cordon is not None and cordon.owner == PAIR_OWNER:
            port.uncordon(partner, by=PAIR_OWNER)
        holds.release(port, holder, [node, partner])
    return why


def pair_partner(node: str, workflow_name: str = "", workflow_uid: str = "") -> str:
    """Choose the known-good partner of the pair test, hold it and mark both; output ``partner`` (empty:
    no test).

    No test when the node's own certification did not pass (it escalates anyway), or when no node is
    known good (see the module's rule); the ``dsx.dev/pair-test`` annotation says which. The hold is
    taken under the remediation's Workflow (``workflow_name``, ``workflow_uid``).
    """
    port = connect()
    _unpair(port)
    holder = _holder(port, workflow_name, workflow_uid)
    _lift(port, holder, alive=False)
    verdict = port.get_node(node).labels.get(vocab.LABEL_CERTIFICATION, "")
    if verdict != _PASSED:
        write_params(partner="")
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
        write_params(partner="")
        return _note(
            port,
            node,
            "skipped: no known-good partner (certification=passed, not cordoned, Ready); "
            "the node's own certification decides",
        )
    busy = [name for name in good if any(p.holds_gpus for p in port.pods_on(name))]
    passed_over = [f"{name}: its GPUs are in use" for name in busy]
    for candidate in (name for name in good if name not in busy):
        why = _hold(port, node, candidate, holder)
        if why:
            passed_over.append(why)
            continue
        for name in (node, candidate):
            port.set_labels(name, {vocab.LABEL_RECERTIFY: _PAIR})
        write_params(partner=candidate)
        skipped = f" (passed over {'; '.join(passed_over)})" if passed_over else ""
        return _note(port, node, f"running beside {candidate}{skipped}")
    write_params(partner="")
    why = (
        f"every known-good partner's GPUs are in use ({', '.join(good)})"
        if len(busy) == len(good)
        else f"no known-good partner could be held: {'; '.join(passed_over)}"
    )
    return _no_verdict(port, node, why)


def release_pair(workflow_name: str, workflow_uid: str) -> str:
    """The exit handler's part: give back the pair test's hold on its partner (cordon and Leases) and the
    pair marks, however the run ended. Nothing to do when :func:`pair_verdict` already did."""
    port = connect()
    holder = _holder(port, workflow_name, workflow_uid)
    # The marks first: they are found by the Leases that lifting the cordon gives back.
    marked = [n.name for n in port.list_nodes(PAIR_SELECTOR) if holds.lease_holder(port, n.name) == holder]
    for name in marked:
        port.set_labels(name, {vocab.LABEL_RECERTIFY: None})
    lifted = _lift(port, holder, alive=True)
    holds.release(port, holder, marked)
    done = sorted(set(lifted) | set(marked))
    return f"pair hold given back: {', '.join(done)}" if done else "no pair hold to give back"


def _no_verdict(port: ClusterPort, node: str, why: str) -> str:
    """Nothing was proven about the node: its certification goes back to ``pending``, saying why, and the
    note says no verdict, in one patch (``conclude`` never reads one without the other)."""
    note = f"{NO_VERDICT}: {why}"
    port.set_node_metadata(
        node,
        labels={vocab.LABEL_CERTIFICATION: vocab.Certification.pending.value},
        annotations={
            vocab.ANNOTATION_CERTIFICATION_REASON: f"pair test: {why}"[:250],
            vocab.ANNOTATION_PAIR_TEST: note[:250],
        },
    )
    return f"{node}: pair test {note}"


def pair_verdict(
    node: str, partner: str = "", status: str = "", workflow_name: str = "", workflow_uid: str = ""
) -> str:
    """After the pair test (``status``: how ``dsx-bisect``'s ``finish`` ended): unmark both nodes and
    write the verdict. The test names the node failed by labelling it (``search-group`` does, with
    its reason, when the node failed beside the partner); a test that ended otherwise without naming it
    gave no verdict (its pods could not all be scheduled, or a step stopped): the node goes back to
    ``pending``, and ``conclude`` keeps it recertifying. The partner's hold is given back first."""
    port = connect()
    _unpair(port)
    holder = _holder(port, workflow_name, workflow_uid)
    _lift(port, holder, alive=True)
    holds.release(port, holder, [node, partner] if partner else [node])
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
    return _no_verdict(port, node, why)
