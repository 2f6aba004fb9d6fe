"""The whole sentinel story on one machine, as the README plays it: the agent on a simulated fleet, a fatal
XID injected mid-run, the taint, the Sensor firing, dsx-remediate running, the simulated repair and the
node back in service, certified."""

import json
from pathlib import Path

import pytest

from steps.cluster import connect
from steps.cluster import vocabulary as vocab
from tests.cli import dsx_here, dsx_started

FLEET = "sim:nodes=4,gpu=h100,racks=2,repair-delay=1"


@pytest.mark.story
def test_a_fatal_xid_mid_run_is_remediated_and_the_node_returns_certified(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "play"
    code, stdout, stderr = dsx_here(
        capsys,
        "events", "play", "--cluster", FLEET, "--agent", "--inject", "node-02:xid=79@1",
        "--until-done", "--for", "3m", "--interval", "0.3", "-p", "iters=2", "-p", "p-min=0.9",
        "--out", str(out),
    )  # fmt: skip
    assert code == 0, stdout + stderr
    lines = stdout.splitlines()

    def first(text: str) -> int:
        return next(i for i, line in enumerate(lines) if text in line)

    # The story in its order: fault, taint, Sensor, remediation, repair (new boot), back in service.
    assert first("inject node-02: xid=79") < first("node node-02: taint off -> on")
    assert first("taint off -> on") < first("sensor dsx-remediate: node-02 matched dsx_xid")
    assert first("matched dsx_xid") < first("submit dsx-remediate node=node-02 check=xid")
    assert first("check=xid") < first("cordoned no -> yes")
    assert first("cordoned no -> yes") < first(" boot ") < first(": Succeeded")  # the repair: a new boot
    assert first("-> recertifying") < first(": Succeeded")
    # the taint comes off in the workflow's last steps, after recertification; the player's poll may see it
    # before it reports the workflow's end, so only the order against recertification is the workflow's own
    assert first("-> recertifying") < first("taint on -> off")
    assert sum("submit dsx-remediate" in line for line in lines) == 1

    node = connect(f"state:{out / 'fleet.json'}").get_node("node-02")
    assert not node.has_taint(vocab.TAINT_UNHEALTHY) and not node.unschedulable
    assert vocab.LABEL_STATE not in node.labels
    assert node.labels[vocab.LABEL_CERTIFICATION] == "passed"
    (run,) = [p for p in out.iterdir() if p.name.startswith("dsx-remediate-")]
    workflow = json.loads((run / "workflow.json").read_text())
    assert workflow["status"]["phase"] == "Succeeded"
    arguments = {p["name"]: p["value"] for p in workflow["spec"]["arguments"]["parameters"]}
    assert (arguments["node"], arguments["check"], arguments["iters"]) == ("node-02", "xid", "2")


def test_a_quiet_fleet_starts_nothing_and_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, stdout, stderr = dsx_here(
        capsys, "events", "play", "--cluster", FLEET, "--agent", "--for", "1s", "--interval", "0.3",
        "--out", str(tmp_path / "quiet"),
    )  # fmt: skip
    assert code == 1
    assert "submit" not in stdout and "no workflow was started" in stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--inject", "node-02"], "expected NODE:FAULT"),
        (["--inject", "node-09:xid=79"], "no node node-09"),
        (
            ["--inject", "node-01:xid=79@1", "--inject", "node-02:nope=1@30"],
            "--inject: fault 'nope=1' on node-02",
        ),
        (["--for", "soon"], "--for 'soon'"),
        (["--for", "-5s"], "--for '-5s'"),
        (["--for", "0s"], "--for '0s'"),
        (["-p", "iters"], "expected KEY=VALUE"),
        (["--cluster", "sim:nodes=2,gpu=h100,faults=node-00:nope"], "nope"),
    ],
)
def test_bad_input_exits_2_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    code, _, stderr = dsx_here(capsys, "events", "play", "--out", str(tmp_path / "x"), *args)
    assert code == 2 and message in stderr
    assert list(tmp_path.iterdir()) == []  # checked before anything played: no run folder


