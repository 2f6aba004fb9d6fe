"""Reading YAML (and JSON, which is YAML) from files a person hands dsx, safely and with line numbers.

Every part reads its inputs here (catalogue, resolved recipes, snapshots, fleet files, thresholds,
workflow files), so every input gets the same guarantees:

- safe loading only (no Python objects), and duplicate keys refused with their line: YAML says a key is
  unique, and taking the last one silently hides a typo;
- text that is not UTF-8 refused with its line, not a ``UnicodeDecodeError``;
- aliases bounded: ``*alias`` re-uses a node without copying it, so a few lines can stand for billions
  of nodes (the "billion laughs"), which anything walking the data (validation, JSON) would then visit.
  Aliases may add at most :data:`ALIAS_EXPANSION_LIMIT` nodes to a document; a recursive alias is
  refused outright;
- values YAML's own rules reject on construction (a timestamp such as ``2025-13-45``) and nesting too
  deep to walk are input errors naming the file.

Every mapping and sequence carries the line of each key or item, so that a schema error found later
can still be reported as ``file:line`` (:func:`line_of`).
"""

from __future__ import annotations

import importlib
import json
import os
import stat
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from steps.errors import InputError

__all__ = [
    "ALIAS_EXPANSION_LIMIT",
    "MAX_INPUT_BYTES",
    "LineDict",
    "LineList",
    "check_input_file",
    "line_of",
    "load_yaml",
    "parse_json",
    "parse_yaml",
    "plain",
    "read_text",
    "shipped",
]


def shipped(*parts: str) -> Path:
    """A file or folder of the data shipped in the ``recipes`` package (package data, found through
    importlib): ``shipped("faults", "xid.yaml")``.

    A folder named ``recipes`` in the current directory can shadow the package under ``python -m``; it is
    then a namespace package, and the data installed beside ``steps`` is used instead.
    """
    package = importlib.import_module("recipes")
    if getattr(package, "__file__", None):
        return Path(str(resources.files("recipes")), *parts)
    return Path(__file__).resolve().parents[1].joinpath("recipes", *parts)


#: Nodes that aliases may add to one document, over the nodes it spells out. Real files use a handful
#: of anchors; an alias bomb needs millions.
ALIAS_EXPANSION_LIMIT = 100_000

_BaseLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class LineDict(dict[Any, Any]):
    """A mapping read from YAML: ``line`` of the mapping and ``key_lines`` of each key (1-based)."""

    line: int = 0
    key_lines: dict[Any, int]


class LineList(list[Any]):
    """A sequence read from YAML: ``line`` of the sequence and ``item_lines`` of each item (1-based)."""

    line: int = 0
    item_lines: list[int]


class _Problem(Exception):
    def __init__(self, message: str, line: int) -> None:
        super().__init__(message)
        self.line = line


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _check_aliases(root: yaml.Node) -> None:
    """Refuse a document whose aliases expand it by more than the limit, or refer to their own parent.

    The composed document is a graph in which an alias is the anchored node itself, met a second time.
    A depth-first walk sizes each node once (its size as expanded); each further meeting adds that size.

    Raises:
        _Problem: with the line of the node holding the alias.
    """
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()
    added = 0
    stack: list[tuple[yaml.Node, yaml.Node | None, bool]] = [(root, None, False)]
    while stack:
        node, parent, finished = stack.pop()
        key = id(node)
        if finished:
            open_nodes.discard(key)
            sizes[key] = 1 + sum(sizes[id(child)] for child in _children(node))
            continue
        where = (parent or node).start_mark.line + 1
        if key in open_nodes:
            raise _Problem("a recursive alias (it refers to a node that contains it)", where)
        if key in sizes:
            added += sizes[key]
            if added > ALIAS_EXPANSION_LIMIT:
                raise _Problem(
                    f"aliases expand the document by more than {ALIAS_EXPANSION_LIMIT} nodes "
                    "(refused: an alias bomb?)",
                    where,
                )
            continue
        open_nodes.add(key)
        stack.append((node, parent, True))
        stack.extend((child, node, False) for child in reversed(_children(node)))


class _Loader(_BaseLoader):  # type: ignore[misc]
    """Safe loader whose mappings and sequences remember their lines, refusing duplicate keys and
    aliases that expand without bound."""

    def construct_document(self, node: yaml.Node) -> Any:
        _check_aliases(node)
        return super().construct_document(node)


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


_Loader.add_constructor("tag:yaml.org,2002:map", _construct_mapping)
_Loader.add_constructor("tag:yaml.org,2002:seq", _construct_sequence)


MAX_INPUT_BYTES = 64 * 2**20
"""The largest file dsx reads as input (a recipe, a fleet, a rate table, a workflow): 64 MiB."""


