"""The local event player: dsx's compiled EventSource and Sensor read as Argo Events reads them, against
the cluster port of a simulated fleet (gjson paths, expression filters, trigger parameters, rate limits)."""

import copy
import itertools
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from steps.cluster import connect, shareable
from steps.cluster import vocabulary as vocab
from workflows.compiler import compiled_documents
from workflows.runner import gjson
from workflows.runner.errors import UnsupportedConstruct
from workflows.runner.events import Player, SensorPlay, Submission, evaluate, load


def _docs() -> list[dict[str, Any]]:
    return list(compiled_documents().values())


def _sensor() -> SensorPlay:
    _, sensors = load(_docs())
    (sensor,) = sensors
    return sensor


def _node(*conditions: tuple[str, str], tainted: bool = True) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if tainted:
        spec["taints"] = [{"key": vocab.TAINT_UNHEALTHY, "effect": "NoSchedule"}]
    return {
        "metadata": {"name": "node-02", "resourceVersion": "7"},
        "spec": spec,
        "status": {
            "conditions": [{"type": "Ready", "status": "True"}]
            # a True sentinel condition as the agent writes it for a fatal fault (the Sensor fires on that)
            + [
                {"type": t, "status": s, **({"reason": "FatalReboot"} if s == "True" else {})}
                for t, s in conditions
            ]
        },
    }


def _event(body: dict[str, Any], old: dict[str, Any]) -> dict[str, Any]:
    return {"type": "UPDATE", "body": body, "oldBody": old, "group": "", "version": "v1", "resource": "nodes"}


def test_gjson_paths_read_as_gjson_does() -> None:
    node = _node(("DsxGpuXid", "True"), ("DsxGpuEcc", "False"))
    count = 'status.conditions.#(type=="DsxGpuXid")#|#(status=="True")#|#'
    assert gjson.get(node, count) == 1
    assert gjson.get(_node(), count) == 0  # never had the condition: 0, not missing
    assert gjson.get(node, 'spec.taints.#(key=="dsx.dev/unhealthy").effect') == "NoSchedule"
    assert gjson.get(_node(tainted=False), 'spec.taints.#(key=="dsx.dev/unhealthy").effect') is gjson.MISSING
    assert gjson.get(node, 'status.conditions.#(type%"Dsx*")#.type') == ["DsxGpuXid", "DsxGpuEcc"]
    assert gjson.get(node, "status.conditions.1.type") == "DsxGpuXid"
    assert gjson.get({"a": {"b.c": 1}}, "a.b\\.c") == 1
    for path in ("a.*", "a.@reverse", "a..b", "a.#(b)"):
        with pytest.raises(gjson.UnsupportedPath, match="gjson path"):
            gjson.check(path)


def test_expressions_follow_govaluate_and_refuse_anything_else() -> None:
    assert evaluate("now > before", {"now": 1.0, "before": 0.0}) is True
    assert evaluate("a && !b || c == 'x'", {"a": True, "b": True, "c": "x"}) is True
    assert evaluate("(a || b) && !(n - 1 >= 2)", {"a": False, "b": True, "n": 2}) is True
    for bad in ("__import__('os')", "a.b", "a[0]", "unknown > 1"):
        with pytest.raises(UnsupportedConstruct):
            evaluate(bad, {"a": 1})


def test_the_sensor_fires_when_a_check_turns_true_naming_the_node_and_the_check() -> None:
    sensor = _sensor()
    firing = sensor.handle("dsx-nodes", "node-health", _event(_node(("DsxGpuXid", "True")), _node()))
    assert firing.matched == ("dsx_xid",)
    (submission,) = firing.submissions
    assert submission.template == "dsx-remediate"
    assert submission.parameters["node"] == "node-02" and submission.parameters["check"] == "xid"
    assert json.loads(submission.parameters["event"]) == {
        "type": "DsxGpuXid",
        "status": "True",
        "reason": "FatalReboot",
    }
    nic = sensor.handle(
        "dsx-nodes",
        "node-health",
        _event(_node(("DsxGpuXid", "True"), ("DsxNicDegraded", "True")), _node(("DsxGpuXid", "True"))),
    )
    assert [s.parameters["check"] for s in nic.submissions] == ["nic"]


