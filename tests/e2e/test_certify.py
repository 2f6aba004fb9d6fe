"""dsx-certify on the real control plane, submitted with the real ``argo`` CLI, run by the real
workflow-controller with its executor in pods of the process kubelet."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.cluster import NAMESPACE, ROOT
from tests.e2e.conftest import RealCluster

pytestmark = pytest.mark.e2e

FILES = sorted((ROOT / "charts" / "dsx" / "files").glob("*.yaml"))
#: CPU ranks over gloo stand in for the GPUs: the local recipe's relative judging, small messages.
CPU_RUN = [
    "-p",
    "launcher=job",
    "-p",
    "service=local",
    "-p",
    "accelerator=cpu",
    "-p",
    "min-bytes=64KiB",
    "-p",
    "max-bytes=1MiB",
    "-p",
    "iters=5",
]


def test_argo_lint_accepts_every_compiled_template(real_cluster: RealCluster) -> None:
    """The real ``argo lint`` against the cluster (the CRDs' schemas and the installed templates)."""
    workflows = [str(f) for f in FILES if "event-source" not in f.name and "sensor" not in f.name]
    result = real_cluster.argo("lint", "-n", NAMESPACE, *workflows, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no linting errors found" in (result.stdout + result.stderr).lower()


def test_the_chart_installed_every_template(real_cluster: RealCluster) -> None:
    names = {t["metadata"]["name"] for t in real_cluster.get("workflowtemplates", "-n", NAMESPACE)["items"]}
    expected = {
        Path(f).stem.removeprefix("workflow-template-")
        for f in FILES
        if f.name.startswith("workflow-template-")
    }
    assert expected <= names


def test_certify_on_four_nodes_succeeds_and_leaves_nothing_behind(real_cluster: RealCluster) -> None:
    result = real_cluster.argo(
        "submit",
        "-n",
        NAMESPACE,
        "--from",
        "workflowtemplate/dsx-certify",
        "--wait",
        "-o",
        "name",
        *CPU_RUN,
        check=False,
        timeout=1500,
    )
    name = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    assert name, result.stderr + real_cluster.debug()
    workflow = real_cluster.workflow(name)
    phase = workflow["status"].get("phase")
    failed = {
        n["displayName"]: n.get("message", "")
        for n in workflow["status"].get("nodes", {}).values()
        if n.get("phase") in ("Failed", "Error")
    }
    assert phase == "Succeeded", (
        f"{name}: {phase} {workflow['status'].get('message')} {failed}\n{real_cluster.debug()}"
    )

    labels = real_cluster.node_labels()
    assert {n: marks.get("dsx.dev/certification") for n, marks in labels.items()} == dict.fromkeys(
        labels, "passed"
    )
    report = real_cluster.get("configmap", f"dsx-report-{name}", "-n", NAMESPACE)
    assert report["data"], "the report ConfigMap is empty"
    uid = workflow["metadata"]["uid"]
    selector = f"dsx.dev/certification-run={uid}"
    for kind in ("jobs", "services", "leases"):
        assert real_cluster.get(kind, "-n", NAMESPACE, "-l", selector)["items"] == [], f"{kind} left behind"
    rank_pods = real_cluster.get("pods", "-n", NAMESPACE, "-l", "dsx.dev/group-test")["items"]
    assert rank_pods == [], "rank pods left behind"
    listed = real_cluster.argo("list", "-n", NAMESPACE).stdout
    assert name in listed
