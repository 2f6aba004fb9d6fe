"""The chart's Argo Events part: the EventSource and the Sensor, their accounts and least RBAC, and the
values that turn them on, off and tune them. Rendered with real helm."""

from typing import Any

from tests.test_chart import CHART, _granted, _of, _render, _template, _validate

EVENTS = "events.enabled=true"
SOURCE_ACCOUNT = "dsx-node-events"
SENSOR_ACCOUNT = "dsx-remediate-sensor"


def _one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (doc,) = _of(docs, kind)
    return doc


def test_events_are_off_by_default_so_a_cluster_without_argo_events_takes_the_chart() -> None:
    docs = _render(CHART)
    assert not _of(docs, "EventSource") and not _of(docs, "Sensor")
    accounts = {d["metadata"]["name"] for d in _of(docs, "ServiceAccount")}
    assert not accounts & {SOURCE_ACCOUNT, SENSOR_ACCOUNT}


def test_the_event_source_and_sensor_pass_validate_manifests_with_the_workflow_they_submit() -> None:
    rendered = _template(CHART, EVENTS)
    _validate(rendered)  # validate-manifests checks the Sensor's workflowTemplateRef against the set
    docs = _render(CHART, EVENTS)
    sensor = _one(docs, "Sensor")
    (trigger,) = sensor["spec"]["triggers"]
    workflow = trigger["template"]["argoWorkflow"]["source"]["resource"]
    assert trigger["template"]["argoWorkflow"]["operation"] == "submit"
    assert workflow["spec"]["workflowTemplateRef"] == {"name": "dsx-remediate"}
    assert "dsx-remediate" in {d["metadata"]["name"] for d in _of(docs, "WorkflowTemplate")}
    for doc in (sensor, _one(docs, "EventSource")):
        assert doc["metadata"]["namespace"] == "gpu-ops"
        assert doc["metadata"]["labels"]["app.kubernetes.io/instance"] == "dsx"


def test_each_runs_as_its_own_account_with_the_least_it_needs() -> None:
    docs = _render(CHART, EVENTS)
    assert _one(docs, "EventSource")["spec"]["template"]["serviceAccountName"] == SOURCE_ACCOUNT
    assert _one(docs, "Sensor")["spec"]["template"]["serviceAccountName"] == SENSOR_ACCOUNT
    accounts = {d["metadata"]["name"] for d in _of(docs, "ServiceAccount")}
    assert {SOURCE_ACCOUNT, SENSOR_ACCOUNT} <= accounts
    assert _granted(docs, SOURCE_ACCOUNT) == [("*", "", "nodes", v) for v in ("list", "watch")]
    assert _granted(docs, SENSOR_ACCOUNT) == [
        ("gpu-ops", "argoproj.io", "workflows", "create"),
        ("gpu-ops", "argoproj.io", "workflows", "list"),
        ("gpu-ops", "argoproj.io", "workflowtemplates", "get"),
    ]
    renamed = _render(CHART, EVENTS, "events.sensor.serviceAccount=sensor", "serviceAccounts.create=false")
    assert _one(renamed, "Sensor")["spec"]["template"]["serviceAccountName"] == "sensor"
    assert _granted(renamed, "sensor") == _granted(docs, SENSOR_ACCOUNT)
    assert "ServiceAccount" not in {d["kind"] for d in renamed}


def test_values_set_the_rate_limit_and_the_event_bus_and_turn_each_part_off() -> None:
    docs = _render(
        CHART,
        EVENTS,
        "events.sensor.rateLimit.unit=Hour",
        "events.sensor.rateLimit.requestsPerUnit=20",
        "events.eventBusName=dsx-bus",
    )
    sensor, source = _one(docs, "Sensor"), _one(docs, "EventSource")
    assert [t["rateLimit"] for t in sensor["spec"]["triggers"]] == [{"unit": "Hour", "requestsPerUnit": 20}]
    assert sensor["spec"]["eventBusName"] == source["spec"]["eventBusName"] == "dsx-bus"
    default = _one(_render(CHART, EVENTS), "Sensor")
    assert [t["rateLimit"] for t in default["spec"]["triggers"]] == [{"unit": "Minute", "requestsPerUnit": 6}]
    assert "eventBusName" not in default["spec"]

    no_sensor = _render(CHART, EVENTS, "events.sensor.enabled=false")
    assert not _of(no_sensor, "Sensor") and _of(no_sensor, "EventSource")
    assert _granted(no_sensor, SENSOR_ACCOUNT) == []
    no_source = _render(CHART, EVENTS, "events.eventSource.enabled=false")
    assert not _of(no_source, "EventSource") and _of(no_source, "Sensor")
    assert _granted(no_source, SOURCE_ACCOUNT) == []


def test_the_event_source_watches_only_managed_nodes_carrying_the_dsx_taint() -> None:
    source = _one(_render(CHART, EVENTS), "EventSource")
    (watch,) = source["spec"]["resource"].values()
    assert (watch["group"], watch["version"], watch["resource"], watch["eventTypes"]) == (
        "",
        "v1",
        "nodes",
        ["UPDATE"],
    )
    assert watch["filter"]["labels"] == [{"key": "dsx.dev/managed", "operation": "!=", "value": "false"}]
    (taint,) = watch["filter"]["fields"]
    assert "dsx.dev/unhealthy" in taint["key"] and taint["value"] == "^NoSchedule$"
