"""Where steps leave their evidence (written through :mod:`steps.files`, so none is ever half-written)."""

from __future__ import annotations

import os
from pathlib import Path

from steps.cluster import vocabulary as vocab
from steps.errors import InputError

__all__ = ["OUTPUT_ENV", "output_dir"]

#: The environment variable that names the folder for a step's evidence (set by the workflow).
OUTPUT_ENV = vocab.ENV_OUTPUT_DIR


def output_dir(default: str | Path | None) -> Path:
    """The folder for evidence: ``$DSX_OUTPUT_DIR`` when set, else ``default``; created if absent.

    Raises:
        InputError: neither is given, or the folder cannot be created.
    """
    chosen = os.environ.get(OUTPUT_ENV) or default
    if chosen is None or str(chosen) == "":
        raise InputError(f"no folder for the evidence: set {OUTPUT_ENV} or pass an output folder")
    path = Path(chosen)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"{path}: cannot create the evidence folder ({exc.strerror})") from None
    return path
