"""Rendering of command results for people (rich tables) and machines (JSON, YAML)."""

from __future__ import annotations

import enum
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import typer

__all__ = ["OUTPUT_OPTION", "OutputFormat", "console", "emit", "print_table", "to_plain"]


class OutputFormat(enum.StrEnum):
    """The output formats every reporting command accepts with ``-o``."""

    table = "table"
    json = "json"
    yaml = "yaml"


OUTPUT_OPTION = typer.Option(OutputFormat.table, "--output", "-o", help="Output format.")


def to_plain(data: Any) -> Any:
    """Turn pydantic models (and lists or dicts of them) into plain JSON-compatible data."""
    if hasattr(data, "model_dump"):
        return data.model_dump(mode="json")
    if isinstance(data, dict):
        return {str(k): to_plain(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [to_plain(v) for v in data]
    return data


def console() -> Any:
    """A rich console on stdout; a pipe or a CI log has no width of its own, so none is imposed (no
    wrapping at rich's default of 80 columns)."""
    from rich.console import Console

    width = None if sys.stdout.isatty() else int(os.environ.get("COLUMNS", "200"))
    return Console(width=width)


def print_table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Print rows as a rich table on stdout."""
    from rich.table import Table

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
        sys.stdout.write(json.dumps(plain, indent=2, sort_keys=True) + "\n")
    elif fmt is OutputFormat.yaml:
        import yaml

        sys.stdout.write(yaml.safe_dump(plain, sort_keys=True))
    else:
        assert table is not None
        table(data)