def check_input_file(path: Path | str, label: str | None = None, what: str = "") -> None:
    """Refuse, without opening it, what dsx must not read as an input file: a folder, something that is
    not a regular file (a FIFO would block until a writer came, ``/dev/zero`` would never end), a file
    larger than :data:`MAX_INPUT_BYTES`.

    Raises:
        InputError: naming the file (``label``, default the path) and why.
    """
    name = label or str(path)
    reading = f"cannot read {what}" if what else "cannot read"
    try:
        info = os.stat(path)
    except OSError as exc:
        raise InputError(f"{name}: {reading}: {exc.strerror or exc}") from None
    if stat.S_ISDIR(info.st_mode):
        raise InputError(f"{name}: is a folder, not a file")
    if not stat.S_ISREG(info.st_mode):
        raise InputError(f"{name}: {reading}: not a regular file (a pipe, a device...)")
    if info.st_size > MAX_INPUT_BYTES:
        raise InputError(f"{name}: {reading}: larger than {MAX_INPUT_BYTES // 2**20} MiB")


def read_text(path: Path, label: str | None = None, what: str = "") -> str:
    """A file's text, read as UTF-8.

    Args:
        path: the file.
        label: how errors name the file (default: the path).
        what: what the file is, for the error (``"the fleet file"``: "cannot read the fleet file").

    Raises:
        InputError: the file is missing, a folder, not a regular file, larger than
            :data:`MAX_INPUT_BYTES`, unreadable, or not UTF-8 text (naming the line).
    """
    name = label or str(path)
    reading = f"cannot read {what}" if what else "cannot read"
    check_input_file(path, label, what)
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_INPUT_BYTES + 1)
    except OSError as exc:
        raise InputError(f"{name}: {reading}: {exc.strerror or exc}") from None
    if len(data) > MAX_INPUT_BYTES:
        raise InputError(f"{name}: {reading}: larger than {MAX_INPUT_BYTES // 2**20} MiB")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise InputError(f"{name}:{line}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def parse_yaml(text: str, name: str, *, documents: bool = False) -> Any:
    """Parse YAML text (one document, or with ``documents`` the list of all); errors name the line.

    Raises:
        InputError: not valid YAML, a duplicate key, an alias bomb, or a value YAML cannot construct.
    """
    try:
        if documents:
            return list(yaml.load_all(text, Loader=_Loader))  # a SafeLoader subclass
        return yaml.load(text, Loader=_Loader)  # a SafeLoader subclass
    except _Problem as exc:
        raise InputError(f"{name}:{exc.line}: {exc}") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = exc.problem or exc.context or "a syntax error"
        raise InputError(f"{name}{line}: not valid YAML: {problem}") from None
    except yaml.YAMLError as exc:
        raise InputError(f"{name}: not valid YAML: {' '.join(str(exc).split())}") from None
    except RecursionError:
        raise InputError(f"{name}: not valid YAML: nested too deeply") from None
    except (ValueError, TypeError, OverflowError) as exc:  # e.g. a timestamp with month 13
        raise InputError(f"{name}: not valid YAML: a value cannot be read: {exc}") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def parse_json(text: str, name: str) -> Any:
    """Parse strict JSON text; errors name the line, as :func:`parse_yaml`'s do.

    JSON is YAML, and :func:`parse_yaml` reads it with lines for later schema errors; this is for files
    that must be JSON to the letter (``NaN`` and ``Infinity`` are not numbers in JSON) or are too large
    to read as YAML quickly.

    Raises:
        InputError: not valid JSON, a constant JSON does not allow, or nested too deeply.
    """
    try:
        return json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise InputError(f"{name}:{exc.lineno}: not valid JSON: {exc.msg}") from None
    except ValueError as exc:  # NaN, Infinity
        raise InputError(f"{name}: not strict JSON: {exc}") from None
    except RecursionError:
        raise InputError(f"{name}: not valid JSON: nested too deeply") from None


def load_yaml(path: Path, label: str | None = None, *, documents: bool = False, what: str = "") -> Any:
    """Read one YAML document (or, with ``documents``, the list of all); errors name the line.

    Args:
        path: the file.
        label: how errors name the file (default: the path).
        documents: read a multi-document stream, returning a list.
        what: what the file is, for the error when it cannot be read (see :func:`read_text`).

    Raises:
        InputError: the file is missing, unreadable, not UTF-8 or not valid YAML.
    """
    name = label or str(path)
    return parse_yaml(read_text(path, name, what), name, documents=documents)


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


def plain(data: Any) -> Any:
    """The same data as plain ``dict`` (string keys) and ``list``, without line numbers."""
    if isinstance(data, dict):
        return {str(k): plain(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [plain(v) for v in data]
    return data
