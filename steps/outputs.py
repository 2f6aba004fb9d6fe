"""A step's outputs, one contract for every part: its evidence folder and its output parameters.

Argo (and dsx's local runner) runs a step with ``$DSX_OUTPUT_DIR`` set (``/tmp/dsx-out`` in a pod). The
step's evidence goes under it and the workflow collects it as artifacts; each output parameter is the file
``params/NAME`` there, the path the template names in ``valueFrom.path``
(:func:`workflows.templates._base.param_outputs`). Every file is written through :mod:`steps.files`, so none
is ever half-written. With the variable unset (a step called as a function, or from the command line):

- :func:`output_dir` uses the folder the caller gives, and refuses when it gives none;
- :func:`runner_dir` is ``None``, so whatever only a workflow collects is not written;
- :func:`write_params` writes nothing: no runner asked for a parameter.
"""

from __future__ import annotations

import os
from pathlib import Path

from steps.cluster import vocabulary as vocab
from steps.errors import InputError
from steps.files import write_text

__all__ = ["OUTPUT_ENV", "PARAMS", "output_dir", "runner_dir", "write_params"]

OUTPUT_ENV = vocab.ENV_OUTPUT_DIR
"""The environment variable that names a step's output folder (the workflow sets it)."""

PARAMS = "params"
"""The folder, under the output folder, of a step's output parameters (one file each)."""


def runner_dir() -> Path | None:
    """The output folder the runner gave the step, or ``None`` outside a runner."""
    chosen = os.environ.get(OUTPUT_ENV)
    return Path(chosen) if chosen else None


def output_dir(default: str | Path | None) -> Path:
    """The folder for evidence: ``$DSX_OUTPUT_DIR`` when set, else ``default``; created if absent.

    Raises:
        InputError: neither is given, or the folder cannot be created.
    """
    path = runner_dir() or (Path(default) if default is not None and str(default) != "" else None)
    if path is None:
        raise InputError(f"no folder for the evidence: set {OUTPUT_ENV} or pass an output folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"{path}: cannot create the evidence folder ({exc.strerror})") from None
    return path


def write_params(**values: str) -> None:
    """Give the step's output parameters (``NAME=VALUE``): each the file ``$DSX_OUTPUT_DIR/params/NAME``;
    nothing outside a runner."""
    folder = runner_dir()
    if folder is None:
        return
    for name, value in values.items():
        write_text(folder / PARAMS / name, value)
