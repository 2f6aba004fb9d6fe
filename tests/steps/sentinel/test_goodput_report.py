"""``dsx goodput``: the ledger read back, every minute of every node accounted for."""

from __future__ import annotations

import base64
import datetime as dt
import gzip
import json
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from steps.cluster import connect, shareable
from steps.errors import InputError
from steps.sentinel import ledger
from steps.sentinel.catalogue import load_catalogue
from steps.sentinel.goodput.ledger_report import STATES, NodeStory, Observation, Verdict, account, parse_since
from steps.sentinel.goodput.metrics import exposition
from steps.sentinel.node import build_sentinel
from tests.cli import dsx, dsx_here

FAST = {"deadline_s": 2, "force": True, "poll_s": 0.1, "backoff_s": 0.1}
T0 = dt.datetime(2025, 3, 1, tzinfo=dt.UTC).timestamp()
H = 3600.0


def _after_now() -> str:
    """A period's end two seconds from now, RFC 3339: after every entry the ledger has yet (its times are
    to the second), without waiting for the clock to get there."""
    return (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=2)).strftime("%Y-%m-%dT%H:%M:%SZ")


def _sums_to_period(report: dict) -> None:
    period = report["period_hours"]
    for node in report["nodes"]:
        assert set(node["hours"]) == set(STATES)
        assert sum(node["hours"].values()) == pytest.approx(period, abs=1e-9), node["node"]
    fleet = report["fleet"]
    assert sum(fleet["hours_by_state"].values()) == pytest.approx(period * fleet["nodes"])
    assert fleet["in_service_gpu_hours"] + sum(fleet["lost_by_cause"].values()) == pytest.approx(
        fleet["gpu_hours"]
    )


