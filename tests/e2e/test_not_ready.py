"""A node that goes down, judged by the real control plane: the process kubelet stops renewing the node's
Lease and posting its status, the real node lifecycle controller marks it ``Unknown`` and taints it
unreachable; the reconciler's ``not-ready`` check (as dsx-reconcile's account, with the catalogue the chart
gives its CronWorkflow) writes ``DsxNodeNotReady`` and the sentinel's taint and would start dsx-remediate;
the drain (as dsx-remediate's account) evicts a Deployment's pod there, which the real API server keeps
terminating as no kubelet confirms it, and records it ``stranded`` instead of waiting out its deadline; a
person's out-of-service taint lets the real pod garbage collector remove it, as the emulator's double does;
and once the node is back (a reboot) the reconciler clears the condition. The emulator's scenario
(``tests/steps/sentinel/test_drain_unreachable.py``) must end as the real one does.

The reconciler's marking is an edge the real Sensor sees (the taint, then the condition turning fatal): it
submits one ``dsx-remediate`` for the node, which waits on the node's mutex, held here as the Events tier's
test holds it, and is superseded once the node is back. Were it to run while the node is down, it would
take the quarantine breaker's one slot (a tenth of four nodes) for an hour and refuse the next remediation
of the tier."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from steps.cluster import vocabulary as vocab
from steps.cluster.kube import KubeCluster, load_api_client
from steps.sentinel.catalogue import given_catalogue
from steps.sentinel.drain import DrainPolicy, drain
from steps.sentinel.reconcile import mark_not_ready, plan
from tests.e2e.cluster import NAMESPACE, Cluster
from tests.e2e.conftest import ACCOUNTS, RealCluster, pinned_workload, wait_until
from tests.e2e.test_events import _hold, _parameters, _submitted, _superseded, _wait_submitted
from tests.steps.sentinel.test_drain_unreachable import down_node_outcomes, sim_down_node_outcomes

pytestmark = pytest.mark.e2e

NODE = "node-03"
WORKLOADS = "batch"
CONDITION = vocab.CONDITION_SENTINEL["not-ready"]


def _as(real_cluster: RealCluster, account: str) -> KubeCluster:
    api, _ = load_api_client(str(real_cluster.kubeconfig))
    api.set_default_header("Impersonate-User", f"{ACCOUNTS}{account}")
    return KubeCluster(api, namespace=NAMESPACE)


def _forget(real_cluster: RealCluster, holder: str) -> None:
    """Whatever the test leaves, gone: the Sensor's runs for the node (none left when it passed) and the
    Workflow holding the node's mutex."""
    for workflow in _submitted(real_cluster, NODE):
        real_cluster.kubectl("delete", "workflow", "-n", NAMESPACE, workflow["metadata"]["name"], check=False)
    real_cluster.kubectl("delete", "workflow", "-n", NAMESPACE, holder, "--ignore-not-found", check=False)


def _ready(real_cluster: RealCluster) -> dict[str, Any]:
    node = real_cluster.get("node", NODE)
    return next(c for c in node["status"]["conditions"] if c["type"] == "Ready")


