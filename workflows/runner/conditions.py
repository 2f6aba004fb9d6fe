"""Resource templates' ``successCondition`` / ``failureCondition`` and ``valueFrom.jsonPath`` outputs.

Conditions use Argo's syntax: comma-separated requirements ``path op value`` over gjson-style paths of
the object (``status.phase == Running``, ``status.succeeded > 0``, ``metadata.labels.tier in (a, b)``,
``status.ready`` for "exists", ``!status.error`` for "does not exist"); every requirement must hold.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

__all__ = ["ConditionError", "Requirement", "json_path", "lookup", "matches", "parse_condition"]

_MISSING = object()


class ConditionError(ValueError):
    """A condition or JSON path that cannot be parsed."""


@dataclass(frozen=True)
class Requirement:
    """One ``path op values`` requirement of a condition."""

    path: str
    op: str
    values: tuple[str, ...]
    text: str

    def holds(self, obj: Any) -> bool:
        """Whether the requirement holds for ``obj`` (a Kubernetes object as plain data)."""
        found = lookup(obj, self.path)
        if self.op == "exists":
            return found is not _MISSING
        if self.op == "!":
            return found is _MISSING
        if found is _MISSING:
            return self.op in ("!=", "notin")
        value = _as_text(found)
        if self.op in ("==", "=", "in"):
            return value in self.values
        if self.op in ("!=", "notin"):
            return value not in self.values
        try:
            left, right = float(value), float(self.values[0])
        except ValueError:
            return False
        return {">": left > right, "<": left < right, ">=": left >= right, "<=": left <= right}[self.op]


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value, separators=(",", ":"))


def _split_top(text: str) -> list[str]:
    parts: list[str] = []
    depth = 0
    current = ""
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return [p.strip() for p in parts if p.strip()]


_REQUIREMENT = re.compile(r"^(?P<path>[^\s=!<>()]+)\s*(?P<op>==|=|!=|>=|<=|>|<)\s*(?P<value>[^\s()]*)$")
_SET = re.compile(r"^(?P<path>[^\s=!<>()]+)\s+(?P<op>in|notin)\s*\((?P<values>[^()]*)\)$")


def parse_condition(text: str) -> list[Requirement]:
    """The requirements of a condition; raises :class:`ConditionError` on bad syntax."""
    requirements: list[Requirement] = []
    for part in _split_top(text):
        if match := _SET.match(part):
            values = tuple(v.strip() for v in match.group("values").split(",") if v.strip())
            requirements.append(Requirement(match.group("path"), match.group("op"), values, part))
        elif match := _REQUIREMENT.match(part):
            requirements.append(
                Requirement(match.group("path"), match.group("op"), (match.group("value"),), part)
            )
        elif re.fullmatch(r"![^\s=!<>()]+", part):
            requirements.append(Requirement(part[1:], "!", (), part))
        elif re.fullmatch(r"[^\s=!<>()]+", part):
            requirements.append(Requirement(part, "exists", (), part))
        else:
            raise ConditionError(f"unable to parse requirement '{part}' of condition '{text}'")
    return requirements


def matches(obj: Any, requirements: list[Requirement]) -> bool:
    """Whether every requirement holds for ``obj``."""
    return all(r.holds(obj) for r in requirements)


def _segments(path: str) -> list[str]:
    return [s.replace("\\.", ".") for s in re.split(r"(?<!\\)\.", path) if s != ""]


def lookup(obj: Any, path: str) -> Any:
    """The value at a gjson-style path (``a.b.0.c``, ``items.#`` for a length); a sentinel when absent."""
    current = obj
    for segment in _segments(path):
        if isinstance(current, list):
            if segment == "#":
                current = len(current)
                continue
            if not segment.isdigit() or int(segment) >= len(current):
                return _MISSING
            current = current[int(segment)]
        elif isinstance(current, dict):
            if segment not in current:
                return _MISSING
            current = current[segment]
        else:
            return _MISSING
    return current


def json_path(obj: Any, expression: str) -> str:
    """A kubectl-style JSON path (``{.metadata.name}``, ``{.items[0].id}``, ``{.items[*].id}``) as text.

    Raises:
        ConditionError: the path is malformed or names nothing in ``obj``.
    """
    text = expression.strip()
    if text.startswith("{") and text.endswith("}"):
        text = text[1:-1]
    text = text.strip()
    if text.startswith("$"):
        text = text[1:]
    tokens = re.findall(r"\.([^.\[\]]+)|\[(\*|\d+)\]", text)
    if "".join(f".{a}" if a else f"[{b}]" for a, b in tokens) != text:
        raise ConditionError(f"unsupported JSON path '{expression}'")
    values: list[Any] = [obj]
    for key, index in tokens:
        following: list[Any] = []
        for value in values:
            if key:
                if isinstance(value, dict) and key in value:
                    following.append(value[key])
            elif index == "*":
                if isinstance(value, list):
                    following.extend(value)
            elif isinstance(value, list) and int(index) < len(value):
                following.append(value[int(index)])
        values = following
    if not values:
        raise ConditionError(f"JSON path '{expression}' names nothing in the object")
    return " ".join(_as_text(v) for v in values)
