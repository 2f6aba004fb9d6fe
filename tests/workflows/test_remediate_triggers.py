"""What starts a remediation, and what keeps a stale start from acting: the Sensor's fatal edge,
JetStream's one firing per dependency, at-least-once retries, guard's superseded runs and the
level-triggered reconciler."""

from __future__ import annotations

import copy
import datetime as dt
import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from steps.cluster import connect
from steps.cluster import vocabulary as vocab
from steps.errors import DsxError, InputError
from steps.sentinel import ledger
from steps.sentinel.catalogue import FaultOverrides, load_catalogue
from steps.sentinel.node import build_sentinel
from steps.sentinel.policy import Breaker, BreakerSettings
from steps.sentinel.reconcile import mark_not_ready, plan, remediations
from steps.sentinel.remediate import guard
from tests.cli import dsx_here
from workflows.compiler import compiled_documents
from workflows.runner.events import Player, SensorPlay, Submission, load

XID = vocab.CONDITION_SENTINEL["xid"]
ECC = vocab.CONDITION_SENTINEL["ecc"]


def _sensor() -> SensorPlay:
    _, sensors = load(list(compiled_documents().values()))
    return sensors[0]


def _node(*conditions: dict[str, str], tainted: bool = True) -> dict[str, Any]:
    taints = [{"key": vocab.TAINT_UNHEALTHY, "effect": vocab.TAINT_UNHEALTHY_EFFECT}] if tainted else []
    return {
        "metadata": {"name": "node-02"},
        "spec": {"taints": taints} if taints else {},
        "status": {"conditions": [{"type": "Ready", "status": "True"}, *conditions]},
    }


def _condition(type_: str, reason: str, status: str = "True") -> dict[str, str]:
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": f"{reason}: GPU 0",
        "lastTransitionTime": "2026-01-05T10:00:00Z",
        "lastHeartbeatTime": "2026-01-05T10:00:05Z",
    }


