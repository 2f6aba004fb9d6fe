"""YAML reading that remembers line numbers, and canonical YAML/JSON writing.

Every mapping and sequence read by :func:`load_yaml` carries the line of each key or item, so that a
schema error found later can still be reported as ``file:line``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from steps.errors import InputError

__all__ = ["LineDict", "LineList", "canonical_json", "dump_yaml", "line_of", "load_yaml"]

_BaseLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_BaseDumper: Any = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


class LineDict(dict[Any, Any]):
    """A mapping read from YAML: ``line`` of the mapping and ``key_lines`` of each key (1-based)."""

    line: int = 0
    key_lines: dict[Any, int]


class LineList(list[Any]):
    """A sequence read from YAML: ``line`` of the sequence and ``item_lines`` of each item (1-based)."""

    line: int = 0
    item_lines: list[int]


class _Loader(_BaseLoader):  # type: ignore[misc]
    """Safe loader whose mappings and sequences remember their lines and refuse duplicate keys."""


def _construct_mapping(loader: Any, node: yaml.MappingNode) -> LineDict:
    loader.flatten_mapping(node)
    result = LineDict()
    result.line = node.start_mark.line + 1
    result.key_lines = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, str | int | float | bool) and key is not None:
            raise _Problem(f"unhashable or complex key {key!r}", key_node.start_mark.line + 1)
        if key in result:
            raise _Problem(f"duplicate key {key!r}", key_node.start_mark.line + 1)
        result[key] = loader.construct_object(value_node, deep=True)
        result.key_lines[key] = key_node.start_mark.line + 1
    return result


def _construct_sequence(loader: Any, node: yaml.SequenceNode) -> LineList:
    result = LineList(loader.construct_object(child, deep=True) for child in node.value)
    result.line = node.start_mark.line + 1
    result.item_lines = [child.start_mark.line + 1 for child in node.value]
    return result


class _Problem(Exception):
    def __init__(self, message: str, line: int) -> None:
        super().__init__(message)
        self.line = line


_Loader.add_constructor("tag:yaml.org,2002:map", _construct_mapping)
_Loader.add_constructor("tag:yaml.org,2002:seq", _construct_sequence)


def load_yaml(path: Path, label: str | None = None, *, documents: bool = False) -> Any:
    """Read one YAML document (or, with ``documents``, the list of all); errors name the line.

    Args:
        path: the file.
        label: how errors name the file (default: the path).
        documents: read a multi-document stream, returning a list.

    Raises:
        InputError: the file is missing, unreadable or not valid YAML.
    """
    name = label or str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{name}: cannot read: {exc.strerror or exc}") from exc
    try:
        if documents:
            return list(yaml.load_all(text, Loader=_Loader))  # a SafeLoader subclass
        return yaml.load(text, Loader=_Loader)  # a SafeLoader subclass
    except _Problem as exc:
        raise InputError(f"{name}:{exc.line}: {exc}") from exc
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = exc.problem or exc.context or "invalid YAML"
        raise InputError(f"{name}{line}: invalid YAML: {problem}") from exc
    except yaml.YAMLError as exc:
        raise InputError(f"{name}: invalid YAML: {exc}") from exc


def line_of(data: Any, loc: Sequence[Any]) -> int | None:
    """The line of the deepest element of ``loc`` (a pydantic error location) found in ``data``."""
    line: int | None = getattr(data, "line", None) or None
    node = data
    for part in loc:
        if isinstance(node, LineDict) and part in node:
            line = node.key_lines.get(part, line)
            node = node[part]
        elif isinstance(node, LineList) and isinstance(part, int) and 0 <= part < len(node):
            line = node.item_lines[part]
            node = node[part]
        else:
            break
    return line


def _plain(data: Any) -> Any:
    if isinstance(data, dict):
        return {str(k): _plain(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [_plain(v) for v in data]
    return data


def dump_yaml(data: Any) -> str:
    """Block-style YAML with sorted keys: the same data always gives the same text."""
    text: str = yaml.dump(
        _plain(data),
        Dumper=_BaseDumper,
        sort_keys=True,
        default_flow_style=False,
        allow_unicode=True,
        width=110,
    )
    return text


def canonical_json(data: Any, *, plain: bool = False) -> str:
    """Compact JSON with sorted keys: the canonical form digests are computed over.

    Args:
        data: what to encode.
        plain: ``data`` is already made of str-keyed dicts and lists (skips the conversion).
    """
    return json.dumps(
        data if plain else _plain(data), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
