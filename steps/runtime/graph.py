"""Dependency graph of a recipe's components: checks, deployment order and tiers, renderings.

The order comes from Kahn's algorithm taken level by level with every level sorted by name, so the
same graph always gives the same order; a component's tier is its level (0: depends on nothing).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from steps.errors import InputError

__all__ = ["DependencyGraph", "find_cycle", "order", "to_dot", "to_json", "to_mermaid"]


class DependencyGraph:
    """Components (names) and, for each, the components it depends on."""

    def __init__(self, depends_on: Mapping[str, Sequence[str]], versions: Mapping[str, str] | None = None):
        self.depends_on = {name: sorted(set(deps)) for name, deps in depends_on.items()}
        self.versions = dict(versions or {})

    @property
    def edges(self) -> list[tuple[str, str]]:
        """``(dependency, dependent)`` pairs, sorted."""
        return sorted((dep, name) for name, deps in self.depends_on.items() for dep in deps)


def find_cycle(depends_on: Mapping[str, Sequence[str]]) -> list[str] | None:
    """One dependency cycle as ``[a, b, ..., a]`` (following dependsOn), or None; deterministic."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(depends_on.get(node, ())):
            if dep not in depends_on:
                continue
            if state.get(dep) == 1:
                return [*stack[stack.index(dep) :], dep]
            if dep not in state:
                found = visit(dep)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for start in sorted(depends_on):
        if start not in state:
            found = visit(start)
            if found:
                return found
    return None


def order(depends_on: Mapping[str, Sequence[str]]) -> tuple[list[str], list[list[str]]]:
    """Deployment order and tiers of a dependency mapping.

    Returns:
        ``(order, tiers)``: every component once, each after all it depends on; ``tiers[i]`` the
        sorted components whose longest dependency chain has ``i`` links.

    Raises:
        InputError: a dependsOn target that is not a component, or a cycle printed as ``a -> b -> a``.
    """
    for name in sorted(depends_on):
        for dep in depends_on[name]:
            if dep not in depends_on:
                raise InputError(f"component {name}: dependsOn names {dep!r}, which is not in the recipe")
    remaining = {name: len(set(deps)) for name, deps in depends_on.items()}
    dependents: dict[str, list[str]] = {name: [] for name in depends_on}
    for name, deps in depends_on.items():
        for dep in set(deps):
            dependents[dep].append(name)
    level = sorted(name for name, count in remaining.items() if count == 0)
    tiers: list[list[str]] = []
    result: list[str] = []
    while level:
        tiers.append(level)
        result.extend(level)
        following: list[str] = []
        for name in level:
            for child in dependents[name]:
                remaining[child] -= 1
                if remaining[child] == 0:
                    following.append(child)
        level = sorted(following)
    if len(result) != len(depends_on):
        cycle = find_cycle(depends_on) or sorted(set(depends_on) - set(result))
        raise InputError(f"dependency cycle: {' -> '.join(cycle)}")
    return result, tiers


def _tier_of(tiers: Sequence[Sequence[str]]) -> dict[str, int]:
    return {name: index for index, level in enumerate(tiers) for name in level}


def to_dot(graph: DependencyGraph, tiers: Sequence[Sequence[str]]) -> str:
    """Graphviz text: one box per component (name and version), arrows from dependency to dependent."""
    lines = ["digraph recipe {", "  rankdir=LR;", '  node [shape=box, fontname="Helvetica"];']
    for index, level in enumerate(tiers):
        lines.append(f"  subgraph tier_{index} {{")
        lines.append("    rank=same;")
        for name in level:
            version = graph.versions.get(name, "")
            label = f"{name}\\n{version}" if version else name
            lines.append(f'    "{name}" [label="{label}"];')
        lines.append("  }")
    for dep, name in graph.edges:
        lines.append(f'  "{dep}" -> "{name}";')
    lines.append("}")
    return "\n".join(lines) + "\n"


def _mermaid_id(name: str) -> str:
    return "c_" + "".join(ch if ch.isalnum() else "_" for ch in name)


def to_mermaid(graph: DependencyGraph, tiers: Sequence[Sequence[str]]) -> str:
    """Mermaid flowchart text, left to right, arrows from dependency to dependent."""
    lines = ["flowchart LR"]
    for index, level in enumerate(tiers):
        lines.append(f'  subgraph tier{index}["tier {index}"]')
        for name in level:
            version = graph.versions.get(name, "")
            label = f"{name}<br/>{version}" if version else name
            lines.append(f'    {_mermaid_id(name)}["{label}"]')
        lines.append("  end")
    for dep, name in graph.edges:
        lines.append(f"  {_mermaid_id(dep)} --> {_mermaid_id(name)}")
    return "\n".join(lines) + "\n"


def to_json(graph: DependencyGraph, deployment_order: Sequence[str], tiers: Sequence[Sequence[str]]) -> str:
    """The graph as JSON: nodes (name, version, tier, dependsOn), edges, order and tiers."""
    tier_of = _tier_of(tiers)
    data = {
        "nodes": [
            {
                "name": name,
                "version": graph.versions.get(name, ""),
                "tier": tier_of[name],
                "dependsOn": graph.depends_on[name],
            }
            for name in deployment_order
        ],
        "edges": [{"from": dep, "to": name} for dep, name in graph.edges],
        "deploymentOrder": list(deployment_order),
        "tiers": [list(level) for level in tiers],
    }
    return json.dumps(data, indent=2, sort_keys=True) + "\n"
