"""The chart's monitoring: with its values on, ``helm template`` renders the PrometheusRule (the shipped
rules, overrides applied), the dashboard ConfigMaps for kube-prometheus-stack's Grafana sidecar and the fleet
exporter; the PrometheusRule passes the CRD's schema and promtool, the Argo documents validate-manifests."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.monitoring import DASHBOARDS, rules
from tests.paths import prometheus_binaries
from tests.test_chart import CHART, _docs, _template, _validate

ON = (
    "monitoring.rules.enabled=true",
    "monitoring.dashboards.enabled=true",
    "monitoring.exporter.enabled=true",
    "monitoring.exporter.serviceMonitor.enabled=true",
)

_DURATION = {
    "type": "string",
    "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$",
}
_STRINGS = {"type": "object", "additionalProperties": {"type": "string"}}
PROMETHEUS_RULE_SCHEMA: dict[str, Any] = {
    # The fields of monitoring.coreos.com/v1 PrometheusRule's openAPIV3Schema (prometheus-operator), strict:
    # an unknown field is an error, as the API server's structural pruning would silently drop it.
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PrometheusRule"},
        "metadata": {"type": "object", "required": ["name", "namespace"]},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "groups": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["name"],
                        "additionalProperties": False,
                        "properties": {
                            "name": {"type": "string", "minLength": 1},
                            "interval": _DURATION,
                            "query_offset": _DURATION,
                            "limit": {"type": "integer"},
                            "partial_response_strategy": {
                                "type": "string",
                                "pattern": "^([Aa][Bb][Oo][Rr][Tt]|[Ww][Aa][Rr][Nn])?$",
                            },
                            "labels": _STRINGS,
                            "rules": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "required": ["expr"],
                                    "additionalProperties": False,
                                    "oneOf": [{"required": ["alert"]}, {"required": ["record"]}],
                                    "properties": {
                                        "alert": {"type": "string"},
                                        "record": {"type": "string"},
                                        "expr": {"type": ["string", "integer"]},
                                        "for": _DURATION,
                                        "keep_firing_for": {**_DURATION, "minLength": 1},
                                        "labels": _STRINGS,
                                        "annotations": _STRINGS,
                                    },
                                },
                            },
                        },
                    },
                }
            },
        },
    },
}


def _kinds(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def test_off_by_default() -> None:
    docs = _docs(_template(CHART))
    assert _kinds(docs, "PrometheusRule") == []
    assert [
        d for d in _kinds(docs, "ConfigMap") if "grafana_dashboard" in d["metadata"].get("labels", {})
    ] == []
    assert [d for d in _kinds(docs, "Deployment") if d["metadata"]["name"] == "dsx-exporter"] == []


def test_the_prometheus_rule_is_the_shipped_rules_and_passes_the_crd_schema_and_promtool(
    tmp_path: Path,
) -> None:
    rendered = _template(CHART, *ON)
    _validate(rendered)
    (rule,) = _kinds(_docs(rendered), "PrometheusRule")
    jsonschema.validate(rule, PROMETHEUS_RULE_SCHEMA)
    assert rule["spec"] == rules()
    path = tmp_path / "rendered-rules.yaml"
    path.write_text(yaml.safe_dump(rule["spec"]))
    _, promtool = prometheus_binaries()
    checked = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_schema_check_can_fail() -> None:
    (rule,) = _kinds(_docs(_template(CHART, *ON)), "PrometheusRule")
    rule["spec"]["groups"][1]["rules"][0]["for"] = "fifteen minutes"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(rule, PROMETHEUS_RULE_SCHEMA)
    del rule["spec"]["groups"][1]["rules"][0]["for"]
    rule["spec"]["groups"][1]["rules"][0]["severity"] = "critical"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(rule, PROMETHEUS_RULE_SCHEMA)


def test_overrides_replace_an_alerts_fields_and_an_unknown_alert_is_refused() -> None:
    docs = _docs(
        _template(
            CHART,
            *ON,
            "monitoring.rules.overrides.DsxNodeTaintedWithoutRemediation.for=30m",
            "monitoring.rules.overrides.DsxDriftFound.labels.severity=info",
            "monitoring.rules.labels.release=kube-prometheus-stack",
        )
    )
    (rule,) = _kinds(docs, "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    found = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r}
    assert found["DsxNodeTaintedWithoutRemediation"]["for"] == "30m"
    assert found["DsxDriftFound"]["labels"] == {"severity": "info"}
    assert found["DsxDriftFound"]["annotations"]["summary"]  # merged, not replaced
    assert found["DsxQuarantineBreakerOpen"]["for"] == "1m"  # the others as shipped
    from tests.paths import helm_binary

    bad = subprocess.run(
        [
            helm_binary(),
            "template",
            "dsx",
            str(CHART),
            "--set",
            "monitoring.rules.enabled=true",
            "--set",
            "monitoring.rules.overrides.DsxNoSuchAlert.for=1m",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode != 0 and "monitoring.rules.overrides.DsxNoSuchAlert: no such alert" in bad.stderr


def test_dashboards_are_configmaps_the_grafana_sidecar_loads() -> None:
    docs = _docs(_template(CHART, *ON, "monitoring.dashboards.namespace=monitoring"))
    maps = [
        d
        for d in _kinds(docs, "ConfigMap")
        if d["metadata"].get("labels", {}).get("grafana_dashboard") == "1"
    ]
    shipped = {p.name: json.loads(p.read_text()) for p in DASHBOARDS.glob("*.json")}
    assert len(maps) == len(shipped) == 4
    for found in maps:
        assert found["metadata"]["namespace"] == "monitoring"
        assert found["metadata"]["annotations"] == {"grafana_folder": "dsx"}
        ((key, text),) = found["data"].items()
        dashboard = json.loads(text)
        assert dashboard == shipped[key]
        assert dashboard["uid"] == key.removesuffix(".json") and dashboard["panels"]
        assert len(text.encode()) < 900_000


def test_the_exporter_runs_restricted_with_the_least_rbac() -> None:
    docs = _docs(_template(CHART, *ON))
    (deploy,) = [d for d in _kinds(docs, "Deployment") if d["metadata"]["name"] == "dsx-exporter"]
    pod = deploy["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == ["dsx", "exporter"]
    assert pod["serviceAccountName"] == "dsx-exporter"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    (role,) = [d for d in _kinds(docs, "Role") if d["metadata"]["name"] == "dsx-dsx-exporter"]
    assert role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": ["dsx-quarantine-breaker", "dsx-taint-budget", "dsx-goodput-report"],
            "verbs": ["get"],
        },
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list"]},
    ]
    monitors = {d["metadata"]["name"] for d in _kinds(docs, "ServiceMonitor")}
    assert "dsx-exporter" in monitors
    (service,) = [d for d in _kinds(docs, "Service") if d["metadata"]["name"] == "dsx-exporter"]
    assert service["spec"]["selector"] == deploy["spec"]["selector"]["matchLabels"]