def _update(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    return {"type": "UPDATE", "body": after, "oldBody": before}


def test_a_degraded_reading_then_a_fatal_one_on_the_same_check_starts_a_remediation() -> None:
    sensor = _sensor()
    degraded = _node(_condition(XID, "DegradedContactSupport"), tainted=False)
    tainted = copy.deepcopy(degraded)
    tainted["spec"] = _node(tainted=True)["spec"]
    fatal = _node(_condition(XID, "FatalReboot"))
    # The taint arrives first (the agent's fast path), the condition's reason turns fatal after: that fires.
    assert not sensor.handle("dsx-nodes", "node-health", _update(degraded, tainted)).submissions
    fired = sensor.handle("dsx-nodes", "node-health", _update(tainted, fatal)).submissions
    assert [s.parameters["check"] for s in fired] == ["xid"]
    event = json.loads(fired[0].parameters["event"])
    assert event["reason"] == "FatalReboot" and event["lastTransitionTime"] == "2026-01-05T10:00:00Z"
    # A fatal condition that stays fatal (a new entity, a heartbeat) fires nothing more.
    again = copy.deepcopy(fatal)
    again["status"]["conditions"][1]["message"] = "FatalReboot: GPU 0; GPU 1"
    assert not sensor.handle("dsx-nodes", "node-health", _update(fatal, again)).submissions


def test_the_reconcilers_marking_of_a_node_that_is_down_starts_one_remediation_on_the_sensor(
    sim_fleet: Callable[[str], str],
) -> None:
    """The reconciler writes the taint, then the condition, as the agent does: the Sensor, handed each
    write as an update of its own (an informer that merges none), starts one remediation for the not-ready
    check. Written the other way round it started none: the condition on an untainted node, which the
    EventSource passes over, then the taint with no condition turning fatal in it."""
    port = connect(sim_fleet("sim:nodes=4,gpu=h100,racks=2,workloads=false"))
    port.inject("node-01", "not-ready")  # type: ignore[attr-defined]
    sources, (sensor,) = load(list(compiled_documents().values()))
    seen = [port.get_node("node-01").to_manifest()]

    class Watched:
        """dsx's port, each node write read back as the EventSource's informer would see it."""

        def __getattr__(self, name: str) -> Any:
            call = getattr(port, name)
            if name not in ("add_taint", "set_condition"):
                return call

            def written(node: str, *args: Any, **kwargs: Any) -> Any:
                result = call(node, *args, **kwargs)
                seen.append(port.get_node(node).to_manifest())
                return result

            return written

    quick = load_catalogue(
        changes=FaultOverrides.model_validate(
            {
                "apiVersion": "dsx.dev/v1alpha1",
                "kind": "FaultOverrides",
                "entries": [{"check": "not-ready", "code": "ready-false", "threshold": 0}],
            }
        ),
        source="test",
    )
    (line,) = mark_not_ready(Watched(), quick)  # type: ignore[arg-type]
    assert line.startswith("node-01: marked DsxNodeNotReady")
    assert len(seen) == 3, "one write of the taint, one of the condition"
    fired: list[Submission] = []
    for before, after in itertools.pairwise(seen):
        for source in sources:  # as the EventSource passes an update on: an UPDATE of a node it watches
            if "UPDATE" in source.event_types and source.passes(after):
                fired += sensor.handle(source.source, source.event, _update(before, after)).submissions
    assert [(s.parameters["node"], s.parameters["check"]) for s in fired] == [("node-01", "not-ready")]


def test_one_event_passing_two_dependencies_fires_the_trigger_once_for_each() -> None:
    """JetStream's way, on a Sensor whose dependencies are not exclusive (each check's own filter only)."""
    doc = copy.deepcopy(_sensor().doc)
    for dep in doc["spec"]["dependencies"]:
        dep["filters"]["exprs"] = dep["filters"]["exprs"][:1]
    sensor = SensorPlay(doc)
    before = _node()
    after = _node(_condition(XID, "FatalReboot"), _condition(ECC, "FatalResetGpu"))
    fired = sensor.handle("dsx-nodes", "node-health", _update(before, after)).submissions
    assert sorted(s.parameters["check"] for s in fired) == ["ecc", "xid"]
    assert {s.parameters["node"] for s in fired} == {"node-02"}
    assert {json.loads(s.parameters["event"])["type"] for s in fired} == {XID, ECC}


def test_one_event_turning_two_checks_fatal_starts_one_workflow_for_the_first_check() -> None:
    sensor = _sensor()
    before = _node()
    after = _node(_condition(XID, "FatalReboot"), _condition(ECC, "FatalResetGpu"))
    firing = sensor.handle("dsx-nodes", "node-health", _update(before, after))
    assert firing.matched == ("dsx_ecc",)
    (submission,) = firing.submissions
    assert submission.parameters["node"] == "node-02" and submission.parameters["check"] == "ecc"
    assert json.loads(submission.parameters["event"])["type"] == ECC
    # An earlier check that was fatal already, or that cleared in the update, does not hold a later one back.
    was_fatal = _node(_condition(ECC, "FatalResetGpu"))
    fired = sensor.handle("dsx-nodes", "node-health", _update(was_fatal, after)).submissions
    assert [s.parameters["check"] for s in fired] == ["xid"]
    cleared = _node(_condition(ECC, "NoProblem", status="False"), _condition(XID, "FatalReboot"))
    fired = sensor.handle("dsx-nodes", "node-health", _update(was_fatal, cleared)).submissions
    assert [s.parameters["check"] for s in fired] == ["xid"]


def _player(trigger: dict[str, Any], outcomes: list[Exception | None]) -> tuple[Player, list[str]]:
    sensor = SensorPlay({"metadata": {"name": "s"}, "spec": {"dependencies": [], "triggers": [trigger]}})
    calls: list[str] = []
    lines: list[str] = []

    def submit(_: Submission) -> None:
        calls.append("submit")
        failure = outcomes.pop(0) if outcomes else None
        if failure is not None:
            raise failure

    player = Player(connect("sim:nodes=1"), [], [sensor], submit, lines.append)
    player._start(sensor, Submission("s", "t", "dsx-remediate", {}, ()))
    for thread in player.threads:
        thread.join(timeout=10)
    return player, calls + lines


def test_an_at_least_once_trigger_retries_a_failed_submission_and_a_plain_one_does_not() -> None:
    retried = {
        "template": {"name": "t"},
        "atLeastOnce": True,
        "retryStrategy": {"steps": 3, "duration": "10ms", "factor": 2},
    }
    _, seen = _player(retried, [InputError("no WorkflowTemplate"), InputError("API away")])
    assert seen.count("submit") == 3 and "given up" not in " ".join(seen)
    _, seen = _player({**retried, "atLeastOnce": False}, [InputError("API away")])
    assert seen.count("submit") == 1 and any("given up" in line for line in seen)
    _, seen = _player(retried, [DsxError("a"), DsxError("b"), DsxError("c")])
    assert seen.count("submit") == 3 and any("given up" in line for line in seen)


def test_the_compiled_sensor_delivers_at_least_once_with_retries() -> None:
    doc = next(d for d in compiled_documents().values() if d.get("kind") == "Sensor")
    trigger = doc["spec"]["triggers"][0]
    assert trigger["atLeastOnce"] is True
    assert trigger["retryStrategy"]["steps"] >= 3
    for dep in doc["spec"]["dependencies"]:
        paths = [f["path"] for e in dep["filters"]["exprs"] for f in e["fields"]]
        assert all('(reason%"Fatal*")' in p for p in paths), dep["name"]


# ------------------------------------------------------------------ guard: a stale trigger changes nothing


@pytest.fixture
def fleet(sim_fleet: Callable[[str], str]) -> str:
    return sim_fleet("sim:nodes=4,gpu=h100,racks=2,workloads=false")


def _proceed(tmp_path: Path) -> str:
    return (tmp_path / "out" / "params" / "proceed").read_text()


def _faulted(spec: str, node: str = "node-01", fault: str = "xid=79") -> dict[str, str]:
    """Inject ``fault`` and let the node's agent read it: the taint and the condition, as on a node."""
    port = connect(spec)
    port.inject(node, fault)  # type: ignore[attr-defined]
    build_sentinel(connect(spec), node, load_catalogue()).run_once()
    condition = connect(spec).get_node(node).condition(XID)
    assert condition is not None and condition.status == "True"
    return condition.to_manifest()


def test_a_trigger_whose_condition_cleared_is_superseded_naming_the_run_that_handled_it(
    fleet: str, tmp_path: Path
) -> None:
    event = json.dumps(_faulted(fleet))
    port = connect(fleet)
    ledger.record(port, "node-01", ledger.IN_SERVICE, workflow="dsx-remediate-first", check="xid")
    port.set_condition("node-01", XID, False, "NoProblem", "no xid problem")
    message = guard("node-01", "xid", event=event, workflow_name="dsx-remediate-second")
    assert "nothing to do" in message and _proceed(tmp_path) == "false"
    last = ledger.entries(port, "node-01")[-1]
    assert last.state == "superseded" and last.workflow == "dsx-remediate-second"
    assert "handled by dsx-remediate-first" in last.detail
    node = connect(fleet).get_node("node-01")
    assert not node.unschedulable and vocab.LABEL_STATE not in node.labels  # nothing changed


def test_a_condition_written_before_the_node_returned_to_service_is_stale(fleet: str, tmp_path: Path) -> None:
    event = json.dumps(_faulted(fleet))
    port = connect(fleet)
    back = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=5)  # put back after the condition's last write
    ledger.record(port, "node-01", ledger.IN_SERVICE, workflow="dsx-remediate-first", check="xid", now=back)
    guard("node-01", "xid", event=event, workflow_name="dsx-remediate-second")
    assert _proceed(tmp_path) == "false"
    assert "before node-01 returned to service" in ledger.entries(port, "node-01")[-1].detail


