"""Certification through Kubernetes Jobs on an emulated 16-node, 4-rack H100 cluster.

The API server, its Job controller, scheduler (eight GPUs a node), garbage collector and kubelet double
are the emulated cluster's (:mod:`tests.emulator`); the kubelet runs each group's ranks on this machine
over gloo, one rank a pod. The steps are dsx's own, called in the order and
with the fan-out the ``dsx-certify`` DAG gives them: every node's check at once, then every rack at once,
then the whole set, the smoke run, the report, and the exit handler.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from steps.cluster import vocabulary as vocab
from steps.readiness import certify
from steps.readiness.outcomes import RunRef
from tests.paths import REPO

NS = "gpu-ops"
# CPU gloo cannot meet an H100 recipe's absolute figures: judge what a CPU can be judged on (the sweep
# completes with correct data, no straggler, the training loss falls). Relative mode is off: four racks
# measured at once on two shared cores differ by the machine's load, not by their links. The smoke run
# trains the fewest steps its judge reads (two warm-up steps, then two windows of three): what these tests
# look at is the Jobs and what they leave, and sixteen ranks training 30 steps on two cores took seconds.
RECIPE = {
    "digest": "sha256:cluster",
    "thresholds": {"nccl": {"allReduce": [], "relative": {"minGroups": 1000}}, "training": {"steps": 8}},
}
SIZES = {"min_bytes": "16KiB", "max_bytes": "64KiB", "iters": 2}


def _workflow(port: Any, name: str) -> str:
    """The Argo Workflow of a run, as the controller would have made it; its uid."""
    made = port.create_object(
        {
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "Workflow",
            "metadata": {"name": name, "namespace": NS, "uid": str(uuid.uuid4())},
        }
    )
    return str(made["metadata"]["uid"])


def _fan_out(step: Callable[[str, RunRef], Any], items: Iterable[str], run: RunRef) -> list[Any]:
    items = list(items)
    if not items:
        return []
    with ThreadPoolExecutor(max_workers=len(items)) as pool:
        return list(pool.map(lambda item: step(item, run), items))


def _left(port: Any) -> dict[str, list[str]]:
    """What group tests and the run's own records left behind (the kept report aside)."""
    left: dict[str, list[str]] = {}
    for api, kind in (("batch/v1", "Job"), ("v1", "Pod"), ("v1", "Service"), ("v1", "ConfigMap")):
        names = [
            o["metadata"]["name"]
            for o in port.list_objects(api, kind, NS)
            if not o["metadata"]["name"].startswith("dsx-report-")
            and not o["metadata"]["name"].startswith("kube-root-ca")
        ]
        if names:
            left[kind] = sorted(names)
    held = [
        lease["metadata"]["name"]
        for lease in port.list_objects("coordination.k8s.io/v1", "Lease", NS)
        if (lease.get("spec") or {}).get("holderIdentity")
    ]
    if held:
        left["Lease"] = sorted(held)
    return left


