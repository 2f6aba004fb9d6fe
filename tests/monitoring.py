"""What the monitoring tests share: dsx's rules and dashboards as shipped (charts/dsx/monitoring), and the
metric names dsx's own code exports."""

from __future__ import annotations

import json
import re
from typing import Any

from tests import yamltext
from tests.paths import CHART

MONITORING = CHART / "monitoring"
RULES = MONITORING / "rules.yaml"
DASHBOARDS = MONITORING / "dashboards"

PROMQL_WORDS = {
    # functions, aggregations, keywords and modifiers: not metric names
    "abs",
    "absent",
    "absent_over_time",
    "and",
    "avg",
    "avg_over_time",
    "bool",
    "bottomk",
    "by",
    "ceil",
    "changes",
    "clamp_min",
    "clamp_max",
    "count",
    "count_over_time",
    "delta",
    "deriv",
    "floor",
    "group",
    "group_left",
    "group_right",
    "histogram_quantile",
    "idelta",
    "ignoring",
    "increase",
    "irate",
    "label_replace",
    "last_over_time",
    "max",
    "max_over_time",
    "min",
    "min_over_time",
    "offset",
    "on",
    "or",
    "quantile",
    "rate",
    "resets",
    "round",
    "scalar",
    "sort",
    "sort_desc",
    "stddev",
    "sum",
    "sum_over_time",
    "time",
    "timestamp",
    "topk",
    "unless",
    "vector",
    "without",
    "inf",
    "nan",
}
PROMETHEUS_OWN = {"up"}
"""Series Prometheus makes for every target itself: a rule may use them beside dsx's."""


def rules() -> dict[str, Any]:
    data: dict[str, Any] = yamltext.load(RULES.read_text())
    return data


def alerts() -> list[dict[str, Any]]:
    return [r for g in rules()["groups"] for r in g["rules"] if "alert" in r]


def dashboards() -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in sorted(DASHBOARDS.glob("*.json"))}


def dashboard_queries(dashboard: dict[str, Any]) -> list[str]:
    """Every PromQL expression of a dashboard's panels (and of its template variables' queries)."""
    found = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", []) if t.get("expr")]
    for variable in dashboard.get("templating", {}).get("list", []):
        query = variable.get("query")
        text = query.get("query") if isinstance(query, dict) else query
        match = re.fullmatch(r"label_values\((.+),\s*\w+\)", str(text or ""))
        if match:
            found.append(match.group(1))
    return found


def concrete(query: str) -> str:
    """A dashboard query with Grafana's variables given values, so that PromQL tools can read it."""
    return query.replace("$__rate_interval", "5m").replace("$__range", "7d").replace('"$node"', '".*"')


def metric_names(expr: str) -> set[str]:
    """The series names an expression reads (recording rules' names included, ``dsx:...``)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # label values and strings
    text = re.sub(r"\{[^}]*\}", "{}", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "[]", text)  # ranges
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", text))
    return {n for n in names if n.lower() not in PROMQL_WORDS and not re.fullmatch(r"\d.*|e\d+", n)}
