"""Writing files so that no reader ever sees one half-written.

Evidence, fleet state, run records and compiled manifests are read by other processes (a workflow's
next step, ``dsx`` in another shell, ``git diff``) while dsx may still be writing. Each file is written to
a temporary file in the same folder and renamed over the target: a rename within one file system is
atomic, so a reader sees the old file or the new one, never a mix.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["FILE_MODE", "write_bytes", "write_text"]

#: The mode of every file written here: what a plain ``open`` gives under the usual umask (the
#: temporary file would otherwise keep ``mkstemp``'s 0600, which a reader in another container lacks).
FILE_MODE = 0o644


def write_bytes(path: Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same folder and a rename.

    The folder is created when absent. On any failure the temporary file is removed and the target is
    left as it was.

    Returns:
        ``path``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        os.chmod(temp, FILE_MODE)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    return path


def write_text(path: Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically (see :func:`write_bytes`)."""
    return write_bytes(path, text.encode("utf-8"))
