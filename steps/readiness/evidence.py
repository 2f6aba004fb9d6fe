"""Where steps leave their evidence, and how files are written so none is ever half-written."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from steps.errors import InputError

__all__ = ["OUTPUT_ENV", "output_dir", "write_bytes", "write_text"]

#: The environment variable that names the folder for a step's evidence (set by the workflow).
OUTPUT_ENV = "DSX_OUTPUT_DIR"
_FILE_MODE = 0o644


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


def write_bytes(path: Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same folder and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        os.chmod(temp, _FILE_MODE)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    return path


def write_text(path: Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    return write_bytes(path, text.encode("utf-8"))
