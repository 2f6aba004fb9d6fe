"""Quarantine policy, circuit breaker, drain, and the compiled dsx-remediate run by the local runner."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from steps.cluster import Node, connect, shareable
from steps.cluster import vocabulary as vocab
from steps.cluster.node import Taint
from steps.cluster.sim import FileStore, SimCluster
from steps.errors import InputError
from steps.sentinel import ledger
from steps.sentinel.drain import DrainPolicy, NamespaceMode, drain
from steps.sentinel.events import HealthEvent
from steps.sentinel.policy import Breaker, BreakerSettings, QuarantinePolicy, decide
from steps.sentinel.remediate import check_parameters, guard, repair_problems, repair_wait
from tests.cli import dsx, dsx_here

FAST = {"deadline_s": 2, "force": True, "poll_s": 0.1, "backoff_s": 0.1}


def _event(severity: str = "fatal", action: str = "reset-gpu", healthy: bool = False) -> HealthEvent:
    return HealthEvent(
        node="node-01",
        check="xid",
        component="gpu",
        entity="GPU-0",
        code="79",
        severity=severity,
        action=action,
        healthy=healthy,  # type: ignore[arg-type]
    )


def test_rules_by_severity_and_action_with_opt_out_and_breaker() -> None:
    port = connect("sim:nodes=2,gpu=h100,workloads=false")
    node = port.get_node("node-01")
    policy = QuarantinePolicy()
    assert decide(_event(), node, policy).decision == "remediate"
    assert decide(_event(action="restart-app"), node, policy).decision == "taint"
    assert decide(_event(severity="degraded"), node, policy).decision == "observe"
    assert decide(_event(healthy=True), node, policy).decision == "observe"
    assert decide(_event(), node, policy, breaker_open=True).decision == "taint"
    opted_out = port.set_labels("node-01", {vocab.LABEL_MANAGED: "false"})
    assert decide(_event(), opted_out, policy).decision == "observe"


def test_breaker_trips_stays_open_until_reset() -> None:
    port = connect("sim:nodes=10,gpu=h100,workloads=false")
    now = [dt.datetime(2025, 1, 1, tzinfo=dt.UTC)]
    breaker = Breaker(port, BreakerSettings(max_share=0.2, window_s=600), clock=lambda: now[0])
    assert breaker.admit("node-00", 10)[0]
    assert breaker.admit("node-00", 10)[0]  # the same node again is not a second node
    assert breaker.admit("node-01", 10)[0]
    admitted, why = breaker.admit("node-02", 10)
    assert not admitted and "tripped" in why
    now[0] += dt.timedelta(hours=2)  # the window has passed, yet the breaker stays open
    assert not breaker.admit("node-03", 10)[0]
    assert breaker.status().state == "open"
    breaker.reset("alice")
    assert breaker.status().reset_by == "alice"
    assert breaker.admit("node-03", 10)[0]


@pytest.mark.parametrize(
    ("admitted", "named"),
    [
        ('{"node-01": "yesterday"}', "node node-01 admitted at 'yesterday', not an RFC 3339 time"),
        (
            '{"node-01": "2999-01-01T00:00:00Z"}',
            "node node-01 admitted at 2999-01-01T00:00:00Z, in the future",
        ),
        ('["node-01"]', "key 'admitted' is not a JSON object"),
    ],
)
def test_a_breaker_edited_into_nonsense_is_named_and_can_be_reset(admitted: str, named: str) -> None:
    from steps.sentinel.policy import BREAKER_CONFIGMAP

    port = connect("sim:nodes=4,gpu=h100,workloads=false")
    port.update_state(BREAKER_CONFIGMAP, lambda data: {"state": "closed", "admitted": admitted})
    breaker = Breaker(port, BreakerSettings(max_share=0.5, window_s=600))
    with pytest.raises(InputError, match=f"^ConfigMap {BREAKER_CONFIGMAP}: key 'admitted'") as caught:
        breaker.status()
        breaker.admit("node-02", 4)
    assert named in str(caught.value)
    assert breaker.reset("ops").reset_by == "ops"
    assert breaker.admit("node-02", 4)[0]


def test_drain_never_breaks_a_budget_and_escalates_at_the_deadline() -> None:
    port = connect("sim:nodes=4,gpu=h100,blocking-pdb=true")
    port.cordon("node-01", "test", by="sentinel")
    report = drain(port, "node-01", DrainPolicy(deadline_s=0.5, poll_s=0.05, backoff_s=0.05))
    outcomes = {p.pod: p.outcome for p in report.pods}
    assert report.escalate and not report.complete
    assert outcomes["serving/gateway-7f6d5b-0"] == "blocked"  # minAvailable 2 of 2: never evicted
    assert outcomes["gpu-operator/nvidia-device-plugin-daemonset-1"] == "skipped-daemonset"
    assert outcomes["serving/inference-5d8f7c-1"] == "evicted"
    assert "serving/gateway-7f6d5b-0" in {p.ref for p in port.pods_on("node-01")}
    assert not [c for c in port.calls() if c.method == "delete_pod"]


def test_drain_force_and_delete_after_timeout_are_recorded() -> None:
    port = connect("sim:nodes=4,gpu=h100,blocking-pdb=true")
    port.cordon("node-01", "test", by="sentinel")  # else the controllers put replacements back on it
    modes = {"serving": NamespaceMode(mode="delete-after-timeout", timeout_s=0.1)}
    report = drain(port, "node-01", DrainPolicy(namespaces=modes, deadline_s=5, poll_s=0.05, backoff_s=0.05))
    gateway = next(p for p in report.pods if p.pod == "serving/gateway-7f6d5b-0")
    assert report.complete and gateway.outcome == "deleted" and gateway.attempts >= 1


def test_a_bare_pod_is_not_evicted_unless_the_policy_forces_as_kubectl_drain_refuses_it() -> None:
    """``kubectl drain`` refuses a pod no controller manages unless ``--force`` (nothing would make it
    again): the drain evicts nothing, escalates at once and names it; with force it is evicted."""
    port = connect("sim:nodes=4,gpu=h100")
    port.cordon("node-03", "test", by="sentinel")
    before = {p.ref for p in port.pods_on("node-03")}
    assert "default/debug-shell" in before
    report = drain(port, "node-03", DrainPolicy(deadline_s=5, poll_s=0.05, backoff_s=0.05))
    assert report.escalate and not report.complete
    assert "default/debug-shell" in report.message and "force" in report.message
    assert {p.pod: p.outcome for p in report.pods} == {"default/debug-shell": "unmanaged"}
    assert {p.ref for p in port.pods_on("node-03")} == before  # nothing evicted, nothing deleted
    assert not [c for c in port.calls() if c.method in ("evict", "delete_pod")]

    forced = drain(port, "node-03", DrainPolicy(force=True, deadline_s=5, poll_s=0.05, backoff_s=0.05))
    assert forced.complete and not forced.escalate, forced.message
    assert {p.pod: p.outcome for p in forced.pods}["default/debug-shell"] == "evicted"
    assert "default/debug-shell" not in {p.ref for p in port.pods_on("node-03")}


def test_a_drain_the_api_server_never_answers_ends_in_a_verdict_at_its_deadline() -> None:
    """Past the port's retries the API server still fails: the drain keeps trying until its deadline and
    then says so (escalate), never an error that leaves the node half drained with state=draining."""
    from steps.cluster import RetryPolicy
    from steps.cluster.sim import MemoryStore

    fleet = connect("sim:nodes=4,gpu=h100,workloads=true")
    port = SimCluster(MemoryStore(fleet.fleet()), retry=RetryPolicy(attempts=2, base_delay=0, max_delay=0))
    port.cordon("node-01", "test", by="sentinel")
    port.inject_api(errors=7)  # reads and evictions the port gives up on, more than once
    report = drain(port, "node-01", DrainPolicy(deadline_s=5, poll_s=0.05, backoff_s=0.05))
    assert report.complete and not report.escalate, report.message
    assert len([c for c in port.calls() if c.method.startswith("api:")]) == 7
    assert [p for p in port.pods_on("node-01") if not p.daemonset] == []
    port.inject_api(errors=10**6)  # now nothing answers at all
    report = drain(port, "node-02", DrainPolicy(deadline_s=0.3, poll_s=0.05, backoff_s=0.05))
    assert report.escalate and not report.complete
    assert report.message.startswith("deadline of 0.3s passed: the API server did not answer")


def test_bad_drain_policy_is_an_input_error() -> None:
    from steps.sentinel.remediate import drain as drain_step

    with pytest.raises(InputError, match="drain-policy"):
        drain_step("node-01", "xid", "wf", policy="{not json")


def _three_attempts(tmp_path: Path, sim_fleet: Callable[[str], str], ending: str) -> SimCluster:
    """A fleet whose node-01 had three remediation attempts since it was last in service, each requested
    and then ``ending``; the step environment set for guard."""
    sim_fleet("sim:nodes=2,gpu=h100,workloads=false")
    port = SimCluster(FileStore(tmp_path / "fleet.json"))
    for attempt in (1, 2, 3):
        ledger.record(port, "node-01", "requested", workflow=f"w{attempt}", attempt=attempt, check="xid")
        ledger.record(port, "node-01", ending, workflow=f"w{attempt}", attempt=attempt, check="xid")
    return port


def test_a_node_past_its_attempts_is_escalated_out_of_service(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sim_fleet: Callable[[str], str]
) -> None:
    """An in-service node whose remediations kept being cut short (a person uncordoned it each time) is
    escalated at the limit, and an escalated node never takes new work: cordoned by dsx and tainted."""
    from steps.errors import DsxError
    from steps.sentinel import remediate

    port = _three_attempts(tmp_path, sim_fleet, "cancelled")
    with pytest.raises(DsxError, match="escalated: 3 remediation attempts"):
        remediate.guard("node-01", "xid", workflow_name="w4", max_attempts=3)
    node = port.get_node("node-01")
    assert node.unschedulable and node.has_taint(vocab.TAINT_UNHEALTHY, "NoSchedule")
    assert node.labels[vocab.LABEL_STATE] == vocab.NodeState.escalated.value
    assert node.annotations[vocab.ANNOTATION_CORDONED_BY] == remediate.OWNER


def test_attempts_stopped_before_they_changed_anything_do_not_count_towards_the_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sim_fleet: Callable[[str], str]
) -> None:
    """Three runs stopped before their quarantine (SIGTERM at guard, a lost pod) left only requested and
    ended entries: the node is remediated, not escalated; it once counted them towards max-attempts."""
    from steps.sentinel import remediate

    port = _three_attempts(tmp_path, sim_fleet, "ended")
    told = remediate.guard("node-01", "xid", workflow_name="w4", max_attempts="3")
    assert told.startswith("node-01: remediation attempt 4 (")
    assert (tmp_path / "out" / "params" / "proceed").read_text() == "true"
    assert port.get_node("node-01").labels.get(vocab.LABEL_STATE) != vocab.NodeState.escalated.value
    assert ledger.changed_attempts(ledger.entries(port, "node-01")) == 0


def test_a_node_remediated_three_times_in_thirty_days_is_escalated_for_replacement(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sim_fleet: Callable[[str], str]
) -> None:
    """The lemon rule of recipes/faults/history.yaml: three remediations that returned the node to
    service within 30 days, and the fourth fault asks for its replacement instead of another repair."""
    from steps.errors import DsxError
    from steps.sentinel import remediate

    port = _three_attempts(tmp_path, sim_fleet, "in-service")
    with pytest.raises(DsxError, match=r"escalated: remediated 3 times within 30 days \(history rule lemon"):
        remediate.guard("node-01", "xid", workflow_name="w4")
    node = port.get_node("node-01")
    assert node.labels[vocab.LABEL_STATE] == vocab.NodeState.escalated.value
    assert node.labels[vocab.LABEL_REPLACE] == vocab.REPLACE_REQUESTED
    assert node.unschedulable and node.has_taint(vocab.TAINT_UNHEALTHY, "NoSchedule")
    assert (tmp_path / "out" / "params" / "proceed").read_text() == "false"


def test_the_clusters_lemon_rule_given_to_guard_replaces_the_shipped_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sim_fleet: Callable[[str], str]
) -> None:
    """The chart gives guard the history of the sentinel's overrides (DSX_FAULT_HISTORY): a fleet that
    allows four returns within 30 days repairs a node a fourth time; one whose rules say nothing of lemons
    never escalates for them; rules that do not read are named."""
    from steps.errors import InputError
    from steps.sentinel import remediate

    port = _three_attempts(tmp_path, sim_fleet, "in-service")
    monkeypatch.setenv(vocab.ENV_FAULT_HISTORY, '{"lemon": {"count": 4, "withinDays": 30}}')
    remediate.guard("node-01", "xid", workflow_name="w4", dry_run=True)
    assert (tmp_path / "out" / "params" / "proceed").read_text() == "false"  # a dry run: decided, not done
    assert port.get_node("node-01").labels.get(vocab.LABEL_STATE) != vocab.NodeState.escalated.value
    assert "would quarantine" in ledger.entries(port, "node-01")[-1].detail
    monkeypatch.setenv(vocab.ENV_FAULT_HISTORY, "xid: []")
    remediate.guard("node-01", "xid", workflow_name="w5", dry_run=True)
    assert "would quarantine" in ledger.entries(port, "node-01")[-1].detail
    monkeypatch.setenv(vocab.ENV_FAULT_HISTORY, '{"lemon": {"count": 0, "withinDays": 30}}')
    with pytest.raises(InputError, match=r"\$DSX_FAULT_HISTORY: lemon.count"):
        remediate.guard("node-01", "xid", workflow_name="w6")


def test_remediations_older_than_the_lemon_window_do_not_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sim_fleet: Callable[[str], str]
) -> None:
    from steps.sentinel import remediate

    sim_fleet("sim:nodes=2,gpu=h100,workloads=false")
    port = SimCluster(FileStore(tmp_path / "fleet.json"))
    now = dt.datetime.now(dt.UTC)
    for attempt, days in ((1, 45), (2, 31), (3, 2)):
        at = now - dt.timedelta(days=days)
        for state in ("requested", "in-service"):
            ledger.record(port, "node-01", state, workflow=f"w{attempt}", attempt=1, check="xid", now=at)
    told = remediate.guard("node-01", "xid", workflow_name="w4")
    assert told.startswith("node-01: remediation attempt 1 (")
    assert (tmp_path / "out" / "params" / "proceed").read_text() == "true"


@pytest.mark.story
def test_remediate_as_the_readme_runs_it_repairs_recertifies_and_uncordons(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The acceptance command exactly: default drain policy, repair delay and timeout. The sample gateway's
    # budget (minAvailable 1 of 2) lets the drain evict its pod once the other replica is healthy. It runs
    # in this process, from the run folder's parent as a user would (its steps and ranks forked from this
    # worker's fork server, which imports torch once); that a dsx process exits with its run's phase is
    # tests/workflows/runner/test_run_cmd.py's to show.
    monkeypatch.chdir(tmp_path)
    code, out, err = dsx_here(
        capsys, "run", "remediate", "--local", "--cluster", "sim:nodes=4,gpu=h100,faults=node-01:xid=79",
        "-p", "node=node-01", "-p", "check=xid",
    )  # fmt: skip
    assert code == 0, out[-3000:] + err[-3000:]
    (fleet,) = tmp_path.glob("dsx-runs/dsx-remediate-*/fleet.json")
    port = SimCluster(FileStore(fleet))
    node = port.get_node("node-01")
    assert not node.unschedulable and not node.has_taint(vocab.TAINT_UNHEALTHY)
    assert vocab.LABEL_STATE not in node.labels and vocab.LABEL_RECERTIFY not in node.labels
    assert node.labels[vocab.LABEL_CERTIFICATION] == "passed"
    # recertification ran the diagnostics an XID calls for (level 3); this machine has no DCGM, which the
    # report says, failing nothing; the check named on the node for it is gone with the remediation
    (report,) = [
        p
        for p in tmp_path.glob("dsx-runs/dsx-remediate-*/**/report.md")
        if "GPU diagnostics" in p.read_text()
    ]
    assert (
        "| node-01 | 3 | pass |  | none ran: DCGM absent (dcgmi is not on this image's PATH) |"
        in report.read_text()
    )
    assert vocab.ANNOTATION_REMEDIATION_CHECK not in node.annotations
    # the repair request is gone with the repair done
    assert vocab.LABEL_REPAIR not in node.labels
    assert port.get_object("v1", "ConfigMap", "dsx-repair-node-01", port.namespace) is None
    assert any(e.detail.startswith("repair requested: reboot of ") for e in ledger.entries(port, "node-01"))
    states = [e.state for e in ledger.entries(port, "node-01")]
    assert states[:2] == ["requested", "quarantined"] and states[-2:] == ["in-service", "ended"]
    evictions = [c for c in port.calls() if c.method == "evict"]
    assert evictions and not any(c.args.get("pod", "").endswith("daemonset-1") for c in evictions)
    assert not [c for c in port.calls() if c.method == "delete_pod"]
    assert not [p for p in port.pods_on("node-01") if not p.daemonset]


def test_breaker_cli_shows_a_trip_and_a_person_resets_it(tmp_path: Path) -> None:
    spec = shareable("sim:nodes=2,gpu=h100,workloads=false", tmp_path)
    breaker = Breaker(connect(spec), BreakerSettings(max_share=0.5))
    assert breaker.admit("node-00", 2)[0] and not breaker.admit("node-01", 2)[0]
    shown = dsx("sentinel", "breaker", "status", "--cluster", spec, "-o", "json")
    assert json.loads(shown.stdout)["state"] == "open", shown.stderr
    reset = dsx("sentinel", "breaker", "reset", "--by", "oncall", "--cluster", spec)
    assert reset.returncode == 0, reset.stderr
    assert Breaker(connect(spec)).status().state == "closed"


def _repairing(boot: str, ready: str, xid: tuple[str, str, str] | None) -> Node:
    """A node whose repair was asked at 12:00:00 on boot ``old`` and last read on its old boot at 12:01:00;
    ``xid``: the check's condition (status, transition, heartbeat), if any."""
    conditions = [{"type": "Ready", "status": ready, "lastTransitionTime": "2026-12-01T12:01:20Z"}]
    if xid is not None:
        status, moved, beat = xid
        conditions.append(
            {"type": "DsxGpuXid", "status": status, "lastTransitionTime": moved, "lastHeartbeatTime": beat}
        )
    annotations = {
        vocab.ANNOTATION_REPAIR_BOOT_ID: "old",
        vocab.ANNOTATION_REPAIR_REQUESTED_AT: "2026-12-01T12:00:00Z",
        vocab.ANNOTATION_REPAIR_BOOTED_AT: "2026-12-01T12:01:00Z",
    }
    return Node.from_manifest(
        {
            "metadata": {"name": "node-01", "annotations": annotations},
            "status": {"nodeInfo": {"bootID": boot}, "conditions": conditions},
        }
    )


