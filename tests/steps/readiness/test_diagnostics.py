"""DCGM's diagnostics in certification: which nodes run which, and a failed diagnostic failing its node."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from steps.cluster import connect
from steps.cluster import vocabulary as vocab
from steps.errors import InputError
from steps.readiness import certify
from steps.readiness.diagnostics import load_policy, node_runs
from steps.readiness.outcomes import OutcomeStore
from tests.steps.readiness.ranks.test_diag import MEMORY_FAILED, NO_HOST_ENGINE, PASSED, stand_in

RECIPE = {"digest": "sha256:feed", "thresholds": {"nccl": {"allReduce": []}}}


def test_the_shipped_policy_decides_for_every_sentinel_check_and_memory_faults_run_the_memory_tests() -> None:
    policy = load_policy()
    assert set(policy.checks) == set(vocab.SENTINEL_CHECKS)
    assert policy.run_for("ecc") == policy.run_for("remap") == "memory,memtest"
    assert policy.run_for("xid") == "3" and policy.run_for("nic") == "off"


def test_a_policy_naming_an_unknown_check_or_run_is_refused_naming_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "diagnostics.yaml"
    bad.write_text(
        "apiVersion: dsx.dev/v1alpha1\nkind: RecertificationDiagnostics\ndefault: '1'\nchecks:\n  ecc: '9'\n"
    )
    with pytest.raises(InputError, match=r"diagnostics.yaml:4: .*checks: ecc: '9' is not a DCGM diagnostic"):
        load_policy(bad)
    bad.write_text(
        "apiVersion: dsx.dev/v1alpha1\nkind: RecertificationDiagnostics\ndefault: '1'\nchecks:\n  gpu: '1'\n"
    )
    with pytest.raises(InputError, match=r"diagnostics.yaml.*'gpu' is not a sentinel check"):
        load_policy(bad)


@pytest.fixture
def fleet(sim_fleet: Callable[[str], str]) -> None:
    sim_fleet("sim:nodes=3,gpu=h100")


def _under_remediation(node: str, check: str, state: str = "recertifying") -> None:
    connect().set_node_metadata(
        node, labels={vocab.LABEL_STATE: state}, annotations={vocab.ANNOTATION_REMEDIATION_CHECK: check}
    )


@pytest.mark.usefixtures("fleet")
def test_auto_runs_diagnostics_only_on_nodes_under_remediation_as_their_check_calls_for() -> None:
    _under_remediation("node-01", "ecc")
    _under_remediation("node-02", "nic")  # a NIC is the sweep's to test: none
    nodes = connect().list_nodes()
    assert node_runs("auto", nodes) == {"node-01": "memory,memtest"}
    # a note left on a node no remediation holds (a person cleared an escalation by hand) runs nothing
    connect().set_node_metadata("node-01", labels={vocab.LABEL_STATE: None})
    assert node_runs("auto", connect().list_nodes()) == {}
    _under_remediation("node-01", "ecc", "escalated")  # a person recertifying an escalated node
    nodes = connect().list_nodes()
    assert node_runs("auto", nodes) == {"node-01": "memory,memtest"}
    assert node_runs("off", nodes) == {}
    assert node_runs(" pcie, memory ", nodes) == {n: "pcie,memory" for n in ("node-00", "node-01", "node-02")}
    assert certify.plan().diagnostics == {"node-01": "memory,memtest"}


@pytest.mark.parametrize("given", ["5", "memory,stress", "", "all"])
def test_a_diag_option_dcgmi_would_refuse_is_refused_before_anything_is_marked(
    fleet: None, given: str
) -> None:
    before = [n.labels for n in connect().list_nodes()]
    with pytest.raises(InputError, match=r"certify option: diag: .* is not a DCGM diagnostic run"):
        certify.plan(diag=given)
    assert [n.labels for n in connect().list_nodes()] == before


@pytest.mark.usefixtures("fleet")
def test_a_failed_memory_test_fails_its_node_which_then_stays_out_of_the_group_tests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = stand_in(tmp_path / "bin", {"node-01": (MEMORY_FAILED, 226), "node-02": (PASSED, 0)})
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    _under_remediation("node-01", "ecc")
    _under_remediation("node-02", "pcie")
    plan = certify.plan(max_bytes="64KiB", iters=2, dcgm_host="localhost:5555")
    certify.keep_recipe(plan.run, RECIPE)
    results = {n: certify.node_check(n, plan.run) for n in plan.nodes}
    assert {n: r.status for n, r in results.items()} == {
        "node-00": "pass",
        "node-01": "fail",
        "node-02": "pass",
    }
    assert results["node-01"].message.startswith("node node-01: dcgmi diag -r memory,memtest: memory failed")
    runs = [json.loads(line) for line in (bin_dir / "argv").read_text().splitlines()]
    assert sorted(r[2] for r in runs) == ["2", "memory,memtest"]  # node-00 runs none
    assert all(r[-2:] == ["--host", "localhost:5555"] for r in runs)
    store = OutcomeStore(connect(), plan.run)
    assert certify.group_members(plan, store, plan.group(certify.WHOLE)) == ["node-00", "node-02"]
    assert certify.smoke_nodes(plan, store) == []  # the whole set's test has not run: all in doubt
    assert certify.group_check(certify.WHOLE, plan.run).status == "pass"
    assert certify.smoke_nodes(plan, store) == ["node-00", "node-02"]  # its sweep passed, not its GPUs
    summary = certify.report(plan.run)  # the smoke run left out
    assert list(summary.failed) == ["node-01"] and "dcgm-diag fail" in summary.failed["node-01"]
    assert summary.passed == 2 and not summary.pending
    report = connect().get_object("v1", "ConfigMap", summary.report, connect().namespace)
    assert report is not None
    markdown = report["data"]["report.md"]
    assert "## GPU diagnostics (DCGM)" in markdown
    assert "| node-01 | memory,memtest | fail | 4.6.0 | software Pass, memory Fail |" in markdown
    assert "| node-02 | 2 | pass | 4.6.0 | software Pass, pcie Pass |" in markdown


@pytest.mark.usefixtures("fleet")
def test_dcgm_absent_is_said_in_the_report_and_fails_no_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = stand_in(tmp_path / "bin", {f"node-0{i}": (NO_HOST_ENGINE, 255) for i in range(3)})
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    plan = certify.plan(max_bytes="64KiB", iters=2, diag="1")
    certify.keep_recipe(plan.run, RECIPE)
    assert all(certify.node_check(n, plan.run).status == "pass" for n in plan.nodes)
    summary = certify.report(plan.run)  # the group tests and smoke run left out: their nodes stay pending
    assert not summary.failed and summary.pending_count == 3
    report = connect().get_object("v1", "ConfigMap", summary.report, connect().namespace)
    assert report is not None
    markdown = report["data"]["report.md"]
    assert (
        "| node-00 | 1 | pass |  | none ran: DCGM absent (no DCGM host engine answers at localhost"
        in markdown
    )
    assert "node node-02: no DCGM diagnostics ran: no DCGM host engine answers" in markdown