def test_the_sensor_ignores_updates_that_turn_no_check_true() -> None:
    sensor = _sensor()
    unchanged = _node(("DsxGpuXid", "True"))
    for body, old in (
        (unchanged, copy.deepcopy(unchanged)),  # a heartbeat: the condition was already True
        (_node(("DsxGpuXid", "False")), unchanged),  # cleared
        (_node(("DsxNotCertified", "True")), _node()),  # not a sentinel check
        (_node(("Ready", "False")), _node()),
    ):
        firing = sensor.handle("dsx-nodes", "node-health", _event(body, old))
        assert firing.matched == () and firing.submissions == ()
    other = sensor.handle("elsewhere", "node-health", _event(_node(("DsxGpuXid", "True")), _node()))
    assert other.matched == ()


def test_what_the_player_cannot_carry_out_is_refused_naming_it() -> None:
    docs = _docs()
    sensor = next(d for d in docs if d["kind"] == "Sensor")
    with_data = copy.deepcopy(sensor)
    with_data["spec"]["dependencies"][0]["filters"]["data"] = [{"path": "body", "type": "string"}]
    with pytest.raises(UnsupportedConstruct, match=r"filters\.data"):
        load([with_data])
    http = copy.deepcopy(sensor)
    http["spec"]["triggers"][0]["template"] = {"name": "t", "http": {"url": "http://x"}}
    with pytest.raises(UnsupportedConstruct, match="not argoWorkflow"):
        load([http])
    source = next(d for d in docs if d["kind"] == "EventSource")
    pods = copy.deepcopy(source)
    pods["spec"]["resource"]["node-health"]["resource"] = "pods"
    with pytest.raises(UnsupportedConstruct, match="watching v1/pods"):
        load([pods])
    webhook = copy.deepcopy(source)
    webhook["spec"]["webhook"] = {"x": {"port": "12000"}}
    with pytest.raises(UnsupportedConstruct, match=r"spec\.webhook"):
        load([webhook])


def test_the_event_source_passes_only_updates_of_managed_nodes_carrying_the_taint(tmp_path: Path) -> None:
    port = connect(shareable("sim:nodes=3,gpu=h100", tmp_path))
    sources, sensors = load(_docs())
    submitted: list[Submission] = []
    player = Player(port, sources, sensors, submitted.append, report=lambda _: None)
    assert player.poll_once() == []  # the first poll only learns what is there
    port.set_labels("node-00", {"team": "a"})  # untainted: no event
    port.set_labels("node-01", {vocab.LABEL_MANAGED: vocab.MANAGED_FALSE})
    for name in ("node-01", "node-02"):
        port.add_taint(name, vocab.TAINT_UNHEALTHY, effect="NoSchedule")
        port.set_condition(name, vocab.CONDITION_GPU_XID, True, "FatalReboot", "GPU fell off the bus")
    (firing,) = player.poll_once()
    assert firing.matched == ("dsx_xid",)
    assert [(s.parameters["node"], s.parameters["check"]) for s in firing.submissions] == [("node-02", "xid")]
    for thread in player.threads:
        thread.join(5)
    assert [s.parameters["node"] for s in submitted] == ["node-02"]
    port.set_labels("node-02", {"team": "b"})  # tainted, but no check turned True
    assert player.poll_once() == []


def test_the_rate_limit_spaces_firings_and_drops_none() -> None:
    sensor = _sensor()
    trigger = copy.deepcopy(sensor.trigger("dsx-remediate"))
    trigger["rateLimit"] = {"unit": "Second", "requestsPerUnit": 20}
    stop = threading.Event()
    slots, times = [], []
    for _ in range(3):
        assert sensor.wait_for_slot(trigger, stop)
        times.append(time.monotonic())
        slots.append(sensor.last_fired["dsx-remediate"])
    # Each firing gets a slot 1/20 s after the last one's and never leaves before it (a busy machine may
    # return from one late, so the slots are compared, not the return times).
    assert all(b - a >= 0.05 - 1e-9 for a, b in itertools.pairwise(slots))
    assert all(t >= slot for t, slot in zip(times, slots, strict=True))
    hourly = {**trigger, "rateLimit": {"unit": "Hour", "requestsPerUnit": 1}}
    fresh = _sensor()
    stop.set()
    assert fresh.wait_for_slot(hourly, stop) is True  # the first firing never waits
    assert fresh.wait_for_slot(hourly, stop) is False  # the next one waits an hour: stopped meanwhile
