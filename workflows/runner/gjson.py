"""The part of gjson's path syntax that Argo Events' filters and parameters use, read as gjson reads it.

Argo Events reads event data with `tidwall/gjson <https://github.com/tidwall/gjson#path-syntax>`_: an
EventSource's field filters, a Sensor's ``exprs`` and ``data`` filters and a trigger parameter's
``dataKey`` are gjson paths. Supported here:

- keys separated by ``.``, a ``\\`` escaping the next character (``metadata.labels.dsx\\.dev/state``);
- an array index (``conditions.0``) and ``#``, the length of an array;
- queries: ``#(key OP value)`` the first element that matches, ``#(key OP value)#`` all of them, with
  ``==``, ``!=``, ``<``, ``<=``, ``>``, ``>=``, ``%`` (glob match) and ``!%``; after ``#(...)#`` a
  ``.key`` applies to each element;
- ``|`` between parts: the next part applies to the whole result so far (``#(...)#|#`` counts matches).

Anything else (wildcards in keys, ``@modifiers``, multipaths) raises :class:`UnsupportedPath` naming it,
so a filter the local player cannot read is refused before it runs, never misread.
"""

from __future__ import annotations

import fnmatch
import json
import re
from typing import Any

from steps.errors import InputError

__all__ = ["MISSING", "UnsupportedPath", "check", "get"]


class UnsupportedPath(InputError):
    """A gjson path that uses syntax the local player does not carry out."""


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()
"""What :func:`get` returns for a path that does not exist (gjson's ``Exists() == false``)."""

_QUERY = re.compile(r"^\s*([^=!<>%\s]+)\s*(==|!=|<=|>=|<|>|!%|%|=)\s*(.+?)\s*$")


def _split(path: str) -> list[tuple[str, str]]:
    """``(separator, component)`` pairs: separator ``""`` (first), ``.`` or ``|``; escapes kept."""
    parts: list[tuple[str, str]] = []
    current, sep, depth, i = "", "", 0, 0
    while i < len(path):
        ch = path[i]
        if ch == "\\" and i + 1 < len(path):
            current += path[i : i + 2]
            i += 2
            continue
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == '"' and depth:
            end = path.index('"', i + 1) if '"' in path[i + 1 :] else len(path) - 1
            current += path[i : end + 1]
            i = end + 1
            continue
        if depth == 0 and ch in ".|":
            parts.append((sep, current))
            current, sep = "", ch
        else:
            current += ch
        i += 1
    parts.append((sep, current))
    return parts


def _unescape(key: str) -> str:
    return re.sub(r"\\(.)", r"\1", key)


def _literal(text: str, path: str) -> Any:
    if text.startswith('"') and text.endswith('"') and len(text) >= 2:
        return text[1:-1]
    if text in ("true", "false"):
        return text == "true"
    if text == "null":
        return None
    try:
        return json.loads(text)
    except ValueError:
        raise UnsupportedPath(
            f"gjson path {path!r}: query value {text!r} is not a string, number or bool"
        ) from None


def _matches(element: Any, key: str, op: str, value: Any) -> bool:
    if not isinstance(element, dict) or _unescape(key) not in element:
        return False
    found = element[_unescape(key)]
    if op in ("%", "!%"):
        hit = isinstance(found, str) and fnmatch.fnmatchcase(found, str(value))
        return hit if op == "%" else not hit
    if op in ("==", "="):
        return bool(found == value)
    if op == "!=":
        return bool(found != value)
    try:
        return bool({"<": found < value, "<=": found <= value, ">": found > value, ">=": found >= value}[op])
    except TypeError:
        return False


def _component(value: Any, part: str, path: str) -> Any:
    """One component applied to one value (no mapping)."""
    if part == "#":
        return len(value) if isinstance(value, list) else MISSING
    if part.startswith("#(") and (part.endswith(")") or part.endswith(")#")):
        every = part.endswith(")#")
        inner = part[2 : -2 if every else -1]
        match = _QUERY.match(inner)
        if match is None:
            raise UnsupportedPath(f"gjson path {path!r}: query {part!r} is not KEY OP VALUE")
        key, op, text = match.groups()
        if any(c in key for c in "*?#@"):
            raise UnsupportedPath(f"gjson path {path!r}: query key {key!r} is a path, not a key")
        literal = _literal(text, path)
        if not isinstance(value, list):
            return MISSING
        hits = [e for e in value if _matches(e, key, op, literal)]
        if every:
            return hits
        return hits[0] if hits else MISSING
    if any(c in part.replace("\\*", "").replace("\\?", "") for c in "*?") or part.startswith("@"):
        raise UnsupportedPath(f"gjson path {path!r}: {part!r} (wildcards and modifiers are not supported)")
    if not part:
        raise UnsupportedPath(f"gjson path {path!r}: an empty component")
    if isinstance(value, dict):
        return value.get(_unescape(part), MISSING)
    if isinstance(value, list) and part.isdigit():
        index = int(part)
        return value[index] if index < len(value) else MISSING
    return MISSING


def get(data: Any, path: str) -> Any:
    """The value at ``path`` in ``data`` (parsed JSON), or :data:`MISSING`.

    Raises:
        UnsupportedPath: the path uses syntax this module does not carry out.
    """
    value, mapped = data, False
    for sep, part in _split(path):
        if value is MISSING:
            return MISSING
        if mapped and sep == ".":
            if part == "#" or part.startswith("#("):
                raise UnsupportedPath(f"gjson path {path!r}: a query inside a mapped array")
            value = [v for v in (_component(e, part, path) for e in value) if v is not MISSING]
            continue
        value = _component(value, part, path)
        mapped = part.startswith("#(") and part.endswith(")#")
    return value


def check(path: str) -> None:
    """Refuse a path this module cannot read, before anything runs.

    Raises:
        UnsupportedPath: naming the path and the part.
    """
    for _, part in _split(path):
        if part == "#" or not (part.startswith("#(") or part.isdigit()):
            _component({}, part, path)
        else:
            _component([], part, path)
