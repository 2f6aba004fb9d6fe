"""The certification pipeline's steps on a simulated fleet: plan, local checks, labels, gate (group jobs on a
cluster: launchers/test_job.py)."""

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from steps.cluster import ClusterPort, connect
from steps.cluster import vocabulary as vocab
from steps.errors import DsxError, InputError
from steps.readiness import certify
from steps.readiness.checks import ALLREDUCE_SWEEP, SWEEP_TEST, TRAINING_SMOKE
from steps.readiness.launchers.local import local_injections
from steps.readiness.models import Subject
from steps.readiness.outcomes import OutcomeStore, RunRef
from tests import yamltext
from tests.paths import REPO

LOCAL_RECIPE = {
    "digest": "sha256:feed",
    "thresholds": {"nccl": {"allReduce": [], "relative": {"madFactor": 3.5, "minGroups": 3}}},
}


def test_plan_groups_nodes_by_rack_and_fails_nodes_that_are_not_ready(sim_fleet, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    sim_fleet("sim:nodes=6,gpu=h100,racks=2,faults=node-05:not-ready")
    port = connect()
    port.set_labels("node-04", {vocab.LABEL_MANAGED: "false", vocab.LABEL_CERTIFICATION: "passed"})
    port.set_labels("node-02", {vocab.LABEL_CERTIFICATION: "passed"})  # from an earlier run
    plan = certify.plan()
    assert plan.launcher == "local"  # a simulated fleet cannot run pods
    assert plan.criteria == {"service": "local", "accelerator": "cpu", "os": "ubuntu"}
    assert plan.nodes == ["node-00", "node-01", "node-02", "node-03"]
    assert [(e.node, e.reason) for e in plan.excluded] == [("node-05", "node is not Ready")]
    # The racks first (disjoint: tested at once), the whole set last.
    assert [(g.name, g.members) for g in plan.groups] == [
        ("rack-00", ["node-00", "node-01", "node-02"]),
        ("all", ["node-00", "node-01", "node-02", "node-03"]),
    ]
    params = tmp_path / "out" / "params"
    assert sorted(p.name for p in params.iterdir()) == sorted(certify.PLAN_OUTPUTS)  # what the template reads
    assert json.loads((params / "nodes").read_text()) == plan.nodes
    assert json.loads((params / "groups").read_text()) == ["rack-00"]
    assert (params / "whole").read_text() == "all"
    assert RunRef.model_validate_json((params / "run").read_text()) == plan.run
    assert (params / "accelerator").read_text() == "cpu"
    # No node keeps an older verdict while this run tests it; the opted-out node is left alone.
    labels = {n.name: n.labels.get(vocab.LABEL_CERTIFICATION) for n in connect().list_nodes()}
    assert labels == {
        "node-00": "pending",
        "node-01": "pending",
        "node-02": "pending",
        "node-03": "pending",
        "node-04": "passed",
        "node-05": "pending",
    }
    # The later steps get only the run's reference; the plan is stored once, for all of them.
    assert certify.CertifyPlan.model_validate_json(OutcomeStore(port, plan.run).document("plan")) == plan
    with pytest.raises(DsxError, match="has no stored recipe"):  # the keep-recipe step has not run
        certify.load_plan(plan.run)


def test_the_default_selection_leaves_nodes_without_gpus_alone(
    kube_fleet: Callable[..., ClusterPort], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real cluster mixes GPU nodes with CPU system nodes; certifying "every node" means every GPU node."""
    kube_fleet("sim:nodes=2,gpu=h100")
    kube_fleet("sim:nodes=1,gpu=h100,gpus=0,prefix=system-")
    monkeypatch.setenv("DSX_NAMESPACE", "gpu-ops")
    plan = certify.plan(launcher="job")
    assert plan.nodes == ["node-00", "node-01"] and plan.ignored == ["system-00"]
    assert plan.gpus_per_node == 8 and plan.criteria["accelerator"] == "h100"
    assert plan.criteria["service"] == "any"  # no managed service's labels on these nodes
    system = connect().get_node("system-00")
    assert vocab.LABEL_CERTIFICATION not in system.labels
    with pytest.raises(InputError, match="matches no managed node with GPUs"):
        certify.plan(selector="kubernetes.io/hostname=system-00", launcher="job")


def test_the_service_is_read_from_the_labels_eks_puts_on_its_nodes(sim_fleet) -> None:  # type: ignore[no-untyped-def]
    """auto picks the recipe of the managed service, and with it the fabric its rank pods must ask for."""
    sim_fleet("sim:nodes=2,gpu=h100")
    for name in ("node-00", "node-01"):
        connect().set_labels(name, {"eks.amazonaws.com/nodegroup": "p5-train"})
    assert certify.plan(launcher="job", image="r/dsx-gpu:1").criteria["service"] == "eks"


def test_two_certifications_of_one_node_exclude_each_other(sim_fleet) -> None:  # type: ignore[no-untyped-def]
    sim_fleet("sim:nodes=2,gpu=h100")
    first = certify.plan()
    with pytest.raises(InputError, match=r"node node-00 is held by dsx-certify/.*measure each other"):
        certify.plan()
    port = connect()
    assert all(n.labels.get(vocab.LABEL_CERTIFICATION) == "pending" for n in port.list_nodes())
    # The refused run took nothing: once the first run lets go, another may start.
    released = certify.release(first.run.name, first.run.uid)
    assert released.startswith("released 2 node(s)")
    second = certify.plan()
    assert second.run.uid != first.run.uid


def _held_by_workflow(name: str, status: dict[str, str] | None = None) -> ClusterPort:
    """A Workflow ``name`` (with ``status``) that planned a certification of every node: it holds them."""
    port = connect()
    manifest = {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {"name": name, "namespace": port.namespace},
        **({"status": status} if status else {}),
    }
    workflow = port.create_object(manifest)
    certify.plan(workflow_name=name, workflow_uid=workflow["metadata"]["uid"])
    return port


def test_a_killed_runs_hold_on_its_nodes_is_recognised_as_stale(sim_fleet) -> None:  # type: ignore[no-untyped-def]
    sim_fleet("sim:nodes=2,gpu=h100")
    port = _held_by_workflow("dsx-certify-old")
    with pytest.raises(InputError, match=r"held by dsx-certify/.*/dsx-certify-old/"):
        certify.plan()  # the old run's Workflow still exists: it may be running
    port.delete_object("argoproj.io/v1alpha1", "Workflow", "dsx-certify-old", port.namespace)
    plan = certify.plan()  # it was deleted: its Leases are stale, taken over
    assert plan.nodes == ["node-00", "node-01"]


@pytest.mark.parametrize("phase", ["Succeeded", "Failed", "Error"])
def test_a_finished_workflows_hold_on_its_nodes_is_stale(sim_fleet, phase: str) -> None:  # type: ignore[no-untyped-def]
    # e.g. a remediation whose recertification failed: certify's onExit does not run under templateRef
    sim_fleet("sim:nodes=2,gpu=h100")
    port = _held_by_workflow("dsx-remediate-old", {"phase": "Running"})
    with pytest.raises(InputError, match=r"held by dsx-certify/.*/dsx-remediate-old/"):
        certify.plan()  # still running
    port.patch_object(
        "argoproj.io/v1alpha1", "Workflow", "dsx-remediate-old", {"status": {"phase": phase}}, port.namespace
    )
    assert certify.plan().nodes == ["node-00", "node-01"]  # it ended: its hold is stale, taken over


def test_plan_for_jobs_reads_the_accelerator_from_gpu_feature_discovery(sim_fleet) -> None:  # type: ignore[no-untyped-def]
    sim_fleet("sim:nodes=2,gpu=h200")
    plan = certify.plan(launcher="job", image="registry.example/dsx:1")
    assert plan.criteria["accelerator"] == "h200"
    assert plan.gpus_per_node == 8
    assert (plan.min_bytes, plan.max_bytes) == (1 << 20, 8 << 30)


def test_plan_refuses_what_it_cannot_certify(sim_fleet) -> None:  # type: ignore[no-untyped-def]
    sim_fleet("sim:nodes=2,gpu=h100")
    with pytest.raises(InputError, match="selector 'pool=none' matches no managed node"):
        certify.plan(selector="pool=none")
    with pytest.raises(InputError, match="certify option: launcher"):
        certify.plan(launcher="ssh")
    with pytest.raises(InputError, match="min-bytes 8388608 is larger than max-bytes 1024"):
        certify.plan(min_bytes="8MiB", max_bytes="1KiB")


def test_simulated_faults_become_injected_faults_of_the_rank_playing_the_node(sim_fleet) -> None:  # type: ignore[no-untyped-def]
    sim_fleet(
        "sim:nodes=5,gpu=h100,faults=node-01:slow-nic;node-02:failing-gpu;node-03:hang;node-04:flaky-nic=0.5"
    )
    port = connect()
    assert local_injections(port, "node-01", 1, "group") == ["1:delay=30ms"]
    assert local_injections(port, "node-01", 0, "node") == []
    assert local_injections(port, "node-02", 0, "node") == ["0:fail"]
    assert local_injections(port, "node-00", 0, "group") == []
    # NIC faults show only where the node talks to others
    assert local_injections(port, "node-03", 3, "group") == ["3:hang"]
    assert local_injections(port, "node-04", 2, "group") == ["2:fail"]
    assert local_injections(port, "node-03", 0, "node") == []
    assert local_injections(port, "node-04", 0, "node") == []


def test_a_slow_gpu_slows_the_training_rank_only_and_a_faulty_switch_every_node_under_it(sim_fleet) -> None:  # type: ignore[no-untyped-def]
    sim_fleet(
        "sim:nodes=6,gpu=h100,racks=3,switches=rack-01:slow=0.5;rack-02:flaky=0.2,"
        "faults=node-00:slow-gpu=0.5;node-01:slow-rail:mlx5_2=100"
    )
    port = connect()
    # a GPU at half speed: a lost multiple of compute, seen in a training step, never in an all-reduce
    assert local_injections(port, "node-00", 0, "group") == []
    assert local_injections(port, "node-00", 0, "node") == []
    assert local_injections(port, "node-00", 0, "train") == ["0:delay=30ms"]
    assert local_injections(port, "node-01", 0, "train") == ["0:delay=30ms"]  # its slow rail, as in a sweep
    # one rail at a quarter of its rate caps the ring at a quarter: three lost multiples
    assert local_injections(port, "node-01", 1, "group") == ["1:delay=30ms"]
    # a switch at half rate slows both its nodes; a flaky one fails both (played every time)
    assert local_injections(port, "node-02", 0, "group") == local_injections(port, "node-03", 0, "group")
    assert local_injections(port, "node-03", 1, "group") == ["1:delay=10ms"]
    assert local_injections(port, "node-04", 2, "train") == ["2:fail"]
    assert local_injections(port, "node-05", 2, "group") == ["2:fail"]


@pytest.mark.story
def test_local_certification_names_the_slow_node_labels_every_node_and_gates(
    sim_fleet: Callable[[str], str], tmp_path: Path
) -> None:
    sim_fleet("sim:nodes=3,gpu=h100,faults=node-01:slow-nic")
    plan = certify.plan(max_bytes="256KiB", iters=8)
    assert plan.injected == {"node-01": ["delay=30ms"]}
    certify.keep_recipe(plan.run, LOCAL_RECIPE)
    nodes = [certify.node_check(n, plan.run) for n in plan.nodes]
    assert [o.status for o in nodes] == ["pass", "pass", "pass"]  # its NVLink is fine
    (whole,) = [certify.group_check(g.name, plan.run) for g in plan.groups]
    assert (whole.test, whole.subject, whole.status) == ("allreduce-sweep", "all", "fail")
    assert "node-01" in whole.message and "straggler" in whole.message
    store = OutcomeStore(connect(), plan.run)
    (stored,) = store.outcomes(ALLREDUCE_SWEEP, "group")
    (straggler,) = [v for v in stored.verdicts if v.status == "fail"]
    assert straggler.node == "node-01" and stored.result is not None
    assert stored.result.results.size == [65536, 262144]
    smoke = certify.smoke_check(plan.run)
    assert smoke.subject == "smoke"
    (smoked,) = store.outcomes(TRAINING_SMOKE)
    assert smoked.subject.members == ["node-00", "node-02"]
    summary = certify.report(plan.run)
    assert summary.status == "failed"
    assert summary.passed == 2 and summary.pending == {}
    assert list(summary.failed) == ["node-01"]
    kept = connect().get_object("v1", "ConfigMap", summary.report, connect().namespace)
    assert kept is not None and "| node-01 | failed |" in kept["data"]["report.md"]
    assert {"report.json", "report.md", "busbw.png", "step-time.png"} <= set(summary.report_files)
    port = connect()
    labels = {n.name: n.labels.get(vocab.LABEL_CERTIFICATION) for n in port.list_nodes()}
    assert labels == {"node-00": "passed", "node-01": "failed", "node-02": "passed"}
    failed = port.get_node("node-01")
    assert failed.annotations[vocab.ANNOTATION_CERTIFICATION_RECIPE] == "sha256:feed"
    assert "straggler" in failed.annotations[vocab.ANNOTATION_CERTIFICATION_REASON]
    assert vocab.ANNOTATION_CERTIFIED_AT in port.get_node("node-00").annotations
    with pytest.raises(DsxError, match=r"certification failed: node-01: .*straggler"):
        certify.gate(summary)
    assert store.every_outcome() == []  # the report holds them now
    assert certify.plan().nodes == plan.nodes  # the run let go of its nodes


@pytest.mark.story
def test_a_drill_delays_every_rank_on_its_node_and_certification_names_it(sim_fleet, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    sim_fleet("sim:nodes=3,gpu=h100")
    plan = certify.plan(max_bytes="256KiB", iters=8, inject="node-02:delay=40ms")
    assert plan.injected == {"node-02": ["delay=40ms"]}
    assert certify.drill_injections(plan, ["node-02", "node-00", "node-02"]) == [
        "0:delay=40ms",
        "2:delay=40ms",
    ]
    certify.keep_recipe(plan.run, LOCAL_RECIPE)
    nodes = [certify.node_check(n, plan.run) for n in plan.nodes]
    assert [o.status for o in nodes] == ["pass", "pass", "pass"], [o.message for o in nodes]  # late together
    (whole,) = [certify.group_check(g.name, plan.run) for g in plan.groups]
    assert whole.status == "fail" and "node-02" in whole.message and "injected" in whole.message
    summary = certify.report(plan.run)
    assert list(summary.failed) == ["node-02"] and summary.passed == 2
    certify.plan(inject="node-01:fail")  # the drill let go of its nodes: another may start


@pytest.mark.parametrize(
    ("inject", "message"),
    [
        ("node-01", r"inject: 'node-01' is not NODE:KIND\[=VALUE\]"),
        ("node-01:slow", r"inject: 'node-01:slow': .*unknown fault 'slow'"),
        ("node-01:delay", r"a delay needs a duration"),
        ("node-01:fail,node-01:hang", r"node 'node-01' is named twice"),
        ("node-01:nan", r"unknown fault 'nan'"),
    ],
)
def test_a_malformed_drill_is_refused_before_anything_is_marked(sim_fleet, inject: str, message: str) -> None:  # type: ignore[no-untyped-def]
    sim_fleet("sim:nodes=2,gpu=h100,certified=none")
    with pytest.raises(InputError, match=message):
        certify.plan(inject=inject)
    assert not any(vocab.LABEL_CERTIFICATION in n.labels for n in connect().list_nodes())


def test_a_drill_names_only_nodes_the_run_certifies_and_none_the_fleet_already_plays(sim_fleet) -> None:  # type: ignore[no-untyped-def]
    sim_fleet("sim:nodes=2,gpu=h100,faults=node-01:slow-nic,certified=none")
    with pytest.raises(
        InputError, match=r"node 'node-09' is not among the nodes to certify \(node-00, node-01\)"
    ):
        certify.plan(inject="node-09:fail")
    with pytest.raises(InputError, match=r"node 'node-01' already plays the simulated fleet's faults"):
        certify.plan(inject="node-01:fail")
    assert not any(vocab.LABEL_CERTIFICATION in n.labels for n in connect().list_nodes())


def test_a_check_that_stored_no_outcome_leaves_its_node_pending(sim_fleet) -> None:  # type: ignore[no-untyped-def]
    sim_fleet("sim:nodes=2,gpu=h100")
    plan = certify.plan(max_bytes="64KiB", iters=2)
    certify.keep_recipe(plan.run, LOCAL_RECIPE)
    certify.node_check("node-00", plan.run)  # node-01's check never finished
    skipped = certify.group_check("all", plan.run)
    assert skipped.message == "group all: not tested: fewer than two members passed earlier stages (node-00)"
    summary = certify.report(plan.run)
    assert summary.passed == 1 and summary.failed == {}
    assert "node-check stored no outcome" in summary.pending["node-01"]  # nothing measured: not failed
    assert connect().get_node("node-01").labels[vocab.LABEL_CERTIFICATION] == "pending"
    with pytest.raises(DsxError, match=r"certification failed: node-01 \(pending\): check-incomplete"):
        certify.gate(summary)


def test_outcomes_are_kept_per_run_owned_by_the_workflow_and_replaced_on_retry(sim_fleet) -> None:  # type: ignore[no-untyped-def]
    sim_fleet("sim:nodes=2,gpu=h100")
    port = connect()
    workflow = port.create_object(
        {
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "Workflow",
            "metadata": {"name": "dsx-certify-x7k2p", "namespace": port.namespace, "uid": "3f1c-77ab"},
        }
    )
    uid = workflow["metadata"]["uid"]
    plan = certify.plan(max_bytes="64KiB", iters=2, workflow_name="dsx-certify-x7k2p", workflow_uid=uid)
    certify.keep_recipe(plan.run, LOCAL_RECIPE)
    first = certify.node_check("node-00", plan.run)
    again = certify.node_check("node-00", plan.run)  # a retried step
    certify.release(plan.run.name, plan.run.uid)
    other = certify.plan(max_bytes="64KiB", iters=2)  # another run, not under Argo
    certify.keep_recipe(other.run, LOCAL_RECIPE)
    certify.node_check("node-00", other.run)
    assert first.status == again.status == "pass" and len(first.model_dump_json()) < 600
    mine = port.list_objects("v1", "ConfigMap", port.namespace, f"{vocab.LABEL_CERTIFICATION_RUN}={uid}")
    (stored,) = [m for m in mine if m["metadata"]["labels"][vocab.LABEL_OUTCOME_KIND] == "check"]
    assert stored["metadata"]["labels"][vocab.LABEL_OUTCOME_TEST] == "allreduce-sweep"
    assert stored["metadata"]["ownerReferences"] == [
        {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "name": "dsx-certify-x7k2p", "uid": uid}
    ]
    assert stored["metadata"]["annotations"][vocab.ANNOTATION_SUBJECT] == "node-00"
    theirs = OutcomeStore(port, other.run)
    (outcome,) = theirs.outcomes(ALLREDUCE_SWEEP, "node")
    assert not any(
        "ownerReferences" in m["metadata"]
        for m in port.list_objects(
            "v1", "ConfigMap", port.namespace, f"{vocab.LABEL_CERTIFICATION_RUN}={other.run.uid}"
        )
    )
    # Each run keeps its plan, its recipe and its outcomes; deleting one run's leaves the other's.
    assert outcome.subject.name == "node-00" and OutcomeStore(port, plan.run).delete() == 3
    assert theirs.delete() == 3 and theirs.outcomes(ALLREDUCE_SWEEP, "node") == []
    with pytest.raises(InputError, match="certify workflow: uid"):
        certify.plan(workflow_name="w", workflow_uid="not a uid!")


def test_an_outcome_too_big_for_a_configmap_is_an_error_naming_it(sim_fleet) -> None:  # type: ignore[no-untyped-def]
    sim_fleet("sim:nodes=1,gpu=h100")
    subject = Subject(kind="node", name="node-00", members=["node-00"])
    noise = [os.urandom(64).hex() for _ in range(20_000)]  # does not compress
    outcome = ALLREDUCE_SWEEP.outcome(
        test=SWEEP_TEST, subject=subject, status="pass", verdicts=[], evidence=noise, out_dir="", elapsed_s=1
    )
    with pytest.raises(DsxError, match=r"allreduce-sweep of node node-00: it takes .* bytes compressed"):
        OutcomeStore(connect(), RunRef.local("default")).put(outcome)


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
    outcome = ALLREDUCE_SWEEP.outcome(
        test=SWEEP_TEST, subject=subject, status="pass", verdicts=[], evidence=[], out_dir="", elapsed_s=1
    )
    name = store.put(outcome)
    assert store.put(outcome.model_copy(update={"elapsed_s": 2.0})) == name  # a retry replaces it
    (stored,) = store.outcomes(ALLREDUCE_SWEEP, "node")
    assert stored.elapsed_s == 2.0 and store.outcomes(ALLREDUCE_SWEEP, "group") == []
    configmap = port.get_object("v1", "ConfigMap", name, "gpu-ops")
    assert configmap is not None and configmap["metadata"]["ownerReferences"][0]["uid"] == run.uid
    assert store.delete() == 1 and store.outcomes(ALLREDUCE_SWEEP, "node") == []


@pytest.mark.story
def test_the_workflow_stays_small_however_large_the_fleet(monkeypatch, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Argo keeps a Workflow in one etcd object (1 MiB): no step input may grow with the fleet."""
    monkeypatch.setenv("DSX_CLUSTER", "sim:nodes=3000,gpu=h100,racks=200")
    monkeypatch.setenv("DSX_OUTPUT_DIR", str(tmp_path))
    plan = certify.plan(launcher="job", image="registry.example/dsx-gpu:1")
    params = {p.name: p.read_text() for p in (tmp_path / "params").iterdir()}
    assert len(params["run"]) < 200  # what every check, the smoke run and the report receive
    assert len(json.loads(params["nodes"])) == 3000 and len(params["nodes"]) < 64 * 1024
    assert len(json.loads(params["groups"])) == 200 and params["whole"] == "all"
    stored = OutcomeStore(connect(), plan.run)  # a fresh fleet: the store is per process here
    assert stored.run == plan.run
    doc = yamltext.load((REPO / "charts/dsx/files/workflow-template-dsx-certify.yaml").read_text())
    (dag,) = [t["dag"] for t in doc["spec"]["templates"] if t["name"] == "certify"]
    fleet_sized = {"{{tasks.plan.outputs.parameters.nodes}}", "{{tasks.plan.outputs.parameters.groups}}"}
    for task in dag["tasks"]:
        values = [p["value"] for p in (task.get("arguments") or {}).get("parameters") or []]
        assert not fleet_sized & set(values), f"{task['name']} takes a list of the whole fleet as an input"
        assert task["name"] == "plan" or all(
            v in ("{{item}}", "{{tasks.plan.outputs.parameters.run}}")
            or v.startswith("{{tasks.plan.outputs.parameters.")
            or v in ("{{tasks.resolve-recipe.outputs.result}}", "{{tasks.report.outputs.result}}")
            or v in ("training", "groups", "whole")
            # the groups to bisect: only those that failed while their members passed alone
            or v.endswith("targets.outputs.parameters.targets}}")
            for v in values
        ), task["name"]


def test_a_local_runs_hold_lives_while_its_process_does(sim_fleet, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A dsx run --local has no Workflow object: its holds name its process (DSX_LOCAL_RUN, HOST:PID).
    While that process lives, a second certification is refused naming it; once it is gone, its hold
    is stale and taken over. A local run's hold was once always taken over (no Workflow found)."""
    import socket
    import subprocess
    import sys

    sim_fleet("sim:nodes=2,gpu=h100")
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        monkeypatch.setenv(vocab.ENV_LOCAL_RUN, f"{socket.gethostname()}:{sleeper.pid}")
        first = certify.plan(workflow_name="dsx-certify-abcde", workflow_uid="u1")
        monkeypatch.setenv(vocab.ENV_LOCAL_RUN, f"{socket.gethostname()}:{os.getpid()}")
        with pytest.raises(
            InputError, match=rf"is held by dsx-certify/\S+/dsx-certify-abcde/u1/\S+:{sleeper.pid}"
        ):
            certify.plan(workflow_name="dsx-certify-fghij", workflow_uid="u2")
    finally:
        sleeper.kill()
        sleeper.wait()
    second = certify.plan(workflow_name="dsx-certify-fghij", workflow_uid="u2")  # its process is gone
    assert second.nodes == first.nodes
