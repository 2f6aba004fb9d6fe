"""Steps, suspend, exit handlers and parallelism."""

import json
from pathlib import Path

import pytest

from steps.errors import InputError
from tests.workflows.runner.conftest import RunFixture, by_name, printed
from workflows.runner import Phase, RunResult


def test_steps_run_groups_in_order_and_steps_of_a_group_together(run_fixture: RunFixture) -> None:
    result = run_fixture("steps.yaml", "dsx-fixture-steps", {"side": "tails"})
    assert result.phase is Phase.Succeeded
    root = result.nodes[result.root_id]
    groups = [result.nodes[c] for c in root.children]
    assert [g.display_name for g in groups] == ["[0]", "[1]", "[2]"]
    assert all(g.type == "StepGroup" for g in groups)
    flip, other = (result.node(n) for n in ("flip", "other"))
    assert flip.started_at < other.finished_at and other.started_at < flip.finished_at  # same group
    heads, tails = result.node("heads"), result.node("tails")
    assert heads.phase is Phase.Skipped and tails.phase is Phase.Succeeded
    assert tails.started_at >= max(flip.finished_at, other.finished_at)  # next group waits
    assert root.outputs["parameters"] == [
        {"name": "winner", "value": "tails-won"},
        {"name": "fan", "value": '["n1","n2"]'},
    ]


def test_a_failed_step_fails_its_group_and_stops_the_steps(run_fixture: RunFixture) -> None:
    result = run_fixture("steps.yaml", "dsx-fixture-steps", entrypoint="failing")
    bad = result.node("bad")
    assert result.phase is Phase.Failed
    assert result.message == f"child '{bad.id}' failed"
    assert result.node("ok").phase is Phase.Succeeded
    assert not by_name(result, "never")


def test_suspend_waits_for_approve(run_fixture: RunFixture) -> None:
    result = run_fixture("suspend.yaml", "dsx-fixture-suspend", approve=["approve-drain"])
    assert result.phase is Phase.Succeeded
    pause = result.node("pause")
    assert pause.type == "Suspend" and pause.duration is not None and pause.duration >= 1.0
    assert result.node("approve-drain").message == "resumed by --approve approve-drain"
    assert result.node("after").phase is Phase.Succeeded


def test_suspend_by_template_name_too(run_fixture: RunFixture) -> None:
    result = run_fixture("suspend.yaml", "dsx-fixture-suspend", approve=["approval"])
    assert result.phase is Phase.Succeeded


def test_suspend_without_approve_fails_saying_how_to_approve(run_fixture: RunFixture) -> None:
    result = run_fixture("suspend.yaml", "dsx-fixture-suspend")
    node = result.node("approve-drain")
    assert node.phase is Phase.Failed
    assert "--approve approve-drain" in node.message
    assert result.phase is Phase.Failed
    assert not by_name(result, "after")


def test_approving_a_step_that_does_not_exist_is_an_input_error(
    run_fixture: RunFixture, tmp_path: Path
) -> None:
    with pytest.raises(InputError, match=r"--approve nope: .*suspend steps: approval, approve-drain, pause"):
        run_fixture("suspend.yaml", "dsx-fixture-suspend", approve=["nope"])
    assert not list(tmp_path.iterdir())  # nothing left behind


def test_exit_handler_runs_after_a_failure_and_sees_the_status(run_fixture: RunFixture) -> None:
    result = run_fixture("exit-handler.yaml", "dsx-fixture-exit")
    assert result.phase is Phase.Failed
    breaks = result.node("breaks")
    assert breaks.phase is Phase.Failed
    report_node = result.node("report")
    assert report_node.started_at >= breaks.finished_at
    (artifact,) = report_node.outputs["artifacts"]
    report = json.loads((result.run_dir / artifact["path"]).read_text())
    assert report["status"] == "Failed"
    # Argo Go-quotes the marshalled list: a step reads a JSON string that holds the JSON list
    assert report["failures"].startswith('"[{\\"')
    failed = {f["displayName"]: f for f in json.loads(json.loads(report["failures"]))}
    assert failed["breaks"]["message"] == "main: Error (exit code 1)"
    assert failed["breaks"]["templateName"] == "fail"
    assert failed["breaks"]["podName"] == breaks.pod_name
    # the task-level exit handler ran under its task
    works = result.node("works")
    exit_node = result.node("works.onExit")
    assert exit_node.parent_id == works.id and exit_node.phase is Phase.Succeeded
    assert printed(result, exit_node) == "task exit handler ran"
    assert "result" not in exit_node.outputs  # nothing references an exit handler's result


def _overlap(result: RunResult, prefix: str) -> int:
    spans = []
    for node in result.nodes.values():
        if node.display_name.startswith(prefix) and node.outputs.get("artifacts"):
            stamp = json.loads((result.run_dir / node.outputs["artifacts"][0]["path"]).read_text())
            spans.append((stamp["start"], stamp["end"]))
    assert spans
    return max(sum(1 for s, e in spans if s <= moment < e) for moment, _ in spans)


def test_template_parallelism_bounds_concurrent_steps(run_fixture: RunFixture) -> None:
    result = run_fixture("parallelism.yaml", "dsx-fixture-parallelism")
    assert result.phase is Phase.Succeeded
    assert _overlap(result, "stamp(") == 2


def test_workflow_parallelism_bounds_concurrent_steps(run_fixture: RunFixture) -> None:
    result = run_fixture("parallelism.yaml", "dsx-fixture-serial")
    assert result.phase is Phase.Succeeded
    assert _overlap(result, "stamp(") == 1


def test_dsx_resume_asks_only_a_run_that_is_suspended_for_a_step_it_has(tmp_path: Path) -> None:
    """A folder that holds no run, a --node that is no suspend step of the run, and a run that ended are
    refused on one line (exit 2), writing nothing; a run waiting out its suspend is resumed."""
    import threading
    import time

    from tests.cli import dsx
    from workflows.runner import RunOptions, run

    plain = tmp_path / "plain"
    plain.mkdir()
    refused = dsx("resume", str(plain))
    assert refused.returncode == 2 and "not the folder of a local run" in refused.stderr
    assert list(plain.iterdir()) == []

    entry = {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {"name": "dsx-fixture-wait"},
        "spec": {
            "entrypoint": "main",
            "templates": [
                {"name": "main", "steps": [[{"name": "hold", "template": "wait"}]]},
                {"name": "wait", "suspend": {"duration": "10m"}},
            ],
        },
    }
    run_dir = tmp_path / "run"
    results: list[RunResult] = []
    options = RunOptions(out_dir=run_dir, workflow_name="wf")
    worker = threading.Thread(target=lambda: results.append(run(entry, [], {}, options)))
    worker.start()
    deadline = time.monotonic() + 60
    while not (run_dir / "run.json").exists():
        assert time.monotonic() < deadline and worker.is_alive()
        time.sleep(0.05)
    unknown = dsx("resume", str(run_dir), "--node", "hodl")
    assert unknown.returncode == 2
    assert unknown.stderr.strip() == (
        "error: --node hodl: the run wf has no suspend step or template of that name "
        "(suspend steps: hold, wait)"
    )
    assert not (run_dir / "resume").exists()
    while worker.is_alive():  # a resume reaches a suspend that started before it: ask until it has
        assert time.monotonic() < deadline
        assert dsx("resume", str(run_dir), "--node", "hold").returncode == 0
        worker.join(0.5)
    assert [r.phase for r in results] == [Phase.Succeeded]
    ended = dsx("resume", str(run_dir))
    assert ended.returncode == 2 and "the run wf has ended: nothing to resume" in ended.stderr