def test_an_out_that_is_a_file_exits_2_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    taken = tmp_path / "taken"
    taken.write_text("not a folder\n", encoding="utf-8")
    code, _, stderr = dsx_here(capsys, "events", "play", "--out", str(taken), "--for", "1s")
    assert code == 2 and f"--out {taken}: exists and is not a folder" in stderr


NEVER_REPAIRED = "sim:nodes=4,gpu=h100,racks=2,repair=never"


def _stopped_run(out: Path) -> dict[str, object]:
    """The one remediation's workflow.json, checked to be a run ``argo stop`` ended with its exit handler."""
    (run,) = [p for p in out.iterdir() if p.name.startswith("dsx-remediate-")]
    workflow = json.loads((run / "workflow.json").read_text())
    assert workflow["spec"]["shutdown"] == "Stop"
    assert (workflow["status"]["phase"], workflow["status"]["message"]) == (
        "Failed",
        "Stopped with strategy 'Stop'",
    )
    nodes = workflow["status"]["nodes"].values()
    (exit_node,) = [n for n in nodes if n["displayName"] == f"{workflow['metadata']['name']}.onExit"]
    assert exit_node["phase"] == "Succeeded"  # record-outcome and the releases ran
    assert {n["displayName"] for n in nodes} >= {"record-outcome", "release-pair", "release"}
    killed = [n for n in nodes if n["type"] == "Pod" and n["phase"] == "Failed"]
    assert killed and all(n["message"] == "Stopped with strategy 'Stop'" for n in killed)
    return workflow


@pytest.mark.story
def test_a_play_that_runs_out_of_time_stops_its_runs_as_argo_stop_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--for`` ends the play while the remediation waits for a repair that never comes: the run is
    stopped with its exit handler (its outcome recorded), its workflow.json kept, and the play says so."""
    out = tmp_path / "play"
    code, stdout, stderr = dsx_here(
        capsys,
        "events", "play", "--cluster", NEVER_REPAIRED, "--agent", "--inject", "node-02:xid=79@1",
        "--for", "10s", "--interval", "0.3", "-p", "repair-timeout=1h", "--out", str(out),
    )  # fmt: skip
    assert code == 1, stdout + stderr
    workflow = _stopped_run(out)
    name = workflow["metadata"]["name"]  # type: ignore[index]
    assert f"stopping {name} as argo stop does" in stdout
    assert f"{name}  Failed" in stdout and "(stopped when the play ended)" in stdout
    # How far the run got in 10 s depends on the machine's load; the agent's taint is on whatever it reached,
    # and a stopped run never takes it off (the SIGTERM story stops its run after the cordon, and checks that)
    assert connect(f"state:{out / 'fleet.json'}").get_node("node-02").has_taint(vocab.TAINT_UNHEALTHY)


@pytest.mark.story
def test_sigterm_stops_the_plays_runs_with_their_exit_handlers_and_exits_143(tmp_path: Path) -> None:
    import signal

    out = tmp_path / "play"
    play = dsx_started(
        "events", "play", "--cluster", NEVER_REPAIRED, "--agent", "--inject", "node-02:xid=79@1",
        "--for", "5m", "--interval", "0.3", "-p", "repair-timeout=1h", "--out", str(out),
    )  # fmt: skip
    try:
        seen = []
        for line in play.lines(timeout=120):
            seen.append(line)
            if "cordoned no -> yes" in line:  # the remediation is under way
                break
        play.send_signal(signal.SIGTERM)
        stdout, stderr = play.communicate(timeout=120)
    finally:
        play.close()
    assert play.returncode == 143, stdout + stderr
    assert "stopped by SIGTERM" in stdout
    workflow = _stopped_run(out)
    assert f"stopping {workflow['metadata']['name']} as argo stop does" in stdout  # type: ignore[index]
    node = connect(f"state:{out / 'fleet.json'}").get_node("node-02")
    # a stopped remediation leaves its node quarantined, never half given back
    assert node.unschedulable and node.has_taint(vocab.TAINT_UNHEALTHY)
