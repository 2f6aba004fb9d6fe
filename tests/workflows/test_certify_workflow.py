"""`dsx run certify --local`: real all-reduce among local ranks, a simulated fleet, verdicts on the nodes."""

import json
import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from steps.cluster import connect
from steps.cluster import vocabulary as vocab
from steps.readiness.certify import PLAN_OUTPUTS
from tests import yamltext
from tests.cli import dsx, dsx_here, dsx_started
from tests.paths import REPO

SMALL = ["-p", "max-bytes=256KiB", "-p", "iters=8"]


def _certify(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, spec: str, *extra: str
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """``dsx run certify --local`` on ``spec`` with small sweeps, in this process (its steps and ranks forked
    from this process's fork server, whose torch the stories here share; the README's own command runs as
    a new process in :func:`test_a_healthy_local_fleet_is_certified`). A bisection screens the nodes it
    leaves in service for faults failing 90% of tests (2 passes, not 21) unless ``extra`` sets ``p-min``:
    the screening's depth is the subject of the tests that set it."""
    if not any(arg.startswith("p-min=") for arg in extra):
        extra = (*extra, "-p", "p-min=0.9")
    out = tmp_path / "run"
    args = ["run", "certify", "--local", "--cluster", spec, *extra, *SMALL, "--out", str(out), "-o", "json"]
    code, stdout, stderr = dsx_here(capsys, *args)
    return subprocess.CompletedProcess(args, code, stdout, stderr), out


def _labels(out: Path) -> dict[str, str]:
    port = connect(f"state:{out / 'fleet.json'}")
    return {n.name: n.labels.get(vocab.LABEL_CERTIFICATION, "") for n in port.list_nodes()}


@pytest.mark.story
def test_a_healthy_local_fleet_is_certified(tmp_path: Path) -> None:
    """As the README runs it: ``dsx run certify --local``, a process of its own."""
    out = tmp_path / "run"
    result = dsx(
        "run", "certify", "--local", "--cluster", "sim:nodes=3,gpu=h100,racks=1", *SMALL, "--out", str(out),
        "-o", "json",
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert json.loads(result.stdout)["phase"] == "Succeeded"
    assert _labels(out) == {"node-00": "passed", "node-01": "passed", "node-02": "passed"}
    report = json.loads((out / "nodes" / "report(0)" / "artifacts" / "report.json").read_text())
    assert report["status"] == "passed"
    assert {"report.md", "busbw.png", "step-time.png"} <= set(report["files"])


@pytest.mark.story
def test_a_slow_node_fails_the_workflow_and_is_named(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    result, out = _certify(capsys, tmp_path, "sim:nodes=3,gpu=h100,racks=1,faults=node-01:slow-nic")
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    status = json.loads(result.stdout)
    assert status["phase"] == "Failed"
    workflow = json.loads((out / "workflow.json").read_text())
    gate = next(n for n in workflow["status"]["nodes"].values() if n["displayName"] == "gate")
    assert "certification failed: node-01" in gate["message"]
    assert "straggler" in gate["message"]
    assert _labels(out) == {"node-00": "passed", "node-01": "failed", "node-02": "passed"}
    markdown = (out / "nodes" / "report(0)" / "artifacts" / "report.md").read_text()
    assert "| node-01 | failed |" in markdown
    assert "injected" in markdown


@pytest.mark.story
def test_a_crashed_check_step_still_ends_with_a_report_and_every_node_labelled(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A failed check omits nothing after it: the stages run on, the report labels every node."""
    doc = yamltext.load((REPO / "charts/dsx/files/workflow-template-dsx-certify.yaml").read_text())
    (template,) = [t for t in doc["spec"]["templates"] if t["name"] == "node-check"]
    args = template["script"]["args"]
    args[args.index("steps.readiness.certify:node_check")] = "tests.workflows.certify_faults:crash_on_node_01"
    broken = tmp_path / "certify.yaml"
    broken.write_text(yaml.safe_dump(doc))
    out = tmp_path / "run"
    args = ["run", "dsx-certify", "--file", str(broken), "--local"]
    args += ["--allow-host-commands"]  # the crashing check is a test's function, not one of dsx's steps
    args += ["--cluster", "sim:nodes=3,gpu=h100,racks=1", *SMALL, "--out", str(out), "-o", "json"]
    code, stdout, stderr = dsx_here(capsys, *args)
    assert code == 1, stdout[-3000:] + stderr[-3000:]
    workflow = json.loads((out / "workflow.json").read_text())
    phases = {n["displayName"]: n["phase"] for n in workflow["status"]["nodes"].values()}
    assert phases["node-check(1:node-01)"] == "Failed"
    assert phases["report"] == "Succeeded" and phases["gate"] == "Failed"
    assert _labels(out) == {"node-00": "passed", "node-01": "pending", "node-02": "passed"}
    gate = next(n for n in workflow["status"]["nodes"].values() if n["displayName"] == "gate")
    assert "node-01 (pending): check-incomplete" in gate["message"]


def test_certify_template_explains_itself_in_the_argo_ui() -> None:
    doc = yamltext.load((REPO / "charts/dsx/files/workflow-template-dsx-certify.yaml").read_text())
    params = {p["name"]: p for p in doc["spec"]["arguments"]["parameters"]}
    assert set(params) >= {"nodes", "launcher", "accelerator", "min-bytes", "max-bytes"}
    assert params["launcher"]["enum"] == ["auto", "job", "local"]
    assert all(p["description"] for p in params.values())
    steps = {t["name"]: t for t in doc["spec"]["templates"]}
    assert steps["gate"]["script"]["terminationMessagePolicy"] == "FallbackToLogsOnError"
    # The plan's outputs are the files the plan step writes (steps.readiness.certify.PLAN_OUTPUTS).
    assert [p["name"] for p in steps["plan"]["outputs"]["parameters"]] == list(PLAN_OUTPUTS)
    assert steps["report"]["outputs"]["artifacts"] == [{"name": "report", "path": "/tmp/dsx-out"}]


def test_stages_never_share_a_nodes_gpus_and_each_runs_whatever_the_one_before_gave() -> None:
    """Node checks, then racks (and their bisection), then the whole set (and its bisection), then the
    smoke run: no two stages at once, and a stage that failed (or was skipped: no racks; or omitted: nothing
    to bisect) never omits those after it."""
    doc = yamltext.load((REPO / "charts/dsx/files/workflow-template-dsx-certify.yaml").read_text())
    (dag,) = [t["dag"] for t in doc["spec"]["templates"] if t["name"] == "certify"]
    depends = {t["name"]: t.get("depends", "") for t in dag["tasks"]}
    ended = "({0}.Succeeded || {0}.Failed || {0}.Errored || {0}.Skipped)"
    # a bisection runs only when its targets step found a group to bisect: omitted otherwise
    ended_or_omitted = "({0}.Succeeded || {0}.Failed || {0}.Errored || {0}.Skipped || {0}.Omitted)"
    for stage, after in (
        ("group-check", ended.format("node-check")),
        ("bisect-targets", ended.format("group-check")),
        ("bisect-groups", "bisect-targets"),
        ("whole-check", ended_or_omitted.format("bisect-groups")),
        ("bisect-whole-targets", ended.format("whole-check")),
        ("bisect-whole", "bisect-whole-targets"),
        ("smoke-check", ended_or_omitted.format("bisect-whole")),
        ("report", ended.format("smoke-check")),
    ):
        assert depends[stage] == after, stage
    assert doc["spec"]["onExit"] == "exit"  # the run's hold on its nodes is released however it ends
    templates = {t["name"]: t for t in doc["spec"]["templates"]}
    for check in ("node-check", "group-check", "smoke-check"):  # the UI shows each check's one-line verdict
        (verdict,) = templates[check]["outputs"]["parameters"]
        assert verdict["name"] == "verdict" and verdict["valueFrom"]["default"] == ""


def test_malformed_certify_parameters_are_refused_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The plan step would refuse them; dsx run refuses them first, exit 2, and starts nothing (in this
    process: a refusal needs no run)."""
    for bad, message in (
        (["-p", "nodes=a b ==c"], "label selector 'a b ==c'"),
        (["-p", "min-bytes=8MiB", "-p", "max-bytes=1KiB"], "min-bytes 8388608 is larger than max-bytes 1024"),
        (["-p", "iters=0"], "certify option: iters"),
        (["-p", "group-label=not a label"], "is not a node label key"),
    ):
        out = tmp_path / "never"
        code, _, err = dsx_here(capsys, "run", "certify", "--local", *bad, "--out", str(out))
        assert code == 2, err
        assert message in err and not out.exists()


@pytest.mark.story
def test_a_slow_nic_passes_every_node_check_and_bisection_names_the_node(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Issue 12's story: the node checks pass; rack-01 fails together; dsx-bisect names node-02."""
    result, out = _certify(
        capsys, tmp_path, "sim:nodes=4,gpu=h100,racks=2,faults=node-02:slow-nic", "-p", "p-min=0.2"
    )
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    workflow = json.loads((out / "workflow.json").read_text())
    nodes = list(workflow["status"]["nodes"].values())
    checks = [n for n in nodes if n["displayName"].startswith("node-check(")]
    assert len(checks) == 4 and all(n["phase"] == "Succeeded" for n in checks)
    searched = [n for n in nodes if n["displayName"].startswith("search-group(")]
    assert [n["phase"] for n in searched] == ["Succeeded"]
    assert _labels(out) == {n: ("failed" if n == "node-02" else "passed") for n in _labels(out)}
    assert len(_labels(out)) == 4
    reason = connect(f"state:{out / 'fleet.json'}").get_node("node-02").annotations
    assert reason[vocab.ANNOTATION_CERTIFICATION_REASON].startswith(
        "multi-node-bisect fail: node-02: slow in multi-node tests:"
    )
    report = json.loads(next(out.glob("nodes/report*/artifacts/report.json")).read_text())
    (named,) = [v for v in report["verdicts"] if v["test"] == "multi-node-bisect"]
    assert named["node"] == "node-02" and named["probability"] >= 0.99
    screening = {s["group"]: s for s in report["screening"]}
    # rack-00 passed its one group test: it would catch only faults failing 99% of tests; rack-01 was
    # bisected, and node-03 screened beside a partner until a fault failing a fifth of tests would show
    assert (screening["rack-00"]["passes"], screening["rack-00"]["bisected"]) == (1, False)
    assert screening["rack-01"]["bisected"] and screening["rack-01"]["passes"] >= 21


@pytest.mark.story
def test_a_slow_gpu_passes_every_all_reduce_and_the_training_run_names_its_node(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A compute straggler: no sweep sees it (an all-reduce does no arithmetic worth timing), the smoke
    run's step time does, and its rank names the node. A GPU at a quarter of its speed is played as
    90 ms more per step, clear of the skew limit however busy the machine (at half speed, 30 ms fell
    under it once, when load stretched every step)."""
    result, out = _certify(capsys, tmp_path, "sim:nodes=4,gpu=h100,racks=2,faults=node-02:slow-gpu=0.25")
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    nodes = list(json.loads((out / "workflow.json").read_text())["status"]["nodes"].values())
    sweeps = [n for n in nodes if n["displayName"].startswith(("node-check(", "group-check("))]
    assert len(sweeps) == 6 and all(n["phase"] == "Succeeded" for n in sweeps)
    assert not [n for n in nodes if n["displayName"].startswith("search-group(")]
    report = json.loads(next(out.glob("nodes/report*/artifacts/report.json")).read_text())
    failing = {(v["test"], v["node"]) for v in report["verdicts"] if v["status"] == "fail"}
    assert failing == {("smoke-straggler", "node-02")}
    assert _labels(out) == {n: ("failed" if n == "node-02" else "passed") for n in _labels(out)}


@pytest.mark.story
def test_p_min_sets_how_long_bisection_screens_the_nodes_it_leaves_in_service(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """``-p p-min=0.5``: the operator screens for faults failing half their tests or more, so node-03 is
    cleared after 7 passes beside its partner (not 21), and the report says what that screening catches."""
    result, out = _certify(
        capsys, tmp_path, "sim:nodes=4,gpu=h100,racks=2,faults=node-02:slow-nic", "-p", "p-min=0.5"
    )
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    assert _labels(out) == {
        "node-00": "passed",
        "node-01": "passed",
        "node-02": "failed",
        "node-03": "passed",
    }
    report = json.loads(next(out.glob("nodes/report*/artifacts/report.json")).read_text())
    screening = {s["group"]: s for s in report["screening"]}
    assert screening["rack-01"]["bisected"] and screening["rack-01"]["needed"] == 7
    assert 7 <= screening["rack-01"]["passes"] < 21
    assert 0.48 <= screening["rack-01"]["caught"] <= 0.5


@pytest.mark.story
@pytest.mark.parametrize("where", ["state", "kube"])
def test_two_local_certifications_of_one_fleet_at_once_the_second_is_refused_naming_the_first(
    tmp_path: Path, where: str, k8s_cluster: Callable[..., Any]
) -> None:
    """Two dsx run certify --local on one fleet (its state file, or the emulated API server), in two
    processes: the second finds the nodes held by the first, whose process is alive, and is refused
    naming it; the first is certified. The second once took the first's holds over (no Workflow object
    behind a local run) and both measured the same nodes."""
    import time

    from steps.cluster import shareable

    if where == "state":
        state = shareable("sim:nodes=2,gpu=h100,racks=1", tmp_path / "fleet")
        target, port = ["--cluster", state], connect(state)
    else:
        made = k8s_cluster(nodes=2, racks=1)
        target, port = (
            ["--cluster", "kube", "--kubeconfig", str(made.kubeconfig), "-p", "launcher=local"],
            made.port(),
        )

    def certify(name: str) -> list[str]:
        return [
            "run", "certify", "--local", *target, "--out", str(tmp_path / name), "-p", "max-bytes=64KiB",
            "-p", "iters=2",
        ]  # fmt: skip

    first = dsx_started(*certify("first"))
    try:
        deadline = time.monotonic() + 120
        while not any(
            x["spec"].get("holderIdentity")
            for x in port.list_objects("coordination.k8s.io/v1", "Lease", None)  # every namespace
        ):
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()
            time.sleep(0.1)
        # The first is stopped (alive, holding its nodes) while the second runs: a healthy fleet of two is
        # certified in seconds, sooner than the second reaches its plan.
        os.kill(first.pid, signal.SIGSTOP)
        try:
            second = dsx(*certify("second"), timeout=300)
        finally:
            os.kill(first.pid, signal.SIGCONT)
        first_out, first_err = first.communicate(timeout=600)
    finally:
        first.close()
    out, err = second.stdout, second.stderr
    assert first.returncode == 0, first_out[-2000:] + first_err
    name = json.loads((tmp_path / "first" / "run.json").read_text())["workflow"]
    assert second.returncode == 1 and f"is held by dsx-certify/default/{name}/" in out + err, out[-3000:]
    assert {n.labels.get(vocab.LABEL_CERTIFICATION) for n in port.list_nodes()} == {"passed"}
