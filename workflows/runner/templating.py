"""Argo's ``{{...}}`` variables: finding them and substituting them in strings and nested manifests."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

__all__ = [
    "TAG",
    "Unresolved",
    "expression_tags",
    "render",
    "render_all",
    "tags",
    "walk_strings",
]

TAG = re.compile(r"\{\{(.*?)\}\}", re.S)
"""One ``{{ tag }}``; the tag is the text between the braces, spaces trimmed."""


class Unresolved(Exception):
    """A ``{{tag}}`` with no value in scope."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        super().__init__(f"failed to resolve {{{{{tag}}}}}")


def tags(text: str) -> list[str]:
    """The tags of the ``{{...}}`` variables in ``text`` (expression tags ``{{=...}}`` excluded)."""
    return [m.group(1).strip() for m in TAG.finditer(text) if not m.group(1).startswith("=")]


def expression_tags(text: str) -> list[str]:
    """The ``{{=...}}`` expression tags in ``text``."""
    return [m.group(1) for m in TAG.finditer(text) if m.group(1).startswith("=")]


def render(
    text: str,
    scope: Mapping[str, str] | Callable[[str], str | None],
    defer: Callable[[str], bool] | None = None,
) -> str:
    """Substitute every ``{{tag}}`` of ``text`` from ``scope``.

    A tag without a value is kept as it is when ``defer(tag)`` is true (it is resolved later, as Argo
    does for task outputs and items); otherwise :class:`Unresolved` is raised.
    """
    if "{{" not in text:
        return text
    lookup = scope.get if isinstance(scope, Mapping) else scope

    def replace(match: re.Match[str]) -> str:
        raw = match.group(1)
        tag = raw.strip()
        value = lookup(tag)
        if value is not None:
            return value
        if defer is not None and defer(tag):
            return match.group(0)
        raise Unresolved(tag)

    return TAG.sub(replace, text)


def render_all(
    node: Any,
    scope: Mapping[str, str] | Callable[[str], str | None],
    defer: Callable[[str], bool] | None = None,
    skip: Callable[[tuple[str | int, ...]], bool] | None = None,
    path: tuple[str | int, ...] = (),
) -> Any:
    """A copy of ``node`` (dicts, lists, scalars) with every string rendered; ``skip(path)`` leaves a part."""
    if skip is not None and skip(path):
        return node
    if isinstance(node, str):
        return render(node, scope, defer)
    if isinstance(node, dict):
        return {k: render_all(v, scope, defer, skip, (*path, k)) for k, v in node.items()}
    if isinstance(node, list):
        return [render_all(v, scope, defer, skip, (*path, i)) for i, v in enumerate(node)]
    return node


def walk_strings(node: Any, path: str = "") -> Iterator[tuple[str, str]]:
    """Every string below ``node`` with its field path (``dag.tasks[0].arguments``)."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from walk_strings(value, f"{path}.{key}" if path else str(key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from walk_strings(value, f"{path}[{index}]")
    elif isinstance(node, str):
        yield path, node
