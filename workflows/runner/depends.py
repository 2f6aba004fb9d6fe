"""DAG ``depends`` and ``dependencies``: which tasks a task waits for, and whether it then runs.

A plain task name ``A`` means ``(A.Succeeded || A.Skipped || A.Daemoned)`` (plus ``A.Failed`` /
``A.Errored`` when ``A`` sets ``continueOn``), as in Argo; results are ``.Succeeded .Failed .Errored
.Skipped .Omitted .Daemoned .AnySucceeded .AllFailed``, combined with ``&& || !`` and parentheses.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "RESULTS",
    "DependsError",
    "TaskResults",
    "ancestors",
    "depends_logic",
    "evaluate_depends",
    "task_names",
]

RESULTS = ("Succeeded", "Failed", "Errored", "Skipped", "Omitted", "Daemoned", "AnySucceeded", "AllFailed")

_TOKEN = re.compile(
    r"\s*(?:(?P<ref>[a-zA-Z0-9][-a-zA-Z0-9]*?(?:\.[A-Za-z][a-zA-Z]*)?(?![-a-zA-Z0-9.]))"
    r"|(?P<op>&&|\|\||!)|(?P<lp>\()|(?P<rp>\)))"
)


class DependsError(ValueError):
    """A ``depends`` expression Argo would reject."""


@dataclass(frozen=True)
class TaskResults:
    """What a finished task offers to ``depends`` (Argo's TaskResults)."""

    Succeeded: bool = False
    Failed: bool = False
    Errored: bool = False
    Skipped: bool = False
    Omitted: bool = False
    Daemoned: bool = False
    AnySucceeded: bool = False
    AllFailed: bool = False


def _tokens(text: str) -> list[tuple[str, str]]:
    tokens: list[tuple[str, str]] = []
    position = 0
    text = text.rstrip()
    while position < len(text):
        match = _TOKEN.match(text, position)
        if match is None or match.end() == position:
            raise DependsError(f"unable to parse depends '{text}' near '{text[position:].strip()}'")
        position = match.end()
        for kind in ("ref", "op", "lp", "rp"):
            if match.group(kind) is not None:
                tokens.append((kind, match.group(kind)))
    return tokens


def depends_logic(task: Mapping[str, Any], continue_on: Mapping[str, Mapping[str, Any]]) -> str:
    """The ``depends`` of ``task`` (or its ``dependencies`` as one ``&&`` expression), names expanded.

    ``continue_on`` maps each sibling task name to its ``continueOn`` (``{"failed": true}``...).
    """

    def expand(name: str) -> str:
        results = [f"{name}.Succeeded", f"{name}.Skipped", f"{name}.Daemoned"]
        flags = continue_on.get(name) or {}
        if flags.get("error"):
            results.append(f"{name}.Errored")
        if flags.get("failed"):
            results.append(f"{name}.Failed")
        return "(" + " || ".join(results) + ")"

    if task.get("depends"):
        parts = []
        for kind, value in _tokens(str(task["depends"])):
            if kind == "ref" and "." not in value:
                parts.append(expand(value))
            else:
                parts.append(value)
        return " ".join(parts)
    return " && ".join(expand(str(name)) for name in task.get("dependencies") or [])


def task_names(logic: str) -> list[str]:
    """The tasks an expression names, in order of first appearance; raises on an invalid result."""
    names: list[str] = []
    for kind, value in _tokens(logic):
        if kind != "ref":
            continue
        name, _, result = value.partition(".")
        if result and result not in RESULTS:
            raise DependsError(f"task result '{result}' for task '{name}' is invalid")
        if name not in names:
            names.append(name)
    return names


def ancestors(name: str, deps: Mapping[str, Iterable[str]]) -> set[str]:
    """Every task ``name`` depends on, directly or through others: what its expressions may read."""
    seen: set[str] = set()
    stack = list(deps.get(name, []))
    while stack:
        current = stack.pop()
        if current not in seen:
            seen.add(current)
            stack.extend(deps.get(current, []))
    return seen


def evaluate_depends(logic: str, results: Mapping[str, TaskResults]) -> bool:
    """Evaluate an expanded ``depends`` expression against the finished tasks' results."""
    tokens = _tokens(logic)
    position = 0

    def peek() -> tuple[str, str] | None:
        return tokens[position] if position < len(tokens) else None

    def take() -> tuple[str, str]:
        nonlocal position
        if position >= len(tokens):
            raise DependsError(f"unable to evaluate depends '{logic}': unexpected end")
        position += 1
        return tokens[position - 1]

    def or_expr() -> bool:
        value = and_expr()
        while peek() == ("op", "||"):
            take()
            right = and_expr()
            value = value or right
        return value

    def and_expr() -> bool:
        value = unary()
        while peek() == ("op", "&&"):
            take()
            right = unary()
            value = value and right
        return value

    def unary() -> bool:
        if peek() == ("op", "!"):
            take()
            return not unary()
        kind, value = take()
        if kind == "lp":
            inner = or_expr()
            if take()[0] != "rp":
                raise DependsError(f"unable to evaluate depends '{logic}': unbalanced parenthesis")
            return inner
        if kind != "ref":
            raise DependsError(f"unable to evaluate depends '{logic}': unexpected '{value}'")
        name, _, result = value.partition(".")
        if not result:
            raise DependsError(f"unable to evaluate depends '{logic}': '{name}' has no result")
        if result not in RESULTS:
            raise DependsError(f"task result '{result}' for task '{name}' is invalid")
        return bool(getattr(results.get(name, TaskResults()), result))

    if not tokens:
        return True
    outcome = or_expr()
    if position != len(tokens):
        raise DependsError(f"unable to evaluate depends '{logic}': unexpected '{tokens[position][1]}'")
    return outcome