@pytest.mark.story
def test_a_remediated_node_shows_detection_and_repair_and_every_minute_is_counted(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # The remediation runs in this process (its steps and ranks forked from this worker's fork server,
    # which imports torch once); the agent and the reports are processes of their own. The repair takes
    # 1.5 s, so the wait for it crosses a second's boundary: the ledger's times are to the second, and a
    # shorter wait could read as none.
    spec = shareable("sim:nodes=4,gpu=h100,faults=node-01:xid=79,repair-delay=1.5", tmp_path)
    # The agent sees XID 79 (its Event and condition say when), then the remediation takes the node.
    seen = dsx("sentinel", "agent", "--once", "--node", "node-01", "--cluster", spec, "--metrics-port", "0")
    assert seen.returncode == 1, seen.stderr
    time.sleep(1.1)
    code, out, err = dsx_here(
        capsys, "run", "remediate", "--local", "--cluster", spec, "--out", str(tmp_path / "run"),
        "-p", "node=node-01", "-p", "check=xid", "-p", f"drain-policy={json.dumps(FAST)}",
        "-p", "repair-timeout=4s", "-p", "iters=2", "-p", "p-min=0.9",
    )  # fmt: skip
    assert code == 0, out + err
    metrics = tmp_path / "goodput.prom"
    until = _after_now()  # the period ends after the node came back (times are to the second)
    result = dsx(
        "goodput", "--cluster", spec, "--since", "7d", "--until", until,
        "-o", "json", "--metrics", str(metrics),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["period_hours"] == 168.0 and report["fleet"]["nodes"] == 4
    _sums_to_period(report)
    [fixed] = report["remediations"]
    assert (fixed["node"], fixed["check"], fixed["xid"], fixed["cause"]) == (
        "node-01",
        "xid",
        "79",
        "xid:RESTART_BM",
    )
    assert fixed["outcome"] == "in-service" and fixed["recertification"] == "passed"
    assert fixed["detect_s"] >= 1 and fixed["repair_s"] > 0
    assert fixed["observed_at"] <= fixed["quarantined_at"] < fixed["returned_at"]
    first = report["nodes"][0]  # ranked by GPU-hours lost
    assert first["node"] == "node-01" and first["lost_gpu_hours"] > 0
    assert {"waiting-for-repair", "waiting-for-recertification"} <= set(first["lost_by_cause"])
    assert [s["state"] for s in first["timeline"]][-2:] == ["recertifying", "in-service"]
    assert all(n["lost_gpu_hours"] == 0 for n in report["nodes"][1:])
    fleet = report["fleet"]
    assert fleet["mean_time_to_repair_s"] == fixed["repair_s"] and fleet["recertification_pass_rate"] == 1.0
    families = {f.name: f for f in text_string_to_metric_families(metrics.read_text())}
    repairs = {s.name: s.value for s in families["dsx_goodput_remediation_duration_seconds"].samples}
    assert repairs["dsx_goodput_remediation_duration_seconds_count"] == 1
    assert repairs["dsx_goodput_remediation_duration_seconds_sum"] == fixed["repair_s"]
    nodes = {s.labels["state"]: s.value for s in families["dsx_goodput_nodes"].samples}
    assert nodes["in-service"] == 4 and sum(nodes.values()) == 4
    table = dsx("goodput", "--cluster", spec, "--plot", str(tmp_path / "goodput.png"))
    assert table.returncode == 0 and "node-01" in table.stdout and "mean time to repair" in table.stdout
    assert (tmp_path / "goodput.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.story
def test_detection_time_outlives_the_event_through_the_ledger(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # The Sensor's event says the agent saw XID 79 two hours ago: its Event has aged out of the API server
    # (none here), the ledger's requested entry keeps when.
    spec = shareable("sim:nodes=4,gpu=h100,faults=node-01:xid=79,repair-delay=0.5", tmp_path)
    build_sentinel(connect(spec), "node-01", load_catalogue()).run_once()  # the fault on the node, as read
    seen = dt.datetime.now(dt.UTC).replace(microsecond=0) - dt.timedelta(hours=2)
    event = {
        "node": "node-01", "check": "xid", "component": "gpu", "entity": "GPU-0", "code": "79",
        "severity": "fatal", "action": "reboot", "healthy": False, "observed_at": seen.isoformat(),
    }  # fmt: skip
    code, out, err = dsx_here(
        capsys, "run", "remediate", "--local", "--cluster", spec, "--out", str(tmp_path / "run"),
        "-p", "node=node-01", "-p", "check=xid", "-p", f"drain-policy={json.dumps(FAST)}",
        "-p", "repair-timeout=4s", "-p", f"event={json.dumps(event)}", "-p", "iters=2", "-p", "p-min=0.9",
    )  # fmt: skip
    assert code == 0, out + err
    stamp = seen.strftime("%Y-%m-%dT%H:%M:%SZ")
    requested = [e for e in ledger.entries(connect(spec), "node-01") if e.state == "requested"]
    assert requested[0].detail.endswith(f"; observed {stamp}")
    result = dsx("goodput", "--cluster", spec, "--since", "7d", "--until", _after_now(), "-o", "json")
    assert result.returncode == 0, result.stderr
    [fixed] = json.loads(result.stdout)["remediations"]
    assert fixed["observed_at"] == stamp
    assert 2 * H <= fixed["detect_s"] < 2 * H + 120


def _story(name: str, ledger: list[tuple[float, str]], **extra: object) -> NodeStory:
    entries = [
        {"at": dt.datetime.fromtimestamp(at, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), "state": state,
         "attempt": 1, "check": "xid"}
        for at, state in ledger
    ]  # fmt: skip
    return NodeStory(name=name, gpus=8, ledger=entries, **extra)  # type: ignore[arg-type]


def test_states_are_clipped_to_the_period_and_causes_follow_the_state() -> None:
    start, end = T0, T0 + 24 * H
    stories = [
        # Quarantined before the period began: only its part inside counts.
        _story(
            "a",
            [
                (start - H, "requested"),
                (start - H, "quarantined"),
                (start + H, "awaiting-repair"),
                (start + 2 * H, "recertifying"),
                (start + 3 * H, "in-service"),
                (start + 3 * H, "ended"),
            ],
            observations=[Observation(start - 2 * H, "xid", "48")],
        ),
        # Found slow by bisection ten hours in; still labelled failed.
        _story("b", [], verdicts=[Verdict(start + 10 * H, "failed", "multi-node-bisect fail: node-b: slow")]),
        # Escalated with no ledger left: the label and its since say when.
        _story("c", [], state="escalated", state_since=start + 20 * H),
        # Failed certification, then passed: out for those five hours only.
        _story(
            "d",
            [],
            verdicts=[Verdict(start + 2 * H, "failed", "nccl busbw"), Verdict(start + 7 * H, "passed")],
        ),
    ]
    report = account(stories, start, end)
    nodes = {n.node: n for n in report.nodes}
    assert nodes["a"].hours["quarantined"] == 1 and nodes["a"].hours["awaiting-repair"] == 1
    assert nodes["a"].hours["recertifying"] == 1 and nodes["a"].hours["in-service"] == 21
    assert nodes["a"].lost_by_cause == {
        "xid:WORKFLOW_XID_48": 8.0,
        "waiting-for-repair": 8.0,
        "waiting-for-recertification": 8.0,
    }
    assert nodes["b"].hours["bisection-suspect"] == 14 and nodes["b"].lost_by_cause == {
        "slow-node-bisection": 112.0
    }
    assert nodes["c"].hours["escalated"] == 4 and nodes["c"].state == "escalated"
    assert nodes["d"].hours["certification-failed"] == 5 and nodes["d"].state == "in-service"
    assert [n.node for n in report.nodes] == ["b", "d", "c", "a"]
    assert report.remediations == []  # quarantined before the period: not a remediation of it
    assert report.fleet.repairs == 0
    _sums_to_period(report.model_dump())
    text = exposition(report)
    assert 'dsx_goodput_lost_gpu_hours{cause="slow-node-bisection"} 112.0' in text
    assert "_created" not in text and exposition(report) == text


def test_a_replaced_machine_ends_its_remediation_and_the_name_is_in_service_after() -> None:
    start, end = T0, T0 + 24 * H
    ledger_of_name = [
        (start + H, "requested"),
        (start + H, "quarantined"),
        (start + 2 * H, "awaiting-repair"),
        (start + 6 * H, "replaced"),  # the machine was terminated; a node of its name joined later
        (start + 6 * H, "ended"),
    ]
    report = account([_story("a", ledger_of_name)], start, end)
    (node,) = report.nodes
    assert node.hours["quarantined"] == 1 and node.hours["awaiting-repair"] == 4
    assert node.hours["in-service"] == 19 and node.state == "in-service"
    (remediation,) = report.remediations
    assert remediation.outcome == "replaced" and remediation.recertification is None
    _sums_to_period(report.model_dump())


def test_the_period_and_its_errors() -> None:
    until = dt.datetime(2025, 3, 8, tzinfo=dt.UTC)
    assert parse_since("7d", until) == dt.datetime(2025, 3, 1, tzinfo=dt.UTC)
    assert parse_since("2025-03-07T12:00:00Z", until) == dt.datetime(2025, 3, 7, 12, tzinfo=dt.UTC)
    for bad in ("7x", "2025-03-09T00:00:00Z", "2025-03-01T00:00:00", "99999999999d", "0001-01-01T00:00:00Z"):
        with pytest.raises(InputError, match="--since"):
            parse_since(bad, until)


def test_bad_options_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = dsx_here(capsys, "goodput", "--cluster", "sim:nodes=2", "--since", "a week")
    assert code == 2 and "--since 'a week'" in err
    code, _, err = dsx_here(capsys, "goodput", "--cluster", "sim:nodes=2", "--plot", "x.svg")
    assert code == 2 and "--plot" in err
    for option, value in (("--since", "99999999999d"), ("--until", "0001-01-01T00:00:00Z")):
        code, _, err = dsx_here(capsys, "goodput", "--cluster", "sim:nodes=2", option, value)
        assert code == 2 and f"{option} '{value}'" in err, err


def test_a_ledger_that_lies_is_read_with_a_warning_for_each_entry_passed_over(tmp_path: Path) -> None:
    """A hand-edited ledger: an attempt that is no number, an entry out of time order (a pod's clock
    behind), a time in the future, a node's value that is no JSON array. Each is named in a warning and
    passed over; the report still counts every second, with no negative duration."""
    spec = shareable("sim:nodes=3,gpu=h100,workloads=false", tmp_path)
    port = connect(spec)
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)

    def at(hours: float) -> str:
        return (now - dt.timedelta(hours=hours)).strftime("%Y-%m-%dT%H:%M:%SZ")

    entries = [
        {"at": at(30), "state": "requested", "attempt": 1, "check": "xid"},
        {"at": at(30), "state": "quarantined", "attempt": 1, "check": "xid"},
        {"at": at(29), "state": "awaiting-repair", "attempt": "abc", "check": "xid"},
        {"at": at(31), "state": "in-service", "attempt": 1, "check": "xid"},  # before the quarantine
        {"at": at(20), "state": "in-service", "attempt": 1, "check": "xid"},
        {"at": at(-48), "state": "quarantined", "attempt": 2, "check": "xid"},  # two days ahead
        {"at": at(10), "state": "draining", "attempt": 1e400, "check": "xid"},
    ]
    month = ledger.month_of(now)
    for node, value in (("node-01", json.dumps(entries)), ("node-02", '{"at": 1}')):
        port.create_object(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {
                    "name": ledger.object_name(node, month),
                    "namespace": port.namespace,
                    "labels": ledger.object_labels(node, month),
                },
                "data": {node: value},
            }
        )
    result = dsx("goodput", "--cluster", spec, "--since", "2d", "-o", "json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    _sums_to_period(report)
    warned = [line for line in result.stderr.splitlines() if line.startswith("warning: ")]
    assert warned == [
        f"warning: ledger ConfigMap {ledger.object_name('node-02', month)}, node node-02: not a JSON array "
        "of entries; skipped",
        "warning: ledger of node-01, entry 3 ('awaiting-repair'): attempt 'abc' is no whole number; skipped",
        f"warning: ledger of node-01, entry 4 ('in-service'): time {at(31)} is before the entry before it "
        f"({at(30)}); skipped",
        f"warning: ledger of node-01, entry 6 ('quarantined'): time {at(-48)} is in the future; skipped",
        "warning: ledger of node-01, entry 7 ('draining'): attempt inf is no whole number; skipped",
    ], result.stderr
    (remediation,) = report["remediations"]
    assert remediation["node"] == "node-01" and remediation["repair_s"] == 10 * 3600
    assert report["warnings"] == [w.removeprefix("warning: ") for w in warned]


@pytest.mark.story
def test_the_weekly_workflow_keeps_the_report_in_a_configmap(tmp_path: Path) -> None:
    spec = shareable("sim:nodes=3,gpu=h100,workloads=false", tmp_path)
    port = connect(spec)
    now = dt.datetime.now(dt.UTC)
    for hours, state in (
        (30, "quarantined"),
        (29, "awaiting-repair"),
        (5, "recertifying"),
        (4, "in-service"),
    ):
        ledger.record(
            port, "node-02", state, workflow="wf", attempt=1, check="ecc", now=now - dt.timedelta(hours=hours)
        )
    run = dsx("run", "goodput", "--local", "--cluster", spec, "--out", str(tmp_path / "run"), timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    kept = port.get_object("v1", "ConfigMap", "dsx-goodput-report", port.namespace)
    assert kept is not None and kept["metadata"]["annotations"]["dsx.dev/report-contents"] == "complete"
    report = json.loads(gzip.decompress(base64.b64decode(kept["binaryData"]["report.json.gz"])))
    _sums_to_period(report)
    node = next(n for n in report["nodes"] if n["node"] == "node-02")
    assert node["hours"]["awaiting-repair"] == pytest.approx(24) and node["lost_by_cause"][
        "ecc"
    ] == pytest.approx(8)
    assert report["fleet"]["mean_time_to_repair_s"] == pytest.approx(26 * H)
    assert "dsx_goodput_lost_gpu_hours" in kept["data"]["metrics.prom"]
    assert "remediations repaired 1" in kept["data"]["summary.txt"]
