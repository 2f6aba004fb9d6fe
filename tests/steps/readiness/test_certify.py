"""The certification pipeline's steps on a simulated fleet: plan, local checks, labels, gate (group jobs on a
cluster: test_jobs.py)."""

import json
import os
from pathlib import Path

import pytest

from steps.cluster import connect, shareable
from steps.cluster import vocabulary as vocab
from steps.errors import DsxError, InputError
from steps.readiness import certify
from steps.readiness.checks import SweepOutcome
from steps.readiness.models import Subject
from steps.readiness.outcomes import OutcomeStore, RunRef

LOCAL_RECIPE = {
    "digest": "sha256:feed",
    "thresholds": {"nccl": {"allReduce": [], "relative": {"madFactor": 3.5, "minGroups": 3}}},
}


@pytest.fixture
def fleet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """Point the steps at a shared simulated fleet built from a spec; returns a function to do so."""
    monkeypatch.setenv("DSX_OUTPUT_DIR", str(tmp_path / "out"))

    def use(spec: str) -> None:
        monkeypatch.setenv("DSX_CLUSTER", shareable(spec, tmp_path))

    return use


def test_plan_groups_nodes_by_rack_and_fails_nodes_that_are_not_ready(fleet, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    fleet("sim:nodes=6,gpu=h100,racks=2,faults=node-05:not-ready")
    port = connect()
    port.set_labels("node-04", {vocab.LABEL_MANAGED: "false"})
    plan = certify.plan_certification()
    assert plan.launcher == "local"  # a simulated fleet cannot run pods
    assert plan.criteria == {"service": "local", "accelerator": "cpu", "os": "ubuntu"}
    assert plan.nodes == ["node-00", "node-01", "node-02", "node-03"]
    assert [(e.node, e.reason) for e in plan.excluded] == [("node-05", "node is not Ready")]
    assert [(g.name, g.members) for g in plan.groups] == [
        ("all", ["node-00", "node-01", "node-02", "node-03"]),
        ("rack-00", ["node-00", "node-01", "node-02"]),
    ]
    params = tmp_path / "out" / "params"
    assert json.loads((params / "nodes").read_text()) == plan.nodes
    assert json.loads((params / "groups").read_text()) == ["all", "rack-00"]
    assert (params / "accelerator").read_text() == "cpu"


def test_plan_for_jobs_reads_the_accelerator_from_gpu_feature_discovery(fleet) -> None:  # type: ignore[no-untyped-def]
    fleet("sim:nodes=2,gpu=h200")
    plan = certify.plan_certification(launcher="job", image="registry.example/dsx:1")
    assert plan.criteria["accelerator"] == "h200"
    assert plan.gpus_per_node == 8
    assert (plan.min_bytes, plan.max_bytes) == (1 << 20, 8 << 30)


def test_plan_refuses_what_it_cannot_certify(fleet) -> None:  # type: ignore[no-untyped-def]
    fleet("sim:nodes=2,gpu=h100")
    with pytest.raises(InputError, match="selector 'pool=none' matches no managed node"):
        certify.plan_certification(selector="pool=none")
    with pytest.raises(InputError, match="certify option launcher"):
        certify.plan_certification(launcher="ssh")
    with pytest.raises(InputError, match="min-bytes 8388608 is larger than max-bytes 1024"):
        certify.plan_certification(min_bytes="8MiB", max_bytes="1KiB")


def test_simulated_faults_become_injected_faults_of_the_rank_playing_the_node(fleet) -> None:  # type: ignore[no-untyped-def]
    fleet("sim:nodes=3,gpu=h100,faults=node-01:slow-nic;node-02:failing-gpu")
    port = connect()
    assert certify.local_injections(port, "node-01", 1, "group") == ["1:delay=30ms"]
    assert certify.local_injections(port, "node-01", 0, "node") == []
    assert certify.local_injections(port, "node-02", 0, "node") == ["0:fail"]
    assert certify.local_injections(port, "node-00", 0, "group") == []


def test_local_certification_names_the_slow_node_labels_every_node_and_gates(fleet, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    fleet("sim:nodes=3,gpu=h100,faults=node-01:slow-nic")
    plan = certify.plan_certification(max_bytes="256KiB", iters=8)
    assert plan.injected == {"node-01": ["delay=30ms"]}
    nodes = [certify.certify_node(n, plan, LOCAL_RECIPE) for n in plan.nodes]
    assert [o.status for o in nodes] == ["pass", "pass", "pass"]  # its NVLink is fine
    (whole,) = [certify.certify_group(g.name, plan, LOCAL_RECIPE) for g in plan.groups]
    assert (whole.kind, whole.subject, whole.status) == ("group", "all", "fail")
    assert "node-01" in whole.message and "straggler" in whole.message
    store = OutcomeStore(connect(), plan.run)
    (stored,) = store.sweeps("group")
    (straggler,) = [v for v in stored.verdicts if v.status == "fail"]
    assert straggler.node == "node-01" and stored.run is not None
    assert stored.run.results.size == [65536, 262144]
    smoke = certify.certify_smoke(plan, LOCAL_RECIPE)
    assert smoke.subject == "smoke"
    smoked = store.smoke()
    assert smoked is not None and smoked.subject.members == ["node-00", "node-02"]
    summary = certify.finish_certification(plan, LOCAL_RECIPE)
    assert summary.status == "failed"
    assert summary.passed == ["node-00", "node-02"]
    assert list(summary.failed) == ["node-01"]
    assert {"report.json", "report.md", "busbw.png", "step-time.png"} <= set(summary.report_files)
    port = connect()
    labels = {n.name: n.labels.get(vocab.LABEL_CERTIFICATION) for n in port.list_nodes()}
    assert labels == {"node-00": "passed", "node-01": "failed", "node-02": "passed"}
    failed = port.get_node("node-01")
    assert failed.annotations[vocab.ANNOTATION_CERTIFICATION_RECIPE] == "sha256:feed"
    assert "straggler" in failed.annotations[vocab.ANNOTATION_CERTIFICATION_REASON]
    assert vocab.ANNOTATION_CERTIFIED_AT in port.get_node("node-00").annotations
    with pytest.raises(DsxError, match=r"certification failed: node-01: .*straggler"):
        certify.certification_gate(summary)
    assert store.sweeps("node") == [] and store.smoke() is None  # the report holds them now


def test_a_check_that_stored_no_outcome_fails_its_nodes_in_the_report(fleet) -> None:  # type: ignore[no-untyped-def]
    fleet("sim:nodes=2,gpu=h100")
    plan = certify.plan_certification(max_bytes="64KiB", iters=2)
    certify.certify_node("node-00", plan, LOCAL_RECIPE)  # node-01's check never finished
    certify.certify_group("all", plan, LOCAL_RECIPE)
    summary = certify.finish_certification(plan, LOCAL_RECIPE)
    assert summary.passed == ["node-00"]
    assert "node-check stored no outcome" in summary.failed["node-01"]


def test_outcomes_are_kept_per_run_owned_by_the_workflow_and_replaced_on_retry(fleet) -> None:  # type: ignore[no-untyped-def]
    fleet("sim:nodes=2,gpu=h100")
    port = connect()
    workflow = port.create_object(
        {
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "Workflow",
            "metadata": {"name": "dsx-certify-x7k2p", "namespace": port.namespace, "uid": "3f1c-77ab"},
        }
    )
    uid = workflow["metadata"]["uid"]
    plan = certify.plan_certification(
        max_bytes="64KiB", iters=2, workflow_name="dsx-certify-x7k2p", workflow_uid=uid
    )
    other = certify.plan_certification(max_bytes="64KiB", iters=2)  # another run, not under Argo
    first = certify.certify_node("node-00", plan, LOCAL_RECIPE)
    again = certify.certify_node("node-00", plan, LOCAL_RECIPE)  # a retried step
    certify.certify_node("node-00", other, LOCAL_RECIPE)
    assert first.status == again.status == "pass" and len(first.model_dump_json()) < 600
    mine = port.list_objects("v1", "ConfigMap", port.namespace, f"{vocab.LABEL_CERTIFICATION_RUN}={uid}")
    (stored,) = mine
    assert stored["metadata"]["ownerReferences"] == [
        {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "name": "dsx-certify-x7k2p", "uid": uid}
    ]
    assert stored["metadata"]["annotations"][vocab.ANNOTATION_SUBJECT] == "node-00"
    theirs = OutcomeStore(port, other.run)
    (outcome,) = theirs.sweeps("node")
    assert (
        "ownerReferences"
        not in port.list_objects(
            "v1", "ConfigMap", port.namespace, f"{vocab.LABEL_CERTIFICATION_RUN}={other.run.uid}"
        )[0]["metadata"]
    )
    assert outcome.subject.name == "node-00" and OutcomeStore(port, plan.run).delete() == 1
    assert theirs.delete() == 1 and theirs.sweeps("node") == []
    with pytest.raises(InputError, match="certify workflow uid"):
        certify.plan_certification(workflow_name="w", workflow_uid="not a uid!")


def test_an_outcome_too_big_for_a_configmap_is_an_error_naming_it(fleet) -> None:  # type: ignore[no-untyped-def]
    fleet("sim:nodes=1,gpu=h100")
    subject = Subject(kind="node", name="node-00", members=["node-00"])
    noise = [os.urandom(64).hex() for _ in range(20_000)]  # does not compress
    outcome = SweepOutcome(
        subject=subject, status="pass", verdicts=[], evidence=noise, out_dir="", elapsed_s=1
    )
    with pytest.raises(DsxError, match=r"node node-00: its outcome takes .* bytes compressed"):
        OutcomeStore(connect(), RunRef.local("default")).put("node", outcome)


def test_the_outcome_store_works_through_the_kubernetes_client(kubeconfig: Path) -> None:
    """The same store over the real client and HTTP: create, retry, list by label, owner, delete."""
    from steps.cluster.kube import KubeCluster, load_api_client

    api_client, _ = load_api_client(str(kubeconfig))
    port = KubeCluster(api_client, namespace="gpu-ops")
    workflow = port.create_object(
        {
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "Workflow",
            "metadata": {"name": "dsx-certify-q9", "namespace": "gpu-ops"},
        }
    )
    run = RunRef(name="dsx-certify-q9", uid=workflow["metadata"]["uid"], namespace="gpu-ops")
    store = OutcomeStore(port, run)
    subject = Subject(kind="node", name="node-00", members=["node-00"])
    outcome = SweepOutcome(subject=subject, status="pass", verdicts=[], evidence=[], out_dir="", elapsed_s=1)
    name = store.put("node", outcome)
    assert store.put("node", outcome.model_copy(update={"elapsed_s": 2.0})) == name  # a retry replaces it
    (stored,) = store.sweeps("node")
    assert stored.elapsed_s == 2.0 and store.sweeps("group") == []
    configmap = port.get_object("v1", "ConfigMap", name, "gpu-ops")
    assert configmap is not None and configmap["metadata"]["ownerReferences"][0]["uid"] == run.uid
    assert store.delete() == 1 and store.sweeps("node") == []
