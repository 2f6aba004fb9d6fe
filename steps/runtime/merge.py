"""Merge rules of overlays, with provenance: which overlay set each value.

- mappings (``values``, ``images``, ``constraints``, ``thresholds``, ``scheduling``, ``fabric``) are
  deep-merged: keys merge recursively, a later scalar or list replaces an earlier one, ``null`` deletes
  the key;
- ``dependsOn`` is replaced as a whole;
- ``manifests`` lists are added, without duplicates, in first-seen order;
- ``version``, ``namespace`` and ``enabled`` are replaced.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["Provenance", "deep_merge", "plain_copy", "union"]

Provenance = dict[str, str]
"""Dotted path (``gpu-operator.values.driver.version``) to the overlay (or file) that set it."""


def plain_copy(value: Any) -> Any:
    """A copy whose mappings are fresh plain dicts (merging mutates those); lists are replaced whole,
    never changed in place, so they are shared."""
    if isinstance(value, dict):
        return {k: plain_copy(v) for k, v in value.items()}
    return value


def _record(value: Any, path: str, source: str, provenance: Provenance) -> None:
    if isinstance(value, dict) and value:
        for key, child in value.items():
            _record(child, f"{path}.{key}", source, provenance)
    else:
        provenance[path] = source


def _forget(path: str, provenance: Provenance) -> None:
    prefix = path + "."
    for key in [k for k in provenance if k == path or k.startswith(prefix)]:
        del provenance[key]


def deep_merge(
    target: dict[str, Any], overlay: Mapping[str, Any], source: str, provenance: Provenance, path: str
) -> None:
    """Merge ``overlay`` into ``target`` in place, recording ``source`` for every leaf it sets.

    Args:
        target: the mapping merged so far (modified).
        overlay: the later mapping; ``None`` values delete keys.
        source: name recorded in ``provenance`` for every value taken from ``overlay``.
        provenance: path-to-source map (modified).
        path: dotted path of ``target`` in the result, prefix of the recorded paths.
    """
    for key, value in overlay.items():
        child_path = f"{path}.{key}"
        old = target.get(key)
        if value is None:
            if key in target:
                del target[key]
                _forget(child_path, provenance)
            continue
        value_is_dict = isinstance(value, dict)
        old_is_dict = isinstance(old, dict)
        if value_is_dict and old_is_dict:
            if not value and not old:
                provenance[child_path] = source
            deep_merge(target[key], value, source, provenance, child_path)
            continue
        if old_is_dict or (value_is_dict and child_path in provenance):
            _forget(child_path, provenance)
        if value_is_dict:
            target[key] = plain_copy(value)
            _record(value, child_path, source, provenance)
        else:
            target[key] = value
            provenance[child_path] = source


def union(first: Iterable[str], second: Iterable[str]) -> list[str]:
    """Items of both lists, first-seen order, no duplicates."""
    seen: dict[str, None] = dict.fromkeys(first)
    for item in second:
        seen.setdefault(item, None)
    return list(seen)