def test_a_standing_fault_proceeds_with_its_detection_time_from_the_condition(
    fleet: str, tmp_path: Path
) -> None:
    condition = _faulted(fleet)
    guard("node-01", "xid", event=json.dumps(condition), workflow_name="dsx-remediate-first")
    assert _proceed(tmp_path) == "true"
    requested = ledger.entries(connect(fleet), "node-01")[-1]
    assert requested.state == "requested"
    assert requested.detail.endswith(f"; observed {condition['lastTransitionTime']}")


def test_an_event_of_another_check_or_not_json_is_refused(fleet: str) -> None:
    condition = _faulted(fleet)
    with pytest.raises(InputError, match="not check ecc's"):
        guard("node-01", "ecc", event=json.dumps(condition))
    with pytest.raises(InputError, match="not JSON"):
        guard("node-01", "xid", event="{oops")


# ------------------------------------------------------------------ the reconciler


def test_the_reconciler_starts_what_the_edges_missed_and_leaves_the_rest_alone(fleet: str) -> None:
    _faulted(fleet, "node-01")
    _faulted(fleet, "node-02")
    port = connect(fleet)
    port.add_taint("node-02")  # (the agents' taint budget of a 4-node fleet held it back)
    port.set_labels("node-02", {vocab.LABEL_STATE: vocab.NodeState.escalated.value})
    port.add_taint("node-03")  # tainted with no sentinel condition: a person's
    found = plan(port)
    assert [(s.node, s.check) for s in found.starts] == [("node-01", "xid")]
    assert json.loads(found.starts[0].event)["type"] == XID
    why = {s.node: s.why for s in found.skips}
    assert "escalated" in why["node-02"] and "no sentinel condition" in why["node-03"]
    # A remediation under way (running or waiting on the node's mutex) is left to it.
    port.create_object(
        {
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "Workflow",
            "metadata": {"name": "dsx-remediate-abcde", "namespace": port.namespace},
            "spec": {
                "workflowTemplateRef": {"name": "dsx-remediate"},
                "arguments": {"parameters": [{"name": "node", "value": "node-01"}]},
            },
            "status": {"phase": "Running"},
        }
    )
    assert remediations(port) == {"node-01": "dsx-remediate-abcde"}
    assert not plan(port).starts