@pytest.mark.parametrize(
    ("boot", "ready", "xid", "problems"),
    [
        ("new", "True", ("False", "2026-12-01T12:02:00Z", "2026-12-01T12:02:00Z"), []),
        # a check whose condition was False before the repair was asked (a person asked for it)
        ("new", "True", ("False", "2026-11-30T08:00:00Z", "2026-11-30T08:00:00Z"), []),
        ("new", "True", None, []),
        ("old", "True", None, ["still on boot old (no reboot)"]),
        # the boot id changes first; Ready comes tens of seconds later
        (
            "new",
            "False",
            ("True", "2026-11-30T08:00:00Z", "2026-11-30T08:00:00Z"),
            ["not Ready", "condition DsxGpuXid still True"],
        ),
        (
            "new",
            "True",
            ("True", "2026-11-30T08:00:00Z", "2026-11-30T08:00:00Z"),
            ["condition DsxGpuXid still True"],
        ),
        # cleared after the request, but by a reading of the old boot
        (
            "new",
            "True",
            ("False", "2026-12-01T12:00:30Z", "2026-12-01T12:00:30Z"),
            ["condition DsxGpuXid last written at 2026-12-01T12:00:30Z, before the boot"],
        ),
    ],
)
def test_repaired_means_a_new_boot_ready_and_the_condition_cleared_by_a_reading_of_that_boot(
    boot: str, ready: str, xid: tuple[str, str, str] | None, problems: list[str]
) -> None:
    assert repair_problems(_repairing(boot, ready, xid), "xid") == problems


