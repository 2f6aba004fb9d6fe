"""Leaf templates: retries, timeouts, inline scripts, containers, environment, outputs, run folder."""

import json
from pathlib import Path

from tests.workflows.runner.conftest import RunFixture, by_name, printed
from workflows.runner import Phase
from workflows.runner.engine import DEADLINE_MESSAGE


def test_a_step_that_fails_twice_succeeds_under_retries(run_fixture: RunFixture, tmp_path: Path) -> None:
    state = tmp_path / "attempts"
    result = run_fixture("retry.yaml", "dsx-fixture-retry", {"state": str(state), "failures": "2"})
    assert result.phase is Phase.Succeeded
    flaky = result.node("flaky")
    assert flaky.type == "Retry"
    attempts = [result.nodes[c] for c in flaky.children]
    assert [a.display_name for a in attempts] == ["flaky(0)", "flaky(1)", "flaky(2)"]
    assert [a.phase for a in attempts] == [Phase.Failed, Phase.Failed, Phase.Succeeded]
    assert attempts[0].message == "main: Error (exit code 3)"
    for number, attempt in enumerate(attempts[:2]):  # {{retries}} is the attempt number
        stderr = (result.run_dir / str(attempt.folder) / "stderr.log").read_text()
        assert f"attempt {number} (retries={number}): failing on purpose" in stderr
    assert printed(result, attempts[2]) == "succeeded after 2 failures"
    assert state.read_text() == "3"
    # backoff: 50ms, then 100ms (factor 2) between attempts
    assert attempts[1].started_at - attempts[0].finished_at >= 0.05
    assert attempts[2].started_at - attempts[1].finished_at >= 0.1


def test_retries_run_out(run_fixture: RunFixture) -> None:
    result = run_fixture("retry.yaml", "dsx-fixture-retry", entrypoint="exhausted")
    node = result.node("always-fails")
    assert (node.phase, node.message) == (Phase.Failed, "No more retries left")
    assert len(node.children) == 2  # limit 1: the first attempt and one retry
    assert result.phase is Phase.Failed


def test_a_failed_step_names_its_error_when_its_log_is_its_termination_message(
    run_fixture: RunFixture,
) -> None:
    result = run_fixture("retry.yaml", "dsx-fixture-retry", entrypoint="not-retried")
    assert result.node("fails-once").message == "main: Error (exit code 1): RuntimeError: failing on purpose"
    # Without FallbackToLogsOnError Argo has only the exit code to show.
    exhausted = run_fixture("retry.yaml", "dsx-fixture-retry", entrypoint="exhausted")
    assert [c.message for c in by_name(exhausted, "always-fails(0)")] == ["main: Error (exit code 1)"]


def test_retry_policy_on_error_does_not_retry_failures(run_fixture: RunFixture) -> None:
    result = run_fixture("retry.yaml", "dsx-fixture-retry", entrypoint="not-retried")
    node = result.node("fails-once")
    assert len(node.children) == 1
    assert (node.phase, node.message) == (
        Phase.Failed,
        "main: Error (exit code 1): RuntimeError: failing on purpose",
    )


def test_a_task_that_runs_past_its_timeout_is_killed(run_fixture: RunFixture) -> None:
    result = run_fixture("timeout.yaml", "dsx-fixture-timeout")
    assert result.phase is Phase.Failed
    for name in ("slow", "deadline"):  # template timeout, activeDeadlineSeconds
        node = result.node(name)
        assert (node.phase, node.message) == (Phase.Failed, DEADLINE_MESSAGE)
        assert node.duration is not None and node.duration < 10
    assert result.finished_at - result.started_at < 10


def test_inline_scripts_containers_and_environment(run_fixture: RunFixture) -> None:
    result = run_fixture("local-commands.yaml", "dsx-fixture-local")
    assert result.phase is Phase.Succeeded
    assert printed(result, result.node("inline")) == "LOCAL"
    shell = result.node("shell")
    assert shell.outputs["parameters"] == [{"name": "file", "value": "LOCAL"}]
    assert printed(result, shell) == f"wrote {shell.pod_name}"
    assert printed(result, result.node("env")) == "from-template"


def test_run_folder_keeps_status_logs_and_artifacts(run_fixture: RunFixture) -> None:
    result = run_fixture("bisect.yaml", "dsx-fixture-bisect", {"items": '["a", "b"]'})
    document = json.loads((result.run_dir / "workflow.json").read_text())
    assert document["kind"] == "Workflow"
    assert document["spec"]["workflowTemplateRef"]["name"] == "dsx-fixture-bisect"
    assert document["status"]["phase"] == "Succeeded"
    nodes = document["status"]["nodes"]
    assert set(nodes) == set(result.nodes)
    split = next(n for n in nodes.values() if n["name"] == "wf.split")
    for key in ("id", "displayName", "templateName", "phase", "startedAt", "finishedAt", "inputs", "outputs"):
        assert key in split
    folder = result.run_dir / split["folder"]
    assert sorted(p.name for p in folder.iterdir()) == ["artifacts", "script", "stderr.log", "stdout.log"]
    assert json.loads((folder / "stdout.log").read_text())["size"] == 2
    assert sorted(p.name for p in (folder / "artifacts").iterdir()) == ["left.json", "right.json", "size"]
    assert (folder / "script").read_text() == '[{"name":"items","value":"[\\"a\\", \\"b\\"]"}]'
