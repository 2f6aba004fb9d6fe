"""Reading a resolved recipe (RecipeResult) back from a JSON or YAML file."""

from __future__ import annotations

from pathlib import Path

from steps.models import read_model
from steps.runtime.resolve import RecipeResult

__all__ = ["read_recipe"]


def read_recipe(path: Path) -> RecipeResult:
    """Load a RecipeResult written by ``dsx recipe resolve -o json|yaml`` and check its digest.

    Raises:
        InputError: unreadable, not a RecipeResult (with the line), or edited since it was resolved.
    """
    result = read_model(Path(path), RecipeResult, what="RecipeResult")  # JSON is YAML
    result.verify_digest(str(path))
    return result
