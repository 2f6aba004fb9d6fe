"""The base models of dsx's pydantic types, and how a validation error becomes an input error.

Every part validates what crosses its boundary (files, parameters, API objects) with pydantic. The
bases here fix the two rules every such model keeps: an unknown field is refused (a typo must not pass
silently as a default), and, for values that are handed on, the instance cannot change after it is
checked. A :class:`pydantic.ValidationError` is a defect report for a programmer; :func:`input_error`
turns its first problem into the one line a person acts on: ``file:line: where.in[0].it: what is wrong``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.alias_generators import to_camel

from steps.errors import InputError

__all__ = ["Camel", "Frozen", "Strict", "input_error", "location", "read_model", "validate"]

M = TypeVar("M", bound=BaseModel)


class Strict(BaseModel):
    """A model that refuses unknown fields (and may be changed after it is built)."""

    model_config = ConfigDict(extra="forbid")


class Frozen(BaseModel):
    """A model that refuses unknown fields and cannot be changed once built."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Camel(Frozen):
    """A :class:`Frozen` model read from camelCase keys (``busBwGBps``), as Kubernetes-style files spell
    them; the Python field names are accepted too."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)


def location(loc: Sequence[Any]) -> str:
    """A pydantic error location as a person reads it: ``nodes[0].gpuCount`` (``(document)`` when empty)."""
    text = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc).lstrip(".")
    return text or "(document)"


def input_error(
    exc: ValidationError, name: str, data: Any = None, *, what: str = "", prefix: Sequence[Any] = ()
) -> InputError:
    """The :class:`InputError` for the first problem of ``exc``: ``name[:line]: [not a what: ]loc: msg``.

    Args:
        exc: the validation error.
        name: what the data came from (a file, an option, an environment variable).
        data: the data validated; when read by :mod:`steps.yamlio`, the message names the line.
        what: what the data should have been (``"ClusterSnapshot"``), for ``not a ClusterSnapshot``.
        prefix: where ``data`` sits in a larger document (its location's first parts).
    """
    from steps.yamlio import line_of  # here: the cluster port uses these bases and needs no YAML parser

    first = exc.errors()[0]
    loc = (*prefix, *first["loc"])
    line = line_of(data, loc) if data is not None else None
    where = f"{name}:{line}" if line else name
    kind = f"not a {what}: " if what else ""
    message = str(first["msg"]).removeprefix("Value error, ")
    return InputError(f"{where}: {kind}{location(loc)}: {message}")


def validate(model: type[M], data: Any, name: str, *, what: str = "") -> M:
    """``model`` validated from ``data``.

    Raises:
        InputError: the data does not fit the model (see :func:`input_error`).
    """
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise input_error(exc, name, data, what=what) from None


def read_model(path: Path, model: type[M], label: str | None = None, *, what: str = "") -> M:
    """Read a YAML or JSON file as ``model``; every error names the file and, where it can, the line.

    Args:
        path: the file.
        model: the model its content must fit.
        label: how errors name the file (default: the path).
        what: what the file should be (``"RecipeResult"``: ``f.json:3: not a RecipeResult: ...``).

    Raises:
        InputError: the file cannot be read, is not YAML, or does not fit the model.
    """
    from steps.yamlio import load_yaml

    name = label or str(path)
    return validate(model, load_yaml(Path(path), name), name, what=what)
