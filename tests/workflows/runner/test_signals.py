"""Stopping a local run: SIGTERM as SIGINT, evidence kept, and no process of the run left behind.

Each case runs ``dsx run --local`` as its own process (in its own session, so the signals sent to it
never reach the tests), with a step that launches two rank processes as dsx's checks do. Every process
the run starts inherits a marker in its environment; once the run is over, none may be left.
"""

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.cli import dsx_started
from tests.paths import REPO
from tests.processes import marked

WORKFLOW = """\
apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata: {generateName: ranks-}
spec:
  entrypoint: main
  arguments:
    parameters:
    - {name: folder}
    - {name: seconds}
  templates:
  - name: main
    inputs:
      parameters:
      - {name: folder, value: '{{workflow.parameters.folder}}'}
      - {name: seconds, value: '{{workflow.parameters.seconds}}'}
    script:
      image: ghcr.io/dsx-dev/dsx:0.1.0
      command: [python]
      args: [-m, hera.workflows.runner, -e, tests.workflows.runner.fixture_steps:launch_ranks]
      source: '{{inputs.parameters}}'
"""


def _wait(condition: object, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return True
        time.sleep(0.1)
    return False


def _files(tmp_path: Path) -> tuple[Path, Path, Path]:
    """The workflow's file, the evidence folder (made) and the run folder."""
    workflow = tmp_path / "ranks.yaml"
    workflow.write_text(WORKFLOW)
    folder, out = tmp_path / "evidence", tmp_path / "run"
    folder.mkdir()
    return workflow, folder, out


def _arguments(workflow: Path, folder: Path, out: Path, seconds: float) -> list[str]:
    return [
        "run", "ranks", "--local", "-f", str(workflow), "--out", str(out), "--allow-host-commands",
        "-p", f"folder={folder}", "-p", f"seconds={seconds}",
    ]  # fmt: skip


def _start(tmp_path: Path, seconds: float, marker: str) -> tuple[subprocess.Popen[str], Path, Path]:
    workflow, folder, out = _files(tmp_path)
    env = dict(os.environ, DSX_TEST_MARK=marker.split("=", 1)[1])
    command = [sys.executable, "-m", "workflows.cli", *_arguments(workflow, folder, out, seconds)]
    process = subprocess.Popen(
        command,
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    return process, folder, out


def _ranks_running(folder: Path, process: subprocess.Popen[str]) -> list[dict[str, int]]:
    notes = [folder / "step.json", folder / "rank-0.json", folder / "rank-1.json"]
    if not _wait(lambda: all(n.exists() for n in notes) or process.poll() is not None, 120):
        pytest.fail("the ranks did not start within 120 s")
    assert process.poll() is None, process.communicate()
    return [json.loads(n.read_text()) for n in notes]


@pytest.mark.story
@pytest.mark.parametrize(
    ("signals", "code"),
    [([signal.SIGTERM], 143), ([signal.SIGINT, signal.SIGINT], 130)],
    ids=["sigterm", "two-quick-ctrl-c"],
)
def test_a_stopped_run_keeps_its_evidence_and_leaves_no_process(
    signals: list[signal.Signals], code: int, tmp_path: Path
) -> None:
    marker = f"DSX_TEST_MARK={uuid.uuid4()}"
    process, folder, out = _start(tmp_path, 300, marker)
    try:
        step, *ranks = _ranks_running(folder, process)
        for rank in ranks:  # in the step's process group: killing the step's group reaches them
            assert rank["pgid"] == step["pgid"] and rank["sid"] == os.getsid(process.pid)
            # forked from the nested server the step was given, which had its module's imports
            assert rank["imported"] == ["xml.dom.minidom"]
        for sig in signals:  # to dsx's process group, as a terminal's Ctrl-C and `timeout` send them
            os.killpg(process.pid, sig)
        stdout, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode == code, f"stdout:\n{stdout[-3000:]}\nstderr:\n{stderr[-3000:]}"
    document = json.loads((out / "workflow.json").read_text())
    assert document["status"]["phase"] == "Failed"
    assert document["status"]["message"] == "Stopped with strategy 'Terminate'"
    assert document["spec"]["shutdown"] == "Terminate"
    assert (out / "nodes").is_dir()  # the steps' logs are kept
    assert f"Stopped by: {signals[0].name} (exit status {code})" in stdout
    left = _wait(lambda: not marked(marker), 15)
    assert left, f"processes of the run still alive: {marked(marker)}"


@pytest.mark.story
def test_a_run_that_ends_leaves_no_process(tmp_path: Path) -> None:
    marker = f"DSX_TEST_MARK={uuid.uuid4()}"
    process, folder, out = _start(tmp_path, 0.5, marker)
    try:
        _, stderr = process.communicate(timeout=180)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode == 0, stderr
    assert json.loads((out / "workflow.json").read_text())["status"]["phase"] == "Succeeded"
    assert not json.loads((folder / "step.json").read_text())["nested"]  # its steps' server is new
    assert _wait(lambda: not marked(marker), 15), f"processes of the run still alive: {marked(marker)}"


@pytest.mark.story
def test_a_run_forked_by_a_server_that_nests_takes_the_nested_server_for_its_steps(tmp_path: Path) -> None:
    """``dsx run`` forked from a fork server with ``nest_for`` naming the runner, as the tests start dsx
    (:mod:`tests.cli`): its steps fork from the server nested in it, with what the forking server had
    imported, not from a new interpreter; each step still leads its own group, its ranks in it, and
    nothing is left once the run ends."""
    marker = f"DSX_TEST_MARK={uuid.uuid4()}"
    workflow, folder, out = _files(tmp_path)
    run = dsx_started(
        *_arguments(workflow, folder, out, 0.5), env=dict(os.environ, DSX_TEST_MARK=marker.split("=", 1)[1])
    )
    try:
        code = run.wait(180)
        _, stderr = run.output()
    finally:
        run.close()
    assert code == 0, stderr
    step = json.loads((folder / "step.json").read_text())
    assert step["nested"] and step["pgid"] == step["pid"]
    ranks = [json.loads((folder / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert all(rank["pgid"] == step["pgid"] and rank["imported"] == ["xml.dom.minidom"] for rank in ranks)
    assert _wait(lambda: not marked(marker), 15), f"processes of the run still alive: {marked(marker)}"
