"""YAML and JSON for the runtime part: reading through :mod:`steps.yamlio` (line numbers, duplicate keys
and alias bombs refused), and canonical writing (sorted keys, so the same data gives the same bytes)."""

from __future__ import annotations

import json
from typing import Any

import yaml

from steps.yamlio import LineDict, LineList, line_of, load_yaml
from steps.yamlio import plain as _plain

__all__ = ["LineDict", "LineList", "canonical_json", "dump_yaml", "line_of", "load_yaml"]

_BaseDumper: Any = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


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
