"""The Events tier: the chart's EventSource and Sensor run by the real Argo Events controller on a JetStream
bus, and the local double of the Sensor (:mod:`workflows.runner.events`) given the same node updates.

A sentinel condition turning fatal on a tainted node (written as the agent writes it: the taint first, then
the condition) makes the real Sensor submit one ``dsx-remediate`` Workflow for that node, through the
``argo`` CLI in its pod; a heartbeat of that condition, a degraded reading of another check and a condition
that is not the sentinel's submit none; one update turning two checks fatal at once (it passes two of the
Sensor's dependencies, were they not exclusive: JetStream fires once per dependency) submits one. The double
is handed each update as the real EventSource saw it (the node before and after) and must submit the same
Workflows.

Two things make the counts exact rather than timed. The Workflows the Sensor submits wait on the node's
mutex, which the test holds (a Workflow of its own that only waits), so no remediation runs while they
are counted. And the bus tells when the Sensor is done: it acknowledges a message only once every trigger
it fired has run (argo-events v1.9.11 ``pkg/eventbus/jetstream/sensor/trigger_conn.go``, ``processMsg``
acks after the action), and it reads one subject in order; so once the last update's Workflow is there
and every message is acknowledged, every earlier update has had its say. Then the faults are cleared, the
mutex given back, and each submitted run ends Succeeded as superseded (``guard``: the condition is gone),
leaving the nodes as they were.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from steps.cluster import vocabulary as vocab
from steps.sentinel.events import condition_reason
from tests.e2e.cluster import EVENT_STREAM, NAMESPACE, Cluster
from tests.e2e.conftest import RealCluster
from workflows.runner.events import Submission, load
from workflows.templates.events import EVENT_SOURCE, SENSOR

pytestmark = pytest.mark.e2e

ONE_CHECK = "node-02"
TWO_CHECKS = "node-03"
XID = vocab.CONDITION_SENTINEL["xid"]
ECC = vocab.CONDITION_SENTINEL["ecc"]
THERMAL = vocab.CONDITION_SENTINEL["thermal"]


def _stamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _condition(kind: str, status: str, reason: str, message: str, since: str | None = None) -> dict[str, str]:
    now = _stamp()
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since or now,
        "lastHeartbeatTime": now,
    }


def _conditions(real: RealCluster, node: str, *conditions: dict[str, str]) -> dict[str, Any]:
    """Write ``conditions`` on the node's status; the node as the write left it."""
    patch = json.dumps({"status": {"conditions": list(conditions)}})
    out = real.kubectl(
        "patch", "node", node, "--subresource=status", "--type=strategic", "-p", patch, "-o", "json"
    ).stdout
    result: dict[str, Any] = json.loads(out)
    return result


def _taint(real: RealCluster, node: str, on: bool = True) -> dict[str, Any]:
    taint = f"{vocab.TAINT_UNHEALTHY}=:{vocab.TAINT_UNHEALTHY_EFFECT}" if on else f"{vocab.TAINT_UNHEALTHY}-"
    real.kubectl("taint", "node", node, taint, check=on)
    result: dict[str, Any] = real.get("node", node)
    return result


# ------------------------------------------------------------------ the bus


def _stream(cluster: Cluster) -> dict[str, Any]:
    """The events' stream as the JetStream server reports it (empty before the first client made it)."""
    report = cluster.jetstream("streams=true&consumers=true")
    for account in report.get("account_details") or []:
        for stream in account.get("stream_detail") or []:
            if stream["name"] == EVENT_STREAM:
                found: dict[str, Any] = stream
                return found
    return {}


def _settled(cluster: Cluster, timeout: float = 120) -> None:
    """Wait until the Sensor reads the bus and has acknowledged every message on it (every trigger it
    fired has run)."""
    deadline = time.monotonic() + timeout
    while True:
        stream = _stream(cluster)
        consumers = stream.get("consumer_detail") or []
        last = int((stream.get("state") or {}).get("last_seq", 0))
        if consumers and all(
            int(c["ack_floor"]["stream_seq"]) >= last and not c["num_pending"] and not c["num_ack_pending"]
            for c in consumers
        ):
            return
        if time.monotonic() > deadline:
            raise AssertionError(
                f"the Sensor did not read and acknowledge every event in {timeout:.0f}s: {stream}"
            )
        time.sleep(0.5)


# ------------------------------------------------------------------ Workflows


def _submitted(real: RealCluster, node: str) -> list[dict[str, Any]]:
    """The Workflows the Sensor submitted for ``node`` (Argo Events labels what it submits)."""
    listed = real.get("workflows", "-n", NAMESPACE, "-l", f"events.argoproj.io/sensor={SENSOR}")["items"]
    return [w for w in listed if _parameters(w).get("node") == node]


