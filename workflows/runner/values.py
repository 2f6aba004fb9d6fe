"""How Argo writes the values it passes between nodes: Go's JSON, Go's quoting, items and parameter lists.

Argo's controller is Go, so every value a step receives went through ``encoding/json`` or
``strconv``: maps with sorted keys, ``<>&`` escaped, a parameter list in Go's field order. A local run
that wrote them the Python way would hand steps different text than a cluster does, so these few
encoders copy Go's output byte for byte.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from workflows.runner.errors import NodeError

__all__ = [
    "MAX_RESULT_BYTES",
    "compact_json",
    "go_json",
    "go_quote",
    "go_unmarshal",
    "item_label",
    "item_text",
    "no_constant",
    "params_json",
    "script_result",
    "sorted_keys",
    "trim_newline",
]

MAX_RESULT_BYTES = 256 * (1 << 10)
"""The executor keeps only the last 256 kB of a step's stdout as ``outputs.result``."""
_GO_ESCAPES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v"}


def compact_json(value: Any) -> str:
    """``value`` as JSON with no spaces and non-ASCII kept, as Go writes it (before its escapes)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def go_json(value: Any) -> str:
    """``value`` as Go's ``json.Marshal`` writes it: compact, with ``<``, ``>``, ``&`` escaped."""
    text = compact_json(value)
    for char, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026")):
        text = text.replace(char, escaped)
    return text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def go_quote(text: str) -> str:
    """Go's ``strconv.Quote``: a double-quoted literal, ``"`` and ``\\`` escaped, unprintables as escapes."""
    out = ['"']
    for char in text:
        if char in ('"', "\\"):
            out.append("\\" + char)
        elif char in _GO_ESCAPES:
            out.append(_GO_ESCAPES[char])
        elif char.isprintable() or char == " ":
            out.append(char)
        elif ord(char) < 0x80:
            out.append(f"\\x{ord(char):02x}")
        elif ord(char) < 0x10000:
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(f"\\U{ord(char):08x}")
    out.append('"')
    return "".join(out)


def no_constant(name: str) -> Any:
    """Refuse ``NaN`` and ``Infinity``, which Python's json reads and Go's does not."""
    raise ValueError(f"invalid character '{name[0]}' looking for beginning of value")


def go_unmarshal(text: str) -> Any:
    """``text`` as JSON, refused where Go's ``json.Unmarshal`` refuses it (with its message)."""
    stripped = text.strip(" \t\r\n")
    if not stripped:
        raise NodeError("unexpected end of JSON input")
    if stripped[0] not in '{["-0123456789tfn':
        raise NodeError(f"invalid character {stripped[0]!r} looking for beginning of value")
    try:
        return json.loads(stripped, parse_constant=no_constant)
    except ValueError as exc:
        raise NodeError(f"invalid JSON in a result: {exc}") from exc


def sorted_keys(value: Any) -> Any:
    """Maps with their keys sorted, as Go marshals a map."""
    if isinstance(value, dict):
        return {k: sorted_keys(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [sorted_keys(v) for v in value]
    return value


def item_text(value: Any) -> str:
    """How Argo writes an item (or an item field) into a template."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
    return compact_json(value)


def item_label(value: Any) -> str:
    """How an item shows in its node's name: ``fan(0:a)``, a map as ``key:value`` pairs, sorted."""
    if isinstance(value, dict):
        return ",".join(sorted(f"{k}:{item_text(v)}" for k, v in value.items()))
    return item_text(value)


def trim_newline(text: str) -> str:
    """``text`` less one trailing newline, as the executor reads an output parameter's file."""
    return text[:-1] if text.endswith("\n") else text


def params_json(params: Iterable[Mapping[str, Any]]) -> str:
    """A parameter list as Argo marshals it (Go field order: name, default, value, enum, description).

    ``default``, ``value`` and ``description`` are pointers in Argo's types, so an empty string is kept
    (``omitempty`` drops only nil); ``enum`` is a slice, dropped when empty.
    """
    out = []
    for param in params:
        entry = {"name": param.get("name")}
        for key in ("default", "value", "enum", "description"):
            if param.get(key) is not None and param.get(key) != []:
                entry[key] = param[key]
        out.append(entry)
    return compact_json(out)


def script_result(stdout: bytes) -> str:
    """The executor's ``outputs.result``: stdout less one trailing newline, its last 256 kB only."""
    if stdout.endswith(b"\n"):
        stdout = stdout[:-1]
    if len(stdout) > MAX_RESULT_BYTES:
        stdout = stdout[-MAX_RESULT_BYTES:]
    return stdout.decode("utf-8", errors="replace")
