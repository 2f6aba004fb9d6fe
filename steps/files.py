"""Writing files so that no reader ever sees one half-written.

Evidence, fleet state, run records and compiled manifests are read by other processes (a workflow's
next step, ``dsx`` in another shell, ``git diff``) while dsx may still be writing. Each file is written to
a temporary file in the same folder and renamed over the target: a rename within one file system is
atomic, so a reader sees the old file or the new one, never a mix.

A file that cannot be written (a read-only or full file system, a folder in the way, no permission) is
an :class:`~steps.errors.InputError` naming the path and the system's reason: the place a person asked
dsx to write to cannot take it, which is theirs to fix, not a defect of dsx. Nothing is left behind: not
the temporary file, nor the folders made for it.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from steps.errors import InputError

__all__ = ["FILE_MODE", "make_folder", "write_bytes", "write_text"]

#: The mode of every file written here: what a plain ``open`` gives under the usual umask (the
#: temporary file would otherwise keep ``mkstemp``'s 0600, which a reader in another container lacks).
FILE_MODE = 0o644


def write_bytes(path: Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same folder and a rename.

    The folder is created when absent. On any failure the temporary file and the folders made for it
    are removed and the target is left as it was.

    Returns:
        ``path``.

    Raises:
        InputError: the file system refused the write (naming the path and why).
    """
    path = Path(path)
    made = _missing_folders(path.parent)
    above = made[-1].parent if made else path.parent
    if not above.is_dir():
        raise InputError(f"cannot write {path}: {above} is a file, not a folder")
    temp: str | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        os.chmod(temp, FILE_MODE)
        os.replace(temp, path)
    except BaseException as exc:
        if temp is not None:
            Path(temp).unlink(missing_ok=True)
        for folder in made:  # the deepest first; one that holds anything else stays
            try:
                folder.rmdir()
            except OSError:
                break
        if isinstance(exc, OSError):
            raise InputError(f"cannot write {path}: {exc.strerror or exc}") from None
        raise
    return path


def _missing_folders(folder: Path) -> list[Path]:
    """The folders of ``folder``'s path that do not exist yet, the deepest first."""
    missing: list[Path] = []
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    return missing


def write_text(path: Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically (see :func:`write_bytes`)."""
    return write_bytes(path, text.encode("utf-8"))


def make_folder(path: Path, label: str = "") -> Path:
    """Make the folder ``path`` and those above it that are missing, and check that it takes files.

    Args:
        path: the folder.
        label: how errors name it (``--out``: "--out PATH: ..."); default: "cannot write PATH".

    Raises:
        InputError: a file is in the way, or the file system refused (naming the folder and why); the
            folders made before the refusal are removed.
    """
    path = Path(path)
    name = f"{label} {path}" if label else f"cannot write {path}"
    made = _missing_folders(path)
    above = made[-1].parent if made else path
    if not above.is_dir():
        detail = "is a file" if above == path else f"lies under {above}, which is a file"
        raise InputError(f"{name}: {detail}, not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe, temp = tempfile.mkstemp(prefix=".dsx-write-check.", dir=path)
        os.close(probe)
        os.unlink(temp)
    except OSError as exc:
        for folder in made:
            try:
                folder.rmdir()
            except OSError:
                break
        raise InputError(f"{name}: {exc.strerror or exc}") from None
    return path
