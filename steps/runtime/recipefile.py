"""Reading a resolved recipe (RecipeResult) back from a JSON or YAML file."""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from steps.errors import InputError
from steps.runtime.resolve import RecipeResult
from steps.runtime.yamlio import line_of, load_yaml

__all__ = ["read_recipe"]


def read_recipe(path: Path) -> RecipeResult:
    """Load a RecipeResult written by ``dsx recipe resolve -o json|yaml`` and check its digest.

    Raises:
        InputError: unreadable, not a RecipeResult (with the line), or edited since it was resolved.
    """
    raw = load_yaml(Path(path), str(path))  # JSON is YAML
    try:
        result = RecipeResult.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        line = line_of(raw, first["loc"])
        where = f"{path}:{line}" if line else str(path)
        loc = ".".join(str(p) for p in first["loc"]) or "(document)"
        raise InputError(f"{where}: not a RecipeResult: {loc}: {first['msg']}") from exc
    result.verify_digest(str(path))
    return result