def _wait_until(check: Callable[[], bool], what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.fixture
def cluster(k8s_cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    made = k8s_cluster(nodes=16, racks=4, gpu="h100", service_accounts=("dsx-ranks",), namespace=NS)
    _steps_on(made, tmp_path, monkeypatch)
    return made


def _steps_on(made: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **more: str) -> None:
    """The environment the steps have in their pods, on the emulated cluster ``made``."""
    for name, value in {
        "DSX_CLUSTER": "kube",
        "KUBECONFIG": str(made.kubeconfig),
        "DSX_NAMESPACE": NS,
        "DSX_GPU_IMAGE": "registry.example/dsx-gpu:0.1.0",
        "DSX_OUTPUT_DIR": str(tmp_path / "out"),
        "DSX_JOB_POLL_S": "0.1",
        "DSX_SCHEDULE_BUDGET_S": "120",
        "DSX_STALE_WAIT_S": "60",
        "DSX_RETRY_BASE_DELAY": "0.05",
        **more,
    }.items():
        monkeypatch.setenv(name, value)


def _certify(port: Any, name: str) -> certify.CertifySummary:
    """One whole run, in the DAG's order; the exit handler last, as Argo runs it."""
    uid = _workflow(port, name)
    plan = certify.plan(launcher="job", workflow_name=name, workflow_uid=uid, **SIZES)  # type: ignore[arg-type]
    try:
        certify.keep_recipe(plan.run, RECIPE)
        nodes = _fan_out(certify.node_check, plan.nodes, plan.run)
        assert [r.status for r in nodes] == ["pass"] * len(plan.nodes), [r.message for r in nodes]
        racks = [g.name for g in plan.groups if g.name != certify.WHOLE]
        assert [r.status for r in _fan_out(certify.group_check, racks, plan.run)] == ["pass"] * 4
        assert certify.group_check(certify.WHOLE, plan.run).status == "pass"
        assert certify.smoke_check(plan.run).status == "pass"
        return certify.report(plan.run)
    finally:
        certify.release(name, uid)


@pytest.mark.story
def test_sixteen_nodes_in_four_racks_are_certified_through_jobs_and_nothing_is_left(cluster) -> None:  # type: ignore[no-untyped-def]
    port = cluster.port(NS)
    summary = _certify(port, "dsx-certify-a1")
    assert summary.status == "passed" and summary.passed == 16, summary.summary
    labels = {n.name: n.labels.get(vocab.LABEL_CERTIFICATION) for n in port.list_nodes()}
    assert labels == {f"node-{i:02d}": "passed" for i in range(16)}
    assert _left(port) == {}
    kept = port.get_object("v1", "ConfigMap", summary.report, NS)
    assert kept is not None and "| node-15 | passed |" in kept["data"]["report.md"]
    events = port.list_objects("v1", "Event", "default")
    assert len([e for e in events if e["reason"] == "DsxCertificationPassed"]) == 16


@pytest.mark.story
def test_a_run_stopped_halfway_then_started_again_ends_certified_and_leaves_nothing(  # type: ignore[no-untyped-def]
    cluster, tmp_path: Path
) -> None:
    """Argo stops a workflow by signalling its pods: the rack stage is stopped while its Jobs run."""
    port = cluster.port(NS)
    name = "dsx-certify-stopped"
    uid = _workflow(port, name)
    plan = certify.plan(launcher="job", workflow_name=name, workflow_uid=uid, **SIZES)  # type: ignore[arg-type]
    certify.keep_recipe(plan.run, RECIPE)
    _fan_out(certify.node_check, plan.nodes, plan.run)
    # The rack check of rack-00 in its own process, as in its pod; stopped once its Job's pods run.
    script = (
        "import sys; from steps.readiness import certify; from steps.readiness.outcomes import RunRef; "
        "certify.group_check('rack-00', RunRef.model_validate_json(sys.argv[1]))"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    step = subprocess.Popen(
        [sys.executable, "-c", script, plan.run.model_dump_json()],
        env=env,
        cwd=tmp_path,
        stderr=subprocess.PIPE,
    )

    def running() -> bool:
        pods = port.list_objects("v1", "Pod", NS, vocab.LABEL_GROUP_TEST)
        return len(pods) == 4 and all((p.get("status") or {}).get("phase") == "Running" for p in pods)

    _wait_until(running, "rack-00's four rank pods to run")
    step.send_signal(signal.SIGTERM)
    _, stderr = step.communicate(timeout=120)
    assert step.returncode == 143, stderr.decode()[-2000:]
    _wait_until(lambda: not port.list_objects("v1", "Pod", NS, vocab.LABEL_GROUP_TEST), "the rank pods to go")
    certify.release(name, uid)  # the stopped workflow's exit handler
    # Never certified: the stopped run's nodes stay pending, not passed.
    assert {n.labels.get(vocab.LABEL_CERTIFICATION) for n in port.list_nodes()} == {"pending"}

    summary = _certify(port, "dsx-certify-again")
    assert summary.status == "passed" and summary.passed == 16, summary.summary
    assert {n.labels.get(vocab.LABEL_CERTIFICATION) for n in port.list_nodes()} == {"passed"}
    # What remains of the stopped run is owned by its Workflow: Argo's TTL deletes that, and with it all.
    port.delete_object("argoproj.io/v1alpha1", "Workflow", name, NS)
    _wait_until(
        lambda: _left(port) == {}, f"the stopped run's records to be collected: {_left(port)}", timeout=30
    )


def test_dcgm_diagnostics_run_in_the_nodes_rank_pods_and_fail_the_node(
    k8s_cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """The node check's diagnostics go through the same Job as its sweep: rank 0's pod runs dcgmi (a
    stand-in on the kubelet's PATH, as the GPU image would carry it) and publishes what DCGM said."""
    from tests.steps.readiness.ranks.test_diag import MEMORY_FAILED, stand_in

    made = k8s_cluster(nodes=2, racks=1, gpu="h100", service_accounts=("dsx-ranks",), namespace=NS)
    bin_dir = stand_in(tmp_path / "bin", {"node-01": (MEMORY_FAILED, 226)})
    _steps_on(made, tmp_path, monkeypatch, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    port = made.port(NS)
    name = "dsx-certify-diag"
    uid = _workflow(port, name)
    plan = certify.plan(
        launcher="job",
        selector="kubernetes.io/hostname=node-01",
        diag="memory",
        workflow_name=name,
        workflow_uid=uid,
        **SIZES,
    )  # type: ignore[arg-type]
    try:
        certify.keep_recipe(plan.run, RECIPE)
        result = certify.node_check("node-01", plan.run)
        assert result.status == "fail", result.message
        assert result.message.startswith("node node-01: dcgmi diag -r memory: memory failed (GPU 1: A DBE")
        assert (bin_dir / "argv").read_text().splitlines() == ['["diag", "-r", "memory", "-j"]']
    finally:
        certify.release(name, uid)
    # no Job, pod or Service left: only the run's stored outcomes, which its report step deletes
    assert list(_left(port)) == ["ConfigMap"]