def _parameters(workflow: dict[str, Any]) -> dict[str, str]:
    return {
        p["name"]: p.get("value", "")
        for p in (workflow["spec"].get("arguments") or {}).get("parameters") or []
    }


def _wait_submitted(real: RealCluster, node: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not _submitted(real, node):
        if time.monotonic() > deadline:
            raise AssertionError(f"the Sensor submitted no Workflow for {node} in {timeout:.0f}s")
        time.sleep(0.5)


def _hold(real: RealCluster, node: str) -> str:
    """Hold ``dsx-remediate``'s mutex for ``node`` with a Workflow that only waits; its name."""
    template = real.get("workflowtemplate", "dsx-remediate", "-n", NAMESPACE)
    (mutex,) = template["spec"]["synchronization"]["mutexes"]
    holder = {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {"generateName": f"hold-{node}-", "namespace": NAMESPACE},
        "spec": {
            "entrypoint": "hold",
            "synchronization": {
                "mutexes": [{"name": mutex["name"].replace("{{workflow.parameters.node}}", node)}]
            },
            "templates": [{"name": "hold", "suspend": {}}],
        },
    }
    name = real.run("kubectl", "create", "-f", "-", "-o", "name", input=json.dumps(holder)).stdout
    name = name.strip().removeprefix("workflow.argoproj.io/")
    deadline = time.monotonic() + 60
    while (
        not ((real.workflow(name).get("status") or {}).get("synchronization") or {})
        .get("mutex", {})
        .get("holding")
    ):
        assert time.monotonic() < deadline, f"{name} did not take the mutex in 60 s"
        time.sleep(0.5)
    return name


def _superseded(real: RealCluster, node: str) -> list[str]:
    """Wait for each Workflow the Sensor submitted for ``node`` to end, and check it ended Succeeded with
    its guard saying not to proceed (the fault gone before it began); their names."""
    names = []
    for workflow in _submitted(real, node):
        name = workflow["metadata"]["name"]
        real.argo("wait", "-n", NAMESPACE, name, timeout=600)
        status = real.workflow(name)["status"]
        guard = next(n for n in status["nodes"].values() if n.get("displayName") == "guard")
        proceed = {p["name"]: p.get("value") for p in guard["outputs"]["parameters"]}["proceed"]
        assert status["phase"] == "Succeeded" and proceed == "false", (name, status.get("message"), guard)
        names.append(name)
    return names


# ------------------------------------------------------------------ the double


class Double:
    """The local double of Argo Events, over the EventSource and Sensor as the cluster has them."""

    def __init__(self, real: RealCluster) -> None:
        docs = [
            real.get(kind, name, "-n", NAMESPACE)
            for kind, name in (("eventsource", EVENT_SOURCE), ("sensor", SENSOR))
        ]
        self.sources, self.sensors = load(docs)

    def update(self, before: dict[str, Any], after: dict[str, Any]) -> list[Submission]:
        """What the update of a node from ``before`` to ``after`` submits."""
        submitted: list[Submission] = []
        for source in self.sources:
            if "UPDATE" not in source.event_types or not source.passes(after):
                continue
            data = {
                "type": "UPDATE",
                "body": after,
                "oldBody": before,
                "group": source.group,
                "version": source.version,
                "resource": source.resource,
            }
            for sensor in self.sensors:
                submitted += sensor.handle(source.source, source.event, data).submissions
        return submitted


def _what(parameters: dict[str, str]) -> tuple[str, str, dict[str, Any]]:
    """A submission as the test compares it: node, check and the condition passed as its event."""
    return parameters["node"], parameters["check"], json.loads(parameters["event"])


# ------------------------------------------------------------------ the scenario


def test_a_fatal_condition_starts_one_remediation_per_node_on_the_real_sensor_and_on_the_double(
    real_cluster: RealCluster, own_cluster: Cluster
) -> None:
    real = real_cluster
    double = Double(real)
    _settled(own_cluster)  # the Sensor is subscribed and has caught up
    holders = [_hold(real, node) for node in (ONE_CHECK, TWO_CHECKS)]
    expected: dict[str, list[Submission]] = {ONE_CHECK: [], TWO_CHECKS: []}
    try:
        # The agent's fast path: the taint first. The EventSource passes the update (the node now carries
        # it), but no check turned fatal in it.
        for node in (ONE_CHECK, TWO_CHECKS):
            before = real.get("node", node)
            after = _taint(real, node)
            expected[node] += double.update(before, after)
        _settled(own_cluster)
        assert not _submitted(real, ONE_CHECK) and not _submitted(real, TWO_CHECKS)

        # Then the condition, as the agent writes a fatal XID: one Workflow for the node.
        before = real.get("node", ONE_CHECK)
        fatal = _condition(
            XID, "True", condition_reason("fatal", "reset-gpu"), "fatal (reset-gpu): XID 79 on GPU 0"
        )
        after = _conditions(real, ONE_CHECK, fatal)
        expected[ONE_CHECK] += double.update(before, after)
        _wait_submitted(real, ONE_CHECK)

        # None for: the same condition's heartbeat (a new entity, still fatal), a degraded reading of another
        # check (True, not fatal), a condition that is not the sentinel's.
        for changed in (
            {**fatal, "message": "fatal (reset-gpu): XID 79 on GPU 0, GPU 1", "lastHeartbeatTime": _stamp()},
            _condition(THERMAL, "True", condition_reason("degraded", "none"), "degraded: GPU 0 at 88 C"),
            _condition(
                "KernelDeadlock", "True", "DockerHung", "task docker:7 blocked for more than 120 seconds"
            ),
        ):
            before, after = after, _conditions(real, ONE_CHECK, changed)
            expected[ONE_CHECK] += double.update(before, after)

        # One update turning two checks fatal at once, on the other node: it would pass two dependencies.
        before = real.get("node", TWO_CHECKS)
        after = _conditions(
            real,
            TWO_CHECKS,
            _condition(XID, "True", condition_reason("fatal", "reboot"), "fatal (reboot): XID 95 on GPU 1"),
            _condition(
                ECC, "True", condition_reason("fatal", "reset-gpu"), "fatal (reset-gpu): 4 DBE on GPU 1"
            ),
        )
        expected[TWO_CHECKS] += double.update(before, after)
        _wait_submitted(real, TWO_CHECKS)
        _settled(own_cluster)  # every update above has been handled: the bus is read in order

        submitted = {node: _submitted(real, node) for node in expected}
        for node, workflows in submitted.items():
            real_says = sorted(_what(_parameters(w)) for w in workflows)
            double_says = sorted(_what(s.parameters) for s in expected[node])
            assert real_says == double_says, f"{node}: the real Sensor and the double differ"
            assert len(workflows) == 1, (
                f"{node}: {len(workflows)} Workflows: {[w['metadata']['name'] for w in workflows]}"
            )
            (workflow,) = workflows
            assert workflow["spec"]["workflowTemplateRef"] == {"name": "dsx-remediate"}
            status = workflow.get("status") or {}  # behind the held mutex: not a step run yet
            assert status.get("phase") in (None, "", "Pending") and not status.get("nodes"), status.get(
                "phase"
            )
        assert _parameters(submitted[ONE_CHECK][0])["check"] == "xid"
        assert _parameters(submitted[TWO_CHECKS][0])["check"] == "ecc"  # the first of the two, in name order
        event = json.loads(_parameters(submitted[ONE_CHECK][0])["event"])
        assert (event["type"], event["reason"]) == (XID, "FatalResetGpu")
    except BaseException:
        _clear(real, [ONE_CHECK, TWO_CHECKS])
        real.kubectl("delete", "workflows", "-n", NAMESPACE, "-l", f"events.argoproj.io/sensor={SENSOR}")
        real.kubectl("delete", "workflows", "-n", NAMESPACE, *holders)
        raise
    _clear(real, [ONE_CHECK, TWO_CHECKS])
    for holder in holders:
        real.argo("resume", "-n", NAMESPACE, holder)

    # The faults are gone before any run began: each run is superseded and changes nothing.
    for node in expected:
        _superseded(real, node)
        state = real.get("node", node)
        assert not state["spec"].get("unschedulable"), f"{node} left cordoned"
        assert vocab.LABEL_STATE not in (state["metadata"].get("labels") or {})
    real.kubectl("delete", "workflows", "-n", NAMESPACE, "-l", f"events.argoproj.io/sensor={SENSOR}")
    real.kubectl("delete", "workflows", "-n", NAMESPACE, *holders)


def _clear(real: RealCluster, nodes: list[str]) -> None:
    """The nodes back as they were: every condition the test set written False, no taint."""
    for node in nodes:
        state = real.get("node", node)
        cleared = [
            _condition(c["type"], "False", "NoProblem", "no problem")
            for c in state["status"].get("conditions") or []
            if c["status"] == "True" and (c["type"].startswith("Dsx") or c["type"] == "KernelDeadlock")
        ]
        if cleared:
            _conditions(real, node, *cleared)
        _taint(real, node, on=False)
