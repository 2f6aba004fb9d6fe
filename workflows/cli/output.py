"""Rendering of command results for people (rich tables) and machines (JSON, YAML)."""

from __future__ import annotations

import enum
import json
import math
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import typer
import yaml
from rich.console import Console
from rich.table import Table

from steps.errors import InputError

__all__ = [
    "OUTPUT_OPTION",
    "OutputFormat",
    "check_out_dir",
    "console",
    "emit",
    "print_table",
    "to_plain",
]


class OutputFormat(enum.StrEnum):
    """The output formats every reporting command accepts with ``-o``."""

    table = "table"
    json = "json"
    yaml = "yaml"


OUTPUT_OPTION = typer.Option(OutputFormat.table, "--output", "-o", help="Output format.")


def _finite(data: Any) -> Any:
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: _finite(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_finite(v) for v in data]
    return data


def to_plain(data: Any) -> Any:
    """Turn pydantic models (and lists or dicts of them) into plain JSON-compatible data.

    A figure that is not finite (NaN, infinity) becomes ``null``: strict JSON has no such numbers, and
    a reader would fail on the whole document for one figure.
    """
    if hasattr(data, "model_dump"):
        return _finite(data.model_dump(mode="json"))
    if isinstance(data, dict):
        return {str(k): to_plain(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [to_plain(v) for v in data]
    if isinstance(data, float):
        return _finite(data)
    return data


def check_out_dir(path: Path | None, option: str) -> None:
    """Refuse, before any work, an output folder that is a file or lies under one, or one that would land
    where nothing can be written (the nearest folder that exists refuses new files).

    Raises:
        InputError: naming the option and the file in the way, or why nothing can be written there.
    """

    if path is None:
        return
    for place in (path, *path.parents):
        if place.exists() and not place.is_dir():
            detail = "is a file" if place == path else f"lies under {place}, which is a file"
            raise InputError(f"{option} {path}: {detail}, not a folder")
        if place.exists():
            _writable(place, f"{option} {path}")
            return


def _writable(place: Path, name: str) -> None:
    """Refuse a folder that takes no new file: one made and removed there is the one sure test."""

    try:
        handle, probe = tempfile.mkstemp(prefix=".dsx-write-check.", dir=place)
        os.close(handle)
        os.unlink(probe)
    except OSError as exc:
        raise InputError(f"{name}: {place} takes no new files ({exc.strerror or exc})") from None


def check_out_file(path: Path | None, option: str) -> None:
    """Refuse, before any work, an output file that is a folder, lies under a file, or would land where
    nothing can be written (the nearest folder that exists refuses new files).

    Raises:
        InputError: naming the option and why.
    """

    if path is None:
        return
    if path.is_dir():
        raise InputError(f"{option} {path}: is a folder, not a file")
    for place in (path.parent, *path.parent.parents):
        if place.exists() and not place.is_dir():
            raise InputError(f"{option} {path}: lies under {place}, which is a file, not a folder")
        if place.exists():
            _writable(place, f"{option} {path}")
            return


def console() -> Console:
    """A rich console on stdout; a pipe or a CI log has no width of its own, so none is imposed (no
    wrapping at rich's default of 80 columns)."""

    width = None if sys.stdout.isatty() else int(os.environ.get("COLUMNS", "200"))
    return Console(width=width)


def print_table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Print rows as a rich table on stdout."""

    table = Table(title=title)
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*("" if cell is None else str(cell) for cell in row))
    console().print(table)


def emit(data: Any, fmt: OutputFormat, table: Callable[[Any], None] | None = None) -> None:
    """Write ``data`` in the chosen format; ``table`` renders it for people (default: JSON)."""
    plain = to_plain(data)
    if fmt is OutputFormat.json or (fmt is OutputFormat.table and table is None):
        sys.stdout.write(json.dumps(plain, indent=2, sort_keys=True, allow_nan=False) + "\n")
    elif fmt is OutputFormat.yaml:
        sys.stdout.write(yaml.safe_dump(plain, sort_keys=True))
    else:
        assert table is not None
        table(data)
