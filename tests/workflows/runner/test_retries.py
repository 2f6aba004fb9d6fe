"""Retries as Argo's processNodeRetries does them: backoff first, then the policy, then the limit."""

from pathlib import Path
from typing import Any

import pytest

from steps.durations import humanize_duration
from tests.workflows.runner.conftest import shell, workflow
from workflows.runner import NodeStatus, Phase, RunOptions, RunResult, run
from workflows.runner.engine import transient


def _retried(tmp_path: Path, command: str, retry: dict[str, Any]) -> tuple[RunResult, list[str]]:
    """Run ``command`` as task ``t`` under ``retry``; also return every message its Retry node showed."""
    template = shell("step", command, retryStrategy=retry)
    template["container"]["terminationMessagePolicy"] = "FallbackToLogsOnError"
    doc = workflow([{"name": "main", "dag": {"tasks": [{"name": "t", "template": "step"}]}}, template])
    messages: list[str] = []

    def seen(node: NodeStatus) -> None:
        if node.display_name == "t" and node.type == "Retry":
            messages.append(node.message)

    options = RunOptions(
        allow_host_commands=True, out_dir=tmp_path / "run", workflow_name="wf", on_update=seen
    )
    return run(doc, [], {}, options), messages


def test_on_transient_error_retries_only_what_argo_counts_as_transient(tmp_path: Path) -> None:
    retry = {"limit": 2, "retryPolicy": "OnTransientError"}
    dial = "echo 'dial tcp 10.0.0.1:443: connect: connection refused' >&2; exit 1"
    result, _ = _retried(tmp_path / "dial", dial, retry)
    node = result.node("t")
    assert (len(node.children), node.message) == (3, "No more retries left")
    python = "echo 'ConnectionRefusedError: [Errno 111] Connection refused' >&2; exit 1"
    result, _ = _retried(tmp_path / "python", python, retry)
    node = result.node("t")
    assert len(node.children) == 1
    assert node.message == "main: Error (exit code 1): ConnectionRefusedError: [Errno 111] Connection refused"


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("Get https://10.0.0.1/api: dial tcp: i/o timeout", True),
        ("etcdserver: leader changed", True),
        ("read: connection reset by peer", True),
        ("Connection reset by peer", False),  # Argo matches case-sensitively
        ("the server could not find the requested resource", False),
        ("TimeoutError: timed out", False),
    ],
)
def test_transient_messages_are_argos(message: str, expected: bool) -> None:
    assert transient(message) is expected


def test_backoff_comes_before_the_policy(tmp_path: Path) -> None:
    # Argo waits out the backoff, then finds that OnError does not retry a failure
    retry = {"limit": 2, "retryPolicy": "OnError", "backoff": {"duration": "0.2s"}}
    result, messages = _retried(tmp_path, "exit 3", retry)
    node = result.node("t")
    assert (node.phase, node.message, len(node.children)) == (Phase.Failed, "main: Error (exit code 3)", 1)
    assert "Backoff for 0 seconds" in messages


def test_backoff_waits_only_under_a_limit(tmp_path: Path) -> None:
    state = tmp_path / "attempts"
    count = f"n=$(cat {state} 2>/dev/null || echo 0); echo $((n+1)) > {state}; [ $n -ge 2 ]"
    unlimited = {"retryPolicy": "Always", "backoff": {"duration": "0.2s", "factor": 2}}
    result, messages = _retried(tmp_path / "unlimited", count, unlimited)
    assert result.phase is Phase.Succeeded and len(result.node("t").children) == 3
    assert not [m for m in messages if m.startswith("Backoff")]
    state.unlink()
    result, messages = _retried(tmp_path / "limited", count, {**unlimited, "limit": 5})
    assert result.phase is Phase.Succeeded and len(result.node("t").children) == 3
    assert [m for m in messages if m.startswith("Backoff")] == ["Backoff for 0 seconds"] * 2


def test_max_duration_is_checked_before_the_policy(tmp_path: Path) -> None:
    retry = {"limit": 3, "retryPolicy": "OnError", "backoff": {"duration": "1s", "maxDuration": "1ms"}}
    # the attempt outlasts maxDuration for sure (an instant "exit 3" may end within the millisecond)
    result, _ = _retried(tmp_path, "sleep 0.05; exit 3", retry)
    node = result.node("t")
    assert (node.phase, node.message) == (Phase.Failed, "Max duration limit exceeded")
    assert node.outputs["exitCode"] == "3"  # the retry node keeps its last attempt's outputs


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.05, "0 seconds"),
        (1.5, "1 second"),
        (42, "42 seconds"),
        (90, "1 minute 30 seconds"),
        (3725, "1 hour 2 minutes"),
        (5 * 86400 + 7200, "5 days 2 hours"),
    ],
)
def test_backoff_messages_read_like_argos(seconds: float, text: str) -> None:
    assert humanize_duration(seconds) == text