def test_the_reconciler_starts_nothing_while_the_breaker_is_open(fleet: str) -> None:
    _faulted(fleet, "node-01")
    port = connect(fleet)
    breaker = Breaker(port, BreakerSettings(max_share=0.25))
    assert breaker.admit("node-02", 4)[0]
    assert not breaker.admit("node-03", 4)[0]  # trips
    found = plan(port)
    assert not found.starts and found.breaker
    assert "waits for the breaker" in {s.node: s.why for s in found.skips}["node-01"]


@pytest.mark.story
def test_reconcile_cli_dry_run_then_a_run_that_puts_the_node_back(
    fleet: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _faulted(fleet, "node-01")
    code, out, err = dsx_here(capsys, "sentinel", "reconcile", "--cluster", fleet, "--dry-run")
    assert code == 0, out + err
    assert "node-01: would start dsx-remediate for xid" in out
    assert not connect(fleet).get_node("node-01").unschedulable
    code, out, err = dsx_here(
        capsys,
        "sentinel",
        "reconcile",
        "--cluster",
        fleet,
        "-p",
        "iters=2",
        "-p",
        "p-min=0.9",
        "--out",
        str(tmp_path / "runs"),
    )
    assert code == 0, out + err
    assert "node-01: started dsx-remediate-" in out
    node = connect(fleet).get_node("node-01")
    assert not node.has_taint(vocab.TAINT_UNHEALTHY) and vocab.LABEL_STATE not in node.labels
    code, out, _ = dsx_here(capsys, "sentinel", "reconcile", "--cluster", fleet, "-p", "node=node-02")
    assert code == 2 and "set by the reconciler" in out + _


# ------------------------------------------------------------------ the whole story, as the README plays it

PLAY = "sim:nodes=4,gpu=h100,racks=2,repair-delay=1"


def _play(capsys: pytest.CaptureFixture[str], out: Path, *injections: str) -> tuple[str, str]:
    args = [a for i in injections for a in ("--inject", i)]
    code, stdout, stderr = dsx_here(
        capsys,
        "events", "play", "--cluster", PLAY, "--agent", *args, "--until-done", "--for", "3m",
        "--interval", "0.3", "-p", "iters=2", "-p", "p-min=0.9", "--out", str(out),
    )  # fmt: skip
    assert code == 0, stdout + stderr
    return stdout, f"state:{out / 'fleet.json'}"


@pytest.mark.story
def test_a_degraded_xid_then_a_fatal_one_is_remediated_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stdout, spec = _play(capsys, tmp_path / "play", "node-02:xid=162@1", "node-02:xid=79@4")
    assert stdout.count("submit dsx-remediate node=node-02") == 1
    node = connect(spec).get_node("node-02")
    assert not node.unschedulable and not node.has_taint(vocab.TAINT_UNHEALTHY)


@pytest.mark.story
def test_a_second_trigger_for_a_node_just_repaired_is_superseded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, spec = _play(capsys, tmp_path / "play", "node-02:xid=79@1", "node-02:ecc=4@2")
    history = ledger.entries(connect(spec), "node-02")
    requested = [e for e in history if e.state == "requested"]
    superseded = [e for e in history if e.state == "superseded"]
    assert len(requested) == 1 and len(superseded) == 1, [(e.state, e.workflow) for e in history]
    assert f"handled by {requested[0].workflow}" in superseded[0].detail
    assert not any(e.state == "quarantined" and e.workflow == superseded[0].workflow for e in history)
