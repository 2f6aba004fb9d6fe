"""Pod paths on this machine: which of a step's paths lie in its folder, and why one is refused.

In a pod, ``/tmp/dsx-out`` (``$DSX_OUTPUT_DIR``, and Hera's outputs folder) is the step's own; here the
node's ``artifacts/`` folder stands for it. The validator refuses an output path outside it before the
run, and the pod's wait container (:mod:`workflows.runner.workflowpod`) refuses one that leads out of it
at run time, so no step can make the runner read or keep the host's files.
"""

from __future__ import annotations

import posixpath

__all__ = ["LOCAL_PREFIXES", "local_path", "outside_message"]

LOCAL_PREFIXES = ("/tmp/dsx-out", "/tmp/hera-outputs")
"""Pod paths that map to a step's artifact folder on this machine."""


def local_path(path: str) -> str | None:
    """The part of a pod path below ``/tmp/dsx-out`` (or Hera's outputs folder); None elsewhere.

    The path is normalised first, as the pod's filesystem reads it: ``/tmp/dsx-out/a/../b`` is ``b``,
    and ``/tmp/dsx-out/../../etc/passwd`` (``/etc/passwd``) is None. On this machine the step's folder
    stands for ``/tmp/dsx-out``, so a path that leaves it would read the host's files.
    """
    normal = posixpath.normpath(path) if path else path
    if normal.startswith("//"):  # POSIX keeps a leading '//'; the pod's kernel reads it as '/'
        normal = "/" + normal.lstrip("/")
    for prefix in LOCAL_PREFIXES:
        if normal == prefix:
            return ""
        if normal.startswith(prefix + "/"):
            return normal[len(prefix) + 1 :]
    return None


def outside_message(path: str, what: str = "files") -> str:
    """Why an output path is refused: it is not in the step's folder, or it leads out of it."""
    if ".." in path.split("/") and any(path.startswith(prefix + "/") for prefix in LOCAL_PREFIXES):
        return f"output path {path!r} leads out of the step's folder (/tmp/dsx-out) through '..'"
    return (
        f"output path {path!r} is outside the step's folder: output {what} must be under /tmp/dsx-out/ "
        "($DSX_OUTPUT_DIR)"
    )
