"""Kubernetes label selectors: parse ``a=b,c!=d,e,!f,g in (x,y),h notin (z)`` and match labels."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from steps.errors import InputError

__all__ = ["Requirement", "matches", "parse_selector"]

_KEY = r"[A-Za-z0-9][-A-Za-z0-9_./]*"
_VALUE = r"[-A-Za-z0-9_.]*"
_SET = re.compile(rf"^({_KEY})\s+(in|notin)\s+\(([^)]*)\)$")
_EQ = re.compile(rf"^({_KEY})\s*(==|=|!=)\s*({_VALUE})$")
_EXISTS = re.compile(rf"^(!?)\s*({_KEY})$")


@dataclass(frozen=True)
class Requirement:
    """One term of a selector: ``operator`` is ``in``, ``notin``, ``exists`` or ``!exists``."""

    key: str
    operator: str
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether labels satisfy this term."""
        if self.operator == "exists":
            return self.key in labels
        if self.operator == "!exists":
            return self.key not in labels
        if self.operator == "in":
            return labels.get(self.key) in self.values
        return labels.get(self.key) not in self.values


def _split(selector: str) -> list[str]:
    terms: list[str] = []
    current: list[str] = []
    depth = 0
    for char in selector:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            terms.append("".join(current).strip())
            current = []
        else:
            current.append(char)
    terms.append("".join(current).strip())
    return [t for t in terms if t]


def parse_selector(selector: str | None) -> list[Requirement]:
    """Parse a label selector; an empty or ``None`` selector matches everything.

    Raises:
        InputError: the selector is malformed (the message quotes the bad term).
    """
    if not selector or not selector.strip():
        return []
    out: list[Requirement] = []
    for term in _split(selector):
        if match := _SET.match(term):
            values = frozenset(v.strip() for v in match.group(3).split(",") if v.strip())
            out.append(Requirement(match.group(1), match.group(2), values))
        elif match := _EQ.match(term):
            operator = "notin" if match.group(2) == "!=" else "in"
            out.append(Requirement(match.group(1), operator, frozenset({match.group(3)})))
        elif match := _EXISTS.match(term):
            out.append(Requirement(match.group(2), "!exists" if match.group(1) else "exists"))
        else:
            raise InputError(f"label selector {selector!r}: cannot read the term {term!r}")
    return out


def matches(selector: str | None, labels: Mapping[str, str]) -> bool:
    """Whether labels satisfy every term of the selector."""
    return all(r.matches(labels) for r in parse_selector(selector))