def test_a_node_a_person_marked_out_of_service_is_not_repaired_until_they_take_the_taint_off() -> None:
    node = _repairing("new", "True", None)
    down = node.model_copy(
        update={"taints": [Taint(key=vocab.TAINT_OUT_OF_SERVICE, value="nodeshutdown", effect="NoExecute")]}
    )
    assert repair_problems(down, "xid") == [
        "out of service (a person's taint node.kubernetes.io/out-of-service, theirs to remove)"
    ]


def test_the_repair_wait_refuses_a_timeout_it_cannot_read_or_keep() -> None:
    with pytest.raises(InputError, match="parameter repair-timeout: invalid duration 'soon'"):
        repair_wait("node-01", "xid", "soon")
    with pytest.raises(InputError, match=r"not between 1s and the repair wait's bound \(168h\)"):
        repair_wait("node-01", "xid", "200h")


#: Each parameter dsx-remediate reads after guard, malformed, and the words its refusal names it with.
BAD_PARAMETERS = [
    ({"repair_timeout": "abc"}, "parameter repair-timeout: invalid duration 'abc'"),
    ({"repair_timeout": "0s"}, "parameter repair-timeout: 0s is not between 1s"),
    ({"repair_timeout": "14400h"}, "parameter repair-timeout: 14400h is not between"),
    ({"drain_policy": "{bad"}, "parameter drain-policy: not JSON"),
    ({"drain_policy": '{"deadline_s": -1}'}, "parameter drain-policy: deadline_s"),
    ({"max_attempts": "abc"}, "parameter max-attempts: 'abc' is not a whole number"),
    ({"max_attempts": "0"}, "parameter max-attempts: 0 is not between 1 and 100"),
    ({"breaker_share": "5"}, "parameter breaker-share: 5 is not a share of the fleet"),
    ({"breaker_window_s": "nan"}, "parameter breaker-window-s: 'nan' is not a finite number"),
    ({"breaker_window_s": "-60"}, "parameter breaker-window-s: -60 is not a positive number"),
    ({"event": '{"bad": 1}'}, "parameter event: node: Field required"),
    ({"event": "{oops"}, "parameter event: not JSON"),
    ({"node": ""}, "parameter node: required"),
    ({"node": "Node_01"}, "parameter node: 'Node_01' is not a node name"),
    ({"check": "disk"}, "check 'disk' is not a sentinel check"),
]


