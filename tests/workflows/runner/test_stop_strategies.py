"""Stopping a run from another thread as ``argo stop`` and ``argo terminate`` do (Argo's shutdown
strategies): both kill the running step and start nothing new; ``Stop`` then runs the exit handler,
``Terminate`` does not. The events player stops its runs with ``Stop`` when it ends."""

import dataclasses
import json
import threading
import time
from pathlib import Path

import pytest

from tests import yamltext
from workflows.runner.api import RunControl, run
from workflows.runner.model import NodeStatus, Phase, RunOptions

WORKFLOW = """\
apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata: {name: stopped}
spec:
  entrypoint: main
  onExit: exit
  templates:
  - name: main
    steps:
    - - {name: long, template: sleep}
    - - {name: after, template: sleep}
  - name: sleep
    script: {image: busybox, command: [sh], source: 'sleep 60'}
  - name: exit
    script: {image: busybox, command: [sh], source: 'echo "{{workflow.status}}"'}
"""


def _stopping_when_long_runs(control: RunControl, strategy: str) -> RunOptions:
    """Options whose progress reporter stops the run once the step ``long`` is running."""

    def update(node: NodeStatus) -> None:
        if node.display_name == "long" and node.phase is Phase.Running:
            threading.Timer(0.5, control.stop, (strategy,)).start()  # its process has started by then

    return RunOptions(allow_host_commands=True, on_update=update)


@pytest.mark.parametrize(("strategy", "exit_ran"), [("Stop", True), ("Terminate", False)])
def test_a_stopped_run_ends_as_argos_shutdown_strategy_says(
    tmp_path: Path, strategy: str, exit_ran: bool
) -> None:
    out = tmp_path / "run"
    control = RunControl()
    options = dataclasses.replace(_stopping_when_long_runs(control, strategy), out_dir=out)
    began = time.monotonic()
    result = run(yamltext.load(WORKFLOW), [], {}, options, control=control)
    assert time.monotonic() - began < 30  # the 60 s step was killed
    message = f"Stopped with strategy '{strategy}'"
    assert (result.phase, result.message) == (Phase.Failed, message)
    by_name = {n.display_name: n for n in result.nodes.values()}
    assert (by_name["long"].phase, by_name["long"].message) == (Phase.Failed, message)
    assert "after" not in by_name  # nothing new started
    exits = [n for n in result.nodes.values() if n.display_name.endswith(".onExit")]
    assert bool(exits) is exit_ran
    if exit_ran:
        assert exits[0].phase is Phase.Succeeded
        said = (out / "nodes" / "onExit" / "stdout.log").read_text()
        assert said.strip() == "Failed"  # {{workflow.status}} as the exit handler sees it


def test_a_stop_asked_before_the_run_starts_applies_as_it_starts(tmp_path: Path) -> None:
    control = RunControl()
    control.stop("Stop")
    result = run(
        yamltext.load(WORKFLOW),
        [],
        {},
        RunOptions(allow_host_commands=True, out_dir=tmp_path / "r"),
        control=control,
    )
    assert (result.phase, result.message) == (Phase.Failed, "Stopped with strategy 'Stop'")
    assert not [n for n in result.nodes.values() if n.display_name == "long"]  # its steps never started
    assert [n.phase for n in result.nodes.values() if n.display_name.endswith(".onExit")] == [Phase.Succeeded]


LOCKED = """\
apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata: {name: locked}
spec:
  entrypoint: main
  onExit: exit
  synchronization: {mutexes: [{name: one-at-a-time}]}
  templates:
  - name: main
    script: {image: busybox, command: [sh], source: 'sleep 4'}
  - name: exit
    script: {image: busybox, command: [sh], source: 'echo bye'}
"""


@pytest.mark.story
@pytest.mark.parametrize("strategy", ["Stop", "Terminate"])
def test_a_run_stopped_while_it_waits_for_its_workflows_mutex_ends_failed_having_run_nothing(
    tmp_path: Path, strategy: str
) -> None:
    """The second of two runs sharing a workflow-level mutex waits; stopped then, it ends Failed with the
    stop's message, no node and its workflow.json, never an exception (an exit handler would need the
    mutex it never held)."""
    first = threading.Thread(
        target=run,
        args=(
            yamltext.load(LOCKED),
            [],
            {},
            RunOptions(allow_host_commands=True, out_dir=tmp_path / "first"),
        ),
    )
    first.start()
    while not list((tmp_path / "first").rglob("stdout.log")):  # the first holds the mutex
        time.sleep(0.05)
    control = RunControl()
    threading.Timer(0.5, control.stop, (strategy,)).start()
    second = tmp_path / "second"
    result = run(
        yamltext.load(LOCKED), [], {}, RunOptions(allow_host_commands=True, out_dir=second), control=control
    )
    first.join()
    assert (result.phase, result.message, result.nodes) == (
        Phase.Failed,
        f"Stopped with strategy '{strategy}'",
        {},
    )
    document = json.loads((second / "workflow.json").read_text())
    assert document["status"]["phase"] == "Failed" and document["spec"]["shutdown"] == strategy
