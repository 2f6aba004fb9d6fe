"""Criteria: what a recipe is for (service, accelerator, OS, intent, platform, node count).

A query names concrete values; an overlay's criteria may leave a field out or write ``any``, which
matches every query value. ``any`` in a query is not a wildcard: it matches only overlays that leave
the field open, so that an unspecified flag never silently picks a specific overlay.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

from steps.errors import InputError
from steps.runtime.names import ALLOWED, ANY, FIELDS

__all__ = ["ALLOWED", "ANY", "FIELDS", "Criteria", "parse_criteria"]


class Criteria(BaseModel):
    """A point (query) or a region (overlay) in criteria space; ``any`` leaves a field open.

    ``nodes`` is an integer or ``any``. On an overlay, ``nodes: N`` matches a query of at least N
    nodes ("from N nodes up"), so multi-node settings apply to every larger cluster.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    service: str = ANY
    accelerator: str = ANY
    os: str = ANY
    intent: str = ANY
    platform: str = ANY
    nodes: int | str = ANY

    def specificity(self) -> int:
        """How many fields are pinned (not ``any``): more specific overlays apply later."""
        return sum(1 for name in FIELDS if getattr(self, name) != ANY)

    def matches(self, query: Criteria) -> bool:
        """Whether this overlay's criteria select the given query."""
        for name in FIELDS:
            mine = getattr(self, name)
            if mine == ANY:
                continue
            theirs = getattr(query, name)
            if theirs == ANY:
                return False
            if name == "nodes":
                if int(theirs) < int(mine):
                    return False
            elif mine != theirs:
                return False
        return True

    def as_dict(self) -> dict[str, Any]:
        """Every field, ``any`` included, in a stable order."""
        return {name: getattr(self, name) for name in FIELDS}

    def pinned(self) -> dict[str, Any]:
        """Only the fields that are not ``any``."""
        return {k: v for k, v in self.as_dict().items() if v != ANY}


def _check_value(name: str, value: Any, where: str) -> int | str:
    if name == "nodes":
        if isinstance(value, bool):
            raise InputError(f"{where}nodes: expected a positive integer or 'any', got {value!r}")
        if isinstance(value, int):
            number = value
        else:
            text = str(value).strip().lower()
            if text == ANY:
                return ANY
            if not text.isdigit():
                raise InputError(f"{where}nodes: expected a positive integer or 'any', got {value!r}")
            number = int(text)
        if number < 1:
            raise InputError(f"{where}nodes: expected a positive integer or 'any', got {value!r}")
        return number
    text = str(value).strip().lower()
    allowed = ALLOWED[name]
    if text != ANY and text not in allowed:
        raise InputError(f"{where}{name}: unknown value {value!r}; allowed: {', '.join((*allowed, ANY))}")
    return text


def parse_criteria(values: Mapping[str, Any], where: str = "--") -> Criteria:
    """Validate criteria given as flags or as an overlay's ``criteria`` mapping.

    Args:
        values: field name to value; missing fields are ``any``.
        where: prefix naming the origin in error messages (``--`` for CLI flags, ``file:line: `` for
            an overlay), so that ``--accelerator: unknown value 'h800'`` names the flag.

    Raises:
        InputError: an unknown field or value, naming it and the allowed values.
    """
    checked: dict[str, Any] = {}
    for name, value in values.items():
        if name not in FIELDS:
            raise InputError(f"{where}{name}: unknown criterion; allowed: {', '.join(FIELDS)}")
        if value is None:
            continue
        checked[name] = _check_value(name, value, where)
    return Criteria(**checked)