def test_a_node_that_goes_down_is_marked_drained_without_waiting_and_cleared_once_back(
    real_cluster: RealCluster,
    own_cluster: Cluster,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    # The catalogue overrides the chart gives dsx-reconcile's step (the install's sentinel.overrides).
    cron = real_cluster.get("cronworkflow", "-n", NAMESPACE, vocab.WORKFLOW_RECONCILE)
    env = {
        e["name"]: e.get("value", "")
        for t in cron["spec"]["workflowSpec"]["templates"]
        for e in (t.get("script") or t.get("container") or {}).get("env") or []
    }
    monkeypatch.setenv(vocab.ENV_FAULT_OVERRIDES, env[vocab.ENV_FAULT_OVERRIDES])
    catalogue = given_catalogue()
    assert catalogue.rule("not-ready", "ready-unknown").threshold == 20
    pod = pinned_workload(real_cluster, NODE, WORKLOADS, "server")["metadata"]["name"]
    admin, _ = load_api_client(str(real_cluster.kubeconfig))
    admin_port = KubeCluster(admin, namespace=NAMESPACE)
    reconciler, remediation = _as(real_cluster, "dsx-reconcile"), _as(real_cluster, "dsx-remediate")
    down = own_cluster.dir / "kubelet" / "nodes" / NODE / "down"
    holder = _hold(real_cluster, NODE)  # the Sensor's remediation waits until the node is back
    request.addfinalizer(lambda: _forget(real_cluster, holder))
    down.touch()
    try:
        # The real node lifecycle controller, once the Lease is older than its grace period (50 s).
        ready = wait_until(
            lambda: (r := _ready(real_cluster))["status"] == "Unknown" and r,
            240,
            "Ready Unknown",
            real_cluster.debug,
        )
        assert ready["reason"] == "NodeStatusUnknown", ready
        taints = {t["key"] for t in real_cluster.get("node", NODE)["spec"].get("taints") or []}
        assert "node.kubernetes.io/unreachable" in taints, taints
        lines = wait_until(
            lambda: mark_not_ready(reconciler, catalogue),
            120,
            "the reconciler marks the node",
            real_cluster.debug,
        )
        assert len(lines) == 1, lines
        assert lines[0].startswith(
            f"{NODE}: marked {CONDITION} (ready-unknown: node: Ready Unknown (NodeStatusUnknown)"
        )
        node = real_cluster.get("node", NODE)
        marked = next(c for c in node["status"]["conditions"] if c["type"] == CONDITION)
        assert (marked["status"], marked["reason"]) == ("True", "FatalReboot"), marked
        assert "Kubelet stopped posting node status" in marked["message"], marked
        assert vocab.TAINT_UNHEALTHY in {t["key"] for t in node["spec"].get("taints") or []}
        # The real Sensor saw the edge: one dsx-remediate for the node, for the not-ready check; the
        # reconciler, told to remediate, would start none beside it.
        _wait_submitted(real_cluster, NODE)
        submitted = _submitted(real_cluster, NODE)
        assert [_parameters(w)["check"] for w in submitted] == ["not-ready"], submitted
        planned = plan(reconciler)
        assert not [s for s in planned.starts if s.node == NODE], planned.starts
        skips = {s.node: s.why for s in planned.skips}
        assert submitted[0]["metadata"]["name"] in skips.get(NODE, ""), skips

        # The drain: the evicted pod stays terminating on the real API server (no kubelet confirms it).
        report = drain(remediation, NODE, DrainPolicy(unreachable_wait_s=5, poll_s=1, deadline_s=120))
        assert report.complete and not report.escalate, report.summary()
        outcomes = {p.pod: p.outcome for p in report.pods}
        assert outcomes.get(f"{WORKLOADS}/{pod}") == "stranded", outcomes
        left = real_cluster.get("pod", "-n", WORKLOADS, pod)
        terminating = bool(left["metadata"].get("deletionTimestamp"))

        # A person confirms the node is down: the real pod garbage collector removes the pod.
        admin_port.add_taint(NODE, vocab.TAINT_OUT_OF_SERVICE, "nodeshutdown", "NoExecute")
        wait_until(
            lambda: (
                pod not in {p["metadata"]["name"] for p in real_cluster.get("pods", "-n", WORKLOADS)["items"]}
            ),
            120,
            "the pod garbage collector removes the pod",
            real_cluster.debug,
        )
        real = (outcomes[f"{WORKLOADS}/{pod}"], terminating, True)
    finally:
        admin_port.remove_taint(NODE, vocab.TAINT_OUT_OF_SERVICE)
        admin_port.remove_taint(NODE, vocab.TAINT_UNHEALTHY)
        down.unlink(missing_ok=True)  # back, as a reboot
        real_cluster.kubectl("delete", "namespace", WORKLOADS, "--wait=false", check=False)
    try:
        wait_until(lambda: _ready(real_cluster)["status"] == "True", 180, "Ready again", real_cluster.debug)
        assert mark_not_ready(reconciler, catalogue) == [f"{NODE}: cleared {CONDITION} (Ready again)"]
        node = real_cluster.get("node", NODE)
        assert next(c for c in node["status"]["conditions"] if c["type"] == CONDITION)["status"] == "False"
    finally:
        real_cluster.argo("resume", "-n", NAMESPACE, holder, check=False)
    # The node is back before the Sensor's run began: it is superseded and changes nothing.
    real_cluster.kubectl("delete", "workflow", "-n", NAMESPACE, holder, *_superseded(real_cluster, NODE))
    # The doubles (the kubelet double holding a node down and the emulator's pod garbage collector; the
    # simulated fleet) end the same scenario as the real control plane does.
    assert down_node_outcomes(tmp_path) == sim_down_node_outcomes() == real == ("stranded", True, True)
