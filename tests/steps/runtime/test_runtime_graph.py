"""Dependency graph: deterministic Kahn order with tiers, cycles printed, renderings for people."""

import json

import pytest

from steps.errors import InputError
from steps.runtime.graph import DependencyGraph, order, to_dot, to_json, to_mermaid

DEPS = {"app": ["db", "cache"], "db": ["storage"], "cache": [], "storage": [], "ui": ["app"]}


def test_kahn_order_is_sorted_by_tier_then_name() -> None:
    deployment, tiers = order(DEPS)
    assert tiers == [["cache", "storage"], ["db"], ["app"], ["ui"]]
    assert deployment == ["cache", "storage", "db", "app", "ui"]
    assert order(dict(reversed(list(DEPS.items())))) == (deployment, tiers)


def test_cycles_are_printed_and_unknown_targets_named() -> None:
    with pytest.raises(InputError, match=r"dependency cycle: a -> b -> c -> a"):
        order({"a": ["b"], "b": ["c"], "c": ["a"], "d": []})
    with pytest.raises(InputError, match=r"component a: dependsOn names 'ghost'"):
        order({"a": ["ghost"]})


def test_renderings_carry_every_edge() -> None:
    deployment, tiers = order(DEPS)
    graph = DependencyGraph(DEPS, {"app": "1.2.3"})
    dot = to_dot(graph, tiers)
    assert '"db" -> "app";' in dot and '"storage" -> "db";' in dot
    assert 'label="app\\n1.2.3"' in dot
    mermaid = to_mermaid(graph, tiers)
    assert mermaid.startswith("flowchart LR")
    assert "c_db --> c_app" in mermaid
    data = json.loads(to_json(graph, deployment, tiers))
    assert {"from": "cache", "to": "app"} in data["edges"]
    assert [n["tier"] for n in data["nodes"]] == [0, 0, 1, 2, 3]
