"""JSON merge patch (RFC 7386), as the API server applies ``application/merge-patch+json``."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

__all__ = ["MERGE_KEYS", "merge_patch", "strategic_merge_patch"]


def merge_patch(target: Any, patch: Any) -> Any:
    """Apply a merge patch: objects merge key by key, ``None`` removes a key, anything else replaces.

    Neither argument is changed; the result shares no mutable parts with them.
    """
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result: dict[str, Any] = copy.deepcopy(dict(target)) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


MERGE_KEYS: dict[str, str] = {
    "conditions": "type",
    "addresses": "type",
    "containers": "name",
    "initContainers": "name",
    "volumes": "name",
    "env": "name",
    "ports": "containerPort",
    "tolerations": "key",
}
"""List fields a strategic merge patch merges item by item, and the key that identifies an item."""


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """Apply a strategic merge patch: as :func:`merge_patch`, but lists named in :data:`MERGE_KEYS`
    merge by their key (an item with ``$patch: delete`` removes its match) instead of being replaced."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result: dict[str, Any] = copy.deepcopy(dict(target)) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        elif key in MERGE_KEYS and isinstance(value, list) and isinstance(result.get(key), list):
            merge_key = MERGE_KEYS[key]
            items = [copy.deepcopy(i) for i in result[key]]
            for item in value:
                position = next(
                    (
                        n
                        for n, old in enumerate(items)
                        if isinstance(old, Mapping) and old.get(merge_key) == item.get(merge_key)
                    ),
                    None,
                )
                if item.get("$patch") == "delete":
                    if position is not None:
                        del items[position]
                elif position is None:
                    items.append(copy.deepcopy(item))
                else:
                    items[position] = strategic_merge_patch(items[position], item)
            result[key] = items
        else:
            result[key] = strategic_merge_patch(result.get(key), value)
    return result