@pytest.mark.parametrize(("bad", "named"), BAD_PARAMETERS)
def test_every_parameter_is_read_before_anything_changes(
    bad: dict[str, str],
    named: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    sim_fleet: Callable[[str], str],
) -> None:
    """guard reads every parameter a later step reads: a malformed one fails the run at guard, naming it,
    before the breaker admits the node or the ledger records anything (a repair-timeout of 'abc' once
    escalated a healthy node and asked for its replacement)."""
    spec = sim_fleet("sim:nodes=4,gpu=h100,workloads=false")
    port = connect(spec)
    before = port.get_node("node-01")
    arguments = {"node": "node-01", "check": "xid", **bad}
    with pytest.raises(InputError, match=named):
        check_parameters(**arguments)
    with pytest.raises(InputError, match=named):
        guard(workflow_name="dsx-remediate-bad", **arguments)
    assert port.get_node("node-01") == before
    assert ledger.entries(port, "node-01") == []
    assert Breaker(port, BreakerSettings()).status().admitted == {}
    assert not (tmp_path / "out" / "params" / "proceed").exists()


def test_parameters_in_range_are_read_into_the_run_settings() -> None:
    settings = check_parameters(
        "node-01",
        "xid",
        "",
        "5",
        "0.25",
        "600",
        json.dumps({"deadline_s": 60, "force": True}),
        "14400",  # bare seconds, as Argo's suspend reads them
    )
    assert (settings.triggered, settings.reading, settings.max_attempts) == (False, None, 5)
    assert settings.breaker == BreakerSettings(max_share=0.25, window_s=600)
    assert settings.drain_policy == DrainPolicy(deadline_s=60, force=True)
    assert settings.repair_timeout_s == 14400


@pytest.mark.parametrize(
    "given",
    ["repair-timeout=abc", "max-attempts=abc", "breaker-share=5", "drain-policy={bad", "node=Node_01"],
)
def test_a_local_run_with_a_malformed_parameter_exits_2_before_it_starts(given: str, tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = dsx("run", "remediate", "--local", "--out", str(out), "-p", "node=node-01", "-p", given)
    assert result.returncode == 2, result.stdout + result.stderr
    name = given.split("=", 1)[0]
    assert f"error: parameter {name}: " in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not out.exists()
