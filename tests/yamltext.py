"""YAML as the tests read it: safe loading through libyaml, PyYAML's C parser, as ``steps.yamlio`` reads
dsx's inputs. The pure-Python parser took half a second of CPU for each render of the chart (126 KB), and
the tests read renders and compiled workflows hundreds of times."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import yaml

__all__ = ["load", "load_all"]

_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load(text: str) -> Any:
    """The one document of ``text``, as ``yaml.safe_load`` gives it."""
    return yaml.load(text, Loader=_LOADER)


def load_all(text: str) -> Iterator[Any]:
    """Every document of ``text``, as ``yaml.safe_load_all`` gives them."""
    return yaml.load_all(text, Loader=_LOADER)
